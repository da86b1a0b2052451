"""Gopher's repetition rules (Rae et al. 2021, as implemented in datatrove), measured as :mod:`.quality` measures:
in units, over prose lines, n-grams of characters for Chinese-dominant documents; a document that breaks them loses
its repeats and is dropped only when it is repetition through and through (:class:`RepetitionFilter`).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import replace
from typing import Any

import numpy as np

from mindfoundry.config.clean import RepetitionConfig
from mindfoundry.data.clean.block import Drop, Transform, Verdict
from mindfoundry.data.clean.formulaic import echo_lines, spread_repetition
from mindfoundry.data.clean.quality import is_syntax_line, prose_part
from mindfoundry.data.clean.text import is_cjk_text, units
from mindfoundry.data.document import Document

_PARAGRAPH_BREAK = re.compile(r"\n[ \t]*\n")
_PARAGRAPH_SPLIT = re.compile(r"(\n[ \t]*\n)")  # keeps the breaks, so joining the parts gives the text back

#: In a text shorter than ``ngram_min_units`` a duplicate n-gram rule drops it only when more than this share of its
#: characters repeats: a quote or a stanza repeats a phrase by design ("That, that is, is."), spam repeats itself.
SHORT_TEXT_REPEAT_SHARE = 0.5


def without_repeats(text: str) -> tuple[str, int, int]:
    """``text`` without the second and later copies of its paragraphs and of its prose lines (compared stripped;
    code, markup and table lines repeat by syntax and stay), with how many lines and paragraphs went."""
    seen_paragraphs: set[str] = set()
    kept_paragraphs: list[str] = []
    paragraphs = 0
    parts = _PARAGRAPH_SPLIT.split(text)  # paragraph, break, paragraph, ...
    for i in range(0, len(parts), 2):
        key = parts[i].strip()
        if key and key in seen_paragraphs:
            paragraphs += 1
            continue  # with the break before it, which the next paragraph's own break replaces
        seen_paragraphs.add(key)
        kept_paragraphs += ([parts[i - 1]] if kept_paragraphs else []) + [parts[i]]
    seen_lines: set[str] = set()
    kept_lines, lines = [], 0
    for line in "".join(kept_paragraphs).split("\n"):
        key = line.strip()
        if key and key in seen_lines and not is_syntax_line(key):
            lines += 1
            continue
        seen_lines.add(key)
        kept_lines.append(line)
    return "\n".join(kept_lines), lines, paragraphs


def _once_share(rest: str, text: str) -> float:
    """The share of ``rest`` (``text`` without its repeats) in prose lines that ``text`` holds once: most of it when the
    repeats were copies of a few lines (a catalogue listing one message sixteen times), none when ``text`` was its
    lines over and over."""
    counts = Counter(line.strip() for line in text.split("\n"))
    once = sum(len(line) for line in rest.split("\n") if counts[line.strip()] == 1 and not is_syntax_line(line))
    return once / len(rest) if rest else 0.0


def _windowed_fractions(parts: list[str], window: int | None) -> tuple[float, float]:
    """:func:`_duplicate_fractions` over consecutive windows of about ``window`` characters of ``parts`` (None: all
    at once), averaged by the windows' characters (a short last window joins the one before)."""
    if window is None or sum(map(len, parts)) <= window:
        return _duplicate_fractions(parts)
    groups: list[list[str]] = [[]]
    size = 0
    for part in parts:
        if size >= window:
            groups.append([])
            size = 0
        groups[-1].append(part)
        size += len(part)
    if len(groups) > 1 and size < window // 2:
        last = groups.pop()
        groups[-1] += last
    weights = [sum(map(len, group)) for group in groups]
    fractions = [_duplicate_fractions(group) for group in groups]
    total = sum(weights) or 1
    return (sum(w * f for w, (f, _) in zip(weights, fractions, strict=True)) / total,
            sum(w * c for w, (_, c) in zip(weights, fractions, strict=True)) / total)


