"""Character-level normalization: control characters, Unicode NFKC, timestamps.

Order matters and is fixed by :mod:`~mindfoundry.data.clean.profiles`: mojibake is detected on
the raw text first (NFKC would turn the tell-tale ``â€™`` into ``â€'`` and ``™`` into ``TM``),
then control characters go, then NFKC folds compatibility forms.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import replace
from typing import Any

from mindfoundry.config.clean import ControlCharsConfig, NfkcConfig, TimestampsConfig
from mindfoundry.data.clean.block import Transform
from mindfoundry.data.clean.text import remove_matches
from mindfoundry.data.document import Document

# C0 controls except \t and \n, DEL, C1 controls; zero-width and bidirectional formatting marks,
# the soft hyphen and a stray byte-order mark. \r is handled first as a line ending.
_CONTROL = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u00ad\u200b-\u200f\u202a-\u202e\u2060-\u2064\ufeff]"
)
_LINE_ENDING = re.compile(r"\r\n?")

# Punctuation that Chinese prose writes full width: NFKC would fold "，" to "," and "……" to
# "......", changing the text's typography (and turning an ellipsis into a symbol run).
CJK_PUNCTUATION = "，：；！？（）…～"
_PROTECTED = re.compile(f"([{CJK_PUNCTUATION}])")


class ControlCharRemover(Transform):
    """Normalize line endings to ``\\n`` and delete control and invisible formatting characters.

    Tabs and newlines are kept (code and tables need them). Edits: ``line_endings`` (``\\r\\n``
    or lone ``\\r`` converted) and ``control_chars`` (characters deleted).
    """

    name = "control_chars"
    section = ControlCharsConfig

    def transform(self, doc: Document) -> Document:
        text, endings = _LINE_ENDING.subn("\n", doc.text)
        text, controls = _CONTROL.subn("", text)
        self.count("line_endings", endings)
        self.count("control_chars", controls)
        return replace(doc, text=text) if endings or controls else doc


class NfkcNormalizer(Transform):
    """Unicode normalization that keeps meaning: NFC, and full-width letters, digits and symbols folded to ASCII.

    ``fold: width`` (the default) composes characters (NFC: ``e`` + combining acute becomes ``é``) and folds the
    full-width forms U+FF01-FF5E (``Ａ１＃`` to ``A1#``), nothing else: NFKC's compatibility folding changes
    meaning (``2⁵²`` becomes ``252``, ``2⁻⁵³`` becomes ``2−53``) and rewrites ligatures and CJK compatibility
    forms. ``fold: compatibility`` is NFKC. ``keep_cjk_punctuation`` leaves the full-width punctuation of Chinese
    prose (``，：；！？（）…～``) as written, so normalized Chinese still reads like Chinese. Edit: ``nfkc``
    (documents changed; the name of the section, whichever fold).
    """

    name = "nfkc"
    section = NfkcConfig

    def __init__(self, **settings: Any) -> None:
        super().__init__(**settings)
        self.keep_cjk_punctuation = self.settings.keep_cjk_punctuation
        self.form = "NFKC" if self.settings.fold == "compatibility" else "NFC"
        kept = set(CJK_PUNCTUATION) if self.keep_cjk_punctuation else set()
        self.width = {code: code - 0xFEE0 for code in range(0xFF01, 0xFF5F) if chr(code) not in kept}

    def transform(self, doc: Document) -> Document:
        text = self._normalize(doc.text)
        if text == doc.text:
            return doc
        self.count("nfkc")
        return replace(doc, text=text)

    def _normalize(self, text: str) -> str:
        if self.form == "NFC":
            return unicodedata.normalize("NFC", text).translate(self.width)
        if unicodedata.is_normalized("NFKC", text):
            return text
        if not self.keep_cjk_punctuation:
            return unicodedata.normalize("NFKC", text)
        # split() with a capture group puts the protected characters at odd positions.
        parts = _PROTECTED.split(text)
        return "".join(p if i % 2 else unicodedata.normalize("NFKC", p) for i, p in enumerate(parts))


_MONTH = (
    r"(?:Jan(?:uary)?|Feb(?:ruary)?|Mar(?:ch)?|Apr(?:il)?|May|June?|July?|Aug(?:ust)?|"
    r"Sep(?:t(?:ember)?)?|Oct(?:ober)?|Nov(?:ember)?|Dec(?:ember)?)"
)
_CLOCK = r"\d{1,2}[:：]\d{2}(?:[:：]\d{2}(?:\.\d+)?)?"
_ISO_DATE = r"\d{4}[-/.]\d{1,2}[-/.]\d{1,2}"
_ZH_DATE = r"(?:\d{2,4}[ \t]*年[ \t]*)?\d{1,2}[ \t]*月[ \t]*\d{1,2}[ \t]*[日号]|\d{4}[ \t]*年[ \t]*\d{1,2}[ \t]*月"
_EN_DATE = rf"{_MONTH}\.?[ \t]+\d{{1,2}}(?:st|nd|rd|th)?,?[ \t]+\d{{4}}|\d{{1,2}}[ \t]+{_MONTH}\.?,?[ \t]+\d{{4}}"
_DATE = rf"(?:{_ISO_DATE}|{_ZH_DATE}|{_EN_DATE})(?:(?:T|[ \t]+){_CLOCK}(?:Z|[+-]\d{{2}}:?\d{{2}})?)?"

# (edit kind, pattern); applied in this order so a labelled date goes as one piece.
TIMESTAMP_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("labelled_timestamp", re.compile(
        rf"(?:发布|发表|更新|编辑|上传|修改|提交)?(?:时间|日期)[ \t]*[:：][ \t]*(?:{_DATE}|{_CLOCK})"
        rf"|\b(?:date|time)[ \t]*[:：][ \t]*(?:{_DATE}|{_CLOCK})"
        rf"|(?:Published|Posted|Updated|Last updated)(?:[ \t]+on)?[ \t]*:?[ \t]*{_DATE}",
        re.IGNORECASE,
    )),
    ("date", re.compile(_DATE, re.IGNORECASE)),
    ("time", re.compile(rf"(?<![\d:：]){_CLOCK}(?:[ \t]*(?:[AaPp]\.[Mm]\.|[AaPp][Mm]\b))?(?![\d:：])")),
)


_YEAR = re.compile(r"(?<![\d.:/-])20\d{2}(?:[ \t]*年)?(?![\d.:/-])")


class TimestampRemover(Transform):
    """Delete dates, clock times, "发布时间：…" / "Posted on …" / "date: …" stamps and, with ``years``, the years
    2000-2099 standing alone (optional block: the practitioners' recipe deletes ``time``, ``20\\d{2}`` and ``date:``
    patterns so that a model does not learn the order of events from crawl dates).

    Web pages carry publication and crawl stamps that teach a model nothing but a date format.
    Only Arabic-digit dates are touched ("一九九八年" in prose stays). Edits, per match removed:
    ``labelled_timestamp``, ``date``, ``time``, ``year``.
    """

    name = "timestamps"
    section = TimestampsConfig

    def __init__(self, **settings: Any) -> None:
        super().__init__(**settings)
        self.patterns = TIMESTAMP_PATTERNS + ((("year", _YEAR),) if self.settings.years else ())

    def transform(self, doc: Document) -> Document:
        text = doc.text
        for kind, pattern in self.patterns:
            text, hits = remove_matches(pattern, text)
            self.count(kind, hits)
        return doc if text == doc.text else replace(doc, text=text)
