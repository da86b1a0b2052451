"""The fastest a training step can be on this machine: its matrix multiplies alone, timed shape by shape (CPU).

    .venv/bin/python bench/gemm_ceiling.py [--size large] [--threads 2] [--repeats 15] [--runtime mindspore torch]

Every GEMM of one training step of the bench size (bench/peers.py's SIZES: forward x W^T, the two backward
products dX = dY W and dW = dY^T X of each projection and the tied head; the attention core's QK^T and PV and
their four backward products, batched over every sequence and head), with the transposes the engines' kernels
use, timed one shape at a time in each runtime (MindSpore's compiled, as in its engine) with the thread count
pinned (the fastest of --repeats after a warm-up: on this shared machine a kernel's time moves 2x between repeats).
Their sum is the step time if everything else (softmax, norms, RoPE, the loss, AdamW, the host) took no time at all, so

    MFU ceiling = model FLOPs per step / (GEMM-only step time * sustained GEMM peak)

bounds any engine on this machine from above, and a naive loop's measured step time / 2 below the GEMM-only
time means "twice as fast as that loop" cannot be reached with these kernels. The peak is bench/peers.py's
(best sustained window of a 2048^3 matmul per runtime, the best runtime). Prints a table and a JSON line.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from peers import SIZES, _gemm, _pin_threads, pinned_env  # bench/ is on sys.path when run as a script

ROOT = Path(__file__).resolve().parent.parent


def step_gemms(size: str) -> tuple[list[tuple[str, int, tuple[int, int, int], str]], int, dict]:
    """[(what, count, (m, k, n), transposes)] of one training step, the model FLOPs of that step, and the shapes.

    `transposes` is "nt" for A @ B^T, "nn" for A @ B, "tn" for A^T @ B; a count is how many batched products of
    that shape the step runs (per layer; attention products are batched over every sequence and head)."""
    sys.path.insert(0, str(ROOT / "src"))
    from mindfoundry.config.load import load_config
    from mindfoundry.model.spec import ModelSpec, flops_per_token

    cfg = load_config(ROOT / "configs" / "demo.yaml", SIZES[size])
    spec = ModelSpec.from_config(cfg.model)
    b, s, d, L = cfg.train.micro_batch_size * cfg.train.grad_accum, cfg.train.seq_len, spec.d_model, spec.n_layers
    m, hd = b * s, spec.head_dim
    linears = [
        ("q_proj", d, spec.n_heads * hd),
        ("k_proj", d, spec.n_kv_heads * hd),
        ("v_proj", d, spec.n_kv_heads * hd),
        ("o_proj", spec.n_heads * hd, d),
        ("gate_proj", d, spec.ffn_dim),
        ("up_proj", d, spec.ffn_dim),
        ("down_proj", spec.ffn_dim, d),
    ]
    out = []
    for name, i, o in linears + [("head", d, spec.vocab_size)]:
        count = 1 if name == "head" else L
        out += [(f"{name} forward", count, (m, i, o), "nt"), (f"{name} dX", count, (m, o, i), "nn"),
                (f"{name} dW", count, (o, m, i), "tn")]
    heads = b * spec.n_heads  # one batched product per layer over every (sequence, head)
    out += [(f"scores QK^T [{heads}]", L, (s, hd, s), "nt"), (f"probs @ V [{heads}]", L, (s, s, hd), "nn"),
            (f"dP = dO V^T [{heads}]", L, (s, hd, s), "nt"), (f"dV = P^T dO [{heads}]", L, (s, s, hd), "tn"),
            (f"dQ = dS K [{heads}]", L, (s, s, hd), "nn"), (f"dK = dS^T Q [{heads}]", L, (s, s, hd), "tn")]
    shape = {"batch": b, "seq": s, "d_model": d, "layers": L, "heads": spec.n_heads, "kv_heads": spec.n_kv_heads,
             "ffn": spec.ffn_dim, "vocab": spec.vocab_size}
    return out, flops_per_token(spec, s) * b * s, shape


def time_gemm(runtime: str, mkn: tuple[int, int, int], transposes: str, repeats: int, batch: int = 1) -> float:
    """Fastest seconds over `repeats` of one (m, k) x (k, n) product laid out as `transposes` says (`batch` of them in
    one batched kernel): the best case, so that the sum bounds a step from below however busy the machine is.
    MindSpore's runs as a compiled graph (GRAPH_MODE, as in the engine): eager ops pay milliseconds of dispatch each."""
    import numpy as np

    m, k, n = mkn
    rng = np.random.default_rng(0)
    lead = (batch,) if batch > 1 else ()
    a = rng.standard_normal(lead + ((k, m) if transposes[0] == "t" else (m, k)), dtype=np.float32)
    b = rng.standard_normal(lead + ((n, k) if transposes[1] == "t" else (k, n)), dtype=np.float32)
    if runtime == "torch":
        import torch

        ta, tb = torch.from_numpy(a), torch.from_numpy(b)
        ta = ta.transpose(-1, -2) if transposes[0] == "t" else ta
        tb = tb.transpose(-1, -2) if transposes[1] == "t" else tb
        run = lambda: torch.matmul(ta, tb)  # noqa: E731
        sync = lambda out: None  # noqa: E731  torch's CPU kernels return when done
    else:
        import mindspore as ms
        from mindspore import nn, ops

        flags = {"transpose_a": transposes[0] == "t", "transpose_b": transposes[1] == "t"}

        class Product(nn.Cell):
            def __init__(self):
                super().__init__()
                self.kernel = ops.BatchMatMul(**flags) if batch > 1 else ops.MatMul(**flags)

            def construct(self, x, y):
                return self.kernel(x, y)

        ms.set_context(mode=ms.GRAPH_MODE)
        product, ma, mb = Product(), ms.Tensor(a), ms.Tensor(b)
        run = lambda: product(ma, mb)  # noqa: E731
        sync = lambda out: ms.runtime.synchronize()  # noqa: E731
    sync(run())
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        sync(run())
        times.append(time.perf_counter() - t0)
    return min(times)


