"""Dump overhead: step time with statistics and tensor dumps vs. without, on both engines; and peak
memory of a tensor-mode dump of a ~100M-parameter model vs. its plain step.

    .venv/bin/python bench/dump_overhead.py [--config configs/demo.yaml] [--steps 5] [--engines mindspore torch]
    .venv/bin/python bench/dump_overhead.py --memory [--engine torch]   # the 100M-parameter memory check

Timed per engine, median over `--steps` steps after a warm-up step, same weights and batches:
  plain        the training step as the trainer runs it (MindSpore: compiled GRAPH_MODE)
  eager        the debug path with hooks but nothing selected (MindSpore: PYNATIVE) — what any
               hook-based dump needs before it records anything
  statistics   every module's forward inputs/outputs and backward gradients, plus parameters and
               gradients: shape, dtype, min, max, mean, L2 norm, NaN/Inf counts
  tensor       the same tensors written as .npy files
The ratios that matter: statistics/eager (the cost of recording) and statistics/plain (what a
dumped step costs compared with an ordinary one).
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from mindfoundry.backends.base import create_backend
from mindfoundry.config.load import load_config
from mindfoundry.debug.dump import DumpWriter
from mindfoundry.debug.probe import Probe
from mindfoundry.model.spec import ModelSpec, init_weights, num_parameters, parameter_shapes
from mindfoundry.parallel.layout import launch_layout
from mindfoundry.train.schedule import step_scalars

DIRECTIONS = ("forward", "backward", "params", "grads")
KINDS = ("plain", "eager", "statistics", "tensor")


def _step(backend, cfg, batch, kind: str, root: Path, step: int) -> tuple[float, int]:
    """One step of `kind` (plain / eager / statistics / tensor); returns (seconds, bytes written)."""
    ids, labels = batch
    scalars = step_scalars(step, cfg.train.steps, cfg.optim, labels.size)
    writer = DumpWriter(root, step, 0, kind, {}) if kind in ("statistics", "tensor") else None
    probe = None if kind == "plain" else Probe(writer, ("*",), DIRECTIONS)  # no writer: hooked path, nothing recorded
    t0 = time.perf_counter()
    backend.train_step(ids, labels, scalars, probe)
    if writer:
        writer.close()
    seconds = time.perf_counter() - t0
    return seconds, sum(f.stat().st_size for f in root.rglob("*") if f.is_file())


def time_engine(config: str, engine: str, steps: int) -> dict:
    cfg = load_config(config, [f"backend={engine}"])
    spec = ModelSpec.from_config(cfg.model)
    backend = create_backend(cfg, spec, launch_layout(cfg))
    weights = init_weights(spec, cfg.seed)
    t = cfg.train
    tokens = (
        np.random.default_rng(0)
        .integers(0, spec.vocab_size, (t.grad_accum, t.micro_batch_size, t.seq_len + 1))
        .astype(np.int32)
    )
    batch = (tokens[..., :-1], tokens[..., 1:])
    result = {"engine": engine, "parameters": num_parameters(spec), "tokens_per_step": int(batch[0].size)}
    for kind in KINDS:
        times, written = [], 0
        for i in range(steps + 1):
            backend.load_weights(weights)  # every measurement from the same state
            with tempfile.TemporaryDirectory() as tmp:
                seconds, written = _step(backend, cfg, batch, kind, Path(tmp), i + 1)
            if i:  # the first is a warm-up (compilation, first PYNATIVE pass)
                times.append(seconds)
        result[kind] = {"median_s": statistics.median(times), "bytes": written}
    for label in ("eager", "statistics", "tensor"):
        result[f"{label}_vs_plain"] = result[label]["median_s"] / result["plain"]["median_s"]
    for label in ("statistics", "tensor"):
        result[f"{label}_vs_eager"] = result[label]["median_s"] / result["eager"]["median_s"]
    return result


def memory_child(engine: str, mode: str, out: str) -> None:
    """One ~110M-parameter step (d 768, 12 layers, vocab 32000, 1 x 256 tokens); prints peak RSS in MiB."""
    cfg = load_config("configs/demo.yaml", [f"backend={engine}", "model.vocab_size=32000", "model.d_model=768",
                                            "model.n_layers=12", "model.n_heads=12", "model.n_kv_heads=12",
                                            "train.micro_batch_size=1", "train.grad_accum=1", "train.seq_len=256"])
    spec = ModelSpec.from_config(cfg.model)
    backend = create_backend(cfg, spec, launch_layout(cfg))
    backend.load_weights(init_weights(spec, cfg.seed))
    tokens = np.random.default_rng(0).integers(0, spec.vocab_size, (1, 1, 257)).astype(np.int32)
    ids, labels = tokens[..., :-1], tokens[..., 1:]
    scalars = step_scalars(1, 10, cfg.optim, labels.size)
    writer = DumpWriter(Path(out), 1, 0, "tensor", {}) if mode == "tensor" else None
    probe = Probe(writer, ("*",), ("forward", "backward", "params", "grads", "optimizer")) if mode != "plain" else None
    backend.train_step(ids, labels, scalars, probe)
    if writer:
        writer.close()
    largest = max(int(np.prod(shape)) for shape in parameter_shapes(spec).values())
    print(json.dumps({"engine": engine, "mode": mode, "parameters": num_parameters(spec),
                      "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                      "largest_tensor_mb": largest * 4 / 2**20}))


def memory(engine: str) -> list[dict]:
    rows = []
    for mode in ("plain", "eager", "tensor"):
        with tempfile.TemporaryDirectory() as tmp:
            out = subprocess.run([sys.executable, __file__, "--memory-child", mode, "--engine", engine, "--out", tmp],
                                 capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
            row = json.loads(out)
            row["dump_bytes"] = sum(f.stat().st_size for f in Path(tmp).rglob("*") if f.is_file())
            rows.append(row)
            shutil.rmtree(tmp, ignore_errors=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="configs/demo.yaml")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--engines", nargs="+", default=["mindspore", "torch"])
    ap.add_argument("--memory", action="store_true", help="peak RSS of a tensor dump of a ~110M-parameter model")
    ap.add_argument("--engine", default="torch")
    ap.add_argument("--memory-child", choices=["plain", "eager", "tensor"], help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.memory_child:
        memory_child(args.engine, args.memory_child, args.out)
        return 0
    if args.memory:
        for row in memory(args.engine):
            print(
                f"{row['engine']:9s} {row['mode']:10s} {row['parameters'] / 1e6:.0f}M params: peak RSS "
                f"{row['peak_rss_mb']:,.0f} MiB, "
                f"dump {row['dump_bytes'] / 2**20:,.0f} MiB (largest tensor {row['largest_tensor_mb']:.0f} MiB)"
            )
        return 0
    for engine in args.engines:
        r = time_engine(args.config, engine, args.steps)
        print(f"{engine}: {r['parameters']:,} params, {r['tokens_per_step']} tokens/step")
        for label in KINDS:
            m = r[label]
            print(
                f"  {label:10s} {m['median_s'] * 1000:8.1f} ms/step"
                + (f"  dump {m['bytes'] / 2**20:7.1f} MiB" if m["bytes"] else "")
            )
        print(
            f"  statistics: {r['statistics_vs_eager']:.2f}x the hooked eager step, {r['statistics_vs_plain']:.2f}x the "
            f"plain step; tensor: {r['tensor_vs_eager']:.2f}x eager, {r['tensor_vs_plain']:.2f}x plain"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
