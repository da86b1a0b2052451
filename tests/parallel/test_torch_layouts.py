"""The torch engine's parallel layouts (DP, FSDP, TP, TP+SP, FSDP+TP, HSDP) train like one process.

Real ``torchrun`` processes on gloo (torch_layout_worker.py, two launches: one of 2 processes,
one of 4) train tiny models for 5 AdamW steps (grad_accum=2, padded labels) on the same global
batches as a single-process TorchBackend run in this process; losses, gradient norms, final
weights, evaluation and logits must agree. A checkpoint written through the Backend interface by
an FSDP run must continue identically under TP and in one process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")

import torch_layout_worker as worker  # noqa: E402  (this folder is on sys.path: rootdir-less test module)
from mindfoundry.model.spec import init_weights, parameter_shapes  # noqa: E402

pytestmark = pytest.mark.slow

WORKER = Path(__file__).with_name("torch_layout_worker.py")
UNTIED = {"tie_embeddings": False}
#: name: (processes, parallel section, model overrides)
LAYOUTS = {
    "dp": (2, {"dp_replicate": 2}, {}),
    "fsdp": (2, {"dp_shard": 2}, {}),
    "tp": (2, {"tp": 2, "sequence_parallel": False}, {}),
    "tp_sp": (2, {"tp": 2, "sequence_parallel": True}, UNTIED),  # untied: the separate lm_head is sharded too
    "fsdp_tp": (4, {"dp_shard": 2, "tp": 2}, {}),
    "hsdp": (4, {"dp_replicate": 2, "dp_shard": 2}, {}),
}
#: An FSDP(2) run saves full weights + moments after step 3; a TP(2) run loads them and trains steps 4-5.
CHECKPOINT_JOBS = [
    {"name": "ckpt_fsdp", "parallel": {"dp_shard": 2}, "first": 1, "last": 3, "save": True},
    {"name": "ckpt_tp", "parallel": {"tp": 2}, "first": 4, "last": 5, "load": "ckpt_fsdp"},
]


def launch(nproc: int, out: Path, jobs: list[dict]) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env["OMP_NUM_THREADS"] = "1"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           str(WORKER), str(out), json.dumps(jobs)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    if proc.returncode:
        pytest.fail(f"torchrun ({nproc} processes) failed:\n{(proc.stdout + proc.stderr)[-6000:]}")


def jobs_for(nproc: int) -> list[dict]:
    return [{"name": name, "parallel": parallel, "model": model, "first": 1, "last": worker.TOTAL_STEPS}
            for name, (n, parallel, model) in LAYOUTS.items() if n == nproc]


@pytest.fixture(scope="module")
def runs2(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("torch-layouts-2")
    launch(2, out, jobs_for(2) + CHECKPOINT_JOBS)
    return out


@pytest.fixture(scope="module")
def runs4(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("torch-layouts-4")
    launch(4, out, jobs_for(4))
    return out


_REFERENCES: dict[str, dict] = {}


def reference(model: dict) -> dict:
    """The single-process run (in this process) on the same global batches, cached per model variant."""
    key = json.dumps(model, sort_keys=True)
    if key not in _REFERENCES:
        backend, cfg, spec = worker.make_backend(model=model)
        assert backend.mesh is None
        backend.load_weights(init_weights(spec, 11))
        result = worker.train(backend, cfg, 1, worker.TOTAL_STEPS)
        _REFERENCES[key] = {"result": result, "weights": backend.weights(), "logits": backend.logits(worker.EVAL_IDS[:2]),
                            "boundaries": backend.module_outputs(worker.EVAL_IDS[:2]), "spec": spec}
    return _REFERENCES[key]


def rel(a, b) -> float:
    return float(np.max(np.abs(np.asarray(a, np.float64) / np.asarray(b, np.float64) - 1)))


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_layout_matches_one_process(name: str, request) -> None:
    nproc, parallel, model = LAYOUTS[name]
    folder = request.getfixturevalue(f"runs{nproc}") / name
    got = json.loads((folder / "result.json").read_text())
    ref = reference(model)
    want = ref["result"]

    # the data: the padding is there, and every rank added up the same global token count
    assert got["valid"] == want["valid"]
    assert max(want["valid"]) < worker.GLOBAL_BATCH * worker.SEQ
    assert want["loss"][-1] < want["loss"][0] - 0.3  # the model learns: a real curve, not noise
    assert all(got["applied"])

    weights = dict(np.load(folder / "weights.npz"))
    diffs = {
        "loss_rel": rel(got["loss"], want["loss"]),
        "grad_norm_rel": rel(got["grad_norm"], want["grad_norm"]),
        "grad_sq_rel": rel(got["grad_sq"], want["grad_sq"]),
        "weights_abs": max(float(np.abs(weights[k] - ref["weights"][k]).max()) for k in ref["weights"]),
        "eval_nll_rel": rel(got["eval"][0], want["eval"][0]),
        "logits_abs": float(np.abs(np.load(folder / "logits.npy") - ref["logits"]).max()),
        "module_outputs_abs": max(float(np.abs(v - ref["boundaries"][k]).max()) for k, v in np.load(folder / "boundaries.npz").items()),
    }
    print(f"\n{name} ({nproc} processes, {parallel}): " + ", ".join(f"{k}={v:.2e}" for k, v in diffs.items()))
    assert diffs["loss_rel"] < 1e-5
    assert diffs["grad_norm_rel"] < 1e-5
    assert diffs["grad_sq_rel"] < 1e-4
    assert diffs["weights_abs"] < 1e-4
    assert diffs["eval_nll_rel"] < 1e-5 and got["eval"][1] == want["eval"][1]
    assert diffs["logits_abs"] < 1e-4
    assert diffs["module_outputs_abs"] < 1e-4 and set(np.load(folder / "boundaries.npz")) == set(ref["boundaries"])

    # names and global shapes survive parallelize (checkpoints and dumps rely on them)
    assert {n: tuple(s) for n, s in got["shapes"].items()} == parameter_shapes(ref["spec"])
    assert list(weights) == list(ref["weights"])

    # every rank gathered the same full weights; replicas (ranks that differ only in dp_replicate) hold
    # identical local parameters, and FSDP ranks hold different shards
    digests = [json.loads((folder / f"digest_{r}.json").read_text()) for r in range(nproc)]
    assert len({d["full"] for d in digests}) == 1
    dims = digests[0]["dims"]
    by_place: dict[tuple, set] = {}
    for d in digests:
        place = tuple(c for dim, c in zip(dims, d["coord"]) if dim != "dp_replicate")
        by_place.setdefault(place, set()).add(d["local"])
    assert all(len(locals_) == 1 for locals_ in by_place.values())
    assert len(by_place) == nproc // parallel.get("dp_replicate", 1)
    if nproc // parallel.get("dp_replicate", 1) > 1:  # sharded over dp_shard or tp: the shards differ
        assert len({next(iter(v)) for v in by_place.values()}) == len(by_place)


def test_checkpoint_fsdp_to_tp_and_one_process(runs2: Path) -> None:
    """Full weights + moments saved by FSDP(2) after step 3 continue identically under TP(2) and in one process."""
    backend, cfg, _ = worker.make_backend()
    backend.load_weights(dict(np.load(runs2 / "ckpt_fsdp" / "weights.npz")))
    backend.load_optimizer_state(dict(np.load(runs2 / "ckpt_fsdp" / "optimizer.npz")), step=3)
    single = worker.train(backend, cfg, 4, 5)
    tp = json.loads((runs2 / "ckpt_tp" / "result.json").read_text())
    uninterrupted = reference({})["result"]
    final = backend.weights()
    diffs = {"tp_vs_single": rel(tp["loss"], single["loss"]),
             "single_vs_uninterrupted": rel(single["loss"], uninterrupted["loss"][3:]),
             "tp_weights_abs": max(float(np.abs(w - final[k]).max())
                                   for k, w in np.load(runs2 / "ckpt_tp" / "weights.npz").items())}
    print("\ncheckpoint FSDP(2) -> TP(2) / one process: " + ", ".join(f"{k}={v:.2e}" for k, v in diffs.items()))
    assert diffs["tp_vs_single"] < 1e-5
    assert diffs["single_vs_uninterrupted"] < 1e-5
    assert diffs["tp_weights_abs"] < 1e-4
    fsdp = json.loads((runs2 / "ckpt_fsdp" / "result.json").read_text())
    assert rel(fsdp["loss"], uninterrupted["loss"][:3]) < 1e-5


def test_trainer_under_torchrun_matches_one_process(tiny_prepared, tmp_path: Path) -> None:
    """The whole Trainer with FSDP(2) (per-rank loader slices, global token count, rank-0 metrics and
    checkpoints, collective state gathering, dp-split evaluation) logs what one process logs."""
    from mindfoundry.checkpoint.store import load_checkpoint
    from mindfoundry.train.metrics import read_metrics
    from mindfoundry.train.trainer import Trainer

    cfg, data = tiny_prepared
    cfg = cfg.model_copy(update={"backend": "torch"})
    single_dir, fsdp_dir = tmp_path / "single", tmp_path / "fsdp"
    single_dir.mkdir()
    fsdp_dir.mkdir()
    fsdp = cfg.model_copy(update={
        "run_dir": str(fsdp_dir), "parallel": cfg.parallel.model_copy(update={"dp_shard": 2}),
        "train": cfg.train.model_copy(update={"micro_batch_size": cfg.train.micro_batch_size // 2}),  # same global batch
    })
    launch(2, tmp_path / "out", [{"kind": "trainer", "config": fsdp.model_dump(mode="json")}])
    Trainer(cfg.model_copy(update={"run_dir": str(single_dir)}), data, single_dir).run()

    def steps(run_dir: Path) -> list[dict]:
        return [r for r in read_metrics(run_dir / "metrics.jsonl") if "loss" in r]

    def evals(run_dir: Path) -> list[float]:
        return [r["val_loss"] for r in read_metrics(run_dir / "metrics.jsonl") if "val_loss" in r]

    one, two = steps(single_dir), steps(fsdp_dir)
    assert [r["step"] for r in two] == [r["step"] for r in one] == list(range(1, cfg.train.steps + 1))
    for key in ("valid_tokens", "tokens", "consumed_samples"):
        assert [r[key] for r in two] == [r[key] for r in one], key
    ckpts = sorted(p.name for p in (fsdp_dir / "checkpoints").glob("step_*"))
    assert ckpts == sorted(p.name for p in (single_dir / "checkpoints").glob("step_*")) and ckpts
    w_two, w_one = load_checkpoint(fsdp_dir / "checkpoints" / ckpts[-1]), load_checkpoint(single_dir / "checkpoints" / ckpts[-1])
    diffs = {"loss_rel": rel([r["loss"] for r in two], [r["loss"] for r in one]),
             "grad_norm_rel": rel([r["grad_norm"] for r in two], [r["grad_norm"] for r in one]),
             "val_loss_rel": rel(evals(fsdp_dir), evals(single_dir)),
             "ckpt_weights_abs": max(float(np.abs(w_two.weights[k] - w_one.weights[k]).max()) for k in w_one.weights),
             "ckpt_moments_abs": max(float(np.abs(w_two.optimizer[k] - w_one.optimizer[k]).max()) for k in w_one.optimizer)}
    print("\ntrainer FSDP(2) vs one process: " + ", ".join(f"{k}={v:.2e}" for k, v in diffs.items()))
    assert diffs["loss_rel"] < 1e-5 and diffs["grad_norm_rel"] < 1e-5 and diffs["val_loss_rel"] < 1e-5
    assert diffs["ckpt_weights_abs"] < 1e-4 and diffs["ckpt_moments_abs"] < 1e-4
    assert len(evals(fsdp_dir)) == len(evals(single_dir)) == 2  # step 0 and the end
