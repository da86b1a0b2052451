"""Where the MindSpore engine's resident memory goes: after import, build, graph compile, first and later steps (CPU).

    .venv/bin/python bench/mindspore_memory.py [--size large] [--graph full|grad|forward] [--set key=value ...]

Builds the engine as the trainer does (bench/peers.py's sizes), then compiles the train step on its
own (``TrainStep.compile``, then ``malloc_trim`` so that freed compiler memory is not counted) and
runs three steps, printing VmRSS after each phase, beside the planner's estimate for this engine
(dense attention scores, unfused RMSNorm, no vocab-parallel loss). ``--graph`` isolates parts of
the step: ``forward`` (the loss only), ``grad`` (loss and gradients, no update), ``full`` (the
trainer's step). One process per run; prints a final JSON line.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from memory import proc_status  # noqa: E402
from peers import ROOT, SIZES  # noqa: E402


def _rss_mib() -> float:
    return proc_status("VmRSS") / 2**20


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="large", choices=list(SIZES))
    ap.add_argument("--graph", default="full", choices=["full", "grad", "forward"])
    ap.add_argument("--set", action="append", default=[], help="extra config overrides, e.g. train.micro_batch_size=2")
    args = ap.parse_args(argv)

    import numpy as np
    from mindspore import ops

    from mindfoundry.backends.base import create_backend
    from mindfoundry.backends.mindspore.train_step import TrainStep, scalar, squared_norms
    from mindfoundry.config.load import load_config
    from mindfoundry.config.parallel_config import Layout
    from mindfoundry.model.spec import ModelSpec, init_weights
    from mindfoundry.parallel.layout import launch_layout
    from mindfoundry.parallel.planner import estimate
    from mindfoundry.train.schedule import step_scalars

    class GradOnly(TrainStep):
        def update(self, loss, grads, lr, step_size, bc2_sqrt, loss_limit, grad_limit, grad_unscale):
            grad_sq = squared_norms(grads)
            norm = ops.sqrt(grad_sq.sum())
            return loss, norm, norm > 0, grad_sq

    class ForwardOnly(TrainStep):
        def construct(self, ids, labels, scale, lr, step_size, bc2_sqrt, loss_limit, grad_limit, grad_unscale):
            loss = self.loss_cell(ids[0], labels[0], scale)
            return loss, loss, loss > 0, loss

    phases = {"import": _rss_mib()}
    cfg = load_config(
        ROOT / "configs" / "demo.yaml", SIZES[args.size] + args.set + ["backend=mindspore", "train.grad_accum=1"]
    )
    spec, t = ModelSpec.from_config(cfg.model), cfg.train
    backend = create_backend(cfg, spec, launch_layout(cfg))
    backend.load_weights(init_weights(spec, cfg.seed))
    step = backend.step_cell
    if args.graph != "full":
        step = {"grad": GradOnly, "forward": ForwardOnly}[args.graph](
            step.loss_cell, backend.optimizer, 1, backend.clip
        )
    phases["built"] = _rss_mib()
    rng = np.random.default_rng(cfg.seed)
    ids = rng.integers(0, spec.vocab_size, size=(1, t.micro_batch_size, t.seq_len)).astype(np.int32)
    sc = step_scalars(1, 1000, cfg.optim, valid_tokens=ids.size)
    from mindspore import Tensor

    inputs = (
        Tensor(ids),
        Tensor(ids),
        scalar(sc.loss_scale),
        scalar(sc.lr),
        scalar(sc.step_size),
        scalar(sc.bias_correction2_sqrt),
        scalar(sc.loss_limit),
        scalar(sc.grad_limit),
        scalar(sc.grad_unscale),
    )
    step.compile(*inputs)
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    phases["compiled"] = _rss_mib()
    for i in range(1, 4):
        step(*inputs)[0].asnumpy()
        phases[f"step {i}"] = _rss_mib()
    est = estimate(spec, Layout(), t.micro_batch_size, t.seq_len, t.precision, flash_attention=False, fused_norm=False,
                   vocab_parallel_loss=False)
    print(
        f"size {args.size} {' '.join(args.set)}, graph {args.graph}: "
        + ", ".join(f"{k} {v:.0f}" for k, v in phases.items())
        + f" MiB; planner total {est.total / 2**20:.0f} MiB (activations {est.activations / 2**20:.0f}, "
        f"weights+grads+AdamW {est.model_states / 2**20:.0f}, fixed overhead {est.overhead / 2**20:.0f})"
    )
    print(json.dumps({"size": args.size, "graph": args.graph, "rss_mib": phases, "planned": est.to_dict()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
