"""The planner's memory estimate against the measured peak RSS of real CPU runs, per layout.

    .venv/bin/python bench/planner_memory.py [--layouts single dp_shard=2 tp=2 dp_shard=2,tp=2] [--steps 2]

Each layout runs the torch engine under torchrun (gloo, one process per rank; the single-process
layout without a launcher) on a ~34M-parameter model (d_model 512, 8 layers, vocab 16384, seq 256,
micro-batch 4, fp32, AdamW), for a few training steps. Every rank reports its peak RSS (ru_maxrss)
(sampled during the training steps: loading the full numpy weights is a separate, load-time cost,
shown in the last column). The planner's fixed overhead is measured instead of guessed: the peak RSS
of the same layout training a negligible model (d_model 64, 2 layers, vocab 512) — Python, torch,
the process groups and their buffers; the estimate is `parallel.planner.estimate` with that
overhead, so what is checked is its model-dependent part. A CPU keeps everything in RSS, so RSS is the device memory the
planner models.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

MODEL = [
    "model.vocab_size=16384",
    "model.d_model=512",
    "model.n_layers=8",
    "model.n_heads=8",
    "model.n_kv_heads=8",
    "model.max_seq_len=256",
    "train.seq_len=256",
    "train.micro_batch_size=4",
    "train.grad_accum=1",
    "backend=torch",
]
#: A model too small to matter: its run measures what the runtime itself takes under a layout.
TINY = ["model.vocab_size=512", "model.d_model=64", "model.n_layers=2", "model.n_heads=4", "model.n_kv_heads=4",
        "model.max_seq_len=256", "train.seq_len=256", "train.micro_batch_size=4", "train.grad_accum=1", "backend=torch"]


def worker(layout: str, steps: int, out: Path, model: list[str]) -> None:
    """Runs inside each rank: measure the baseline, build the engine, train, report peak RSS."""
    import numpy as np
    import torch.distributed as dist

    from mindfoundry.backends.base import create_backend
    from mindfoundry.config.load import load_config
    from mindfoundry.model.spec import ModelSpec, init_weights
    from mindfoundry.parallel.layout import launch_layout
    from mindfoundry.train.schedule import step_scalars

    sets = model + [f"parallel.{kv}" for kv in layout.split(",") if kv != "single"]
    cfg = load_config("configs/demo.yaml", sets)
    spec = ModelSpec.from_config(cfg.model)
    if "WORLD_SIZE" in os.environ and not dist.is_initialized():
        dist.init_process_group("gloo")  # the engine reuses it; counted in the baseline like torch itself
    process = psutil.Process()
    baseline = process.memory_info().rss
    backend = create_backend(cfg, spec, launch_layout(cfg))
    backend.load_weights(init_weights(spec, cfg.seed))  # the full numpy weights are a load-time cost, freed here
    gc.collect()
    t = cfg.train
    rng = np.random.default_rng(0)
    peak, done = [0], threading.Event()

    def sample() -> None:  # RSS high-water mark of the training steps alone (ru_maxrss would include loading)
        while not done.is_set():
            peak[0] = max(peak[0], process.memory_info().rss)
            time.sleep(0.002)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    for step in range(1, steps + 1):
        tokens = rng.integers(
            0, spec.vocab_size, (t.grad_accum, t.micro_batch_size * backend.dp_size, t.seq_len + 1)
        ).astype(np.int32)
        mine = tokens[:, backend.dp_rank * t.micro_batch_size:(backend.dp_rank + 1) * t.micro_batch_size]
        backend.train_step(mine[..., :-1], mine[..., 1:], step_scalars(step, 10, cfg.optim, tokens[..., 1:].size))
    done.set()
    sampler.join()
    whole = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    (out / f"rank{backend.rank}.json").write_text(
        json.dumps({"baseline": baseline, "peak": peak[0], "peak_with_load": whole})
    )


def measure(layout: str, steps: int, tiny: bool = False) -> dict:
    procs = 1
    for kv in layout.split(","):
        if kv != "single":
            procs *= int(kv.split("=")[1])
    with tempfile.TemporaryDirectory() as tmp:
        args = [__file__, "--worker", layout, "--steps", str(steps), "--out", tmp, *(["--tiny"] if tiny else [])]
        cmd = ([sys.executable, *args] if procs == 1 else
               [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={procs}", *args])
        subprocess.run(cmd, check=True, capture_output=True)
        ranks = [json.loads(p.read_text()) for p in sorted(Path(tmp).glob("rank*.json"))]
    return {"layout": layout, "processes": procs, "peak": max(r["peak"] for r in ranks),
            "baseline": max(r["baseline"] for r in ranks), "peak_with_load": max(r["peak_with_load"] for r in ranks)}


def estimate(layout: str, overhead: int) -> int:
    from mindfoundry.config.load import load_config
    from mindfoundry.config.parallel_config import Layout
    from mindfoundry.model.spec import ModelSpec
    from mindfoundry.parallel.planner import estimate as planner_estimate

    cfg = load_config("configs/demo.yaml", MODEL)
    degrees = {} if layout == "single" else {k: int(v) for k, v in (kv.split("=") for kv in layout.split(","))}
    est = planner_estimate(
        ModelSpec.from_config(cfg.model),
        Layout(**degrees),
        cfg.train.micro_batch_size,
        cfg.train.seq_len,
        "fp32",
        fixed_overhead_bytes=overhead,
        flash_attention=True,
        fused_norm=False,
        vocab_parallel_loss=False,
    )  # the torch engine gathers full-vocab logits before the loss
    return est.total


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layouts", nargs="+", default=["single", "dp_shard=2", "tp=2", "dp_shard=2,tp=2"])
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--tiny", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.worker, args.steps, Path(args.out), TINY if args.tiny else MODEL)
        return 0
    print(
        f"{'layout':18s} {'procs':>5s} {'runtime MiB':>12s} {'peak RSS MiB':>12s} {'estimate MiB':>12s} "
        f"{'est/peak':>8s} {'peak incl. load':>15s}"
    )
    for layout in args.layouts:
        runtime = measure(layout, args.steps, tiny=True)["peak"]  # what the layout's runtime takes without a model
        m = measure(layout, args.steps)
        est = estimate(layout, runtime)
        print(f"{layout:18s} {m['processes']:5d} {runtime / 2**20:12.0f} {m['peak'] / 2**20:12.0f} {est / 2**20:12.0f} "
              f"{est / m['peak']:8.2f} {m['peak_with_load'] / 2**20:15.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
