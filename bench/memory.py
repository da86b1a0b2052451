"""Peak memory and step time of each `memory` mode, both engines, beside the planner's estimate (CPU).

    .venv/bin/python bench/memory.py [--engines torch mindspore] [--modes none selective full chunk] [--steps 2]
                                     [--set key=value ...]

Default size (activations dominate): d_model 512, 8 layers, 8 heads, vocab 8192, seq 1024, micro-batch 2,
fp32, AdamW. Each (engine, mode) runs in a fresh process: build the engine exactly as the trainer does,
two warm-up steps (the MindSpore graph compiles in the first), then the gradients are dropped, freed
memory is handed back to the OS (malloc_trim) and the resident set is the *static* baseline (weights,
AdamW moments, runtime). The kernel's RSS high-water mark is reset (/proc/self/clear_refs) and
`--steps` timed steps run; activation memory = peak RSS - baseline (gradients being allocated while
activations are freed are part of it, as on a device). A CPU keeps everything in RSS, so RSS is the
device memory here; on an accelerator the same script would read the device's peak allocation.

The planner's figure for each mode is `parallel.planner.estimate(...).activations +
.gradients` for this engine's attention and norm (torch: flash SDPA, unfused RMSNorm; MindSpore: dense
scores), the part of the step that the measurement covers.
Offload needs an accelerator (refused on CPU with the alternative), so it has no row here.
Prints a table and a final JSON line.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODEL = ["model.vocab_size=8192", "model.d_model=512", "model.n_layers=8", "model.n_heads=8", "model.n_kv_heads=8",
         "model.max_seq_len=1024", "train.seq_len=1024", "train.micro_batch_size=2", "train.grad_accum=1", "train.precision=fp32"]
MODES = {
    "none": [],
    "selective": ["memory.recompute=selective"],
    "full": ["memory.recompute=full"],
    "chunk": ["memory.loss_chunk=128"],
    "full+chunk": ["memory.recompute=full", "memory.loss_chunk=128"],
}


def _status(key: str) -> int:
    """A /proc/self/status size (VmRSS, VmHWM) in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


def worker(engine: str, sets: list[str], steps: int) -> dict:
    """In a fresh process: static baseline, then peak RSS and median time of `steps` training steps."""
    import numpy as np

    from mindfoundry.backends.base import create_backend
    from mindfoundry.model.spec import ModelSpec, init_weights
    from mindfoundry.parallel.layout import load_run_config
    from mindfoundry.train.schedule import step_scalars

    cfg = load_run_config(ROOT / "configs" / "demo.yaml", [f"backend={engine}", *sets])
    spec = ModelSpec.from_config(cfg.model)
    backend = create_backend(cfg, spec)
    backend.load_weights(init_weights(spec, cfg.seed))
    t = cfg.train
    rng = np.random.default_rng(0)

    def step(i: int) -> float:
        tokens = rng.integers(0, spec.vocab_size, (t.grad_accum, t.micro_batch_size, t.seq_len + 1)).astype(np.int32)
        start = time.perf_counter()
        backend.train_step(tokens[..., :-1], tokens[..., 1:], step_scalars(i, 10, cfg.optim, tokens[..., 1:].size))
        return time.perf_counter() - start

    for i in (1, 2):
        step(i)
    if engine == "torch":
        backend.optimizer.zero_grad(set_to_none=True)
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    baseline = _status("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # the high-water mark restarts from the current RSS
    times = sorted(step(3 + i) for i in range(steps))
    return {"baseline": baseline, "peak": _status("VmHWM"), "step_s": times[len(times) // 2]}


def planned(engine: str, sets: list[str]) -> dict:
    """The planner's activations (+ gradients, alive at the peak) for this engine and mode."""
    from mindfoundry.model.spec import ModelSpec
    from mindfoundry.parallel.layout import Layout, load_run_config
    from mindfoundry.parallel.planner import estimate

    cfg = load_run_config(ROOT / "configs" / "demo.yaml", [f"backend={engine}", *sets])
    spec, t, m = ModelSpec.from_config(cfg.model), cfg.train, cfg.memory
    est = estimate(spec, Layout(), t.micro_batch_size, t.seq_len, t.precision, m.recompute,
                   recomputed_layers=len(m.recomputed_layers(spec.n_layers)), loss_chunk=m.loss_chunk,
                   fixed_overhead_bytes=0, flash_attention=engine == "torch", fused_norm=False, vocab_parallel_loss=False)
    return {"activations": est.activations, "gradients": est.gradients, "logits": est.logits}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engines", nargs="+", default=["torch", "mindspore"], choices=["torch", "mindspore"])
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--set", action="append", default=[], help="extra config overrides, e.g. train.micro_batch_size=4")
    ap.add_argument("--worker", nargs=2, metavar=("ENGINE", "MODE"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        engine, mode = args.worker
        print(json.dumps(worker(engine, MODEL + MODES[mode] + args.set, args.steps)))
        return 0
    rows = []
    for engine in args.engines:
        for mode in args.modes:
            cmd = [sys.executable, __file__, "--worker", engine, mode, "--steps", str(args.steps),
                   *sum((["--set", s] for s in args.set), [])]
            proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env={**os.environ, "GLOG_v": "3"})
            if proc.returncode:
                print(proc.stderr[-2000:], file=sys.stderr)
                raise SystemExit(f"{engine} {mode} failed (exit {proc.returncode})")
            got = json.loads(proc.stdout.strip().splitlines()[-1])
            plan = planned(engine, MODEL + MODES[mode] + args.set)
            rows.append({"engine": engine, "mode": mode, **got, "measured": got["peak"] - got["baseline"], "plan": plan})
            print(f"{engine:9s} {mode:10s} measured {rows[-1]['measured'] / 2**20:8.0f} MiB  planned "
                  f"{(plan['activations'] + plan['gradients']) / 2**20:8.0f} MiB  step {got['step_s']:.2f} s", flush=True)
    print()
    print(f"{'engine':9s} {'mode':10s} {'baseline':>9s} {'peak':>9s} {'act.':>9s} {'planned':>9s} {'ratio':>6s} "
          f"{'vs none':>8s} {'step s':>7s} {'x none':>7s}")
    for r in rows:
        none = next(x for x in rows if x["engine"] == r["engine"] and x["mode"] == "none")
        plan = r["plan"]["activations"] + r["plan"]["gradients"]
        r["ratio_to_plan"] = r["measured"] / plan
        r["saved_vs_none"] = 1 - r["measured"] / none["measured"]
        r["time_vs_none"] = r["step_s"] / none["step_s"]
        if r["mode"] == "chunk":  # the share of the (planned) full-vocabulary logits term the chunking removed
            r["logits_removed"] = (none["measured"] - r["measured"]) / none["plan"]["logits"]
        mib = lambda b: f"{b / 2**20:8.0f}M"  # noqa: E731
        print(f"{r['engine']:9s} {r['mode']:10s} {mib(r['baseline'])} {mib(r['peak'])} {mib(r['measured'])} {mib(plan)} "
              f"{r['ratio_to_plan']:6.2f} {r['saved_vs_none']:8.0%} {r['step_s']:7.2f} {r['time_vs_none']:7.2f}"
              + (f"  logits term removed {r['logits_removed']:.0%}" if "logits_removed" in r else ""))
    print(json.dumps({"model": MODEL + args.set, "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
