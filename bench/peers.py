"""Our two engines against two plain loops on identical shapes, measured so that the ratios hold (CPU).

    .venv/bin/python bench/peers.py [--sizes demo peer large] [--pairs 7] [--warmup 2] [--threads 2]
                                    [--contenders mf-mindspore mf-torch naive-mindspore plain-torch mf-torch-compiled]

Contenders, each in a process of its own (so no two runtimes' thread pools compete):
- ``mf-mindspore`` / ``mf-torch``: MindFoundry's train step built as the trainer builds it
  (load_config -> ModelSpec -> create_backend -> load_weights -> backend.train_step).
- ``mf-torch-compiled`` (not in the default set): the torch engine with ``train.compile: true`` (torch.compile of the
  model; its first step includes Inductor's compile).
- ``naive-mindspore``: the tutorial-style MindSpore GPT loop (bench/naive_reference.py: MHA, GELU MLP,
  untied head, nn.AdamWeightDecay in TrainOneStepCell), on the same d_model / layers / heads / seq.
- ``plain-torch``: a nanoGPT-style PyTorch loop on our exact architecture (bench/plain_torch.py).

Method. Threads are pinned to ``--threads`` in every process (OMP/MKL env, torch.set_num_threads,
MindSpore runtime_num_threads) and reported. After ``--warmup`` untimed steps each (the first compiles
MindSpore's graph: its time is reported), the coordinator runs ``--pairs`` rounds; in each round every
contender runs one step while the others wait blocked, in a rotating order, so that load from other
jobs on a shared machine hits all alike. Ratios are taken per round (contender A's step time over B's in
the same round) and reported as median and range; step times as medians. The GEMM peak for MFU is
measured in the same run, before and after the steps, by numpy, torch and MindSpore (jit) with the
same thread count: 15 repeats of an n^3 fp32 matmul each, the rate of the best window of 5
consecutive repeats (sustained, not one lucky sample); the best method is the peak. Peak RSS
(VmHWM) of each process; the 1-minute load average before and after. Prints tables and a JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from memory import proc_status  # bench/memory.py: this script's folder is on sys.path

ROOT = Path(__file__).resolve().parent.parent
SIZES = {
    "demo": [],  # configs/demo.yaml: vocab 8192, d256, 4 layers, 8/4 heads, seq 128, micro-batch 16
    "peer": ["model.vocab_size=4096", "model.max_seq_len=256", "train.seq_len=256", "train.micro_batch_size=8"],
    "large": ["model.vocab_size=8192", "model.d_model=512", "model.n_layers=8", "model.n_heads=8", "model.n_kv_heads=4",
              "model.ffn_dim=1408", "model.max_seq_len=512", "train.seq_len=512", "train.micro_batch_size=4"],
}
CONTENDERS = ["mf-mindspore", "mf-torch", "naive-mindspore", "plain-torch"]
OPTIONAL = ["mf-torch-compiled"]
PAIRS = [("mf-mindspore", "mf-torch"), ("mf-mindspore", "naive-mindspore"), ("mf-torch", "plain-torch"),
         ("mf-mindspore", "plain-torch"), ("mf-torch-compiled", "plain-torch"), ("mf-torch-compiled", "mf-torch"),
         ("mf-mindspore", "mf-torch-compiled")]
#: contender -> extra config overrides of our engines
ENGINE_SETTINGS = {"mf-torch-compiled": ["train.compile=true"]}


def pinned_env(threads: int, **extra: str) -> dict[str, str]:
    """This process's environment for a bench worker: OpenMP and MKL pinned to `threads` (read when a runtime starts,
    so set before the worker process exists), plus `extra`."""
    return {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads), **extra}


def _pin_threads(name: str, threads: int) -> None:
    """The runtime's own thread count (the env of the process pins OpenMP/MKL as well)."""
    if "torch" in name:
        import torch

        torch.set_num_threads(threads)
    else:
        import mindspore as ms

        ms.set_context(runtime_num_threads=threads)


def _gemm(method: str, n: int, repeats: int = 15, window: int = 5) -> float:
    """Sustained GFLOP/s: the best median over `window` consecutive repeats of an n^3 fp32 matmul."""
    import numpy as np

    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((n, n), dtype=np.float32) for _ in range(2))
    if method == "numpy":
        run = lambda: a @ b  # noqa: E731
    elif method == "torch":
        import torch

        ta, tb = torch.from_numpy(a), torch.from_numpy(b)
        run = lambda: ta @ tb  # noqa: E731
    else:
        import mindspore as ms

        ma, mb = ms.Tensor(a), ms.Tensor(b)
        run = lambda: _ms_matmul(ma, mb).asnumpy()  # noqa: E731  asnumpy waits for the kernel
    run()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    best = min(statistics.median(times[i:i + window]) for i in range(repeats - window + 1))
    return 2.0 * n**3 / best / 1e9


