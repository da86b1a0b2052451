"""Evaluation throughput (tokens/s) against the training step's, on the demo model, both engines.

    .venv/bin/python bench/eval_throughput.py [--config configs/demo.yaml] [--batches 20]

"eval" is `Backend.eval_batch` (the forward pass and the summed loss, no gradient: what held-out
evaluation and `mindfoundry eval` run), "train" is `Backend.train_step` (forward, backward, clip,
AdamW) on the same batch shape; both after one warm-up call (compilation). The ratio is the
figure that matters: evaluation should cost a fraction of training per token.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from mindfoundry.backends.base import create_backend
from mindfoundry.config.load import load_config
from mindfoundry.model.spec import ModelSpec, init_weights
from mindfoundry.parallel.layout import launch_layout
from mindfoundry.train.schedule import step_scalars


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/demo.yaml")
    ap.add_argument("--batches", type=int, default=20)
    args = ap.parse_args()
    for engine in ("mindspore", "torch"):
        cfg = load_config(args.config, [f"backend={engine}"])
        t, spec = cfg.train, ModelSpec.from_config(cfg.model)
        backend = create_backend(cfg, spec, launch_layout(cfg))
        backend.load_weights(init_weights(spec, cfg.seed))
        rng = np.random.default_rng(0)
        shape = (args.batches + 1, t.grad_accum, t.micro_batch_size, t.seq_len + 1)  # train_step's [accum, micro, seq]
        tokens = rng.integers(2, spec.vocab_size, shape).astype(np.int32)
        ids, labels = tokens[..., :-1], tokens[..., 1:]
        flat = (-1, t.seq_len)  # eval_batch takes [batch, seq]: the same tokens as one step
        scalars = step_scalars(1, t.steps, cfg.optim, int(labels[0].size))
        backend.eval_batch(ids[0].reshape(flat), labels[0].reshape(flat))
        backend.train_step(ids[0], labels[0], scalars)
        timings = {}
        for name, run in (("eval", lambda i: backend.eval_batch(ids[i].reshape(flat), labels[i].reshape(flat))),
                          ("train", lambda i: backend.train_step(ids[i], labels[i], scalars))):
            t0 = time.perf_counter()
            for i in range(1, args.batches + 1):
                run(i)
            timings[name] = args.batches * ids[0].size / (time.perf_counter() - t0)
        print(
            json.dumps(
                {
                    "engine": engine,
                    "tokens_per_batch": int(ids[0].size),
                    "eval_tokens_per_s": round(timings["eval"]),
                    "train_tokens_per_s": round(timings["train"]),
                    "eval_over_train": round(timings["eval"] / timings["train"], 2),
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
