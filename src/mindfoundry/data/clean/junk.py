"""Junk that the practitioners' documents name: ad templates, timestamp lines, garbled text.

- *Ad lines*: contact details (微信 / QQ / 电话 / WhatsApp / Telegram followed by an id or number, a mobile
  number) or promotion phrases (包邮, 限时, 特价, free shipping, % off, call now...: three, or two and an
  exclamation mark) in one short line. They
  are deleted wherever they are; a document that is mostly such lines is an advertisement and is dropped.
- *Stamp lines*: a line that is nothing but a date or a time, labelled or bracketed ("发布时间：2023-05-01
  12:00", "[2021-03-04 12:00]", "date: 2022-01-01", "time: 10:21:07"). Dates inside sentences stay (the
  optional ``timestamps`` block removes those).
- *Garbled text* beyond mojibake, measured per script without any downloaded model: for Chinese the share of
  characters outside the common sets of GB2312 and Big5 (real modern text: under 1%, classical poems up to 24%;
  random CJK characters: over 55%); for Latin script the share of words that no language writes (letters mixed
  with digits, or no vowel in three letters or more: real English under 10%, man pages up to 48%; random
  strings over 80%). Measured on the Debian documentation of bench/curation_quality.py (docs/data-format.md).
"""

from __future__ import annotations

import re
from dataclasses import replace
from functools import lru_cache
from typing import Any

from mindfoundry.config.clean import JunkConfig
from mindfoundry.data.clean.block import Drop, Transform
from mindfoundry.data.clean.normalize import TIMESTAMP_PATTERNS
from mindfoundry.data.clean.text import count, other_script_units
from mindfoundry.data.document import Document

_ID = r"\s*[:：]?\s*(?:[@+]?[A-Za-z_]{0,8}\d[\w-]{3,}|\+?\d[\d -]{6,})"
_CONTACT = re.compile(
    rf"(?:微信|薇信|[vV]信|加[vV]|扣扣|电话|手机|热线|客服)[号码]?{_ID}"
    rf"|(?<![A-Za-z0-9])(?:qq|vx|wx|whats ?app|telegram|wechat|skype)(?![A-Za-z0-9]){_ID}"  # not "vx600x"
    r"|(?<!\d)1[3-9]\d{9}(?!\d)|1-8\d\d-\d{3,}",
    re.IGNORECASE,
)
_PROMOTION = re.compile(
    r"包邮|限时|特价|抢购|优惠|折扣|免费领取|优惠券|代开发票|代办|厂家直销|欢迎来电|咨询热线|点击这里|立即购买|秒杀|低价|"
    r"加盟|招商|返利|日赚|月入|免费咨询|"
    r"free shipping|limited time|special offer|discount|\d+% off|buy now|order now|call now|click here|cheap|"
    r"no prescription|online now|earn \$|from home|best price|act now|free quote|claim your|free gift|subscribe now",
    re.IGNORECASE,
)
#: Ads are short: a longer line that names a discount is more likely news about one.
AD_LINE_MAX_CHARS = 120
_STAMP_LABEL = re.compile(
    r"(?:date|time|posted(?: on)?|updated|last updated|发布|发表|更新|时间|日期)\s*[:：]?", re.IGNORECASE
)
_STAMP_LEFT = re.compile(r"[\s\[\]()（）【】|:：,，.\-–—/]*")
_CJK = re.compile("[\u3400-\u4dbf\u4e00-\u9fff]")
# How a line that is only a stamp starts (a bracket, a label, a month, or digits and a date separator): the cheap test
# that picks the lines the timestamp patterns then judge.
_STAMP_START = re.compile(
    r"(?im)^[ \t]*[\[(（【]?[ \t]*(?:date|time|posted|updated|last updated|发布|发表|更新|编辑|时间|日期|"
    r"(?:jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec)[a-z]*\.?[ \t]+\d|\d{1,4}[ \t]*[-/.:：年月]|\d{1,2}[ "
    r"\t]+[a-z]{3})"
)
_TOKEN = re.compile(r"[A-Za-z0-9]{3,}")  # words of three characters or more (shorter ones say little)
#: Latin words the garbled-word ratio is measured on at most.
MAX_JUDGED = 2000
_HEX = re.compile(r"(?:0x|u)?[0-9a-fA-F]+")  # 0x00c7, u4e2d, deadbeef: numbers, not words
_VOWEL = re.compile("[aeiouyAEIOUY]")


@lru_cache(maxsize=1)
def common_cjk() -> frozenset[str]:
    """The characters of GB2312 (simplified, both levels) and of Big5's common level (traditional): what Chinese
    text is written with, from the codecs Python ships."""
    chars: set[str] = set()
    for codec, leads, trails in (("gb2312", range(0xB0, 0xF8), range(0xA1, 0xFF)),
                                 ("big5", range(0xA4, 0xC7), [*range(0x40, 0x7F), *range(0xA1, 0xFF)])):
        for lead in leads:
            for trail in trails:
                try:
                    chars.add(bytes((lead, trail)).decode(codec))
                except UnicodeDecodeError:
                    continue
    return frozenset(chars)


