"""Curation of text in many scripts: what `data.clean` with `language.keep: [zh, en, ru, ar, ko, ja]` keeps and
removes, and whether real mojibake still goes.

    .venv/bin/python bench/curation_sources.py --fetch       # once: the Debian documentation packages
    .venv/bin/python bench/curation_scripts.py [--per-source 150] [--keep zh en ru ar ko ja]

Documents (bench/curation_sources.py), at most ``--per-source`` per source: GNOME's help translated into Russian,
Korean, Japanese, Chinese, Greek, Hebrew, Hindi, Persian, Ukrainian, German and Tamil; GIMP's help in Russian, Korean
and Greek; LibreOffice's Arabic interface messages; the Japanese, German, French, Russian, Spanish and traditional
Chinese manuals of bench/language_id.py; the zh/en sources of bench/curation_quality.py. Translated help leaves pages
or paragraphs in English: a document's true language is its source's when that script's letters are at least twice
the Latin ones, English when the Latin letters are at least twice those, else ``mixed`` (either answer is right; not
counted); German pages by common words.

Every document goes through the whole cleaning pipeline as ``prepare --preview`` runs it (profile ``auto``, defaults,
``language.keep`` set). Mojibake: documents of each kept language encoded as UTF-8 and decoded as GBK, as Latin-1
and as cp1252 (the ways a pipeline misreads UTF-8), each through the same pipeline. Every document is in one half by
a hash of its text: the rules were written looking at the ``tune`` half; the figures that count are ``held-out``'s.
Prints a table per half and one final JSON line.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
import tempfile
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from curation_sources import language_documents, script_documents, source_documents  # noqa: E402
from language_id import ZH_EN, half, written_in  # noqa: E402
from mindfoundry.config.load import apply_overrides, validate  # noqa: E402
from mindfoundry.data.clean.preview import preview_cleaning  # noqa: E402

KEEP = ("zh", "en", "ru", "ar", "ko", "ja")
MISREADS = ("gbk", "latin-1", "cp1252")
_LETTER = re.compile(r"[^\W\d_]")
MIN_LETTERS = 20


def truth(text: str, nominal: str, source: str) -> str:
    """The language a document is really in (module docstring; :func:`language_id.written_in`)."""
    return written_in(text, nominal) if nominal != "en" and source.endswith(("_help", "_gnome")) else nominal


def corpus(per_source: int, seed: int = 0) -> dict[str, tuple[str, list[str]]]:
    """{source: (language, documents)}, at most ``per_source`` each (a fixed sample)."""
    rng = random.Random(seed)
    sources = {name: (ZH_EN[name], docs) for name, docs in source_documents().items() if name in ZH_EN}
    sources.update(language_documents())
    sources.update(script_documents(per_source=per_source))
    # Pages linked twice count once; a page of fewer than MIN_LETTERS letters (a Mallard title alone) has no language.
    sources = {name: (lang, [t for t in dict.fromkeys(docs) if len(_LETTER.findall(t)) >= MIN_LETTERS])
               for name, (lang, docs) in sources.items()}
    return {name: (lang, rng.sample(docs, per_source) if len(docs) > per_source else docs)
            for name, (lang, docs) in sources.items()}


def misread(text: str, codec: str) -> str:
    """``text``'s UTF-8 bytes decoded as ``codec`` (what a reader that guessed the codec wrong shows)."""
    return text.encode("utf-8").decode(codec, errors="replace")


def mojibake_corpus(docs: dict[str, tuple[str, list[str]]], per_language: int, seed: int = 0
                    ) -> dict[str, tuple[str, list[str]]]:
    """{``mojibake_CODEC_LANG``: (LANG, documents)}: ``per_language`` documents of each kept language (of 200 to
    5,000 characters, with at least a tenth of their characters outside ASCII: a misread that changes nothing is
    not mojibake) misread as each codec of :data:`MISREADS`."""
    rng = random.Random(seed)
    by_language: dict[str, list[str]] = defaultdict(list)
    for name, (lang, texts) in docs.items():
        if lang in KEEP:
            by_language[lang] += [t for t in texts if truth(t, lang, name) == lang and 200 <= len(t) <= 5000
                                  and sum(ord(c) > 127 for c in t) >= len(t) / 10]
    out = {}
    for lang in KEEP:
        chosen = rng.sample(by_language[lang], min(per_language, len(by_language[lang])))
        for codec in MISREADS:
            out[f"mojibake_{codec.replace('-', '')}_{lang}"] = (lang, [misread(t, codec) for t in chosen])
    return out