def _duplicate_fractions(parts: list[str]) -> tuple[float, float]:
    """Share of parts that repeat an earlier part, and share of characters in those repeats."""
    seen: set[str] = set()
    repeats = repeated_chars = 0
    for part in parts:
        if part in seen:
            repeats += 1
            repeated_chars += len(part)
        seen.add(part)
    total_chars = sum(len(p) for p in parts)
    return repeats / max(len(parts), 1), repeated_chars / max(total_chars, 1)


class _UnitSequence:
    """A document's units as integer ids and character lengths, for vectorized n-gram statistics.

    The n-gram keys are 64-bit polynomial hashes (collisions are negligible at document scale),
    extended one unit at a time (``key[n+1] = key[n] * B + id``), so checking n = 2..10 costs
    one vector operation per n rather than one per n-gram.
    """

    _BASE = np.uint64(1_000_003)

    def __init__(self, tokens: tuple[str, ...]) -> None:
        vocab: dict[str, int] = {}
        self.ids = np.array([vocab.setdefault(t, len(vocab) + 1) for t in tokens], dtype=np.uint64)
        self.lengths = np.array([len(t) for t in tokens], dtype=np.int64)
        self.chars = int(self.lengths.sum())
        self._n, self._keys = 1, self.ids

    def keys(self, n: int) -> np.ndarray:
        """The key of every n-gram window, in order (call with non-decreasing n)."""
        if n < self._n:
            raise ValueError(f"n-gram sizes must be requested in increasing order ({n} after {self._n})")
        while self._n < n:
            self._keys = self._keys[:-1] * self._BASE + self.ids[self._n:]
            self._n += 1
        return self._keys

    def top_coverage(self, n: int) -> float:
        """Characters of the most frequent n-gram times its count, over all characters.

        Only an n-gram that occurs at least twice counts: in a short document every n-gram
        occurs once and would otherwise "cover" a large share.
        """
        if len(self.ids) < n:
            return 0.0
        _, first, counts = np.unique(self.keys(n), return_index=True, return_counts=True)
        best = int(np.argmax(counts))
        if counts[best] < 2:
            return 0.0
        start = int(first[best])
        return int(self.lengths[start:start + n].sum()) * int(counts[best]) / self.chars

    def duplicate_coverage(self, n: int) -> float:
        """Share of characters inside repeated occurrences of n-grams (each character once)."""
        if len(self.ids) < n:
            return 0.0
        keys = self.keys(n)
        repeat = np.ones(len(keys), dtype=bool)
        repeat[np.unique(keys, return_index=True)[1]] = False
        starts = np.flatnonzero(repeat)
        if starts.size == 0:
            return 0.0
        size = len(self.ids) + 1
        depth = np.bincount(starts, minlength=size) - np.bincount(starts + n, minlength=size)
        covered = np.cumsum(depth[:-1]) > 0
        return int(self.lengths[covered].sum()) / self.chars


