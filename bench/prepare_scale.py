"""`prepare` at 1x, 4x and 16x a corpus: documents/s per core, MB/s and peak RSS per process, per stage; today's
`prepare` (the commit before the staged pipeline) and datatrove 0.3.0's MinHash pipeline on the same corpus.

    .venv/bin/python bench/prepare_scale.py [--base 25000] [--scales 1 4 16] [--workers 2]
        [--old-scales 1 4] [--old-commit 5e1a7c6] [--datatrove-scales 1 4] [--out /tmp/prepare-scale]

The corpus is cut from real text of the demo packages: documents of 3-12 People's Daily / review sentences (zh,
source ``news``, three to a paragraph) or 4-20 Shakespeare lines (en, source ``plays``, two to a line), drawn at
random so that nearly every document and line is distinct, plus 4% exact copies and 4% near-twins (2-4% character edits,
the labelled benchmark's
``char_edits``) of earlier documents, in .jsonl files of 2,000 documents. ``--base`` documents is 1x.

Each run is a process of its own (``/usr/bin/time``-style peak RSS of every process: the driver and each worker
report theirs; the old `prepare`'s processes are sampled with psutil every 50 ms):

- ``staged``: this `prepare`, ``data.executor: local`` with ``--workers`` processes; its manifest's per-stage
  timings (documents/s, CPU s, peak RSS of the stage's worker processes), the driver's CPU time and peak RSS;
- ``today``: the `prepare` of ``--old-commit`` (a git worktree of this repository, run with the same venv), same
  config and workers;
- ``datatrove``: datatrove 0.3.0's MinHash dedup (signature, buckets, cluster, filter) with its defaults on the same
  files, ``LocalPipelineExecutor`` with one worker (its process pool lost workers and hung once here, at 4x), its
  word tokenizer replaced as in bench/dedup_quality.py (no NLTK download); compared per core with our dedup
  (signing in the clean stage + the dedup stages, task seconds).

Prints a table per scale and one final JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
import yaml

REPO = Path(__file__).resolve().parents[1]
DOCS_PER_FILE = 2000


# -- the corpus --------------------------------------------------------------------------------------------------


def sentence_pools() -> dict[str, list[str]]:
    """Real sentences: zh from People's Daily and the reviews, en lines from Shakespeare."""
    from mindfoundry.data.ingest.builtin import read_builtin
    from mindfoundry.data.ingest.files import SourceStats

    zh: list[str] = []
    for name in ("peoples_daily", "reviews"):
        for doc in read_builtin(name, stats=SourceStats()):
            zh += [s for s in re.split(r"(?<=[。！？])", doc.text) if len(s.strip()) >= 6]
    en = [line.strip() for doc in read_builtin("shakespeare", stats=SourceStats()) for line in doc.text.split("\n")
          if len(line.strip()) >= 20]
    return {"zh": sorted(set(zh)), "en": sorted(set(en))}


def make_corpus(root: Path, documents: int, seed: int = 0) -> dict[str, Any]:
    """``documents`` documents in two source folders (news: zh, plays: en); see the module docstring."""
    from dedup_benchmark import make_twin

    rng = random.Random(seed)
    pools = sentence_pools()
    made: dict[str, list[str]] = {"news": [], "plays": []}
    for i in range(documents):
        source = "news" if rng.random() < 0.6 else "plays"
        language = "zh" if source == "news" else "en"
        earlier = made[source]
        roll = rng.random()
        if earlier and roll < 0.04:
            text = rng.choice(earlier)
        elif earlier and roll < 0.08:
            text = make_twin(rng.choice(earlier), rng.choice(["char_edits_2", "char_edits_4"]), language, rng)
        elif language == "zh":  # paragraphs of up to 3 sentences: lines almost never repeat across documents
            sentences = [rng.choice(pools["zh"]) for _ in range(rng.randint(3, 12))]
            text = "\n".join("".join(sentences[j:j + 3]) for j in range(0, len(sentences), 3))
        else:
            verses = [rng.choice(pools["en"]) for _ in range(rng.randint(4, 20))]
            text = "\n".join(" ".join(verses[j:j + 2]) for j in range(0, len(verses), 2))
        earlier.append(text)
    sizes = {}
    for source, texts in made.items():
        folder = root / source
        folder.mkdir(parents=True)
        for n in range(0, len(texts), DOCS_PER_FILE):
            with open(folder / f"part-{n // DOCS_PER_FILE:05d}.jsonl", "w", encoding="utf-8") as fh:
                fh.writelines(json.dumps({"text": t}, ensure_ascii=False) + "\n" for t in texts[n:n + DOCS_PER_FILE])
        sizes[source] = sum(p.stat().st_size for p in folder.iterdir())
    return {"documents": documents, "bytes": sum(sizes.values()), "by_source": {s: len(t) for s, t in made.items()}}


