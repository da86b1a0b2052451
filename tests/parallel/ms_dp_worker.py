"""One rank of an msrun data-parallel MindSpore run; test_mindspore_dp.py launches it and checks what it writes.

    msrun --worker_num=2 --local_worker_num=2 --master_port=PORT --log_dir=DIR --join=True \\
        tests/parallel/ms_dp_worker.py OUT_DIR

Trains a tiny model for TOTAL_STEPS AdamW steps (grad_accum=2, padded labels) through the Backend
interface, as the Trainer does: TrainLoader's per-rank slice of every global batch, the valid-token
count summed over the ranks with ``global_sum``. Every layout sees the same global batches
(GLOBAL_MICRO sequences per micro-batch, split over the dp ranks), so one single-process run
(:func:`train` in the test's own process) is the reference.

msrun also runs this script as its scheduler process, which exits inside ``communication.init()``
(called by the backend's constructor): nothing is written before that.

Every rank writes OUT_DIR/rank_R/{result.json, weights.npz, logits.npy}.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for mf_testing

from mf_testing import ArraySource, padded_markov_samples, tiny_config  # noqa: E402
from mindfoundry.data.dataset.loader import TrainLoader  # noqa: E402
from mindfoundry.data.dataset.packing import IGNORE_INDEX  # noqa: E402
from mindfoundry.model.spec import ModelSpec, init_weights  # noqa: E402
from mindfoundry.parallel.layout import launch_layout  # noqa: E402
from mindfoundry.train.schedule import step_scalars  # noqa: E402

VOCAB, SEQ, ACCUM, GLOBAL_MICRO, TOTAL_STEPS = 300, 16, 2, 4, 5
GLOBAL_BATCH = GLOBAL_MICRO * ACCUM  # sequences per optimizer step, whatever the layout
#: What msrun exports to its workers (measured with MindSpore 2.10); the test checks them.
MSRUN_VARIABLES = (
    "MS_ROLE",
    "MS_WORKER_NUM",
    "RANK_ID",
    "RANK_SIZE",
    "MS_NODE_ID",
    "DEVICE_ID",
    "MS_SCHED_HOST",
    "MS_SCHED_PORT",
)


def samples(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    return padded_markov_samples(n, VOCAB, SEQ, seed)


TRAIN = ArraySource(*samples(GLOBAL_BATCH * TOTAL_STEPS))
EVAL_IDS, EVAL_LABELS = samples(4, seed=1)  # 4 rows: split over the 2 dp ranks


def make_backend(parallel: dict | None = None):
    from mindfoundry.backends.mindspore.backend import MindSporeBackend

    dp = (parallel or {}).get("dp_replicate", 1)
    cfg = tiny_config(train={"micro_batch_size": GLOBAL_MICRO // dp, "grad_accum": ACCUM, "seq_len": SEQ},
                      parallel=parallel or {})
    spec = ModelSpec.from_config(cfg.model)
    return MindSporeBackend(cfg, spec, launch_layout(cfg)), cfg, spec


def train(backend, cfg) -> dict:
    """All steps on this rank's slices; the losses and norms every rank sees."""
    loader = TrainLoader(TRAIN, micro_batch_size=GLOBAL_MICRO // backend.dp_size, grad_accum=ACCUM,
                         dp_rank=backend.dp_rank, dp_size=backend.dp_size, prefetch=0)
    assert loader.global_batch == GLOBAL_BATCH
    out: dict = {"loss": [], "grad_norm": [], "applied": [], "grad_sq": [], "valid": [], "local_valid": []}
    for t in range(1, TOTAL_STEPS + 1):
        batch = loader.batch((t - 1) * GLOBAL_BATCH)
        local = float((batch.labels != IGNORE_INDEX).sum())
        valid = int(backend.global_sum(local))
        step = backend.train_step(batch.input_ids, batch.labels, step_scalars(t, TOTAL_STEPS, cfg.optim, valid))
        out["loss"].append(step.loss)
        out["grad_norm"].append(step.grad_norm)
        out["applied"].append(step.applied)
        out["grad_sq"].append(step.grad_sq.tolist())
        out["valid"].append(valid)
        out["local_valid"].append(int(local))
    out["eval"] = list(backend.eval_batch(EVAL_IDS, EVAL_LABELS))
    return out


def main() -> None:
    out_dir = Path(sys.argv[1])
    # gradients all-reduced in 3 fused groups (MindFormers' gradient_aggregation_group): the same sums
    backend, cfg, spec = make_backend(
        {"dp_replicate": 2, "grad_fusion_groups": 3}
    )  # msrun's scheduler process exits in here
    backend.load_weights(init_weights(spec, 11))
    result = train(backend, cfg)
    result["placement"] = {k: getattr(backend, k) for k in ("rank", "world_size", "dp_rank", "dp_size")}
    result["env"] = {k: os.environ.get(k) for k in MSRUN_VARIABLES}
    import mindspore as ms

    result["fusion"] = list(ms.get_auto_parallel_context("all_reduce_fusion_config"))
    # exact host sums through the real collective: a fraction and a count beyond float32's 2**24
    result["global_sum_fraction"] = backend.global_sum(0.25 + backend.rank)
    result["global_sum_large"] = backend.global_sum(float(2**40 + backend.rank))
    # rank 0's folder name reaches every rank (how semi-auto ranks learn where to write their checkpoint slices)
    from mindfoundry.backends.mindspore.distributed import broadcast_text

    result["broadcast"] = broadcast_text("/runs/ünï/.tmp-step_00000003-4242/model" if backend.rank == 0 else None)
    folder = out_dir / f"rank_{backend.rank}"
    folder.mkdir(parents=True, exist_ok=True)
    np.savez(folder / "weights.npz", **backend.weights())
    np.save(folder / "logits.npy", backend.logits(EVAL_IDS[:2]))
    (folder / "result.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
