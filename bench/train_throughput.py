"""Training throughput and MFU: MindFoundry on MindSpore and on PyTorch vs a naive tutorial loop (CPU).

    .venv/bin/python bench/train_throughput.py [--config configs/demo.yaml] [--steps N] [--warmup N] [--set key=value
    ...]

1. Measures this machine's fp32 GEMM peak in the same run (numpy, MindSpore eager and jit matmul,
   before and after the training steps; the best median is the peak used for MFU).
2. Times MindFoundry's train step built exactly as the trainer builds it (load_config -> ModelSpec ->
   create_backend -> load_weights(init_weights) -> backend.train_step), on the MindSpore backend and,
   when torch is installed, on the PyTorch backend (same model, same weights, same batches).
3. Times a naive tutorial-style MindSpore loop (bench/naive_reference.py) on the same sizes.

The steps are timed interleaved (one step of each engine in turn) so that load from other jobs on
a shared machine hits all alike; each figure is the median per-step time.
Prints a table and one final JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import mindspore as ms
import numpy as np
from mindspore import ops

sys.path.insert(0, str(Path(__file__).resolve().parent))  # for naive_reference when run as a script


def _median_time(fn, repeats: int) -> float:
    fn()  # warmup (and compile for jit)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _ms_matmul(a, b):
    return ops.matmul(a, b)


_ms_matmul_jit = ms.jit(_ms_matmul)  # one jit object, so the second measurement reuses the compiled graph


def measure_gemm_peak(n: int, repeats: int) -> dict[str, float]:
    """GFLOP/s of an n x n x n fp32 matmul: numpy, MindSpore PYNATIVE and MindSpore jit (GRAPH)."""
    flops = 2.0 * n * n * n
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    out = {"numpy": flops / _median_time(lambda: a @ b, repeats) / 1e9}

    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.set_device("CPU")
    ta, tb = ms.Tensor(a), ms.Tensor(b)

    # PYNATIVE launches asynchronously and ms.runtime.synchronize() is a no-op on CPU: asnumpy() waits
    # for the result (the 16 MB copy costs < 1 ms, measured).
    eager = lambda: _ms_matmul(ta, tb).asnumpy()  # noqa: E731
    graph = lambda: _ms_matmul_jit(ta, tb).asnumpy()  # noqa: E731

    out["mindspore_pynative"] = flops / _median_time(eager, repeats) / 1e9
    out["mindspore_jit"] = flops / _median_time(graph, repeats) / 1e9
    if _torch_available():
        import torch

        xa, xb = torch.from_numpy(a), torch.from_numpy(b)
        out["torch"] = flops / _median_time(lambda: xa @ xb, repeats) / 1e9
    return out


def _torch_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("torch") is not None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="configs/demo.yaml")
    ap.add_argument("--steps", type=int, default=20, help="timed steps per engine (default 20)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps per engine; the first compiles (default 3)")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="config override, e.g. --set train.micro_batch_size=8 (repeatable)")
    ap.add_argument("--gemm-size", type=int, default=2048, help="n for the n^3 fp32 GEMM peak (default 2048)")
    ap.add_argument("--gemm-repeats", type=int, default=5)
    args = ap.parse_args(argv)
    if args.steps < 1 or args.warmup < 1:
        ap.error("--steps and --warmup must be >= 1 (the first step compiles)")

    from mindfoundry.backends.base import create_backend
    from mindfoundry.config.load import load_config
    from mindfoundry.model.spec import ModelSpec, flops_per_token, init_weights, num_parameters
    from mindfoundry.parallel.layout import launch_layout
    from mindfoundry.train.schedule import step_scalars

    cfg = load_config(args.config, args.overrides)
    spec = ModelSpec.from_config(cfg.model)
    t = cfg.train
    accum, mb, seq = t.grad_accum, t.micro_batch_size, t.seq_len

    # 1. GEMM peak ---------------------------------------------------------------------------
    gemm_before = measure_gemm_peak(args.gemm_size, args.gemm_repeats)

    # 2. MindFoundry step, built as the trainer builds it -------------------------------------
    from naive_reference import build_train_net, naive_flops_per_token

    engines = {"mindspore": cfg} | (
        {"torch": cfg.model_copy(update={"backend": "torch"})} if _torch_available() else {}
    )
    backends, build_s = {}, {}
    for name, engine_cfg in engines.items():
        t0 = time.perf_counter()
        backends[name] = create_backend(
            engine_cfg, spec, launch_layout(engine_cfg)
        )  # the MindSpore one sets GRAPH_MODE
        backends[name].load_weights(init_weights(spec, cfg.seed))
        build_s[name] = time.perf_counter() - t0

    # 3. naive tutorial loop on the same sizes (one micro-batch per step, no accumulation) ----
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_seed(cfg.seed)  # the naive model uses MindSpore's own initializers
    naive = build_train_net(spec.vocab_size, spec.d_model, spec.n_layers, spec.n_heads, seq)

    rng = np.random.default_rng(cfg.seed)
    n_batches = 4
    ids = rng.integers(0, spec.vocab_size, size=(n_batches, accum, mb, seq), dtype=np.int32)
    labels = rng.integers(0, spec.vocab_size, size=(n_batches, accum, mb, seq), dtype=np.int32)

    def mf_step(backend):
        def run(step: int) -> float:
            k = step % n_batches
            return backend.train_step(
                ids[k], labels[k], step_scalars(step, cfg.train.steps, cfg.optim, valid_tokens=labels[k].size)
            ).loss

        return run

    def naive_step(step: int) -> float:
        k = step % n_batches
        loss = naive(ms.Tensor(ids[k, 0]), ms.Tensor(labels[k, 0].astype(np.int32)))
        return float(loss.asnumpy())

    steppers = {f"mf-{name}": mf_step(b) for name, b in backends.items()} | {"naive": naive_step}
    first = {}
    for name, fn in steppers.items():
        t0 = time.perf_counter()
        fn(1)
        first[name] = time.perf_counter() - t0
        for s in range(2, args.warmup + 1):
            fn(s)

    times: dict[str, list[float]] = {name: [] for name in steppers}
    losses: dict[str, list[float]] = {name: [] for name in steppers}
    for i in range(args.steps):
        step = args.warmup + 1 + i
        for name, fn in steppers.items():
            t0 = time.perf_counter()
            losses[name].append(fn(step))
            times[name].append(time.perf_counter() - t0)

    # Measure the GEMM peak again after the steps: other jobs on a shared machine depress single
    # samples, so each method keeps the better of its two medians and the best method is the peak.
    gemm_after = measure_gemm_peak(args.gemm_size, args.gemm_repeats)
    gemm = {k: max(v, gemm_after[k]) for k, v in gemm_before.items()}
    peak = max(gemm.values())
    peak_source = max(gemm, key=gemm.get)

    mf_fpt = flops_per_token(spec, seq)
    nv_fpt = naive_flops_per_token(spec.vocab_size, spec.d_model, spec.n_layers, seq)
    tokens = {name: (mb * seq if name == "naive" else accum * mb * seq) for name in steppers}
    fpt = {name: (nv_fpt if name == "naive" else mf_fpt) for name in steppers}
    step_s = {name: statistics.median(ts) for name, ts in times.items()}
    tps = {name: tokens[name] / step_s[name] for name in steppers}
    mfu = {name: fpt[name] * tps[name] / (peak * 1e9) for name in steppers}
    nv_params = sum(int(np.prod(p.shape)) for p in naive.network.trainable_params())
    labels_ = {"mf-mindspore": "MindFoundry MindSpore (Llama/GQA)", "mf-torch": "MindFoundry PyTorch (same model)",
               "naive": "naive MindSpore tutorial (GPT/MHA)"}

    # report ----------------------------------------------------------------------------------
    print(f"config {args.config} {' '.join(args.overrides)}".rstrip())
    print(f"sizes: vocab={spec.vocab_size} d_model={spec.d_model} n_layers={spec.n_layers} n_heads={spec.n_heads} "
          f"seq_len={seq} micro_batch={mb} grad_accum={accum}; {args.warmup} warmup + {args.steps} timed steps each, "
          f"interleaved, median")
    print()
    print(f"fp32 GEMM ({args.gemm_size}^3), median of {args.gemm_repeats}, measured before and after the steps:")
    for k, v in gemm.items():
        print(
            f"  {k:<20} {gemm_before[k]:8.1f} {gemm_after[k]:8.1f}  -> {v:8.1f} "
            f"GFLOP/s{'   <- peak' if k == peak_source else ''}"
        )
    print()
    hdr = (f"{'engine':<36} {'params':>10} {'GFLOP/tok':>10} {'tok/step':>9} {'step s':>8} {'min s':>7} "
           f"{'tokens/s':>9} {'MFU':>7} {'1st step s':>10}")
    print(hdr)
    print("-" * len(hdr))
    for name in steppers:
        params = nv_params if name == "naive" else num_parameters(spec)
        print(f"{labels_[name]:<36} {params:>10,} {fpt[name] / 1e9:>10.4f} {tokens[name]:>9} {step_s[name]:>8.3f} "
              f"{min(times[name]):>7.3f} {tps[name]:>9.0f} {mfu[name]:>6.1%} {first[name]:>10.1f}")
    print()
    for name in steppers:
        if name != "naive":
            print(f"tokens/s ratio {labels_[name]} / naive: {tps[name] / tps['naive']:.2f}x")
    if "mf-torch" in steppers:
        print(
            f"tokens/s ratio MindSpore / PyTorch backend: {tps['mf-mindspore'] / tps['mf-torch']:.2f}x; "
            f"last losses {losses['mf-mindspore'][-1]:.6f} vs {losses['mf-torch'][-1]:.6f} (same weights and batches)"
        )

    result = {
        "peak_gflops": round(peak, 2),
        "peak_source": peak_source,
        "gemm_gflops": {k: round(v, 2) for k, v in gemm.items()},
        "gemm_gflops_before_after": {k: [round(gemm_before[k], 2), round(gemm_after[k], 2)] for k in gemm},
        "tokens_per_s": {k: round(v, 1) for k, v in tps.items()},
        "step_s": {k: round(v, 4) for k, v in step_s.items()},
        "mfu": {k: round(v, 4) for k, v in mfu.items()},
        "flops_per_token": fpt,
        "ratio_vs_naive": {k: round(tps[k] / tps["naive"], 3) for k in steppers if k != "naive"},
        "build_s": {k: round(v, 2) for k, v in build_s.items()},
        "sizes": {
            "vocab_size": spec.vocab_size, "d_model": spec.d_model, "n_layers": spec.n_layers,
            "n_heads": spec.n_heads, "n_kv_heads": spec.n_kv_heads, "ffn_dim": spec.ffn_dim,
            "naive_ffn_dim": 4 * spec.d_model, "seq_len": seq, "micro_batch": mb, "grad_accum": accum,
        },
        "steps": args.steps,
        "warmup": args.warmup,
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
