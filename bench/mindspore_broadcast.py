"""What a broadcasting binary op costs in a compiled MindSpore graph on CPU, against broadcasting first (Tile).

    .venv/bin/python bench/mindspore_broadcast.py [--chain 40] [--rows 4096] [--cols 2048]

Each variant is one jit-compiled Cell that applies the same op ``--chain`` times to a (rows, cols) float32
tensor, in a process of its own (a fresh memory pool), and reports the resident memory its first call
added (VmRSS after minus before: what the graph holds while it runs) and the fastest of 5 later calls.
The variants differ only in how the (rows, 1) operand meets the (rows, cols) one:

- ``equal``: ``x + y`` on two (rows, cols) tensors (the reference: buffers reused along the chain);
- ``broadcast``: ``x + c``, c (rows, 1), broadcast by the Add kernel itself;
- ``broadcast_to`` / ``tile``: c made (rows, cols) first by ``ops.broadcast_to`` / ``ops.tile``, then ``x + C``;
- ``transpose``: ``x.transpose(1, 0)`` chained (the Transpose kernel, for comparison).

The results are bit-identical between broadcast, broadcast_to and tile (a broadcast copies values); this
is why the engine's model tiles before every binary op on unequal shapes (backends/mindspore/layers.py
``expand``). Prints a table and a JSON line.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

VARIANTS = ["equal", "broadcast", "broadcast_to", "tile", "transpose"]


def run_variant(name: str, chain: int, rows: int, cols: int) -> dict:
    """(this process) compile and run one variant; its memory and time."""
    import time

    import mindspore as ms
    import numpy as np
    from mindspore import Tensor, nn, ops

    from memory import proc_status  # bench/memory.py: this script's folder is on sys.path

    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")

    class Chain(nn.Cell):
        def construct(self, x, y, c):
            for _ in range(chain):
                if name == "equal":
                    x = x + y
                elif name == "broadcast":
                    x = x + c
                elif name == "broadcast_to":
                    x = x + ops.broadcast_to(c, x.shape)
                elif name == "tile":
                    x = x + ops.tile(c, (1, x.shape[1]))
                else:
                    x = x.transpose(1, 0).reshape(rows, cols)
            return x

    rng = np.random.default_rng(0)
    x, y = (Tensor(rng.standard_normal((rows, cols), dtype=np.float32)) for _ in range(2))
    c = Tensor(rng.standard_normal((rows, 1), dtype=np.float32))
    cell = Chain()
    before = proc_status("VmRSS")
    out = cell(x, y, c).asnumpy()
    held = proc_status("VmRSS") - before
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        cell(x, y, c).asnumpy()
        times.append(time.perf_counter() - t0)
    return {
        "variant": name,
        "held_mib": held / 2**20,
        "ms": min(times) * 1e3,
        "checksum": float(out.astype(np.float64).sum()),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--chain", type=int, default=40)
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--cols", type=int, default=2048)
    ap.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)  # the worker's own call
    args = ap.parse_args(argv)
    if args.variant:
        print(json.dumps(run_variant(args.variant, args.chain, args.rows, args.cols)))
        return 0
    results = []
    for name in VARIANTS:
        proc = subprocess.run(
            [
                sys.executable,
                __file__,
                "--variant",
                name,
                "--chain",
                str(args.chain),
                "--rows",
                str(args.rows),
                "--cols",
                str(args.cols),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    size = args.rows * args.cols * 4 / 2**20
    print(f"{args.chain} chained ops on ({args.rows}, {args.cols}) float32 ({size:.0f} MiB per tensor)")
    print(f"{'variant':<14}{'held MiB':>10}{'x tensor':>10}{'ms':>9}  checksum")
    for r in results:
        print(
            f"{r['variant']:<14}{r['held_mib']:>10.0f}{r['held_mib'] / size:>10.1f}{r['ms']:>9.1f}  {r['checksum']:.6e}"
        )
    print(json.dumps({"chain": args.chain, "shape": [args.rows, args.cols], "results": results}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