def _batch(what: str) -> int:
    """The batch of an attention product ("scores QK^T [32]" -> 32), 1 for a projection."""
    return int(what.rsplit("[", 1)[1].rstrip("]")) if what.endswith("]") else 1


def worker(runtime: str, size: str, threads: int, repeats: int) -> None:
    _pin_threads(runtime, threads)
    if runtime == "mindspore":
        import mindspore as ms

        ms.set_device("CPU")
    gemms, flops, _ = step_gemms(size)
    rows = [{"what": what, "count": count, "mkn": mkn, "seconds": time_gemm(runtime, mkn, tr, repeats, _batch(what))}
            for what, count, mkn, tr in gemms]
    peak = _gemm(runtime, 2048)
    print(json.dumps({"runtime": runtime, "rows": rows, "peak_gflops": peak, "flops": flops}))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="large", choices=list(SIZES))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--runtime", nargs="+", default=["mindspore", "torch"])
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.worker, args.size, args.threads, args.repeats)
        return 0
    env = pinned_env(args.threads)
    results = {}
    for runtime in args.runtime:  # one process each: no two runtimes' thread pools compete
        proc = subprocess.run(
            [
                sys.executable,
                __file__,
                "--worker",
                runtime,
                "--size",
                args.size,
                "--threads",
                str(args.threads),
                "--repeats",
                str(args.repeats),
            ],
            capture_output=True,
            text=True,
            env=env,
        )
        if proc.returncode:
            print(proc.stderr[-3000:], file=sys.stderr)
            return proc.returncode
        results[runtime] = json.loads(proc.stdout.strip().splitlines()[-1])
    gemms, flops, shape = step_gemms(args.size)
    peak = max(r["peak_gflops"] for r in results.values())
    peaks = ", ".join(f"{k} {v['peak_gflops']:.0f}" for k, v in results.items())
    print(f"size {args.size} {shape}, {flops / 1e9:.1f} GFLOP per step (model FLOPs), {args.threads} threads, "
          f"sustained GEMM peak {peak:.0f} GFLOP/s ({peaks})")
    print(f"{'GEMM (m, k, n)':44s}" + "".join(f"{r + ' ms x n':>20s}{'GFLOP/s':>9s}" for r in results))
    totals = {r: 0.0 for r in results}
    for i, (what, count, mkn, _) in enumerate(gemms):
        line = f"{what + ' ' + str(mkn):44s}"
        for r, res in results.items():
            sec = res["rows"][i]["seconds"]
            totals[r] += sec * count
            line += f"{sec * 1e3:>14.3f} x {count:<4d}{2 * _batch(what) * mkn[0] * mkn[1] * mkn[2] / sec / 1e9:>9.0f}"
        print(line)
    summary = {}
    for r, total in totals.items():
        ceiling = flops / (total * peak * 1e9)
        summary[r] = {"gemm_seconds": total, "mfu_ceiling": ceiling}
        print(f"{r}: GEMMs alone {total:.3f} s per step -> MFU ceiling {100 * ceiling:.1f}% of {peak:.0f} GFLOP/s")
    print(json.dumps({"size": args.size, "shape": shape, "flops": flops, "peak_gflops": peak, "threads": args.threads,
                      "summary": summary}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
