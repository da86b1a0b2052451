"""Peak memory and step time of each `memory` mode, both engines, beside the planner's estimate (CPU).

    .venv/bin/python bench/memory.py [--engines torch mindspore] [--modes none selective full chunk] [--steps 2]
                                     [--set key=value ...]

Default size (activations dominate): d_model 512, 8 layers, 8 heads, vocab 8192, seq 1024, micro-batch 2,
fp32, AdamW. Each (engine, mode) runs in a fresh process: build the engine exactly as the trainer does,
two warm-up steps (the MindSpore graph compiles in the first), then `--steps` timed steps. torch: after
the warm-up the gradients are dropped, freed memory is handed back to the OS (malloc_trim) and the
resident set is the *static* baseline (weights, AdamW moments, runtime); the kernel's RSS high-water
mark is reset (/proc/self/clear_refs) and activation memory = peak RSS of the timed steps - baseline
(gradients being allocated while activations are freed are part of it, as on a device). MindSpore keeps
what its first step allocated in its memory pool, so its baseline is taken before the first step and
its figure is everything the compiled step holds (graph, pool: activations, gradients, workspace). A CPU keeps
everything in RSS, so RSS is the
device memory here; on an accelerator the same script would read the device's peak allocation.

The planner's figures for each mode are `parallel.planner.estimate(...)` for this engine's attention
and norm (torch: flash SDPA, unfused RMSNorm; MindSpore: dense scores): its activations beside the
measured activation memory, and its total (weights + gradients + AdamW + activations + overhead, the
overhead being this process's runtime: baseline - weights - AdamW) beside the measured peak RSS. The
total is the planner's claim; the activation column differs from the measurement by when the
gradients are allocated (with one micro-batch they exist only from the backward on).
Offload needs an accelerator (refused on CPU with the alternative), so it has no row here.
Prints a table and a final JSON line.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODEL = [
    "model.vocab_size=8192",
    "model.d_model=512",
    "model.n_layers=8",
    "model.n_heads=8",
    "model.n_kv_heads=8",
    "model.max_seq_len=1024",
    "train.seq_len=1024",
    "train.micro_batch_size=2",
    "train.grad_accum=1",
    "train.precision=fp32",
]
#: glibc raises its mmap threshold after each large free, after which freed activations stay in the heap and in
#: RSS; a fixed threshold keeps every large tensor in its own mapping, so RSS follows the live tensors.
MALLOC = {"MALLOC_MMAP_THRESHOLD_": "131072"}
MODES = {
    "none": [],
    "selective": ["memory.recompute=selective"],
    "full": ["memory.recompute=full"],
    "chunk": ["memory.loss_chunk=64"],
    "full+chunk": ["memory.recompute=full", "memory.loss_chunk=64"],
}


def proc_status(key: str) -> int:
    """A /proc/self/status size (VmRSS, VmHWM) in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


