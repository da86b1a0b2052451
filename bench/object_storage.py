"""Object storage against local disk, measured side by side in one run on a real S3 server (moto_server on localhost).

    .venv/bin/python bench/object_storage.py [--documents 100000] [--rounds 2] [--workers 2]
        [--steps 60] [--d-model 512] [--layers 8] [--every 15] [--skip-prepare] [--skip-train]

1. ``prepare`` of a corpus of ``--documents`` documents (bench/prepare_scale.py's: real People's Daily / review
   sentences and Shakespeare lines, 4% exact copies and 4% near-twins, .jsonl files of 2,000 documents) from local disk
   to local disk, and from ``s3://`` sources to an ``s3://`` output (the work area on this node's disk, the default),
   alternating, ``--rounds`` times each, a process of its own each time; the wall time of each and the ratio of the
   medians.
2. Training with the torch engine on a model of ``--d-model`` x ``--layers`` (big enough that its checkpoint's upload
   takes several steps) for ``--steps`` steps with ``checkpoint.every: --every`` and ``checkpoint.dir: s3://...``:
   from the run's own metrics, the mean step time of the steps that ran while a checkpoint was committing in the
   background (between its ``checkpoint`` and ``checkpoint_committed`` events) against the steps that ran with none in
   flight, and the seconds training stood still for each snapshot.

The S3 server runs on this machine, so its CPU time (receiving, storing) competes with training and prepare for the
machine's cores: a remote store costs the node less. Prints the figures and one final JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # the S3 server the tests start (tests/s3_server.py)

from mindfoundry.config.load import load_config  # noqa: E402
from mindfoundry.model.spec import ModelSpec, num_parameters  # noqa: E402
from mindfoundry.train.metrics import read_metrics  # noqa: E402
from prepare_scale import make_corpus, sampled, write_config  # noqa: E402
from s3_server import S3Server  # noqa: E402


def prepare_side_by_side(root: Path, server: S3Server, documents: int, rounds: int, workers: int) -> dict[str, Any]:
    corpus = root / "corpus"
    made = make_corpus(corpus, documents)
    bucket = server.bucket("bench")
    server.upload_tree(corpus, bucket, "corpus")
    env = {**os.environ, **server.env()}
    (root / "local").mkdir(parents=True)
    trees = {"local": yaml.safe_load(write_config(root / "local", corpus, workers).read_text())}
    trees["s3"] = json.loads(json.dumps(trees["local"]))
    trees["s3"]["run_dir"] = str(root / "s3" / "run")
    trees["s3"]["data"]["sources"] = [{"name": s, "paths": [f"s3://{bucket}/corpus/{s}"]} for s in ("news", "plays")]
    outputs = {"local": lambda r: str(root / "local" / f"out-{r}"), "s3": lambda r: f"s3://{bucket}/out-{r}"}
    times: dict[str, list[float]] = {"local": [], "s3": []}
    for r in range(rounds):
        for kind, tree in trees.items():
            tree["data"]["output_dir"] = outputs[kind](r)
            config = root / f"{kind}-{r}.yaml"
            config.write_text(yaml.safe_dump(tree))
            figures = sampled([sys.executable, "-m", "mindfoundry.cli", "prepare", str(config)], env=env)
            times[kind].append(round(figures["seconds"], 2))
            print(f"prepare round {r + 1}, {kind}: {figures['seconds']:.1f} s", flush=True)
    ratio = statistics.median(times["s3"]) / statistics.median(times["local"])
    return {"documents": made["documents"], "corpus_mb": round(made["bytes"] / 1e6, 1), "workers": workers,
            "seconds": times, "s3_over_local": round(ratio, 3)}


def training_while_committing(root: Path, server: S3Server, steps: int, d_model: int, layers: int, every: int,
                              to_bucket: bool) -> dict[str, Any]:
    """One training run checkpointing to the S3 server (``to_bucket``) or to a local folder; the step times."""
    bucket = server.bucket("ckpt")
    where = f"s3://{bucket}/ckpt" if to_bucket else str(root / "checkpoints")
    tree = {
        "name": "upload", "run_dir": str(root / "train"), "seed": 7, "backend": "torch",
        "model": {"vocab_size": 8192, "d_model": d_model, "n_layers": layers, "n_heads": 8, "max_seq_len": 256},
        "data": {"sources": [{"name": "news", "builtin": "peoples_daily", "max_bytes": 3_000_000}],
                 "validation_fraction": 0.02},
        "train": {"steps": steps, "micro_batch_size": 8, "seq_len": 256, "eval_every": 0, "eval_samples": 8},
        "optim": {"warmup_steps": 5},
        "checkpoint": {"dir": where, "every": every, "keep_last": 2, "keep_best": False},
        "monitor": {"progress": False},
    }
    root.mkdir(parents=True, exist_ok=True)
    config = root / "train.yaml"
    config.write_text(yaml.safe_dump(tree))
    env = {**os.environ, **server.env()}
    proc = subprocess.run([sys.executable, "-m", "mindfoundry.cli", "train", str(config)], env=env,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-3000:])
    records = read_metrics(root / "train" / "metrics.jsonl")
    step_time = {r["step"]: r["step_time_s"] for r in records if "loss" in r}
    saved = {r["step"]: r["seconds"] for r in records if r.get("event") == "checkpoint"}
    committed = {r["step"]: r["seconds"] for r in records if r.get("event") == "checkpoint_committed"}
    uploading: set[int] = set()
    order = [(r["step"], r.get("event")) for r in records if r.get("event") in ("checkpoint", "checkpoint_committed")
             or "loss" in r]
    in_flight = False
    for step, event in order:
        if event == "checkpoint":
            in_flight = True
        elif event == "checkpoint_committed":
            in_flight = False
        elif in_flight:
            uploading.add(step)
    warm = [s for s in step_time if s > 5]  # the first steps compile and warm up
    during = [step_time[s] for s in warm if s in uploading]
    without = [step_time[s] for s in warm if s not in uploading and s not in saved and s - 1 not in saved]
    newest = json.loads(Path(next(r["path"] for r in reversed(records) if r.get("event") == "checkpoint_committed")
                             ).joinpath("manifest.json").read_text()) if not to_bucket else json.loads(
        server.get(bucket, f"ckpt/step_{steps:08d}/manifest.json"))
    checkpoint_mb = sum(meta["bytes"] for meta in newest["files"].values()) / 1e6
    spec = ModelSpec.from_config(load_config(config).model)
    return {"to": "s3" if to_bucket else "local disk", "parameters_m": round(num_parameters(spec) / 1e6, 1),
            "checkpoint_mb": round(checkpoint_mb, 1), "steps": steps, "every": every,
            "steps_while_uploading": len(during), "steps_without": len(without),
            "mean_step_s_while_uploading": round(statistics.mean(during), 4) if during else None,
            "mean_step_s_without": round(statistics.mean(without), 4) if without else None,
            "ratio": round(statistics.mean(during) / statistics.mean(without), 3) if during and without else None,
            "snapshot_stall_s": [round(v, 3) for v in saved.values()],
            "commit_s": [round(v, 2) for v in committed.values()]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--documents", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--d-model", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--every", type=int, default=15)
    parser.add_argument("--skip-prepare", action="store_true")
    parser.add_argument("--skip-train", action="store_true")
    args = parser.parse_args()
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="mf-object-storage-") as tmp:
        root = Path(tmp)
        os.environ["MF_CACHE_DIR"] = str(root / "cache")
        server = S3Server(root / "moto.log")
        try:
            if not args.skip_prepare:
                out["prepare"] = prepare_side_by_side(root / "prepare", server, args.documents, args.rounds,
                                                      args.workers)
                p = out["prepare"]
                print(f"prepare of {p['documents']:,} documents ({p['corpus_mb']} MB): local {p['seconds']['local']} s,"
                      f" s3 {p['seconds']['s3']} s; s3/local {p['s3_over_local']}x", flush=True)
            if not args.skip_train:
                for to_bucket in (True, False):
                    t = training_while_committing(root / f"train-{to_bucket}", server, args.steps, args.d_model,
                                                  args.layers, args.every, to_bucket)
                    out[f"train_to_{'s3' if to_bucket else 'local'}"] = t
                    print(f"training to {t['to']} ({t['parameters_m']}M parameters, checkpoint {t['checkpoint_mb']} "
                          f"MB): mean step {t['mean_step_s_while_uploading']} s over {t['steps_while_uploading']} "
                          f"steps while committing, {t['mean_step_s_without']} s over {t['steps_without']} steps "
                          f"without; ratio {t['ratio']}; snapshot stalls {t['snapshot_stall_s']} s; commits "
                          f"{t['commit_s']} s", flush=True)
        finally:
            server.stop()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
