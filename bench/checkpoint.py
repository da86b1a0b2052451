"""Checkpoint speed, checkpointing overhead in training, and a SIGKILL soak.

    .venv/bin/python bench/checkpoint.py [--params-m 50] [--overhead-steps 40] [--soak 50] [--engine mindspore]

1. save/load MB/s of `save_checkpoint` (write, fsync, sha256 manifest, verify, retention) and
   `load_checkpoint` (verify + read) for a state of the given size (weights + 2 AdamW moments);
2. the training-time overhead of checkpointing every N steps on the demo model (from the run's
   own metrics: checkpoint seconds / step seconds), for N in 10 and 5;
3. with --soak K: K trials of SIGKILL at a random point of a tiny run (checkpoint every step, so many
   kills land inside a write), resume with --resume auto, and compare every loss with an
   uninterrupted run. Prints how many trials matched exactly.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml

from mindfoundry.checkpoint.directory import Retention, save_checkpoint
from mindfoundry.checkpoint.reader import load_checkpoint
from mindfoundry.train.metrics import read_metrics

REPO = Path(__file__).resolve().parents[1]


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "mindfoundry.cli", *args]


def speed(params_m: int, root: Path) -> dict:
    n = params_m * 1_000_000
    rng = np.random.default_rng(0)
    weights = {f"w{i}": rng.standard_normal(n // 8, dtype=np.float32) for i in range(8)}
    optim = {f"exp_avg.{k}": v for k, v in weights.items()} | {f"exp_avg_sq.{k}": v for k, v in weights.items()}
    mb = 3 * n * 4 / 1e6
    t0 = time.perf_counter()
    path = save_checkpoint(root, 1, weights, optim, {"consumed_samples": 0}, Retention(1))
    save_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    load_checkpoint(path)
    load_s = time.perf_counter() - t0
    shutil.rmtree(root / "checkpoints")
    return {"state_mb": round(mb, 1), "save_s": round(save_s, 3), "save_mb_s": round(mb / save_s, 1),
            "load_s": round(load_s, 3), "load_mb_s": round(mb / load_s, 1)}


def overhead(steps: int, every: int, engine: str, root: Path) -> dict:
    run_dir = root / f"overhead-{every}"
    overrides = [f"run_dir={run_dir}", f"backend={engine}", f"train.steps={steps}", f"checkpoint.every={every}",
                 "checkpoint.keep_last=2", "train.eval_every=0", "train.eval_samples=16", "optim.warmup_steps=5",
                 "monitor.progress=false"]
    args = [a for o in overrides for a in ("--set", o)]
    proc = subprocess.run(cli("train", str(REPO / "configs" / "demo.yaml"), *args), capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(proc.stderr[-2000:])
    records = read_metrics(run_dir / "metrics.jsonl")
    step_s = sum(r["step_time_s"] for r in records if "loss" in r and r["step"] > 1)  # step 1 compiles
    ckpt_s = [r["seconds"] for r in records if r.get("event") == "checkpoint"]
    return {"every": every, "checkpoints": len(ckpt_s), "mean_ckpt_s": round(float(np.mean(ckpt_s)), 3),
            "overhead": round(sum(ckpt_s) / step_s, 4)}


def _tiny_config(root: Path, name: str, engine: str, steps: int) -> Path:
    corpus = root / "corpus.jsonl"
    if not corpus.exists():
        import sysconfig

        stdlib = Path(sysconfig.get_paths()["stdlib"])
        texts = [f.read_text(encoding="utf-8") for f in sorted((stdlib / "email").glob("*.py"))]
        corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    tree = {
        "name": name,
        "run_dir": str(root / name),
        "seed": 7,
        "backend": engine,
        "model": {"vocab_size": 512, "d_model": 32, "n_layers": 2, "n_heads": 2, "max_seq_len": 64},
        "data": {"sources": [{"name": "code", "paths": [str(corpus)]}], "validation_fraction": 0.1},
        "train": {
            "steps": steps,
            "micro_batch_size": 4,
            "grad_accum": 2,
            "seq_len": 32,
            "eval_every": 0,
            "eval_samples": 8,
        },
        "optim": {"warmup_steps": 2, "lr": 1e-2},
        "checkpoint": {"every": 1, "keep_last": 2},
        "monitor": {"progress": False},
    }
    path = root / f"{name}.yaml"
    path.write_text(yaml.safe_dump(tree))
    return path


def _losses(run_dir: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_metrics(run_dir / "metrics.jsonl") if "loss" in r}


def _last_step(run_dir: Path) -> int:
    path = run_dir / "metrics.jsonl"
    return max((r.get("step", 0) for r in read_metrics(path) if "loss" in r), default=0) if path.exists() else 0


def soak(trials: int, engine: str, root: Path, steps: int = 16) -> dict:
    rng = random.Random(0)
    ref = _tiny_config(root, "reference", engine, steps)
    subprocess.run(cli("train", str(ref)), check=True, capture_output=True)
    expected = _losses(root / "reference")
    exact = mid_write = mid_run = 0
    for trial in range(trials):
        config = _tiny_config(root, f"trial{trial}", engine, steps)
        run_dir = root / f"trial{trial}"
        proc = subprocess.Popen(cli("train", str(config)), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        target = rng.randint(1, steps // 2)
        while _last_step(run_dir) < target and proc.poll() is None:
            time.sleep(0.01)
        if proc.poll() is not None:
            raise SystemExit(
                f"trial {trial}: training ended by itself (exit {proc.returncode}) before the "
                f"kill:\n{proc.stderr.read()[-2000:]}"
            )
        time.sleep(rng.uniform(0, 0.05))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        mid_run += _last_step(run_dir) < steps
        mid_write += any(p.name.startswith(".tmp-") for p in (run_dir / "checkpoints").glob(".tmp-*"))
        subprocess.run(cli("train", str(config), "--resume", "auto"), check=True, capture_output=True)
        got = _losses(run_dir)
        exact += all(got.get(s) == expected[s] for s in range(1, steps + 1))
        shutil.rmtree(run_dir)
        print(f"  trial {trial + 1}/{trials}: exact so far {exact}", flush=True)
    return {"trials": trials, "exact": exact, "killed_mid_run": mid_run, "killed_inside_a_checkpoint_write": mid_write}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--params-m", type=int, default=50, help="millions of parameters for the save/load speed test")
    ap.add_argument("--overhead-steps", type=int, default=40)
    ap.add_argument("--engine", default="mindspore", choices=["mindspore", "torch"])
    ap.add_argument("--soak", type=int, default=0, help="SIGKILL trials (0 = skip)")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="mf-bench-ckpt-"))
    try:
        result = {"speed": speed(args.params_m, root)}
        print(
            f"save/load {result['speed']['state_mb']} MB: save {result['speed']['save_mb_s']} MB/s, load "
            f"{result['speed']['load_mb_s']} MB/s"
        )
        result["overhead"] = [overhead(args.overhead_steps, every, args.engine, root) for every in (10, 5)]
        for o in result["overhead"]:
            print(f"checkpoint every {o['every']} steps on the demo model ({args.engine}): {o['mean_ckpt_s']} s each, "
                  f"{o['overhead']:.1%} of training time")
        if args.soak:
            result["soak"] = soak(args.soak, args.engine, root)
            print(
                f"SIGKILL soak: {result['soak']['exact']}/{args.soak} resumed runs reproduce the uninterrupted losses "
                f"exactly ({result['soak']['killed_inside_a_checkpoint_write']} kills inside a checkpoint write)"
            )
        print(json.dumps(result))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
