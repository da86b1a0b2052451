"""Curation quality on real text the project never tuned on: characters of good text kept, junk removed.

    .venv/bin/python bench/curation_sources.py --fetch          # once: the Debian packages (bench/curation_sources.py)
    .venv/bin/python bench/curation_quality.py [--max-chars 600000] [--seed 0] [--set data.clean.KEY=VALUE ...]
    .venv/bin/python bench/curation_quality.py --write-fixtures tests/fixtures/curation

Every source of :mod:`curation_sources` (reference guides, help pages, man pages, poems, a library reference,
quotes; Chinese and English) is cut to about ``--max-chars`` characters (its three longest documents always in),
then junk is mixed in the way the seeds describe it:

- junk *documents*, per language: garbled text (random CJK characters and symbols; random letters and symbols),
  ad templates (contact and promotion lines), symbol-run spam, mojibake (UTF-8 read as Latin-1 / GBK), keyword
  stuffing (a few product phrases repeated in every line);
- junk *lines* inserted into a quarter of the good documents: an ad line, a timestamp line, a star run, a spam line.

Every document then goes through the cleaning blocks exactly as ``prepare`` runs them (the boilerplate pre-pass
over the whole corpus first), with the default settings and the source name as its category (none is called
``docs``). Dedup is left out: what it drops is not a rule's loss. Printed per source: good characters kept, junk
documents removed, junk lines removed, and the biggest losses by block and reason. The last line is JSON.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).parent))
from curation_sources import source_documents  # noqa: E402
from dedup_benchmark import stamp  # noqa: E402
from mindfoundry.config.load import apply_overrides, validate  # noqa: E402
from mindfoundry.data.clean.preview import preview_cleaning  # noqa: E402

PRODUCTS = {
    "zh": ["减肥茶", "手机壳", "护肤品", "发票", "二手车", "保健品"],
    "en": ["watches", "pills", "loans", "sneakers"],
}
AD_LINES = {
    "zh": [
        "加微信 vip{n} 了解详情",
        "联系QQ：{n}，24小时在线",
        "代开发票 {p} 电话 1{n}",
        "全场包邮，限时特价，立即抢购！",
        "{p}厂家直销，价格优惠，欢迎来电咨询 1{n}",
        "扫码添加客服微信 wx{n}，领取优惠券",
        "专业代办{p}，加V：a{n}",
    ],
    "en": [
        "Call now 1-800-{n} for a free quote!",
        "Limited time offer: 50% off all {p}, free shipping!",
        "Contact us on WhatsApp +1 {n} for the best price",
        "Buy cheap {p} online now, no prescription needed",
        "CLICK HERE to claim your free {p} today!!!",
        "Earn $5000 a week from home, message me on Telegram @deal{n}",
    ],
}
STAMP_LINES = {"zh": ["发布时间：{y}-{m:02d}-{d:02d} {H:02d}:{M:02d}:{S:02d}", "[{y}-{m:02d}-{d:02d} {H:02d}:{M:02d}]",
                      "date: {y}-{m:02d}-{d:02d}", "{y}年{m}月{d}日 {H:02d}:{M:02d}", "time: {H:02d}:{M:02d}:{S:02d}"],
               "en": ["Posted on {y}-{m:02d}-{d:02d} {H:02d}:{M:02d}", "[{y}-{m:02d}-{d:02d} {H:02d}:{M:02d}:{S:02d}]",
                      "date: {y}-{m:02d}-{d:02d}", "Last updated: {d} March {y}", "time: {H:02d}:{M:02d}"]}
SYMBOLS = "★☆※◎§@#$%&*~^+=<>|!?【】■□◆◇●○"
JUNK_DOC_KINDS = ("garbled", "ads", "symbol_spam", "mojibake", "stuffing")
#: Keyword-stuffing phrases (a search-spam page repeats a few of them in every line).
STUFFING = {"zh": ["正品{p}", "{p}批发", "便宜{p}", "{p}哪里买", "最好的{p}", "{p}价格", "{p}厂家"],
            "en": ["cheap {p}", "buy {p} online", "best {p} price", "{p} discount", "{p} for sale", "top {p} deals"]}
JUNK_LINE_KINDS = ("ad", "timestamp", "star_run", "spam")


def language(source: str) -> str:
    return source.split("_")[0]


def _ad(lang: str, rng: random.Random) -> str:
    return rng.choice(AD_LINES[lang]).format(n=rng.randrange(10**6, 10**8), p=rng.choice(PRODUCTS[lang]))


def junk_line(kind: str, lang: str, rng: random.Random) -> str:
    """One inserted junk line of ``kind``."""
    if kind == "ad":
        return _ad(lang, rng)
    if kind == "timestamp":
        return stamp(STAMP_LINES[lang], rng, first_year=2005)
    if kind == "star_run":
        return rng.choice("★☆*=#~") * rng.randrange(10, 40)
    spam = "点击这里" if lang == "zh" else "CLICK HERE"
    return f"{'!' * rng.randrange(6, 20)} {spam} {rng.choice('★$>') * rng.randrange(6, 20)}"


def junk_document(kind: str, lang: str, rng: random.Random, good: list[str]) -> str:
    """One junk document of ``kind`` (``good``: real text of the language, for mojibake)."""
    lines = []
    if kind == "garbled":
        for _ in range(rng.randrange(4, 15)):
            if lang == "zh":
                chars = [chr(rng.randrange(0x4E00, 0x9FA6)) if rng.random() < 0.7 else rng.choice(SYMBOLS)
                         for _ in range(rng.randrange(20, 60))]
            else:
                chars = [
                    rng.choice("abcdefghijklmnopqrstuvwxyz0123456789" + SYMBOLS[8:]) if rng.random() < 0.85 else " "
                    for _ in range(rng.randrange(30, 80))
                ]
            lines.append("".join(chars))
    elif kind == "ads":
        lines = [_ad(lang, rng) for _ in range(rng.randrange(4, 12))]
    elif kind == "stuffing":
        phrases = [p.format(p=rng.choice(PRODUCTS[lang])) for p in rng.sample(STUFFING[lang], rng.randrange(3, 6))]
        joiner = "，" if lang == "zh" else " "
        lines = [joiner.join(rng.choice(phrases) for _ in range(rng.randrange(6, 15)))
                 for _ in range(rng.randrange(4, 12))]
    elif kind == "symbol_spam":
        for _ in range(rng.randrange(4, 12)):
            lines.append(" ".join(rng.choice(SYMBOLS) * rng.randrange(3, 12) for _ in range(rng.randrange(2, 6))))
    else:
        text = rng.choice([t for t in good if 200 < len(t) < 5000] or good)
        if lang == "zh":
            return text.encode("utf-8").decode("gbk", errors="replace")
        return text.encode("utf-8").decode("latin-1") + " café – naïve “quoted”".encode("utf-8").decode(
            "cp1252", "replace"
        )
    return "\n".join(lines)


@dataclass
class Item:
    """A bench document: good text with inserted junk lines, or a junk document."""

    source: str
    text: str
    junk_kind: str | None = None  # the kind of a junk document
    junk_lines: list[tuple[str, str]] = field(default_factory=list)  # (kind, line) inserted into good text

    @property
    def good_chars(self) -> int:
        return 0 if self.junk_kind else len(self.text) - sum(len(line) + 1 for _, line in self.junk_lines)


#: Sources that get junk lines but no junk documents (nor lend text to mojibake): the formulaic prose added to measure
#: whole-document drops of good text, kept out so that the junk documents of the other sources stay what they were.
GOOD_TEXT_ONLY = ("en_bible",)


def build(max_chars: int, seed: int, junk_docs: int = 30) -> dict[str, list[Item]]:
    """Each source's bench documents: about ``max_chars`` characters of its real text (its three longest documents
    always in), a quarter of them with 1-3 junk lines inserted, then ``junk_docs`` junk documents of each kind per
    language spread over the sources of that language."""
    rng = random.Random(seed)
    sources = source_documents(seed=seed)
    items: dict[str, list[Item]] = {}
    for name, docs in sources.items():
        longest = sorted(range(len(docs)), key=lambda i: -len(docs[i]))[:3]
        order = longest + [i for i in random.Random(seed).sample(range(len(docs)), len(docs)) if i not in longest]
        chosen, size = [], 0
        for i in order:
            if size >= max_chars:
                break
            chosen.append(docs[i])
            size += len(docs[i])
        items[name] = []
        for text in chosen:
            item = Item(name, text)
            if rng.random() < 0.25:
                lines = text.split("\n")
                for _ in range(rng.randint(1, 3)):
                    kind = rng.choice(JUNK_LINE_KINDS)
                    line = junk_line(kind, language(name), rng)
                    lines.insert(rng.randrange(len(lines) + 1), line)
                    item.junk_lines.append((kind, line))
                item.text = "\n".join(lines)
            items[name].append(item)
    for lang in ("zh", "en"):
        names = [name for name in items if language(name) == lang and name not in GOOD_TEXT_ONLY]
        good = [text for name in names for text in sources[name]]
        for kind in JUNK_DOC_KINDS:
            for i in range(junk_docs):
                name = names[i % len(names)]
                items[name].append(Item(name, junk_document(kind, lang, rng, good), junk_kind=kind))
    for name in items:
        rng.shuffle(items[name])
    return items


def clean_all(items: dict[str, list[Item]], overrides: list[str]) -> tuple[list[str | None], list[dict]]:
    """Every item's text after cleaning as ``prepare`` does it (None: dropped), and the drop-log lines: the sources
    written as .jsonl and cleaned by ``prepare --preview`` over all their documents (the boilerplate pre-pass over
    them all, at prepare's ``min_documents``)."""
    with tempfile.TemporaryDirectory() as folder:
        for name, its in items.items():
            with open(Path(folder) / f"{name}.jsonl", "w", encoding="utf-8") as fh:
                fh.writelines(json.dumps({"text": item.text}, ensure_ascii=False) + "\n" for item in its)
        tree = {"data": {"sources": [{"name": name, "paths": [f"{folder}/{name}.jsonl"]} for name in items]}}
        data = validate(apply_overrides(tree, overrides)).data
        previews, _ = preview_cleaning(data, max(len(its) for its in items.values()))
    out: list[str | None] = []
    for preview, its in zip(previews, items.values(), strict=True):
        texts = {doc.record: doc.text for doc in preview.documents}
        out += [texts.get(i) for i in range(len(its))]
    return out, [line for preview in previews for line in preview.events]


def measure(items: dict[str, list[Item]], overrides: list[str]) -> dict[str, dict]:
    """Per source: good characters and how many were kept, junk documents and lines and how many were removed,
    and the good characters lost per block/reason (from the drop log)."""
    flat = [item for name in items for item in items[name]]
    cleaned, events = clean_all(items, overrides)
    results: dict[str, dict] = {}
    for item, text in zip(flat, cleaned, strict=True):
        r = results.setdefault(
            item.source,
            {
                "good_chars": 0,
                "kept_chars": 0,
                "junk_docs": Counter(),
                "junk_docs_removed": Counter(),
                "junk_lines": Counter(),
                "junk_lines_removed": Counter(),
                "good_docs": 0,
                "good_docs_dropped": 0,
            },
        )
        if item.junk_kind:
            r["junk_docs"][item.junk_kind] += 1
            r["junk_docs_removed"][item.junk_kind] += text is None
            continue
        left = 0
        for kind, line in item.junk_lines:
            r["junk_lines"][kind] += 1
            survived = text is not None and line.strip() in text
            r["junk_lines_removed"][kind] += not survived
            left += (len(line) + 1) * survived
        r["good_chars"] += item.good_chars
        r["kept_chars"] += 0 if text is None else min(len(text) - left, item.good_chars)
        r["good_docs"] += 1
        r["good_docs_dropped"] += text is None
    by_path = {(f"{name}.jsonl", i): item for name in items for i, item in enumerate(items[name])}
    for line in events:
        item = by_path[(line["path"], line["record"])]
        if line["action"] == "drop":
            kind = "junk_drops" if item.junk_kind else "good_drops"
            results[item.source].setdefault(kind, Counter())[f"{line['block']}:{line['reason']}"] += 1
        if item.junk_kind is None and not item.junk_lines:  # an edit's removed characters would include junk lines
            loss = line["chars"] if line["action"] == "drop" else (line["value"] or 0)
            results[item.source].setdefault("losses", Counter())[f"{line['block']}:{line['reason']}"] += loss
    return results


def summary(results: dict[str, dict]) -> dict:
    """Overall and per-source figures (shares), as the JSON line prints them."""
    def share(a: float, b: float) -> float:
        return round(a / b, 4) if b else 1.0

    per = {name: {"kept": share(r["kept_chars"], r["good_chars"]), "good_docs_dropped": r["good_docs_dropped"],
                  "good_drops": dict(r.get("good_drops", Counter()).most_common()),
                  "junk_docs_removed": share(sum(r["junk_docs_removed"].values()), sum(r["junk_docs"].values())),
                  "junk_lines_removed": share(sum(r["junk_lines_removed"].values()), sum(r["junk_lines"].values()))}
           for name, r in results.items()}
    docs, lines = Counter(), Counter()
    removed_docs, removed_lines = Counter(), Counter()
    for r in results.values():
        docs.update(r["junk_docs"])
        removed_docs.update(r["junk_docs_removed"])
        lines.update(r["junk_lines"])
        removed_lines.update(r["junk_lines_removed"])
    by_block: dict[str, Counter[str]] = {}  # block -> junk / good documents it dropped whole
    for r in results.values():
        for kind in ("junk_drops", "good_drops"):
            for key, n in r.get(kind, Counter()).items():
                by_block.setdefault(key.split(":")[0], Counter())[kind] += n
    junk_dropped = sum(removed_docs.values())
    good_dropped = sum(r["good_docs_dropped"] for r in results.values())
    return {"sources": per, "min_kept": min(p["kept"] for p in per.values()),
            # of the documents dropped whole, the share that were junk (a good document dropped whole is a false drop)
            "whole_drop_precision": share(junk_dropped, junk_dropped + good_dropped), "good_docs_dropped": good_dropped,
            "whole_drops_by_block": {block: {"junk": c["junk_drops"], "good": c["good_drops"],
                                             "precision": share(c["junk_drops"], c["junk_drops"] + c["good_drops"])}
                                     for block, c in sorted(by_block.items())},
            "junk_docs_removed": share(sum(removed_docs.values()), sum(docs.values())),
            "junk_lines_removed": share(sum(removed_lines.values()), sum(lines.values())),
            "junk_docs_by_kind": {k: share(removed_docs[k], docs[k]) for k in JUNK_DOC_KINDS},
            "junk_lines_by_kind": {k: share(removed_lines[k], lines[k]) for k in JUNK_LINE_KINDS}}


def write_fixtures(items: dict[str, list[Item]], folder: Path, per_source: int, seed: int) -> None:
    """A small labelled sample for the tests: per source ``per_source`` good documents under 30k characters (the
    longest, then some with inserted junk lines) and the source's first junk document of each kind, as JSON lines."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    for name, its in items.items():
        good = sorted((i for i in its if not i.junk_kind and len(i.text) < 30_000), key=lambda i: -len(i.text))
        lined = [i for i in good[1:] if i.junk_lines]
        pick = good[:1] + rng.sample(lined, min(per_source // 2, len(lined)))
        plain = [i for i in good[1:] if i not in pick]
        pick += rng.sample(plain, min(per_source - len(pick), len(plain)))
        kinds = set()
        for item in its:
            if item.junk_kind and item.junk_kind not in kinds:
                kinds.add(item.junk_kind)
                pick.append(item)
        with (folder / f"{name}.jsonl").open("w", encoding="utf-8") as fh:
            for item in pick:
                fh.write(
                    json.dumps(
                        {
                            "text": item.text,
                            "junk": item.junk_kind,
                            "junk_lines": [line for _, line in item.junk_lines],
                        },
                        ensure_ascii=False,
                    )
                    + "\n"
                )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max-chars", type=int, default=600_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--set", action="append", default=[], dest="overrides", help="a data.clean override, e.g. "
                        "data.clean.timestamps.enabled=true")
    parser.add_argument("--write-fixtures", type=Path, help="write the tests' sample to this folder and stop")
    parser.add_argument("--fixture-docs", type=int, default=8)
    args = parser.parse_args()
    items = build(args.max_chars, args.seed)
    if args.write_fixtures:
        write_fixtures(items, args.write_fixtures, args.fixture_docs, args.seed)
        return
    results = measure(items, args.overrides)
    table = Table(title="curation on real text never tuned on (characters of good text; junk removed)")
    for col in (
        "source",
        "docs",
        "good chars",
        "kept",
        "junk docs removed",
        "junk lines removed",
        "good docs dropped whole",
        "biggest losses (documents without junk lines)",
    ):
        table.add_column(col)
    for name, r in results.items():
        losses = ", ".join(
            f"{k} {v / max(r['good_chars'], 1):.1%}" for k, v in r.get("losses", Counter()).most_common(3)
        )
        table.add_row(name, str(len(items[name])), f"{r['good_chars']:,}", f"{r['kept_chars'] / r['good_chars']:.1%}",
                      f"{sum(r['junk_docs_removed'].values())}/{sum(r['junk_docs'].values())}",
                      f"{sum(r['junk_lines_removed'].values())}/{sum(r['junk_lines'].values())}",
                      f"{r['good_docs_dropped']}/{r['good_docs']}", losses)
    Console(width=200).print(table)
    print(json.dumps(summary(results)))


if __name__ == "__main__":
    main()
