"""Full vs sharded checkpoints under FSDP: save and load seconds, and each rank's peak memory.

    .venv/bin/python bench/sharded_checkpoint.py [--nproc 2] [--d-model 512] [--layers 8] [--vocab 8192]

For each format a fresh ``torchrun --nproc_per_node=N`` (gloo, CPU) builds the torch engine under
FSDP(N) and times, on every rank, one checkpoint through the Trainer's paths:

- full: ``weights()`` + ``optimizer_state()`` (all-gathers on every rank), rank 0 ``save_checkpoint``;
  load: ``load_checkpoint`` + ``load_weights`` + ``load_optimizer_state`` (every rank reads everything);
- sharded: ``save_checkpoint(writer=backend.save_sharded)`` (each rank writes its shards, rank 0 hashes
  and commits); load: ``load_sharded`` (each rank reads its pieces).

Save and load times include the sha256 manifest, the post-commit verification and fsyncs; load
excludes ``find_resumable``'s verification, which is the same for both. Peak RSS is the process's
high-water mark after the save and after the load, minus the mark before the first one.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def worker(fmt: str, root: Path, d_model: int, layers: int, vocab: int) -> None:
    import torch
    import torch.distributed as dist

    from mindfoundry.backends.torch.backend import TorchBackend
    from mindfoundry.checkpoint.directory import Retention, save_checkpoint
    from mindfoundry.checkpoint.reader import load_checkpoint
    from mindfoundry.checkpoint.store import shard_folders
    from mindfoundry.config.load import validate
    from mindfoundry.model.spec import ModelSpec, num_parameters
    from mindfoundry.parallel.layout import launch_layout

    world = int(os.environ["WORLD_SIZE"])
    cfg = validate(
        {
            "backend": "torch",
            "data": {"sources": [{"name": "c", "paths": ["x"]}]},
            "model": {"vocab_size": vocab, "d_model": d_model, "n_layers": layers, "n_heads": 8, "max_seq_len": 64},
            "train": {"micro_batch_size": 1, "seq_len": 16, "steps": 100},
            "parallel": {"dp_shard": world},
            "checkpoint": {"format": fmt},
        }
    )
    spec = ModelSpec.from_config(cfg.model)
    backend = TorchBackend(
        cfg, spec, launch_layout(cfg)
    )  # random init; nothing full-sized allocated before the measurement
    for p in backend.params.values():  # zero moments in the parameters' layout (local shards only)
        backend.optimizer.state[p] = {
            "step": torch.tensor(0.0),
            "exp_avg": torch.zeros_like(p),
            "exp_avg_sq": torch.zeros_like(p),
        }
    rank = dist.get_rank()
    dist.barrier()
    base = _peak_mb()
    t0 = time.perf_counter()
    if fmt == "sharded":
        if rank == 0:
            path = save_checkpoint(root, 1, None, None, {"adam_step": 1}, Retention(1), writer=backend.save_sharded)
        else:
            backend.save_sharded(None)
    else:
        weights, moments = backend.weights(), backend.optimizer_state()
        if rank == 0:
            path = save_checkpoint(root, 1, weights, moments, {"adam_step": 1}, Retention(1))
        del weights, moments
    dist.barrier()
    save_s, save_peak = time.perf_counter() - t0, _peak_mb() - base
    path = root / "checkpoints" / "step_00000001"
    t0 = time.perf_counter()
    if fmt == "sharded":
        backend.load_sharded(shard_folders(path), 1)
    else:
        ckpt = load_checkpoint(path, verify=False)
        backend.load_weights(ckpt.weights)
        backend.load_optimizer_state(ckpt.optimizer, 1)
        del ckpt
    dist.barrier()
    load_s, load_peak = time.perf_counter() - t0, _peak_mb() - base
    rows: list = [None] * world
    dist.all_gather_object(rows, {"save_s": round(save_s, 3), "load_s": round(load_s, 3),
                                  "peak_mb_after_save": round(save_peak), "peak_mb_after_load": round(load_peak)})
    if rank == 0:
        mb = sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 1e6
        print(
            json.dumps(
                {
                    "format": fmt,
                    "ranks": world,
                    "parameters": num_parameters(spec),
                    "checkpoint_mb": round(mb, 1),
                    "per_rank": rows,
                }
            )
        )
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--d-model", type=int, default=512)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--worker", nargs=2, metavar=("FORMAT", "ROOT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.worker[0], Path(args.worker[1]), args.d_model, args.layers, args.vocab)
        return
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    }
    env["OMP_NUM_THREADS"] = "1"
    for fmt in ("full", "sharded"):
        with tempfile.TemporaryDirectory() as root:
            cmd = [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                f"--nproc_per_node={args.nproc}",
                __file__,
                "--d-model",
                str(args.d_model),
                "--layers",
                str(args.layers),
                "--vocab",
                str(args.vocab),
                "--worker",
                fmt,
                root,
            ]
            out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
            if out.returncode:
                sys.exit(out.stdout + out.stderr)
            print([line for line in out.stdout.splitlines() if line.startswith("{")][-1])


if __name__ == "__main__":
    main()
