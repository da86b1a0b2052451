"""What gradient accumulation costs an engine: first step (compile), step time and peak RSS by train.grad_accum (CPU).

    .venv/bin/python bench/grad_accum.py [--engine mindspore] [--size demo] [--accum 1 2 4 8] [--steps 3] [--threads 2]

One process per grad_accum value (a compiled graph and a high-water mark belong to a process): the engine built as
the trainer builds it (bench/peers.py's sizes and micro-batch), one untimed first step (the MindSpore graphs compile
in it), then ``--steps`` timed steps on the same batch; per grad_accum the first step, the median step, the median
step per micro-batch and the process's peak RSS (VmHWM), and the first step's loss (equal across code versions when
the arithmetic is). Prints a table and a JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from memory import proc_status  # noqa: E402
from peers import ROOT, SIZES, _pin_threads, pinned_env  # noqa: E402


def measure(engine: str, size: str, accum: int, steps: int, threads: int) -> dict:
    """One grad_accum value in this process."""
    import numpy as np

    from mindfoundry.backends.base import create_backend
    from mindfoundry.config.load import load_config
    from mindfoundry.model.spec import ModelSpec, init_weights
    from mindfoundry.parallel.layout import launch_layout
    from mindfoundry.train.schedule import step_scalars

    _pin_threads(engine, threads)
    cfg = load_config(
        ROOT / "configs" / "demo.yaml", SIZES[size] + [f"backend={engine}", f"train.grad_accum={accum}"]
    )
    spec, t = ModelSpec.from_config(cfg.model), cfg.train
    backend = create_backend(cfg, spec, launch_layout(cfg))
    backend.load_weights(init_weights(spec, cfg.seed))
    rng = np.random.default_rng(cfg.seed)
    ids, labels = (rng.integers(0, spec.vocab_size, (accum, t.micro_batch_size, t.seq_len)) for _ in range(2))

    def step(i: int) -> float:
        return backend.train_step(ids, labels, step_scalars(i, 1000, cfg.optim, valid_tokens=labels.size)).loss

    t0 = time.perf_counter()
    first_loss = step(1)
    first = time.perf_counter() - t0
    times = []
    for i in range(steps):
        t0 = time.perf_counter()
        step(i + 2)
        times.append(time.perf_counter() - t0)
    median = statistics.median(times)
    return {"accum": accum, "first_step_s": first, "step_s": median, "per_micro_batch_s": median / accum,
            "peak_rss_mib": proc_status("VmHWM") / 2**20, "first_loss": first_loss}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engine", default="mindspore", choices=["mindspore", "torch"])
    ap.add_argument("--size", default="demo", choices=list(SIZES))
    ap.add_argument("--accum", nargs="+", type=int, default=[1, 2, 4, 8])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps(measure(args.engine, args.size, args.worker, args.steps, args.threads)), flush=True)
        return 0
    # a PYTHONPATH given measures that code
    env = pinned_env(args.threads, GLOG_v="3", PYTHONPATH=os.environ.get("PYTHONPATH", str(ROOT / "src")))
    rows = []
    for accum in args.accum:
        out = subprocess.run(
            [
                sys.executable,
                __file__,
                "--engine",
                args.engine,
                "--size",
                args.size,
                "--steps",
                str(args.steps),
                "--threads",
                str(args.threads),
                "--worker",
                str(accum),
            ],
            env=env,
            capture_output=True,
            text=True,
            cwd=ROOT,
        )
        if out.returncode:
            raise SystemExit(f"grad_accum={accum} failed:\n{out.stderr[-3000:]}")
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(
        f"{args.engine}, size {args.size} ({' '.join(SIZES[args.size]) or 'configs/demo.yaml'}), code from "
        f"{env['PYTHONPATH']}"
    )
    print(
        f"{'grad_accum':>10} {'1st step s':>10} {'step s':>8} {'s/micro-batch':>13} {'peak RSS MiB':>12} "
        f"{'1st loss':>11}"
    )
    for r in rows:
        print(f"{r['accum']:>10} {r['first_step_s']:>10.1f} {r['step_s']:>8.3f} {r['per_micro_batch_s']:>13.3f} "
              f"{r['peak_rss_mib']:>12.0f} {r['first_loss']:>11.7f}")
    print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
