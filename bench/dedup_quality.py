"""Near-duplicate precision/recall on the labelled benchmark of real text, ours next to datatrove's MinHash defaults.

    .venv/bin/python bench/dedup_quality.py [--pairs 60] [--distractors 200] [--seed 0] [--texts debian|demo]
                                            [--set threshold=0.7 --set bands=20 --set rows=5]

Builds dedup_benchmark.py's benchmark (``--pairs`` groups per edit kind and
language, documents of 400-6,000 characters from the Debian documentation of bench/curation_sources.py, never
tuned on, or with ``--texts demo`` from the demo packages: character edits at 2% and at 4%, inserted ad lines, inserted
timestamp lines, truncation to
85-95% from the head or the tail; plus ``--distractors`` unrelated documents per language), then
scores:

- ours with the data.dedup defaults (character 5-grams for every script, 128 permutations,
  32 bands x 4 rows, threshold 0.55, signature verification), with exact verification, and with
  word shingles (``shingle: words``);
- datatrove 0.3.0's MinHash pipeline (signature, buckets, cluster, filter stages on local
  folders) with its defaults: word 5-grams, 14 buckets x 8 hashes, its text normalization, run
  per language as datatrove does. Its English tokenizer needs NLTK punkt data (a download), so
  NLTK's Treebank word tokenizer (the word step of the same ``word_tokenize``, no data needed)
  stands in; for Chinese, spaCy's default per-character segmentation stands in for jieba (not
  installed). A removed document counts as dropped for the kept member of its cluster.

With ``--texts debian`` (the default) the benchmark also holds whole pages of six template-sharing sites (each its
own source, or with ``--one-source`` one source whose pages name their site as a ``url_field`` would) and two
translated manuals, each a source: GNOME's help in Chinese, Japanese, Korean, Russian and German (its English pages
are the en_gnome_help site) and the Debian Reference's chapters in English, Chinese, Japanese, French and German. A
translation is a distinct page, not a copy of its original (however many command listings it keeps); a page left
in English is its original (bench/dedup_benchmark.py's ``manual_pages``). Every document is labelled with its
language as `prepare`'s language block would, since dedup compares documents within a language.

datatrove is a bench-only peer (``pip install 'datatrove==0.3.0' 'xxhash<4' orjson``); without it
only our rows print. Prints a table per run and one final JSON line.
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from rich.console import Console
from rich.table import Table

from curation_sources import SITES, reference_chapters, site_pages, translated_pages
from dedup_benchmark import KINDS, LANGUAGES, Case, Score, build, kept_ids, labelled, pieces, run_ours, score


def datatrove_kept_for(cases: list[Case], workdir: Path) -> Callable[[str], str | None] | None:
    """``kept_for`` from datatrove's MinHash pipeline with its defaults, or None when it is not installed."""
    try:
        import nltk
        from datatrove.executor.local import LocalPipelineExecutor
        from datatrove.pipeline.dedup.minhash import (
            MinhashConfig,
            MinhashDedupBuckets,
            MinhashDedupCluster,
            MinhashDedupFilter,
            MinhashDedupSignature,
        )
        from datatrove.pipeline.readers import JsonlReader
        from datatrove.pipeline.writers import JsonlWriter
        from datatrove.utils import word_tokenizers
        from loguru import logger
    except ImportError:
        return None
    logger.remove()  # datatrove logs every stage of every task

    class OfflineTokenizer(word_tokenizers.WordTokenizer):
        """Words without NLTK's punkt download (English) or per character (Chinese, spaCy's default)."""

        def __init__(self, language: str) -> None:
            self.language = language
            self.treebank = nltk.tokenize.NLTKWordTokenizer()

        def word_tokenize(self, text: str) -> list[str]:
            return list(text.replace(" ", "")) if self.language == "zh" else self.treebank.tokenize(text)

        def sent_tokenize(self, text: str) -> list[str]:
            return text.split("\n")

        def span_tokenize(self, text: str) -> list[tuple[int, int]]:
            raise NotImplementedError

    cluster_of: dict[str, int] = {}
    removed: set[str] = set()
    for language in LANGUAGES:
        word_tokenizers.WORD_TOKENIZER_CACHE[language] = OfflineTokenizer(language)
        root = workdir / language
        (root / "input").mkdir(parents=True)
        with (root / "input" / "docs.jsonl").open("w", encoding="utf-8") as fh:
            for case in cases:
                if case.language == language:
                    fh.write(json.dumps({"id": case.doc.id, "text": case.doc.text}, ensure_ascii=False) + "\n")
        config = MinhashConfig()  # datatrove's defaults
        stages = [
            [
                JsonlReader(str(root / "input")),
                MinhashDedupSignature(str(root / "sigs"), config=config, language=language),
            ],
            [MinhashDedupBuckets(str(root / "sigs"), str(root / "buckets"), config=config)],
            [MinhashDedupCluster(str(root / "buckets"), str(root / "remove"), config=config, save_cluster_id=True)],
            [
                JsonlReader(str(root / "input")),
                MinhashDedupFilter(
                    str(root / "remove"), exclusion_writer=JsonlWriter(str(root / "removed")), load_cluster_ids=True
                ),
                JsonlWriter(str(root / "kept")),
            ],
        ]
        for i, pipeline in enumerate(stages):
            tasks = config.num_buckets if i == 1 else 1
            LocalPipelineExecutor(pipeline, tasks=tasks, workers=1, logging_dir=str(root / f"logs{i}")).run()
        for folder, is_removed in (("kept", False), ("removed", True)):
            for path in (root / folder).glob("*.jsonl*"):
                with gzip.open(path, "rt", encoding="utf-8") as fh:
                    for line in fh:
                        record = json.loads(line)
                        cluster = record.get("metadata", {}).get("minhash_cluster")
                        if cluster is not None:
                            cluster_of[record["id"]] = (language, cluster)
                        if is_removed:
                            removed.add(record["id"])
    kept_in: dict[tuple[str, int], str] = {cluster_of[i]: i for i in cluster_of if i not in removed}
    return lambda doc_id: kept_in.get(cluster_of.get(doc_id)) if doc_id in removed else None


