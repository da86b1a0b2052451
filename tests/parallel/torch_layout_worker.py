"""One rank of a multi-process torch run; test_torch_layouts.py launches it and checks what it writes.

    torchrun --standalone --nproc_per_node=N tests/parallel/torch_layout_worker.py OUT_DIR JOBS_JSON

JOBS_JSON is a list of jobs run one after the other in the same processes, each
``{"name", "parallel": {...}, "model": {...}, "first": 1, "last": 5, "load": NAME|null, "save": bool}``:
train steps first..last of tiny models in that layout through the Backend interface, as the
Trainer does (TrainLoader's per-rank slice of each global batch, the valid-token count summed
over ranks with ``global_sum``), then evaluate. Every layout trains on the same global batches
(GLOBAL_MICRO sequences per micro-batch, split over the dp ranks), so one single-process run
(:func:`train` with no parallel section) is the reference for all of them.

A job ``{"kind": "trainer", "config": RunConfig dict}`` runs the whole Trainer instead (rank 0
writes the run directory).

Rank 0 writes OUT_DIR/NAME/{result.json, weights.npz, optimizer.npz (with save), logits.npy,
boundaries.npz (module_outputs)};
every rank writes digest_RANK.json (hash of its local shards, its mesh coordinate, hash of the
full weights it gathered, the names and global shapes of the parameters it holds: all of them, or
under pipeline parallelism its stages' ones).
"""

from __future__ import annotations

import gc
import hashlib
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for mf_testing

from mf_testing import ArraySource, padded_markov_samples, tiny_config  # noqa: E402
from mindfoundry.data.dataset.loader import TrainLoader  # noqa: E402
from mindfoundry.data.dataset.masking import MaskingRule  # noqa: E402
from mindfoundry.data.dataset.packing import IGNORE_INDEX  # noqa: E402
from mindfoundry.model.spec import PAD_ID, ModelSpec, init_weights  # noqa: E402
from mindfoundry.parallel.layout import launch_layout  # noqa: E402
from mindfoundry.train.schedule import step_scalars  # noqa: E402

VOCAB, SEQ, ACCUM, GLOBAL_MICRO, TOTAL_STEPS = 300, 16, 2, 4, 5
GLOBAL_BATCH = GLOBAL_MICRO * ACCUM  # sequences per optimizer step, whatever the layout


