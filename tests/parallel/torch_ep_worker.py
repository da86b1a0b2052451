"""One rank of the torch mixture-of-experts runs under torchrun; test_torch_expert_parallel.py checks what it writes.

    torchrun --standalone --nproc_per_node=2 tests/parallel/torch_ep_worker.py OUT_DIR JOBS_JSON

JOBS_JSON is a list of ``{"name", "parallel": {...}}``. Each job trains the MoE model (MOE) for
STEPS AdamW steps through the Backend interface on the data of torch_layout_worker.py: MICRO
sequences per micro-batch on every rank, GLOBAL sequences per step (so each rank accumulates
GLOBAL / (MICRO * dp) micro-batches, and one process with GLOBAL / MICRO micro-batches sees the
same micro-batches: the load-balancing loss is per micro-batch). Rank 0 writes OUT_DIR/NAME/
{result.json, weights.npz, logits.npy}; every rank writes rank_RANK.json (how its experts are held,
and how many all-to-all exchanges ran).
"""

from __future__ import annotations

import gc
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # torch_layout_worker (and, through it, tests/)

import torch_layout_worker as layout_worker  # noqa: E402

from mindfoundry.data.dataset.loader import TrainLoader  # noqa: E402
from mindfoundry.data.dataset.packing import IGNORE_INDEX  # noqa: E402
from mindfoundry.model.spec import init_weights  # noqa: E402
from mindfoundry.train.schedule import step_scalars  # noqa: E402

MOE = {"moe": {"num_experts": 4, "top_k": 2}}
STEPS, MICRO, GLOBAL = 5, 2, 8


def make_backend(parallel: dict | None = None):
    """A torch backend for the MoE model with the initial weights loaded."""
    backend, cfg, spec = layout_worker.make_backend(parallel, MOE)
    backend.load_weights(init_weights(spec, 11))
    return backend, cfg, spec


def train(backend, cfg) -> dict:
    """STEPS steps on this rank's rows of each global batch; the global losses and norms, then evaluation."""
    dp_rank, dp_size = backend.dp_rank, backend.dp_size
    loader = TrainLoader(layout_worker.TRAIN, micro_batch_size=MICRO, grad_accum=GLOBAL // (MICRO * dp_size),
                         dp_rank=dp_rank, dp_size=dp_size, prefetch=0)
    out: dict = {"loss": [], "grad_norm": [], "applied": []}
    for t in range(1, STEPS + 1):
        batch = loader.batch((t - 1) * GLOBAL)
        valid = int(backend.global_sum(float((batch.labels != IGNORE_INDEX).sum())))
        step = backend.train_step(batch.input_ids, batch.labels, step_scalars(t, STEPS, cfg.optim, valid))
        out["loss"].append(step.loss)
        out["grad_norm"].append(step.grad_norm)
        out["applied"].append(step.applied)
    out["eval"] = list(backend.eval_batch(layout_worker.EVAL_IDS, layout_worker.EVAL_LABELS))
    return out


def _param_groups(module) -> list:
    """FSDP2's parameter groups of one fully_shard module (private API: one group, or a list in newer torch)."""
    state = module._get_fsdp_state()
    groups = getattr(state, "_fsdp_param_groups", None)
    return list(groups) if groups is not None else [g for g in [state._fsdp_param_group] if g is not None]


def _kind(placement) -> str:
    return "S0" if placement.is_shard(0) else "R" if placement.is_replicate() else str(placement)


def run_job(job: dict, out_dir: Path) -> None:
    import torch.distributed as dist
    from torch.distributed import _functional_collectives as funcol
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    from mindfoundry.backends.torch.model import GroupedLinear

    exchanges = [0]
    original = funcol.all_to_all_single_autograd

    def counted(*args, **kwargs):
        exchanges[0] += 1
        return original(*args, **kwargs)

    funcol.all_to_all_single_autograd = counted
    try:
        backend, cfg, _ = make_backend(job["parallel"])
        result = train(backend, cfg)
    finally:
        funcol.all_to_all_single_autograd = original
    rank = dist.get_rank()
    fsdp_managed = {id(fp.sharded_param) for m in backend.model.modules() if isinstance(m, FSDPModule)
                    for group in _param_groups(m) for fp in group.fsdp_params}
    experts = {}
    for name, module in backend.model.named_modules():
        if isinstance(module, GroupedLinear):
            w = module.weight
            experts[name] = {"dtensor": isinstance(w, DTensor), "fsdp": id(w) in fsdp_managed, "global": list(w.shape),
                             "local": list(w.to_local().shape if isinstance(w, DTensor) else w.shape),
                             "placements": [_kind(p) for p in w.placements] if isinstance(w, DTensor) else []}
    folder = out_dir / job["name"]
    folder.mkdir(parents=True, exist_ok=True)
    logits = backend.logits(layout_worker.EVAL_IDS[:2])  # collective
    weights = backend.weights()  # collective
    (folder / f"rank_{rank}.json").write_text(json.dumps({"experts": experts, "exchanges": exchanges[0]}))
    if rank == 0:
        np.savez(folder / "weights.npz", **weights)
        np.save(folder / "logits.npy", logits)
        (folder / "result.json").write_text(json.dumps(result))
    dist.barrier()
    del backend
    gc.collect()


def main() -> None:
    import torch.distributed as dist

    out_dir, jobs = Path(sys.argv[1]), json.loads(sys.argv[2])
    for job in jobs:
        run_job(job, out_dir)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
