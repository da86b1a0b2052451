"""Where a document's repeated n-grams sit: spread over varied sentences (formulaic prose) or making up whole lines
(repetition spam).

Gopher's n-gram limits were set on web pages. Long formulaic prose breaks them although every sentence in it is good
text: a law code, a liturgy, a genealogy or a census list says "the sons of", "for his mercy endureth for ever" or
"the evening and the morning were the ... day" again and again, each time inside a sentence that says something new.
Spam is the other way round: its lines are nothing but the repeated phrases. So the repeated n-grams are located
(every unit inside an n-gram that occurs twice or more in the document) and each prose line is asked how much of it is
its own (units no repeated n-gram covers). A line with at least :data:`NOVEL_SHARE` of its own, and a word found in
few of the document's lines (:data:`OWN_WORD_LINES`), is *varied*. When the
varied lines hold most of the document, its repetition is spread and the document is text; its lines that repeat
within themselves, all but :data:`SPAM_NOVEL_SHARE` of them (``好评好评好评``, ``cheap shoes buy now cheap shoes
buy now``), are spam inserted into it and go. Otherwise the lines that *echo* earlier ones (:func:`echo_lines`: a
paragraph that says the one before it again with a word changed) go when what is left is text by every rule and holds
most of the document; else the n-gram rule drops the document. Measured on the King James Bible (bench/
curation_quality.py, source en_bible): the chapters the n-gram rules drop have 0.36-1.0 of their units in varied lines
(the two under 0.5 are Numbers 7 and 29, twelve copies of one offering list), keyword-stuffing and one-phrase spam 0.0.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from mindfoundry.data.clean.text import units

#: The share of a line's units that no repeated n-gram covers for the line to say something of its own.
NOVEL_SHARE = 0.25
#: A line whose units are all but this share inside n-grams it repeats itself is spam; verse that repeats within a line
#: keeps more of its own ("which was the son of Melchi, which was the son of Addi, ...": the names, 0.17).
SPAM_NOVEL_SHARE = 0.1
#: A line's own word is in at most this share of the document's lines (in one line of a short document): a help page
#: of parallel sections names "cellular" or "battery" in a few of its sixty lines, keyword stuffing names its
#: keywords in every line.
OWN_WORD_LINES = 0.1


#: A line with at least this share of its units inside n-grams that earlier lines hold echoes them.
ECHO_SHARE = 1 - NOVEL_SHARE


def _covered(tokens: tuple[str, ...], n: int, counts: Counter[tuple[str, ...]], least: int = 2) -> np.ndarray:
    """Which of ``tokens`` lie inside an n-gram that ``counts`` holds ``least`` times or more."""
    mask = np.zeros(len(tokens), dtype=bool)
    for i in range(len(tokens) - n + 1):
        if counts[tokens[i:i + n]] >= least:
            mask[i:i + n] = True
    return mask


def _ngrams(tokens: tuple[str, ...], n: int) -> Counter[tuple[str, ...]]:
    return Counter(tokens[i:i + n] for i in range(len(tokens) - n + 1))


def spread_repetition(lines: list[str], n: int, min_varied_share: float) -> list[int] | None:
    """For a document's prose ``lines`` that broke an n-gram rule (``n``: its smallest duplicate n-gram, in units):
    the indexes of the spam lines to remove when its repetition is spread over varied lines holding at least
    ``min_varied_share`` of its units, else ``None`` (what is left would not be text)."""
    tokens = [units(line) for line in lines]
    counts = Counter[tuple[str, ...]]()
    for line_tokens in tokens:
        counts.update(_ngrams(line_tokens, n))
    lines_with = Counter(unit for line_tokens in tokens for unit in set(line_tokens))
    few = max(1, int(OWN_WORD_LINES * len(lines)))
    varied = total = 0
    plain = []
    for i, line_tokens in enumerate(tokens):
        total += len(line_tokens)
        own_word = any(lines_with[unit] <= few for unit in line_tokens)
        if own_word and (~_covered(line_tokens, n, counts)).sum() >= NOVEL_SHARE * len(line_tokens):
            varied += len(line_tokens)
        else:
            plain.append(i)
    if not total or varied < min_varied_share * total:
        return None
    return [i for i in plain
            if tokens[i] and (~_covered(tokens[i], n, _ngrams(tokens[i], n))).mean() < SPAM_NOVEL_SHARE]


def echo_lines(lines: list[str], n: int) -> list[int]:
    """The indexes of the ``lines`` that echo earlier ones: at least :data:`ECHO_SHARE` of their units inside n-grams
    (``n`` units) that earlier lines hold. The first of near-identical paragraphs stays and its later near-copies go
    ("The Cut Named command cuts the content of the selection ... in a special buffer that you name", then the same
    for Copy Named and Copy Visible Named); a line shorter than an n-gram echoes nothing."""
    earlier = Counter[tuple[str, ...]]()
    echoes = []
    for i, line in enumerate(lines):
        tokens = units(line)
        grams = _ngrams(tokens, n)
        if grams and _covered(tokens, n, earlier, least=1).mean() >= ECHO_SHARE:
            echoes.append(i)
        earlier.update(grams)
    return echoes