def _ms_matmul(a, b):
    from mindspore import ops

    return ops.matmul(a, b)


def build_contender(name: str, size: str):
    """(step(i) -> loss, flops per token, tokens per step, parameters) of one contender."""
    import numpy as np

    from mindfoundry.config.load import load_config
    from mindfoundry.model.spec import ModelSpec, flops_per_token, init_weights, num_parameters

    cfg = load_config(ROOT / "configs" / "demo.yaml",
                          SIZES[size] + [f"backend={name.split('-')[1]}"] + ENGINE_SETTINGS.get(name, []))
    spec, t = ModelSpec.from_config(cfg.model), cfg.train
    mb, seq = t.micro_batch_size, t.seq_len
    rng = np.random.default_rng(cfg.seed)
    ids = rng.integers(0, spec.vocab_size, size=(4, 1, mb, seq), dtype=np.int64)
    labels = rng.integers(0, spec.vocab_size, size=(4, 1, mb, seq), dtype=np.int64)
    tokens = mb * seq
    if name.startswith("mf-"):
        from mindfoundry.backends.base import create_backend
        from mindfoundry.parallel.layout import launch_layout
        from mindfoundry.train.schedule import step_scalars

        cfg = cfg.model_copy(update={"train": t.model_copy(update={"grad_accum": 1})})
        backend = create_backend(cfg, spec, launch_layout(cfg))
        backend.load_weights(init_weights(spec, cfg.seed))

        def step(i: int) -> float:
            k = i % 4
            return backend.train_step(
                ids[k], labels[k], step_scalars(i + 1, 1000, cfg.optim, valid_tokens=labels[k].size)
            ).loss

        return step, flops_per_token(spec, seq), tokens, num_parameters(spec)
    if name == "naive-mindspore":
        import mindspore as ms

        from naive_reference import build_train_net, naive_flops_per_token

        ms.set_context(mode=ms.GRAPH_MODE)
        ms.set_device("CPU")
        ms.set_seed(cfg.seed)
        net = build_train_net(spec.vocab_size, spec.d_model, spec.n_layers, spec.n_heads, seq)
        params = sum(int(np.prod(p.shape)) for p in net.network.trainable_params())

        def step(i: int) -> float:
            k = i % 4
            return float(net(ms.Tensor(ids[k, 0].astype(np.int32)), ms.Tensor(labels[k, 0].astype(np.int32))).asnumpy())

        return step, naive_flops_per_token(spec.vocab_size, spec.d_model, spec.n_layers, seq), tokens, params
    import torch

    from plain_torch import build, num_params

    model, plain_step = build(
        spec.vocab_size, spec.d_model, spec.n_layers, spec.n_heads, spec.n_kv_heads, spec.ffn_dim, seq
    )
    tids, tlabels = torch.from_numpy(ids), torch.from_numpy(labels)
    return (
        (lambda i: plain_step(tids[i % 4, 0], tlabels[i % 4, 0])),
        flops_per_token(spec, seq),
        tokens,
        num_params(model),
    )


def worker(name: str, size: str, threads: int, warmup: int) -> None:
    """One contender: build, warm up, then answer 'step' / 'gemm METHOD N' / 'quit' on stdin with JSON lines."""
    _pin_threads(name, threads)
    t0 = time.perf_counter()
    step, fpt, tokens, params = build_contender(name, size)
    build_s = time.perf_counter() - t0
    firsts = []
    for i in range(warmup):
        t0 = time.perf_counter()
        step(i)
        firsts.append(time.perf_counter() - t0)
    print(json.dumps({"ready": name, "build_s": build_s, "first_step_s": firsts[0], "flops_per_token": fpt,
                      "tokens": tokens, "params": params}), flush=True)
    i = warmup
    for line in sys.stdin:
        cmd = line.split()
        if cmd[0] == "step":
            t0 = time.perf_counter()
            loss = step(i)
            print(json.dumps({"s": time.perf_counter() - t0, "loss": loss}), flush=True)
            i += 1
        elif cmd[0] == "gemm":
            print(json.dumps({"gflops": _gemm(cmd[1], int(cmd[2]))}), flush=True)
        else:
            print(json.dumps({"hwm_mib": proc_status("VmHWM") / 2**20}), flush=True)
            return


class Contender:
    """The coordinator's handle on one worker process."""

    def __init__(self, name: str, size: str, threads: int, warmup: int):
        env = pinned_env(threads, GLOG_v="3", PYTHONPATH=str(ROOT / "src"))
        self.name = name
        self.proc = subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--worker",
                name,
                "--size",
                size,
                "--threads",
                str(threads),
                "--warmup",
                str(warmup),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            cwd=ROOT,
        )
        self.info = self._read()

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"{self.name} worker died (exit {self.proc.wait()}); rerun it alone to see its error")
        return json.loads(line)

    def ask(self, command: str) -> dict:
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> float:
        hwm = self.ask("quit")["hwm_mib"]
        self.proc.wait()
        return hwm


