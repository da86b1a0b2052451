"""Monitoring overhead on the demo model: the per-step metrics path and the per-layer detail path,
as a share of the training step time, measured in one process.

    .venv/bin/python bench/monitor_overhead.py [--config configs/demo.yaml] [--steps 10] [--engine mindspore]

Per step the trainer builds one record (RSS, MFU, copy fraction), writes it to metrics.jsonl and
TensorBoard, and runs the health rules; every `monitor.detail_every` steps it also copies the
weights before and after the step and computes per-layer norms. Both paths are timed here with the
trainer's own components on real records and real weights, and divided by the median step time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import psutil

from mindfoundry.backends.base import create_backend
from mindfoundry.config.load import load_config
from mindfoundry.model.spec import ModelSpec, flops_per_token, init_weights, parameter_shapes
from mindfoundry.monitor.health import HealthMonitor
from mindfoundry.monitor.mfu import mfu, peak_flops
from mindfoundry.monitor.tensorboard import TensorBoardSink
from mindfoundry.parallel.layout import launch_layout
from mindfoundry.train.layer_stats import layer_grad_norms, layer_update_ratios, layer_weight_norms
from mindfoundry.train.metrics import JsonlSink, MetricsLogger
from mindfoundry.train.schedule import step_scalars


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="configs/demo.yaml")
    ap.add_argument("--steps", type=int, default=10, help="timed training steps (after one compile step)")
    ap.add_argument("--engine", default="mindspore", choices=["mindspore", "torch"])
    ap.add_argument("--records", type=int, default=500, help="records pushed through the per-step path")
    args = ap.parse_args()

    cfg = load_config(args.config, [f"backend={args.engine}"])
    spec = ModelSpec.from_config(cfg.model)
    backend = create_backend(cfg, spec, launch_layout(cfg))
    backend.load_weights(init_weights(spec, cfg.seed))
    t = cfg.train
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, spec.vocab_size, (args.steps + 1, t.grad_accum, t.micro_batch_size, t.seq_len + 1)).astype(
        np.int32
    )
    times, outs = [], []
    for i in range(args.steps + 1):
        ids, labels = tokens[i, ..., :-1], tokens[i, ..., 1:]
        t0 = time.perf_counter()
        outs.append(backend.train_step(ids, labels, step_scalars(i + 1, t.steps, cfg.optim, labels.size)))
        times.append(time.perf_counter() - t0)
    step_s = statistics.median(times[1:])

    flops_tok, peak, proc = flops_per_token(spec, t.seq_len), peak_flops("cpu"), psutil.Process()
    with tempfile.TemporaryDirectory() as tmp:
        logger = MetricsLogger([JsonlSink(Path(tmp) / "metrics.jsonl"), TensorBoardSink(Path(tmp) / "tb")])
        health = HealthMonitor(cfg.monitor.health, cfg.optim.warmup_steps)
        t0 = time.perf_counter()
        for n in range(args.records):
            out = outs[n % len(outs)]
            record = {
                "step": n + 1,
                "loss": out.loss,
                "lr": 1e-3,
                "grad_norm": out.grad_norm,
                "applied": True,
                "tokens": ids.size,
                "valid_tokens": ids.size,
                "tokens_per_s": ids.size / step_s,
                "step_time_s": step_s,
                "data_time_s": 1e-4,
                "model_tflops_per_s": 0.1,
                "consumed_samples": n,
                "rss_mb": proc.memory_info().rss / 2**20,
                "copy_fraction": float((labels == ids).mean()),
                "mfu": mfu(flops_tok, ids.size / step_s, peak),
            }
            logger.log(record)
            for event in health.observe(record):
                logger.log(event.to_dict())
        per_step = (time.perf_counter() - t0) / args.records
        t0 = time.perf_counter()
        before = backend.weights()
        after = backend.weights()
        logger.log(
            {
                "step": 1,
                "layer_weight_norm": layer_weight_norms(after),
                "layer_update_ratio": layer_update_ratios(before, after),
                "layer_grad_norm": layer_grad_norms(list(parameter_shapes(spec)), outs[-1].grad_sq),
            }
        )
        detail = time.perf_counter() - t0
        logger.close()
    every = cfg.monitor.detail_every
    result = {
        "engine": args.engine, "step_s": round(step_s, 4), "per_step_metrics_s": round(per_step, 6),
        "per_step_overhead": round(per_step / step_s, 5), "detail_s": round(detail, 4), "detail_every": every,
        "detail_overhead_amortized": round(detail / every / step_s, 5) if every else 0.0,
    }
    print(f"step {step_s * 1000:.1f} ms ({args.engine}, demo model); per-step metrics path {per_step * 1000:.3f} ms "
          f"= {result['per_step_overhead']:.2%} of a step; per-layer detail {detail * 1000:.1f} ms every {every} steps "
          f"= {result['detail_overhead_amortized']:.2%} amortized")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