def worker(engine: str, sets: list[str], steps: int) -> dict:
    """In a fresh process: static baseline, then peak RSS and median time of `steps` training steps."""
    import numpy as np

    from mindfoundry.backends.base import create_backend
    from mindfoundry.config.load import load_config
    from mindfoundry.model.spec import ModelSpec, init_weights
    from mindfoundry.parallel.layout import launch_layout
    from mindfoundry.train.schedule import step_scalars

    cfg = load_config(ROOT / "configs" / "demo.yaml", [f"backend={engine}", *sets])
    spec = ModelSpec.from_config(cfg.model)
    backend = create_backend(cfg, spec, launch_layout(cfg))
    backend.load_weights(init_weights(spec, cfg.seed))
    t = cfg.train
    rng = np.random.default_rng(0)

    def step(i: int) -> float:
        tokens = rng.integers(0, spec.vocab_size, (t.grad_accum, t.micro_batch_size, t.seq_len + 1)).astype(np.int32)
        start = time.perf_counter()
        backend.train_step(tokens[..., :-1], tokens[..., 1:], step_scalars(i, 10, cfg.optim, tokens[..., 1:].size))
        return time.perf_counter() - start

    if engine == "mindspore":  # its memory pool keeps what the first step took: measure from before the first step
        gc.collect()
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        baseline = proc_status("VmRSS")
        Path("/proc/self/clear_refs").write_text("5")
    for i in (1, 2):
        step(i)
    if engine == "torch":  # freed tensors go back to the OS: measure the steady step from a static baseline
        backend.optimizer.zero_grad(set_to_none=True)
        gc.collect()
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        baseline = proc_status("VmRSS")
        Path("/proc/self/clear_refs").write_text("5")  # the high-water mark restarts from the current RSS
    times = sorted(step(3 + i) for i in range(steps))
    return {"baseline": baseline, "peak": proc_status("VmHWM"), "step_s": times[len(times) // 2]}


def pynative_worker(recompute: bool) -> dict:
    """MindSpore PYNATIVE (eager) forward + backward of the bench model, with or without Cell.recompute() on every
    block: the mode where the shared notes measured recompute saving memory on CPU. Whole-process peak RSS (the
    eager memory pool keeps what the warm-up took, so no baseline is subtracted)."""
    import mindspore as ms
    import numpy as np

    from mindfoundry.backends.mindspore.model import LossCell, Transformer
    from mindfoundry.config.load import load_config
    from mindfoundry.model.spec import ModelSpec, init_weights

    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.set_device("CPU")
    cfg = load_config(ROOT / "configs" / "demo.yaml", ["backend=mindspore", *MODEL])
    spec = ModelSpec.from_config(cfg.model)
    model = Transformer(spec)
    weights = init_weights(spec, cfg.seed)
    for p in model.get_parameters():
        p.set_data(ms.Tensor(weights[p.name]))
    if recompute:
        for block in model.layers:
            block.recompute()
    grad = ms.value_and_grad(LossCell(model), None, model.trainable_params())
    t = cfg.train
    ids = np.random.default_rng(0).integers(0, spec.vocab_size, (t.micro_batch_size, t.seq_len + 1)).astype(np.int32)
    times = []
    for _ in range(2):
        start = time.perf_counter()
        grad(ms.Tensor(ids[:, :-1]), ms.Tensor(ids[:, 1:]), ms.Tensor(np.float32(1 / ids[:, 1:].size)))
        times.append(time.perf_counter() - start)
    return {"peak": proc_status("VmHWM"), "step_s": times[-1]}


def planned(engine: str, sets: list[str]) -> dict:
    """The planner's terms for this engine and mode (no fixed overhead: the bench adds the measured runtime)."""
    from mindfoundry.config.load import load_config
    from mindfoundry.config.parallel_config import Layout
    from mindfoundry.model.spec import ModelSpec
    from mindfoundry.parallel.planner import estimate, memory_options

    cfg = load_config(ROOT / "configs" / "demo.yaml", [f"backend={engine}", *sets])
    spec, t, m = ModelSpec.from_config(cfg.model), cfg.train, cfg.memory
    est = estimate(
        spec,
        Layout(),
        t.micro_batch_size,
        t.seq_len,
        t.precision,
        **memory_options(m, spec.n_layers),
        fixed_overhead_bytes=0,
        flash_attention=engine == "torch",
        fused_norm=False,
        vocab_parallel_loss=False,
    )
    return {
        "activations": est.activations,
        "logits": est.logits,
        "static": est.weights + est.optimizer,
        "total": est.total,
        "head_gradient": spec.vocab_size * spec.d_model * 4,
    }  # fp32 (V, C): the chunked backward's weight gradient


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engines", nargs="+", default=["torch", "mindspore"], choices=["torch", "mindspore"])
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    ap.add_argument("--steps", type=int, default=3, help="timed steps per process (the median is its step time)")
    ap.add_argument("--rounds", type=int, default=1, help="processes per (engine, mode), run round-robin so that load "
                    "from other jobs hits every mode alike; medians over the rounds")
    ap.add_argument("--set", action="append", default=[], help="extra config overrides, e.g. train.micro_batch_size=4")
    ap.add_argument(
        "--pynative",
        action="store_true",
        help="instead: MindSpore eager (PYNATIVE) peak RSS without and with "
        "Cell.recompute on every block, one process each",
    )
    ap.add_argument("--worker", nargs=2, metavar=("ENGINE", "MODE"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker and args.worker[0] == "pynative":
        print(json.dumps(pynative_worker(args.worker[1] == "full")))
        return 0
    if args.pynative:
        got = {}
        for mode in ("none", "full"):
            proc = subprocess.run(
                [sys.executable, __file__, "--worker", "pynative", mode, *sum((["--set", s] for s in args.set), [])],
                capture_output=True,
                text=True,
                cwd=ROOT,
                env={**os.environ, "GLOG_v": "3", **MALLOC},
            )
            if proc.returncode:
                raise SystemExit(f"pynative {mode} failed:\n{proc.stderr[-2000:]}")
            got[mode] = json.loads(proc.stdout.strip().splitlines()[-1])
            print(f"MindSpore PYNATIVE, recompute {mode:4s}: peak RSS {got[mode]['peak'] / 2**20:7.0f} MiB, "
                  f"step {got[mode]['step_s']:.2f} s")
        print(
            f"full recompute: peak x{got['full']['peak'] / got['none']['peak']:.2f}, step "
            f"x{got['full']['step_s'] / got['none']['step_s']:.2f}"
        )
        print(json.dumps({"model": MODEL + args.set, "pynative": got}))
        return 0
    if args.worker:
        engine, mode = args.worker
        print(json.dumps(worker(engine, MODEL + MODES[mode] + args.set, args.steps)))
        return 0
    runs: dict[tuple[str, str], list[dict]] = {}
    for _ in range(args.rounds):
        for engine in args.engines:
            for mode in args.modes:
                cmd = [sys.executable, __file__, "--worker", engine, mode, "--steps", str(args.steps),
                       *sum((["--set", s] for s in args.set), [])]
                proc = subprocess.run(
                    cmd, capture_output=True, text=True, cwd=ROOT, env={**os.environ, "GLOG_v": "3", **MALLOC}
                )
                if proc.returncode:
                    print(proc.stderr[-2000:], file=sys.stderr)
                    raise SystemExit(f"{engine} {mode} failed (exit {proc.returncode})")
                runs.setdefault((engine, mode), []).append(json.loads(proc.stdout.strip().splitlines()[-1]))
    rows = []
    for (engine, mode), got_all in runs.items():
        got = {key: statistics.median(g[key] for g in got_all) for key in ("baseline", "peak", "step_s")}
        plan = planned(engine, MODEL + MODES[mode] + args.set)
        runtime = got["baseline"] - plan["static"]  # what the process holds besides weights and AdamW moments
        row = {"engine": engine, "mode": mode, **got, "step_s_all": [g["step_s"] for g in got_all],
               "measured": got["peak"] - got["baseline"], "plan": plan, "planned_peak": plan["total"] + runtime}
        row["peak_to_plan"] = got["peak"] / row["planned_peak"]
        rows.append(row)
    print()
    print(
        f"{'engine':9s} {'mode':10s} {'baseline':>9s} {'act.':>9s} {'planned':>9s} {'peak':>9s} {'planned':>9s} "
        f"{'ratio':>6s} {'act. saved':>10s} {'step s':>7s} {'x none':>7s}"
    )
    for r in rows:
        none = next(x for x in rows if x["engine"] == r["engine"] and x["mode"] == "none")
        r["saved_vs_none"] = 1 - r["measured"] / none["measured"]
        r["time_vs_none"] = r["step_s"] / none["step_s"]
        if (
            r["mode"] == "chunk"
        ):  # measured saving as a share of the planned full-vocabulary logits term, and what is left
            r["logits_removed"] = (none["measured"] - r["measured"]) / none["plan"]["logits"]
            r["logits_left"] = r["measured"] - (none["measured"] - none["plan"]["logits"])
        mib = lambda b: f"{b / 2**20:8.0f}M"  # noqa: E731
        print(
            f"{r['engine']:9s} {r['mode']:10s} {mib(r['baseline'])} {mib(r['measured'])} "
            f"{mib(r['plan']['activations'])} {mib(r['peak'])} {mib(r['planned_peak'])} {r['peak_to_plan']:6.2f} "
            f"{r['saved_vs_none']:10.0%} {r['step_s']:7.2f} {r['time_vs_none']:7.2f}"
            + (
                f"\n    saved {r['logits_removed']:.0%} of the logits term ({none['plan']['logits'] / 2**20:.0f} MiB "
                f"planned); left {r['logits_left'] / 2**20:.0f} MiB: one chunk's logits "
                f"({r['plan']['logits'] / 2**20:.0f} MiB planned) and the head weight's gradient "
                f"({r['plan']['head_gradient'] / 2**20:.0f} MiB), which the plain run allocates only after its logits "
                "are freed"
                if "logits_removed" in r
                else ""
            )
        )
    print(json.dumps({"model": MODEL + args.set, "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