def clean(docs: dict[str, tuple[str, list[str]]], overrides: list[str]) -> dict[str, list[tuple[dict | None, int]]]:
    """Per source, each document's drop-log line if a block dropped it (None: kept) and the characters it keeps
    (0 when dropped; edits remove lines), cleaned as ``prepare --preview`` does it."""
    with tempfile.TemporaryDirectory() as folder:
        for name, (_, texts) in docs.items():
            with open(Path(folder) / f"{name}.jsonl", "w", encoding="utf-8") as fh:
                fh.writelines(json.dumps({"text": text}, ensure_ascii=False) + "\n" for text in texts)
        tree = {"data": {"sources": [{"name": name, "paths": [f"{folder}/{name}.jsonl"]} for name in docs]}}
        data = validate(apply_overrides(tree, overrides)).data
        previews, _ = preview_cleaning(data, max(len(texts) for _, texts in docs.values()))
    out: dict[str, list[tuple[dict | None, int]]] = {}
    for preview, (name, (_, texts)) in zip(previews, docs.items(), strict=True):
        drops = {line["record"]: line for line in preview.events if line["action"] == "drop"}
        kept = iter(preview.documents)  # the kept documents, in input order
        out[name] = [(drops[i], 0) if i in drops else (None, len(next(kept).text)) for i in range(len(texts))]
    return out


def measure(docs: dict[str, tuple[str, list[str]]], cleaned: dict[str, list[tuple[dict | None, int]]]
            ) -> dict[str, Any]:
    """Per half and true language: documents and characters, how many were dropped and kept, and by which block and
    reason."""
    rows: dict[str, dict[str, Any]] = {}
    for name, (lang, texts) in docs.items():
        for text, (drop, kept_chars) in zip(texts, cleaned[name], strict=True):
            truly = lang if name.startswith("mojibake_") else truth(text, lang, name)
            row = rows.setdefault(f"{half(text)}|{name}|{truly}", {"documents": 0, "dropped": 0, "chars": 0,
                                                                    "dropped_chars": 0, "kept_chars": 0,
                                                                    "reasons": Counter()})
            row["documents"] += 1
            row["chars"] += len(text)
            row["kept_chars"] += kept_chars
            row["dropped_chars"] += len(text) * (drop is not None)
            if drop is not None:
                row["dropped"] += 1
                row["reasons"][f"{drop['block']}:{drop['reason']}"] += 1
    return rows


def summary(rows: dict[str, dict[str, Any]], part: str) -> dict[str, Any]:
    """The shares the acceptance names, for one half: documents removed, characters in removed documents, and
    characters kept (edits, such as a man page's licence footer or a line repeated within a document, remove some of
    a kept document's)."""
    totals: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0, 0])
    script_mojibake = 0  # documents in a non-Latin script that the mojibake block dropped
    for key, row in rows.items():
        where, name, lang = key.split("|")
        if where != part or lang == "mixed":
            continue
        if name.startswith("mojibake_"):
            groups = ["mojibake", f"mojibake_{name.split('_')[1]}"]
        else:
            groups = [f"kept:{lang}" if lang in KEEP else f"other:{lang}", "kept" if lang in KEEP else "other"]
            script_mojibake += sum(n for reason, n in row["reasons"].items() if reason.startswith("mojibake:")) * (
                lang not in ("en", "de", "fr", "es"))
        for group in groups:
            for i, field in enumerate(("dropped", "documents", "dropped_chars", "kept_chars", "chars")):
                totals[group][i] += row[field]
    shares = {group: {"documents": total, "removed": round(dropped / total, 4),
                      "chars_removed": round(gone / chars, 4), "chars_kept": round(kept / chars, 4)}
              for group, (dropped, total, gone, kept, chars) in sorted(totals.items()) if total}
    return {"shares": shares, "non_latin_dropped_as_mojibake": script_mojibake}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--per-source", type=int, default=150)
    parser.add_argument("--mojibake-per-language", type=int, default=60)
    parser.add_argument("--keep", nargs="+", default=list(KEEP))
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="extra config overrides")
    args = parser.parse_args()
    docs = corpus(args.per_source)
    docs.update(mojibake_corpus(docs, args.mojibake_per_language))
    print(f"{sum(len(t) for _, t in docs.values()):,} documents from {len(docs)} sources")
    overrides = [f"data.clean.language.keep=[{','.join(args.keep)}]", *args.overrides]
    rows = measure(docs, clean(docs, overrides))
    out = {part: summary(rows, part) for part in ("tune", "held-out")}
    for part in ("tune", "held-out"):
        print(f"\n{part}: {json.dumps(out[part])}")
        for key, row in sorted(rows.items()):
            if key.startswith(part + "|") and row["dropped"]:
                print(f"  {key:40} dropped {row['dropped']:4}/{row['documents']:<4} {dict(row['reasons'])}")
    print(json.dumps({"overrides": overrides, **out,
                      "rows": {k: {**v, "reasons": dict(v["reasons"])} for k, v in rows.items()}}))


if __name__ == "__main__":
    main()
