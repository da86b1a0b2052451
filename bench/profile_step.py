"""Where a training step's time goes, per engine: top ops and forward / backward / update / host shares (CPU).

    .venv/bin/python bench/profile_step.py [--engines mindspore torch] [--size large] [--steps 3]

Builds MindFoundry's step as the trainer does (bench/peers.py's sizes), runs two warm-up steps (the
first compiles MindSpore's graph; its time is printed) and then profiles ``--steps`` steps with the
engine's own profiler: ``torch.profiler`` (self CPU time of every op; an op belongs to the backward when
an autograd node is among its ancestors, to the update when ``Optimizer.step`` is) and
``mindspore.profiler.profile`` (its per-kernel CSV; scope ``Gradients/`` is the backward and
``optimizer`` the update). "host" is the step's wall time not covered by kernels (Python, launches,
copies in and out). Prints one table per engine and a final JSON line.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peers import SIZES, build_contender  # noqa: E402

GROUPS = {  # op type -> what it is, for the summary line
    "matmul": ("MatMul", "BatchMatMul", "MatMulExt", "mm", "bmm", "addmm", "matmul", "linear"),
    "attention": ("Softmax", "SoftmaxGrad", "_scaled_dot_product", "flash_attention", "_softmax"),
    "optimizer": ("AdamWeightDecay", "_foreach", "adamw", "_fused_adamw"),
}


def _group(op: str) -> str:
    for name, keys in GROUPS.items():
        if any(k.lower() in op.lower() for k in keys):
            return name
    return "other"


def profile_torch(step, first: int, steps: int) -> tuple[Counter, Counter, float]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        for i in range(steps):
            step(first + i)
        wall = time.perf_counter() - t0
    ops, phases = Counter(), Counter()
    for ev in prof.events():
        own = ev.self_cpu_time_total / 1e6
        if own <= 0 or ev.name.startswith(("autograd::engine", "Optimizer.step")) or "Backward" in ev.name:
            continue  # wrappers: their children carry the time
        phase, parent = "forward", ev.cpu_parent
        while parent is not None:
            if "Backward" in parent.name or parent.name.startswith("autograd::engine"):
                phase = "backward"
                break
            if parent.name.startswith("Optimizer.step"):
                phase = "update"
                break
            parent = parent.cpu_parent
        ops[ev.name] += own
        phases[phase] += own
    return ops, phases, wall


def profile_mindspore(step, first: int, steps: int) -> tuple[Counter, Counter, float]:
    import mindspore as ms
    from mindspore.profiler import ProfilerActivity

    out = tempfile.mkdtemp(prefix="msprof-")
    with ms.profiler.profile(
        activities=[ProfilerActivity.CPU], on_trace_ready=ms.profiler.tensorboard_trace_handler(out)
    ) as prof:
        t0 = time.perf_counter()
        for i in range(steps):
            step(first + i)
            prof.step()
        wall = time.perf_counter() - t0
    detail = next(Path(out).rglob("cpu_op_detail_info_0.csv"))
    ops, phases = Counter(), Counter()
    with detail.open() as fh:
        for row in csv.DictReader(fh):
            own = float(row["op_total_time(ms)"]) / 1e3
            scope = row["full_op_name"]
            phase = "backward" if "Gradients/" in scope else "update" if "optimizer" in scope else "forward"
            ops[row["op_type"]] += own
            phases[phase] += own
    return ops, phases, wall


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engines", nargs="+", default=["mindspore", "torch"], choices=["mindspore", "torch"])
    ap.add_argument("--size", default="large", choices=list(SIZES))
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--top", type=int, default=10)
    args = ap.parse_args(argv)
    results = {}
    for engine in args.engines:
        step = build_contender(f"mf-{engine}", args.size)[0]  # the trainer's step, as peers.py times it
        t0 = time.perf_counter()
        step(0)
        first = time.perf_counter() - t0
        t0 = time.perf_counter()
        step(1)
        plain = time.perf_counter() - t0
        ops, phases, wall = (profile_torch if engine == "torch" else profile_mindspore)(step, 2, args.steps)
        kernels = sum(ops.values())
        shares = {p: phases[p] / wall for p in ("forward", "backward", "update")} | {
            "host": max(0.0, 1 - kernels / wall)
        }
        groups = Counter()
        for op, s in ops.items():
            groups[_group(op)] += s
        print(f"\n== {engine}, size {args.size}: first step {first:.1f} s, unprofiled step {plain:.2f} s, "
              f"profiled {wall / args.steps:.2f} s/step")
        print("shares of the profiled wall time: " + ", ".join(f"{k} {v:.1%}" for k, v in shares.items()))
        print("kernel time by kind: " + ", ".join(f"{k} {v / kernels:.1%}" for k, v in groups.most_common()))
        for op, s in ops.most_common(args.top):
            print(f"  {op:<40} {s / args.steps * 1e3:9.1f} ms/step {s / kernels:7.1%}")
        results[engine] = {"first_step_s": first, "step_s": plain, "shares": shares,
                           "groups": {k: v / kernels for k, v in groups.items()},
                           "top": [(op, s / kernels) for op, s in ops.most_common(args.top)]}
    print(json.dumps({"size": args.size, "overrides": SIZES[args.size], "results": results}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