#: Curation sources whose text is also a template-sharing site's (the same pages): left out of the cut documents, so
#: that a cut document and a whole page never hold the same text under two labels.
SITE_SOURCES = ("zh_help", "zh_man", "en_library")


def debian_texts() -> dict[str, list[str]]:
    """Documents of 400-6,000 characters cut from the Debian documentation sources, per language, shuffled."""
    from curation_sources import source_documents

    texts: dict[str, list[str]] = {"zh": [], "en": []}
    for name, docs in source_documents().items():
        if name not in SITE_SOURCES:
            texts[name.split("_")[0]] += list(pieces(docs))
    for language in texts:
        random.Random(0).shuffle(texts[language])
    return texts


#: The translated manuals (their slices: MANUAL_LANGUAGE).
MANUALS = ("gnome_", "reference_")


def table(title: str, scores: dict[str, Score], console: Console) -> None:
    out = Table(title=title)
    for column in ("slice", "groups", "recall", "dropped", "precision", "F1"):
        out.add_column(column, justify="left" if column == "slice" else "right")
    for name in ("all", *LANGUAGES, *KINDS, *SITES, *sorted(k for k in scores if k.startswith(MANUALS))):
        s = scores.get(name)
        if s is not None:
            out.add_row(name, str(s.groups), f"{s.recall:.3f}", str(s.dropped), f"{s.precision:.3f}", f"{s.f1:.3f}")
    console.print(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=60, help="groups per edit kind and language")
    parser.add_argument("--distractors", type=int, default=200, help="unrelated documents per language")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--texts",
        choices=("demo", "debian"),
        default="debian",
        help="demo: People's Daily, Shakespeare, Python's reference manual; debian: the Debian documentation "
        "of bench/curation_sources.py (never tuned on)",
    )
    parser.add_argument("--site-pairs", type=int, default=60,
                        help="pages per template-sharing site that get a twin (--texts debian)")
    parser.add_argument("--manual-pairs", type=int, default=20,
                        help="pages per language of the translated manual that get a twin (--texts debian)")
    parser.add_argument("--one-source", action="store_true",
                        help="the six sites' pages in one source, each page's site as a url_field's host would name "
                        "it (and a run without: templates counted per source)")
    parser.add_argument("--set", action="append", default=[], dest="settings",
                        help="a data.dedup setting for our default row, e.g. char_ngram=3, threshold=0.6 or "
                        "templates.ngram=16")
    args = parser.parse_args()
    console = Console()
    debian = args.texts == "debian"
    cases = build(
        args.pairs, args.distractors, seed=args.seed, texts=debian_texts() if debian else None,
        sites={name: (language, pages) for name, (language, _, pages) in site_pages().items()} if debian else None,
        site_pairs=args.site_pairs, one_source="sites" if args.one_source else None,
        manuals={"gnome": translated_pages(), "reference": reference_chapters()} if debian else None,
        manual_pairs=args.manual_pairs,
    )
    cases = labelled(cases)
    ours: dict[str, Any] = {}
    for key, value in (item.split("=", 1) for item in args.settings):
        *parents, name = key.split(".")
        node = ours
        for parent in parents:
            node = node.setdefault(parent, {})
        node[name] = json.loads(value)
    console.print(
        f"{len(cases)} documents: {args.pairs} groups per edit kind and language, {args.distractors} distractors per "
        "language"
    )
    results: dict[str, dict] = {}
    runs: list[tuple[str, Callable[[], Callable[[str], str | None] | None]]] = [
        (f"ours (defaults{', ' + str(ours) if ours else ''})", lambda: kept_ids(run_ours(cases, **ours))),
        ("ours (verify: exact)", lambda: kept_ids(run_ours(cases, verify="exact"))),
        ("ours (templates off)", lambda: kept_ids(run_ours(cases, templates={"enabled": False}))),
        ("ours (languages not told apart)", lambda: kept_ids(run_ours(
            [replace(case, doc=replace(case.doc, language="")) for case in cases], **ours))),
        *([("ours (sites not told apart: no url_field)", lambda: kept_ids(run_ours(
            [replace(case, doc=replace(case.doc, site="")) for case in cases], **ours)))] if args.one_source else []),
        ("ours (shingle: words)", lambda: kept_ids(run_ours(cases, shingle="words"))),
    ]
    with tempfile.TemporaryDirectory() as tmp:
        runs.append(("datatrove 0.3.0 defaults (word 5-gram, 14x8)", lambda: datatrove_kept_for(cases, Path(tmp))))
        for name, run in runs:
            start = time.perf_counter()
            kept_for = run()
            seconds = time.perf_counter() - start
            if kept_for is None:
                console.print(f"{name}: not installed, skipped")
                continue
            scores = score(cases, kept_for)
            table(f"{name} - {seconds:.1f} s", scores, console)
            results[name] = {k: {"precision": round(v.precision, 4), "recall": round(v.recall, 4), "f1": round(v.f1, 4)}
                             for k, v in scores.items()}
    print(json.dumps(results))


if __name__ == "__main__":
    main()