def is_ad_line(line: str) -> bool:
    """A short line with contact details, or three promotion phrases, or two and an exclamation mark ("价格太高，
    折扣远比携程优惠。" is a complaint; "全场包邮，限时特价，立即抢购！" an ad)."""
    if len(line) > AD_LINE_MAX_CHARS or not line.strip():
        return False
    if _CONTACT.search(line) is not None:
        return True
    phrases = len(set(_PROMOTION.findall(line.lower())))
    return phrases >= 3 or (phrases == 2 and ("!" in line or "！" in line))


def is_stamp_line(line: str) -> bool:
    """A line that is a date or time and nothing else (a label and brackets aside)."""
    if not any(char.isdigit() for char in line):
        return False
    rest, hits = line, 0
    for _, pattern in TIMESTAMP_PATTERNS:
        rest, found = pattern.subn("", rest)
        hits += found
    return hits > 0 and _STAMP_LEFT.fullmatch(_STAMP_LABEL.sub("", rest)) is not None


def rare_cjk_ratio(text: str) -> tuple[float, int]:
    """Share of CJK characters outside :func:`common_cjk`, and how many CJK characters there are (counted by two
    compiled character classes, so a long text costs two passes in C)."""
    total = count(_CJK, text)
    if not total:
        return 0.0, 0
    return (total - count(_common_cjk_class(), text)) / total, total


@lru_cache(maxsize=1)
def _common_cjk_class() -> re.Pattern[str]:
    return re.compile("[" + "".join(sorted(common_cjk())) + "]")


def garbled_word_ratio(text: str) -> tuple[float, int]:
    """Share of Latin words of three characters or more that no language writes (letters and digits mixed, or
    no vowel), and how many such words were judged (the first :data:`MAX_JUDGED`: garbage is garbled throughout);
    none in text of another script (Chinese, Cyrillic, Arabic...: its Latin words are commands and names)."""
    judged = bad = 0
    for match in _TOKEN.finditer(text):
        token = match.group()
        if token.isdigit() or _HEX.fullmatch(token):
            continue
        judged += 1
        bad += not token.isalpha() or _VOWEL.search(token) is None
        if judged == MAX_JUDGED:
            break
    if not judged or other_script_units(text) >= judged:
        return 0.0, 0  # Chinese, Russian, Arabic... text: its Latin words are commands, names and placeholders
    return bad / judged, judged


class JunkRemover(Transform):
    """Delete ad and stamp lines; drop documents that are mostly ads or that are garbled (module docstring).

    Edits: ``ad_line``, ``stamp_line``. Reasons: ``rare_cjk_chars``, ``garbled_words``, ``ad_lines``.
    """

    name = "junk"
    section = JunkConfig

    def __init__(self, **settings: Any) -> None:
        super().__init__(**settings)
        s = self.settings
        self.ad_lines, self.stamp_lines, self.max_ad_line_share = s.ad_lines, s.stamp_lines, s.max_ad_line_share
        self.garbled = (("rare_cjk_chars", s.max_rare_cjk_ratio, rare_cjk_ratio),
                        ("garbled_words", s.max_garbled_word_ratio, garbled_word_ratio))
        self.min_evidence = s.min_evidence

    def transform(self, doc: Document) -> Document | Drop:
        for reason, limit, measure in self.garbled:
            if limit is not None:
                ratio, evidence = measure(doc.text)
                if evidence >= self.min_evidence and ratio > limit:
                    return Drop(reason, ratio, limit)
        text = doc.text
        may_ad = self.ad_lines and (
            _CONTACT.search(text) is not None or len(set(_PROMOTION.findall(text.lower()))) >= 2
        )
        may_stamp = self.stamp_lines and _STAMP_START.search(text) is not None
        if not may_ad and not may_stamp:  # the common case, decided on the whole text at once
            return doc
        lines = text.split("\n")
        ads = [may_ad and is_ad_line(line) for line in lines]
        stamps = [may_stamp and not ad and _STAMP_START.match(line) is not None and is_stamp_line(line)
                  for line, ad in zip(lines, ads, strict=True)]
        if not any(ads) and not any(stamps):
            return doc
        written = sum(1 for line in lines if line.strip())
        if self.max_ad_line_share is not None and sum(ads) > self.max_ad_line_share * written:
            return Drop("ad_lines", sum(ads) / written, self.max_ad_line_share)
        self.count("ad_line", sum(ads))
        self.count("stamp_line", sum(stamps))
        return replace(doc, text="\n".join(line for line, ad, stamp in zip(lines, ads, stamps, strict=True)
                                           if not ad and not stamp))