def samples(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    return padded_markov_samples(n, VOCAB, SEQ, seed)


TRAIN = ArraySource(*samples(GLOBAL_BATCH * TOTAL_STEPS))
EVAL_IDS, EVAL_LABELS = samples(4, seed=1)  # 4 rows: split over 2 or 4 dp ranks
# model.objective: mlm -- the same streams padded with PAD_ID (hidden keys), masked by position: ids 0, 1 and the last
# are the special tokens (EOS, PAD, mask)
MLM_RULE = MaskingRule(VOCAB - 1, np.array([0, PAD_ID, VOCAB - 1]), np.arange(2, VOCAB - 1), 0.15, 0.8, 0.1, seed=5)
MLM_TRAIN = ArraySource(np.where(TRAIN.labels == IGNORE_INDEX, PAD_ID, TRAIN.ids), TRAIN.labels)
MLM_EVAL = MLM_RULE.apply(np.where(EVAL_LABELS == IGNORE_INDEX, PAD_ID, EVAL_IDS), np.arange(4))


def make_backend(parallel: dict | None = None, model: dict | None = None, memory: dict | None = None):
    from mindfoundry.backends.torch.backend import TorchBackend

    dp = (parallel or {}).get("dp_replicate", 1) * (parallel or {}).get("dp_shard", 1)
    cfg = tiny_config(
        train={"micro_batch_size": GLOBAL_MICRO // dp, "grad_accum": ACCUM, "seq_len": SEQ},
        model=model or {},
        parallel=parallel or {},
        memory=memory or {},
    ).model_copy(update={"backend": "torch"})
    spec = ModelSpec.from_config(cfg.model)
    return TorchBackend(cfg, spec, launch_layout(cfg)), cfg, spec


def train(backend, cfg, first: int, last: int) -> dict:
    """Steps first..last on this rank's slices; the losses and norms every rank sees."""
    dp_rank, dp_size = getattr(backend, "dp_rank", 0), getattr(backend, "dp_size", 1)
    mlm = cfg.model.objective == "mlm"
    loader = TrainLoader(MLM_TRAIN if mlm else TRAIN, micro_batch_size=GLOBAL_MICRO // dp_size, grad_accum=ACCUM,
                         dp_rank=dp_rank, dp_size=dp_size, prefetch=0, masking=MLM_RULE if mlm else None)
    assert loader.global_batch == GLOBAL_BATCH
    out: dict = {"loss": [], "grad_norm": [], "applied": [], "grad_sq": [], "valid": []}
    for t in range(first, last + 1):
        batch = loader.batch((t - 1) * GLOBAL_BATCH)
        local = float((batch.labels != IGNORE_INDEX).sum())
        valid = int(backend.global_sum(local)) if hasattr(backend, "global_sum") else int(local)
        step = backend.train_step(batch.input_ids, batch.labels, step_scalars(t, TOTAL_STEPS, cfg.optim, valid))
        out["loss"].append(step.loss)
        out["grad_norm"].append(step.grad_norm)
        out["applied"].append(step.applied)
        out["grad_sq"].append(step.grad_sq.tolist())
        out["valid"].append(valid)
    out["eval"] = list(backend.eval_batch(*(MLM_EVAL if mlm else (EVAL_IDS, EVAL_LABELS))))
    return out


def eval_ids(cfg) -> np.ndarray:
    """Two rows for logits and module outputs (mlm: masked, with hidden padding keys)."""
    return (MLM_EVAL[0] if cfg.model.objective == "mlm" else EVAL_IDS)[:2]


def _digest(arrays) -> str:
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def run_job(job: dict, out_dir: Path) -> None:
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    backend, cfg, spec = make_backend(job["parallel"], job.get("model"), job.get("memory"))  # joins the process group
    rank = dist.get_rank()
    if job.get("load"):
        src = out_dir / job["load"]
        backend.load_weights(dict(np.load(src / "weights.npz")))
        backend.load_optimizer_state(dict(np.load(src / "optimizer.npz")), step=job["first"] - 1)
    else:
        backend.load_weights(init_weights(spec, 11))
    seen: list[int] = []  # sequence lengths the embedding saw in training and eval (S/cp under context parallelism)
    embed = getattr(backend.model, "embed", None)  # rank 0 has it (a later pipeline stage may not)
    hook = embed.register_forward_pre_hook(lambda _m, args: seen.append(int(args[0].shape[-1]))) if embed else None
    result = train(backend, cfg, job["first"], job["last"])
    if hook is not None:
        hook.remove()
    result["seq_seen"] = sorted(set(seen))
    shapes = {n: list(p.shape) for n, p in backend.model.named_parameters()}  # after TP/FSDP/PP: global shapes
    ids = eval_ids(cfg)
    logits = backend.logits(ids)
    boundaries = backend.module_outputs(ids)  # embed, blocks, final norm: gathered to full arrays
    weights = backend.weights()  # collective
    optimizer = backend.optimizer_state() if job.get("save") else None  # collective
    local = [(p.to_local() if isinstance(p, DTensor) else p).detach().cpu().numpy() for p in backend.params.values()]
    mesh = backend.mesh
    digest = {"rank": rank, "dims": list(mesh.mesh_dim_names), "coord": mesh.get_coordinate(),
              "local": _digest(local), "full": _digest(weights[n] for n in sorted(weights)), "shapes": shapes}
    folder = out_dir / job["name"]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"digest_{rank}.json").write_text(json.dumps(digest))
    if rank == 0:
        np.savez(folder / "weights.npz", **weights)
        if optimizer is not None:
            np.savez(folder / "optimizer.npz", **optimizer)
        np.save(folder / "logits.npy", logits)
        np.savez(folder / "boundaries.npz", **boundaries)
        (folder / "result.json").write_text(json.dumps(result))
    dist.barrier()  # the next job may load what rank 0 just wrote
    del backend
    gc.collect()


def run_trainer(job: dict) -> None:
    """The whole Trainer (data loader, eval, metrics, checkpoints) on every rank, from a prepared tiny run."""
    import mindfoundry.train.trainer as trainer_mod
    from mindfoundry.config.schema import RunConfig
    from mindfoundry.data.dataset.prepared import load_prepared

    cfg = RunConfig.model_validate(job["config"])
    data = load_prepared(cfg.data.output_dir, cfg.model.vocab_size)
    trainer_mod.Trainer(cfg, data, Path(cfg.run_dir), launch_layout(cfg)).run()


def main() -> None:
    import torch.distributed as dist

    out_dir, jobs = Path(sys.argv[1]), json.loads(sys.argv[2])
    for job in jobs:
        if job.get("kind") == "trainer":
            run_trainer(job)
        else:
            run_job(job, out_dir)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