def gemm_peak(contenders: dict[str, Contender], n: int) -> dict[str, float]:
    """Sustained GEMM rate of each method, measured inside a worker that has that runtime loaded."""
    owners = {"numpy": next(iter(contenders.values()))}
    for name, c in contenders.items():
        owners.setdefault("torch" if "torch" in name else "mindspore", c)
    return {method: c.ask(f"gemm {method} {n}")["gflops"] for method, c in owners.items()}


def run_size(size: str, names: list[str], args) -> dict:
    load_before = os.getloadavg()[0]
    contenders = {}
    for name in names:  # built one at a time: compile times are not inflated by each other
        contenders[name] = Contender(name, size, args.threads, args.warmup)
    before = gemm_peak(contenders, args.gemm_size)
    times: dict[str, list[float]] = {n: [] for n in names}
    losses: dict[str, list[float]] = {n: [] for n in names}
    for r in range(args.pairs):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            got = contenders[name].ask("step")
            times[name].append(got["s"])
            losses[name].append(got["loss"])
    after = gemm_peak(contenders, args.gemm_size)
    gemm = {k: max(v, after[k]) for k, v in before.items()}
    peak = max(gemm.values())
    hwm = {name: c.close() for name, c in contenders.items()}
    load_after = os.getloadavg()[0]

    info = {n: contenders[n].info for n in names}
    step_s = {n: statistics.median(ts) for n, ts in times.items()}
    tps = {n: info[n]["tokens"] / step_s[n] for n in names}
    mfu = {n: info[n]["flops_per_token"] * tps[n] / (peak * 1e9) for n in names}
    ratios = {}
    for a, b in PAIRS:
        if a in names and b in names:  # tokens/s ratio per round (same tokens per step for all contenders)
            per_round = [(info[a]["tokens"] / ta) / (info[b]["tokens"] / tb) for ta, tb in zip(times[a], times[b])]
            ratios[f"{a} / {b}"] = {
                "median": statistics.median(per_round),
                "min": min(per_round),
                "max": max(per_round),
            }

    print(f"\n== size {size}: {' '.join(SIZES[size]) or 'configs/demo.yaml'}; {args.threads} threads per process, "
          f"{args.warmup} warmup + {args.pairs} rounds")
    print(f"GEMM {args.gemm_size}^3 fp32, sustained GFLOP/s before/after: "
          + ", ".join(f"{k} {before[k]:.0f}/{after[k]:.0f}" for k in gemm) + f"  -> peak {peak:.0f}")
    print(f"load average (1 min) before {load_before:.2f}, after {load_after:.2f}")
    hdr = (f"{'contender':<18} {'params':>11} {'GFLOP/tok':>9} {'step s':>8} {'tokens/s':>9} {'MFU':>6} "
           f"{'1st step s':>10} {'peak RSS MiB':>12}")
    print(hdr)
    print("-" * len(hdr))
    for n in names:
        print(
            f"{n:<18} {info[n]['params']:>11,} {info[n]['flops_per_token'] / 1e9:>9.4f} {step_s[n]:>8.3f} "
            f"{tps[n]:>9.0f} {mfu[n]:>6.1%} {info[n]['first_step_s']:>10.1f} {hwm[n]:>12.0f}"
        )
    for k, r in ratios.items():
        print(f"tokens/s {k}: {r['median']:.2f}x (range {r['min']:.2f}-{r['max']:.2f})")
    return {"size": size, "overrides": SIZES[size], "threads": args.threads, "pairs": args.pairs,
            "gemm_gflops": gemm, "gemm_before": before, "gemm_after": after, "peak_gflops": peak,
            "load_before": load_before, "load_after": load_after, "step_s": step_s, "tokens_per_s": tps, "mfu": mfu,
            "ratios": ratios, "peak_rss_mib": hwm, "info": info, "last_losses": {n: v[-1] for n, v in losses.items()}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", nargs="+", default=["demo", "peer", "large"], choices=list(SIZES))
    ap.add_argument("--contenders", nargs="+", default=CONTENDERS, choices=CONTENDERS + OPTIONAL)
    ap.add_argument("--pairs", type=int, default=7, help="timed rounds (each contender one step per round)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps per contender; the first compiles")
    ap.add_argument("--threads", type=int, default=2, help="threads per process, pinned in every runtime")
    ap.add_argument("--gemm-size", type=int, default=2048)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--size", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker(args.worker, args.size, args.threads, args.warmup)
        return 0
    if args.pairs < 1 or args.warmup < 1:
        ap.error("--pairs and --warmup must be >= 1 (the first step compiles)")
    results = [run_size(size, args.contenders, args) for size in args.sizes]
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