def write_config(root: Path, corpus: Path, workers: int) -> Path:
    """A prepare-only config over the corpus (the demo's model size for the vocabulary)."""
    tree = {
        "name": "scale",
        "run_dir": str(root / "run"),
        "seed": 1234,
        "model": {"vocab_size": 8192, "d_model": 64, "n_layers": 2, "n_heads": 2, "max_seq_len": 128},
        "data": {
            "sources": [
                {"name": "news", "paths": [str(corpus / "news")]},
                {"name": "plays", "paths": [str(corpus / "plays")]},
            ],
            "workers": workers,
            "tokenizer": {"sample_bytes": 8_000_000},
        },
        "train": {"steps": 1, "micro_batch_size": 2, "seq_len": 64},
        "optim": {"warmup_steps": 0},
    }
    path = root / "config.yaml"
    path.write_text(yaml.safe_dump(tree))
    return path


# -- the runs ----------------------------------------------------------------------------------------------------


def sampled(cmd: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run ``cmd``; wall time, total CPU time, and the peak RSS of the process and of each child (psutil, every 50 ms).
    """
    start = time.perf_counter()
    log = tempfile.TemporaryFile(mode="w+", encoding="utf-8")  # not a pipe: a chatty child would fill it and block
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
    root = psutil.Process(proc.pid)
    peaks: dict[int, float] = {}
    cpu: dict[int, float] = {}
    while proc.poll() is None:
        try:
            for p in [root, *root.children(recursive=True)]:
                with p.oneshot():
                    peaks[p.pid] = max(peaks.get(p.pid, 0.0), p.memory_info().rss / 2**20)
                    times = p.cpu_times()
                    cpu[p.pid] = times.user + times.system
        except psutil.Error:
            pass
        time.sleep(0.05)
    log.seek(0)
    out = log.read()
    log.close()
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{out[-3000:]}")
    driver = peaks.pop(proc.pid, 0.0)
    return {"seconds": time.perf_counter() - start, "cpu_s": sum(cpu.values()), "driver_rss_mib": driver,
            "worker_rss_mib": max(peaks.values(), default=0.0), "log": out}


def run_staged(config: Path) -> dict[str, Any]:
    figures = sampled([sys.executable, "-m", "mindfoundry.cli", "prepare", str(config)])
    run_dir = Path(yaml.safe_load(config.read_text())["run_dir"])
    manifest = json.loads((run_dir / "data" / "manifest.json").read_text())
    figures["timings"] = manifest["timings"]
    figures["dedup_seconds"] = manifest["dedup"]["seconds"]
    return figures


def run_today(config: Path, commit: str, scratch: Path) -> dict[str, Any]:
    """The `prepare` of ``commit`` (a git worktree), same venv, same config (its key names: train_max_bytes)."""
    tree = scratch / f"mf-{commit}"
    if not tree.exists():
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(tree), commit], check=True,
                       capture_output=True)
    old = yaml.safe_load(config.read_text())
    old["data"]["tokenizer"] = {"train_max_bytes": old["data"]["tokenizer"]["sample_bytes"]}
    old["run_dir"] += "-today"
    path = config.with_name("config-today.yaml")
    path.write_text(yaml.safe_dump(old))
    env = dict(os.environ, PYTHONPATH=str(tree / "src"))
    return sampled([sys.executable, "-m", "mindfoundry.cli", "prepare", str(path)], env=env)


def run_datatrove(corpus: Path, scratch: Path) -> dict[str, Any] | None:
    """datatrove 0.3.0's MinHash dedup over the corpus's files, per source (its language), one worker: seconds per
    stage."""
    code = DATATROVE_SCRIPT.format(corpus=str(corpus), scratch=str(scratch))
    script = scratch / "datatrove_run.py"
    script.write_text(code)
    try:
        figures = sampled([sys.executable, str(script)])
    except RuntimeError as exc:
        if "ModuleNotFoundError" in str(exc):
            return None
        raise
    figures["stages"] = json.loads(figures["log"].strip().splitlines()[-1])
    return figures


DATATROVE_SCRIPT = """
import json, shutil, time
from pathlib import Path
import nltk
from loguru import logger
from datatrove.executor.local import LocalPipelineExecutor
from datatrove.pipeline.dedup.minhash import (MinhashConfig, MinhashDedupBuckets, MinhashDedupCluster,
                                              MinhashDedupFilter, MinhashDedupSignature)
from datatrove.pipeline.readers import JsonlReader
from datatrove.pipeline.writers import JsonlWriter
from datatrove.utils import word_tokenizers

class OfflineTokenizer(word_tokenizers.WordTokenizer):
    def __init__(self, language):
        self.language, self.treebank = language, nltk.tokenize.NLTKWordTokenizer()
    def word_tokenize(self, text):
        return list(text.replace(" ", "")) if self.language == "zh" else self.treebank.tokenize(text)
    def sent_tokenize(self, text):
        return text.split("\\n")
    def span_tokenize(self, text):
        raise NotImplementedError

if __name__ == "__main__":
    logger.remove()
    seconds = {{"signature": 0.0, "buckets": 0.0, "cluster": 0.0, "filter": 0.0}}
    for source, language in (("news", "zh"), ("plays", "en")):
        word_tokenizers.WORD_TOKENIZER_CACHE[language] = OfflineTokenizer(language)
        root = Path("{scratch}") / "datatrove" / source
        shutil.rmtree(root, ignore_errors=True)
        files = len(list((Path("{corpus}") / source).glob("*.jsonl")))
        config = MinhashConfig()
        sigs, buckets, remove, kept = (str(root / name) for name in ("sigs", "buckets", "remove", "kept"))
        stages = [
            ("signature", [JsonlReader("{corpus}/" + source),
                           MinhashDedupSignature(sigs, config=config, language=language)], files),
            ("buckets", [MinhashDedupBuckets(sigs, buckets, config=config)], config.num_buckets),
            ("cluster", [MinhashDedupCluster(buckets, remove, config=config)], 1),
            ("filter", [JsonlReader("{corpus}/" + source), MinhashDedupFilter(remove), JsonlWriter(kept)], files),
        ]
        for name, pipeline, tasks in stages:
            start = time.perf_counter()
            LocalPipelineExecutor(pipeline, tasks=tasks, workers=1, logging_dir=str(root / ("logs-" + name))).run()
            seconds[name] += time.perf_counter() - start
    print(json.dumps(seconds))
"""


# -- the report --------------------------------------------------------------------------------------------------


def report(scale: int, corpus: dict[str, Any], staged: dict[str, Any], today: dict[str, Any] | None,
           datatrove: dict[str, Any] | None, workers: int) -> dict[str, Any]:
    docs, mb = corpus["documents"], corpus["bytes"] / 1e6
    stages = staged["timings"]["stages"]
    task_cpu = sum(s["cpu_s"] for s in stages.values())
    row: dict[str, Any] = {
        "scale": scale,
        "documents": docs,
        "mb": round(mb, 1),
        "workers": workers,
        "staged_s": round(staged["seconds"], 1),
        "staged_docs_per_s_per_core": round(docs / staged["seconds"] / workers),
        "staged_mb_per_s": round(mb / staged["seconds"], 2),
        "driver_cpu_share": round(
            staged["timings"]["driver_cpu_s"] / (staged["timings"]["driver_cpu_s"] + task_cpu), 3
        ),
        "driver_peak_rss_mib": round(staged["driver_rss_mib"], 1),
        "worker_peak_rss_mib": round(staged["worker_rss_mib"], 1),
        "stages": {
            name: {
                "docs_per_s": s["documents_per_s"],
                "seconds": s["seconds"],
                "cpu_s": s["cpu_s"],
                "peak_rss_mib": s["peak_rss_mib"],
            }
            for name, s in stages.items()
        },
        "dedup_s": staged["dedup_seconds"],
        "dedup_docs_per_s_per_core": round(docs / staged["dedup_seconds"]),
    }
    if today is not None:
        row.update(
            today_s=round(today["seconds"], 1),
            today_docs_per_s_per_core=round(docs / today["seconds"] / workers),
            today_driver_rss_mib=round(today["driver_rss_mib"], 1),
            today_worker_rss_mib=round(today["worker_rss_mib"], 1),
            speedup=round(today["seconds"] / staged["seconds"], 2),
        )
    if datatrove is not None:
        dt = sum(datatrove["stages"].values())
        row.update(
            datatrove_s=round(dt, 1),
            datatrove_stages={k: round(v, 1) for k, v in datatrove["stages"].items()},
            datatrove_docs_per_s_per_core=round(docs / dt),
            dedup_vs_datatrove=round(dt / staged["dedup_seconds"], 2),
            datatrove_worker_rss_mib=round(datatrove["worker_rss_mib"], 1),
        )
    return row


def print_row(row: dict[str, Any]) -> None:
    print(f"\n== {row['scale']}x: {row['documents']:,} documents, {row['mb']} MB, {row['workers']} workers ==")
    print(f"staged prepare: {row['staged_s']} s, {row['staged_docs_per_s_per_core']:,} docs/s per core, "
          f"{row['staged_mb_per_s']} MB/s; driver CPU share {row['driver_cpu_share']:.1%}; peak RSS driver "
          f"{row['driver_peak_rss_mib']} MiB, largest worker {row['worker_peak_rss_mib']} MiB")
    for name, s in row["stages"].items():
        print(f"  {name:12s} {s['seconds']:8.2f} s  cpu {s['cpu_s']:8.2f} s  docs/s {s['docs_per_s'] or '-':>8}  "
              f"peak RSS {s['peak_rss_mib']} MiB")
    print(
        f"  dedup (signing + dedup stages, task time): {row['dedup_s']:.1f} s, {row['dedup_docs_per_s_per_core']:,} "
        "docs/s per core"
    )
    if "today_s" in row:
        print(
            f"today's prepare: {row['today_s']} s, {row['today_docs_per_s_per_core']:,} docs/s per core; peak RSS "
            f"parent {row['today_driver_rss_mib']} MiB, largest worker {row['today_worker_rss_mib']} MiB; staged is "
            f"{row['speedup']}x"
        )
    if "datatrove_s" in row:
        print(
            f"datatrove 0.3.0 MinHash, 1 worker: {row['datatrove_s']} s ({row['datatrove_stages']}), "
            f"{row['datatrove_docs_per_s_per_core']:,} docs/s per core; our dedup is {row['dedup_vs_datatrove']}x per "
            f"core; largest process {row['datatrove_worker_rss_mib']} MiB"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", type=int, default=25_000, help="documents at 1x")
    parser.add_argument("--scales", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--old-scales", type=int, nargs="*", default=[1, 4], help="scales to run today's prepare at")
    parser.add_argument("--old-commit", default="5e1a7c6", help="the commit of today's prepare")
    parser.add_argument("--datatrove-scales", type=int, nargs="*", default=[1, 4])
    parser.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "prepare-scale")
    args = parser.parse_args()
    rows = []
    for scale in args.scales:
        root = args.out / f"{scale}x"
        if root.exists():
            subprocess.run(["rm", "-rf", str(root)], check=True)
        root.mkdir(parents=True)
        corpus = make_corpus(root / "corpus", args.base * scale)
        config = write_config(root, root / "corpus", args.workers)
        staged = run_staged(config)
        today = run_today(config, args.old_commit, args.out) if scale in args.old_scales else None
        datatrove = run_datatrove(root / "corpus", root) if scale in args.datatrove_scales else None
        rows.append(report(scale, corpus, staged, today, datatrove, args.workers))
        print_row(rows[-1])
        sys.stdout.flush()
    first = rows[0]
    for row in rows[1:]:
        row["driver_rss_vs_1x"] = round(row["driver_peak_rss_mib"] / first["driver_peak_rss_mib"], 3)
        row["worker_rss_vs_1x"] = round(row["worker_peak_rss_mib"] / first["worker_peak_rss_mib"], 3)
        print(f"{row['scale']}x vs {first['scale']}x: driver peak RSS x{row['driver_rss_vs_1x']}, "
              f"largest worker x{row['worker_rss_vs_1x']}")
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
