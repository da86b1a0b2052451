"""Generation tokens/s with the key/value cache vs re-running a fixed window per token, on both engines.

    .venv/bin/python bench/generate_throughput.py [--config configs/demo.yaml] [--prompt 32] [--new 128]

The demo model with its initial weights (the speed does not depend on the values). "cached" is
`mindfoundry.eval.sampling.generate` (prefill once, then one cached step per token); "window" is
the previous implementation: every token re-runs the forward pass over a fixed window of
prompt + new tokens, padded (one compiled shape). Both decode greedily; the script checks that
they produce the same tokens, then prints tokens/s and the ratio. The first call of each path
(compilation) is left out of the timing.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from mindfoundry.backends.base import create_backend
from mindfoundry.config.load import load_config
from mindfoundry.eval.sampling import generate
from mindfoundry.model.spec import ModelSpec, init_weights
from mindfoundry.parallel.layout import launch_layout


def window_greedy(backend, prompt: list[int], new: int, window: int) -> list[int]:
    tokens, out = list(prompt), []
    for _ in range(new):
        buf = np.zeros((1, window), np.int32)
        buf[0, : len(tokens)] = tokens
        nxt = int(np.argmax(backend.logits(buf)[0, len(tokens) - 1]))
        tokens.append(nxt)
        out.append(nxt)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/demo.yaml")
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--new", type=int, default=128)
    args = ap.parse_args()
    for engine in ("mindspore", "torch"):
        cfg = load_config(args.config, [f"backend={engine}"])
        spec = ModelSpec.from_config(cfg.model)
        backend = create_backend(cfg, spec, launch_layout(cfg))
        backend.load_weights(init_weights(spec, cfg.seed))
        prompt = np.random.default_rng(0).integers(2, spec.vocab_size, args.prompt).tolist()
        window = args.prompt + args.new

        def cached(n: int) -> list[int]:
            return generate(backend, prompt, max_seq_len=spec.max_seq_len, max_new_tokens=n, temperature=0, top_k=0,
                            eos_id=-1, seed=0)

        cached(2), window_greedy(backend, prompt, 2, window)  # compile both paths
        t0 = time.perf_counter()
        a = cached(args.new)
        t_cached = time.perf_counter() - t0
        t0 = time.perf_counter()
        b = window_greedy(backend, prompt, args.new, window)
        t_window = time.perf_counter() - t0
        print(
            json.dumps(
                {
                    "engine": engine,
                    "prompt_tokens": args.prompt,
                    "new_tokens": args.new,
                    "same_tokens": a == b,
                    "cached_tokens_per_s": round(args.new / t_cached, 1),
                    "window_tokens_per_s": round(args.new / t_window, 1),
                    "speedup": round(t_window / t_cached, 2),
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