class RepetitionFilter(Transform):
    """Gopher repetition rules over lines, paragraphs and n-grams of units, measured on the prose lines; a document
    that fails them loses its repeats, and only a document that is repetition through and through is dropped.

    Code, markup and table lines (:func:`is_syntax_line`) are left out: there the repetition is the
    syntax (``self.assertEqual(``, ``+------+``). N-gram limits map a size in words to the largest
    share of characters allowed; ``None`` or ``{}`` disables them. For a Chinese-dominant document
    every size is multiplied by ``cjk_chars_per_word`` and measured in characters: Chinese news and
    law repeat long names ("县级以上地方各级人民政府" is one), which word-sized character n-grams
    would flag. N-gram shares are measured in windows of ``window_units`` units (times the same
    factor) and averaged by characters: Gopher's limits were set on web pages of about that length,
    and over a whole book any phrase repeats, so without windows a long clean chapter or API page
    fails. The top n-gram rule needs ``top_ngram_min_units`` units (times the same factor for
    Chinese): in a short text one phrase said twice already covers a large share; below
    ``ngram_min_units`` (a quote, a stanza: rhetoric repeats) the duplicate n-gram rules drop a document only
    when more than :data:`SHORT_TEXT_REPEAT_SHARE` of it repeats.

    A document that breaks a rule loses the second and later copies of its repeated prose lines and
    paragraphs (a page whose header was extracted three times, a chapter pasted twice); when what is left passes
    every rule and keeps at least ``min_rest_share`` of the characters, or is that share lines said once (a
    catalogue listing one message sixteen times), it is kept so (edits ``repeated_line``, ``repeated_paragraph``).
    When what still fails is an n-gram rule, the repeated n-grams are located
    (:mod:`.formulaic`): repetition spread over varied lines holding ``min_rest_share`` of the units (a law code, a
    liturgy, a genealogy) is text, kept without the lines that repeat within themselves (edit ``repetitive_line``:
    spam pasted into it); else it loses the lines that echo earlier ones (edit ``echoed_line``: a paragraph said again
    with a word changed) when the rest passes and holds ``min_rest_share`` of it; otherwise the document is dropped
    for the first rule it broke. Reasons:
    ``duplicate_lines``, ``duplicate_line_chars``, ``duplicate_paragraphs``,
    ``duplicate_paragraph_chars``, ``top_{n}gram_{words|chars}``, ``duplicate_{n}gram_{words|chars}``.
    """

    name = "repetition"
    section = RepetitionConfig

    def __init__(self, **settings: Any) -> None:
        super().__init__(**settings)
        s = self.settings
        self.line_limits = (s.max_duplicate_line_fraction, s.max_duplicate_line_char_fraction)
        self.paragraph_limits = (s.max_duplicate_paragraph_fraction, s.max_duplicate_paragraph_char_fraction)
        self.top_ngrams, self.duplicate_ngrams = dict(s.top_ngrams or {}), dict(s.duplicate_ngrams or {})
        self.top_ngram_min_units = s.top_ngram_min_units
        self.ngram_min_units = s.ngram_min_units
        self.cjk_chars_per_word = s.cjk_chars_per_word
        self.window_units = s.window_units
        self.min_rest_share = s.min_rest_share

    def transform(self, doc: Document) -> Document | Drop:
        verdict = self.judge(doc.text)
        if verdict is True:
            return doc
        rest, lines, paragraphs = without_repeats(doc.text)
        if len(rest) < self.min_rest_share * len(doc.text) and _once_share(rest, doc.text) < self.min_rest_share:
            return verdict
        rest_verdict = self.judge(rest) if lines or paragraphs else verdict
        edit, gone = "repetitive_line", 0
        if rest_verdict is not True:
            if not rest_verdict.reason.endswith(("gram_words", "gram_chars")):
                return verdict
            part = self._without_repetition(rest, len(doc.text))
            if part is None:
                return verdict
            rest, edit, gone = part
        self.count("repeated_line", lines)
        self.count("repeated_paragraph", paragraphs)
        self.count(edit, gone)
        return doc if rest == doc.text else replace(doc, text=rest)

    def _without_repetition(self, text: str, whole: int) -> tuple[str, str, int] | None:
        """``text``, which breaks an n-gram rule, without the lines that carry its repetition, with the edit and how
        many lines went: its spam lines when the repetition is spread over varied lines
        (:func:`~mindfoundry.data.clean.formulaic.spread_repetition`), else its lines that echo earlier ones
        (:func:`~mindfoundry.data.clean.formulaic.echo_lines`) when what is left passes every rule and holds
        ``min_rest_share`` of the document's ``whole`` characters and ``ngram_min_units``; ``None`` when no part of it
        stands."""
        all_lines = text.split("\n")
        prose = [i for i, line in enumerate(all_lines) if line.strip() and not is_syntax_line(line)]
        prose_lines = [all_lines[i] for i in prose]
        n = min(self.duplicate_ngrams or self.top_ngrams) * self._scale(text)  # an n-gram rule broke: one is set

        def without(lines: list[int]) -> str:
            gone = {prose[i] for i in lines}
            return "\n".join(line for i, line in enumerate(all_lines) if i not in gone)

        spam = spread_repetition(prose_lines, n, self.min_rest_share)
        if spam is not None:
            return without(spam), "repetitive_line", len(spam)
        echoes = echo_lines(prose_lines, n)
        rest = without(echoes)
        if (not echoes or len(rest) < self.min_rest_share * whole or self._short(prose_part(rest))
                or self.judge(rest) is not True):
            return None  # (a short rest would be judged by the lenient limits of a quote, not by the document's)
        return rest, "echoed_line", len(echoes)

    def judge(self, text: str) -> Verdict:
        """The first rule ``text`` breaks, or True."""
        text = prose_part(text)
        lines = [line.strip() for line in text.split("\n") if line.strip()]
        paragraphs = [p.strip() for p in _PARAGRAPH_BREAK.split(text) if p.strip()]
        window = self._window_chars(text)
        for kind, parts, limits in (
            ("line", lines, self.line_limits),
            ("paragraph", paragraphs, self.paragraph_limits),
        ):
            fraction, char_fraction = _windowed_fractions(parts, window)
            if limits[0] is not None and fraction > limits[0]:
                return Drop(f"duplicate_{kind}s", fraction, limits[0])
            if limits[1] is not None and char_fraction > limits[1]:
                return Drop(f"duplicate_{kind}_chars", char_fraction, limits[1])
        return self._ngram_verdict(text)

    def _window_chars(self, text: str) -> int | None:
        """The line and paragraph rules' window in characters: ``window_units`` units of this script (a CJK unit is a
        character, times ``cjk_chars_per_word``; a word with its space about 6), so a 2k- and a 200k-character page
        of one kind are judged alike (a repeated sentence weighs the same in each)."""
        if not self.window_units:
            return None
        return self.window_units * (self.cjk_chars_per_word if is_cjk_text(text) else 6)

    def _windows(self, tokens: tuple[str, ...], scale: int) -> list[_UnitSequence]:
        """The units cut into windows of ``window_units * scale`` (a short last window joins the one before)."""
        size = self.window_units * scale if self.window_units else len(tokens)
        starts = list(range(0, len(tokens), max(size, 1)))
        if len(starts) > 1 and len(tokens) - starts[-1] < size // 2:
            starts.pop()
        ends = starts[1:] + [len(tokens)]
        return [_UnitSequence(tokens[a:b]) for a, b in zip(starts, ends, strict=True)]

    def _short(self, text: str) -> bool:
        """Whether ``text`` is under ``ngram_min_units`` (times ``cjk_chars_per_word`` for Chinese), where the
        duplicate n-gram rules let half of it repeat."""
        return len(units(text)) < self.ngram_min_units * self._scale(text)

    def _scale(self, text: str) -> int:
        """Units per word-sized unit of the rules: ``cjk_chars_per_word`` for Chinese-dominant text, else 1."""
        return self.cjk_chars_per_word if is_cjk_text(text) else 1

    def _ngram_verdict(self, text: str) -> Verdict:
        tokens = units(text)
        cjk = is_cjk_text(text)
        scale, kind = (self.cjk_chars_per_word, "chars") if cjk else (1, "words")
        short = self._short(text)
        checks = [(n * scale, max(limit, SHORT_TEXT_REPEAT_SHARE) if short else limit, "duplicate")
                  for n, limit in self.duplicate_ngrams.items()]
        if len(tokens) >= self.top_ngram_min_units * scale:
            checks += [(n * scale, limit, "top") for n, limit in self.top_ngrams.items()]
        if not checks or not tokens:
            return True
        windows = self._windows(tokens, scale)
        chars = sum(w.chars for w in windows)
        for n, limit, rule in sorted(checks):
            share = (
                sum((w.top_coverage(n) if rule == "top" else w.duplicate_coverage(n)) * w.chars for w in windows)
                / chars
            )
            if share > limit:
                return Drop(f"{rule}_{n}gram_{kind}", share, limit)
            if share == 0.0:
                return True  # no n-gram repeats, so no longer one does: the remaining checks would pass
        return True
