"""The torch engine's parallel layouts (DP, FSDP, TP, TP+SP, FSDP+TP, HSDP, PP with 1F1B/GPipe/
Interleaved1F1B, PP+DP, PP+FSDP, CP, CP+FSDP; DP, FSDP and TP+SP for the mlm objective) train like one process.

Real ``torchrun`` processes on gloo (torch_layout_worker.py, two launches: one of 2 processes,
one of 4) train tiny models for 5 AdamW steps (grad_accum=2, padded labels) on the same global
batches as a single-process TorchBackend run in this process; losses, gradient norms, final
weights, evaluation and logits must agree. A checkpoint written through the Backend interface by
an FSDP run must continue identically under TP and in one process.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")

import torch_layout_worker as worker  # noqa: E402  (this folder is on sys.path: rootdir-less test module)

from mindfoundry.model.spec import init_weights, parameter_shapes  # noqa: E402
from mindfoundry.parallel.layout import launch_layout  # noqa: E402

pytestmark = pytest.mark.slow

WORKER = Path(__file__).with_name("torch_layout_worker.py")
UNTIED = {"tie_embeddings": False}
MLM = {"objective": "mlm"}  # bidirectional attention with hidden padding keys, masked samples
FOUR = {"n_layers": 4}  # pipeline stages need a layer each: pp * pp_virtual_stages <= n_layers
#: name: (processes, parallel section, model overrides)
LAYOUTS = {
    "dp": (2, {"dp_replicate": 2}, {}),
    "fsdp": (2, {"dp_shard": 2}, {}),
    "tp": (2, {"tp": 2, "sequence_parallel": False}, {}),
    "tp_sp": (2, {"tp": 2, "sequence_parallel": True}, UNTIED),  # untied: the separate lm_head is sharded too
    "fsdp_tp": (4, {"dp_shard": 2, "tp": 2}, {}),
    "hsdp": (4, {"dp_replicate": 2, "dp_shard": 2}, {}),
    # pipeline: tied embeddings (first/last stage gradient sum) except GPipe, which covers the separate head
    "pp_1f1b": (2, {"pp": 2}, FOUR),
    "pp_gpipe": (2, {"pp": 2, "pp_schedule": "GPipe"}, FOUR | UNTIED),
    "pp_interleaved": (2, {"pp": 2, "pp_schedule": "Interleaved1F1B", "pp_virtual_stages": 2}, FOUR),
    "pp_dp": (4, {"pp": 2, "dp_replicate": 2}, FOUR),
    "pp_fsdp": (4, {"pp": 2, "dp_shard": 2}, FOUR),
    # context parallel: each 16-token sequence in 4 chunks of 4, rank i holding chunks i and 3-i
    "cp": (2, {"cp": 2}, {}),
    "cp_fsdp": (4, {"cp": 2, "dp_shard": 2}, {}),
    "cp_hsdp": (4, {"cp": 2, "dp_replicate": 2}, {}),  # FSDP mesh (dp_replicate, dp_shard x cp)
    # the masked-LM objective: its padding mask through DP, FSDP and TP with sequence parallelism
    "mlm_dp": (2, {"dp_replicate": 2}, MLM),
    "mlm_fsdp": (2, {"dp_shard": 2}, MLM),
    "mlm_tp_sp": (2, {"tp": 2, "sequence_parallel": True}, MLM | UNTIED),
    # memory options composed with the layouts (memory section in MEMORY): the same numbers as the plain single process
    "fsdp_recompute": (2, {"dp_shard": 2}, {}),
    "tp_sp_recompute": (2, {"tp": 2, "sequence_parallel": True}, UNTIED),
    "pp_recompute": (2, {"pp": 2}, FOUR),
    "cp_fsdp_recompute": (4, {"cp": 2, "dp_shard": 2}, {}),
}
#: The memory section of a layout run (none for the others). Chunks of 5 (TP: the checkpointed DTensor path; FSDP: the
#: fused one on the gathered weight) end in a short chunk; under cp each rank's 8 positions make chunks of 5 and 3.
MEMORY = {
    "fsdp_recompute": {"recompute": "full", "loss_chunk": 5},
    "tp_sp_recompute": {"recompute": "selective", "loss_chunk": 5},
    "pp_recompute": {"recompute": "full", "recompute_layers": [1, 2]},
    "cp_fsdp_recompute": {"recompute": "selective", "loss_chunk": 5},
}
#: An FSDP(2) run saves full weights + moments after step 3; a TP(2) run loads them and trains steps 4-5.
CHECKPOINT_JOBS = [
    {"name": "ckpt_fsdp", "parallel": {"dp_shard": 2}, "first": 1, "last": 3, "save": True},
    {"name": "ckpt_tp", "parallel": {"tp": 2}, "first": 4, "last": 5, "load": "ckpt_fsdp"},
    # pipeline state gathered from two stages (tied embedding once) continues under CP(2) and in one process
    {"name": "ckpt_pp", "parallel": {"pp": 2}, "model": FOUR, "first": 1, "last": 3, "save": True},
    {"name": "ckpt_cp", "parallel": {"cp": 2}, "model": FOUR, "first": 4, "last": 5, "load": "ckpt_pp"},
    {"name": "ckpt_pp_resume", "parallel": {"pp": 2}, "model": FOUR, "first": 4, "last": 5, "load": "ckpt_pp"},
]


def launch(nproc: int, out: Path, jobs: list[dict]) -> None:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    }
    env["OMP_NUM_THREADS"] = "1"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           str(WORKER), str(out), json.dumps(jobs)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    if proc.returncode:
        pytest.fail(f"torchrun ({nproc} processes) failed:\n{(proc.stdout + proc.stderr)[-6000:]}")


def jobs_for(nproc: int) -> list[dict]:
    return [
        {
            "name": name,
            "parallel": parallel,
            "model": model,
            "memory": MEMORY.get(name),
            "first": 1,
            "last": worker.TOTAL_STEPS,
        }
        for name, (n, parallel, model) in LAYOUTS.items()
        if n == nproc
    ]


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
        ids = worker.eval_ids(cfg)
        _REFERENCES[key] = {"result": result, "weights": backend.weights(), "logits": backend.logits(ids),
                            "boundaries": backend.module_outputs(ids), "spec": spec}
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
    # the model learns: a real curve, not noise (mlm predicts 15% of the tokens: 5.70 -> 5.55 measured in 5 steps)
    assert want["loss"][-1] < want["loss"][0] - (0.1 if model.get("objective") == "mlm" else 0.3)
    assert all(got["applied"])
    assert got["seq_seen"] == [worker.SEQ // parallel.get("cp", 1)]  # context parallel: each rank ran its chunks only

    weights = dict(np.load(folder / "weights.npz"))
    diffs = {
        "loss_rel": rel(got["loss"], want["loss"]),
        "grad_norm_rel": rel(got["grad_norm"], want["grad_norm"]),
        "grad_sq_rel": rel(got["grad_sq"], want["grad_sq"]),
        "weights_abs": max(float(np.abs(weights[k] - ref["weights"][k]).max()) for k in ref["weights"]),
        "eval_nll_rel": rel(got["eval"][0], want["eval"][0]),
        "logits_abs": float(np.abs(np.load(folder / "logits.npy") - ref["logits"]).max()),
        "module_outputs_abs": max(
            float(np.abs(v - ref["boundaries"][k]).max()) for k, v in np.load(folder / "boundaries.npz").items()
        ),
    }
    print(f"\n{name} ({nproc} processes, {parallel}): " + ", ".join(f"{k}={v:.2e}" for k, v in diffs.items()))
    assert diffs["loss_rel"] < 1e-5
    assert diffs["grad_norm_rel"] < 1e-5
    assert diffs["grad_sq_rel"] < 1e-4
    assert diffs["weights_abs"] < 1e-4
    assert diffs["eval_nll_rel"] < 1e-5 and got["eval"][1:] == want["eval"][1:]  # scored tokens, correct predictions
    assert diffs["logits_abs"] < 1e-4
    assert diffs["module_outputs_abs"] < 1e-4 and set(np.load(folder / "boundaries.npz")) == set(ref["boundaries"])

    # names and global shapes survive parallelize (checkpoints and dumps rely on them); pipeline
    # ranks hold their stages' parameters under the full model's names
    digests = [json.loads((folder / f"digest_{r}.json").read_text()) for r in range(nproc)]
    held = {n: tuple(s) for d in digests for n, s in d["shapes"].items()}
    assert held == parameter_shapes(ref["spec"])
    assert list(weights) == list(ref["weights"])
    if parallel.get("pp", 1) > 1:
        check_stage_names(digests, parallel, ref["spec"])
    else:
        assert all(len(d["shapes"]) == len(held) for d in digests)

    # every rank gathered the same full weights; replicas (ranks that differ only in dp_replicate) hold
    # identical local parameters, and FSDP ranks hold different shards
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


def check_stage_names(digests: list[dict], parallel: dict, spec) -> None:
    """Pipeline rank r holds the blocks of stages r, r+pp, ... (loop placement), the embedding on the
    first stage (and, tied, its copy on the last), the final norm and head on the last."""
    pp, v = parallel["pp"], parallel.get("pp_virtual_stages", 1)
    per = spec.n_layers // (pp * v)
    for d in digests:
        r = d["coord"][d["dims"].index("pp")]
        blocks = sorted({int(n.split(".")[1]) for n in d["shapes"] if n.startswith("layers.")})
        assert blocks == sorted(i for k in range(v) for i in range((r + k * pp) * per, (r + k * pp + 1) * per))
        ends = {n for n in d["shapes"] if not n.startswith("layers.")}
        last = {"norm.weight"} | ({"embed.weight"} if spec.tie_embeddings else {"lm_head.weight"})
        assert ends == ({"embed.weight"} if r == 0 else set()) | (last if r == pp - 1 else set())


def test_stages_keep_names_and_compose_to_the_model() -> None:
    """In one process: the pipeline stages of a 4-layer model carry the full model's parameter names
    and, run one after the other, give the model's logits exactly; CP chunks cover each sequence once."""
    import contextlib

    import torch

    from mindfoundry.backends.torch.context_parallel import chunk_positions
    from mindfoundry.backends.torch.model import Transformer
    from mindfoundry.backends.torch.pipeline_parallel import RankModules, StageModule
    from mindfoundry.model.spec import ModelSpec

    for model_cfg in (FOUR, FOUR | UNTIED):
        _, cfg, spec = worker.make_backend(model=model_cfg)
        torch.manual_seed(0)
        model = Transformer(spec)
        stages = [StageModule(model, i, 4, contextlib.nullcontext) for i in range(4)]
        assert [n for n, _ in stages[1].named_parameters()] == [
            n for n in parameter_shapes(spec) if n.startswith("layers.1.")
        ]
        last = {n for n, _ in stages[3].named_parameters() if not n.startswith("layers.")}
        assert last == {"norm.weight", "embed.weight" if spec.tie_embeddings else "lm_head.weight"}
        rank0 = RankModules([stages[0], stages[2]])  # interleaved placement of pp=2 rank 0
        assert [n for n, _ in rank0.named_parameters()] == [
            n for n in parameter_shapes(spec) if n == "embed.weight" or n.startswith(("layers.0.", "layers.2."))
        ]
        ids = torch.from_numpy(worker.EVAL_IDS.astype(np.int64))
        x = ids
        with torch.no_grad():
            for stage in stages:
                x = stage(x)
            assert torch.equal(x, model(ids))
        assert ModelSpec.from_config(cfg.model) == spec
    assert chunk_positions(16, 2, 0).tolist() == [0, 1, 2, 3, 12, 13, 14, 15]
    assert chunk_positions(16, 2, 1).tolist() == list(range(4, 12))
    assert sorted(torch.cat([chunk_positions(24, 3, r) for r in range(3)]).tolist()) == list(range(24))


@pytest.mark.parametrize("parallel, match", [
    ({"pp": 2, "tp": 2}, "pp=2 with tp=2"),
    ({"pp": 2, "cp": 2}, "pp=2 with cp=2"),
    ({"cp": 2, "tp": 2}, "cp=2 with tp=2"),
])
def test_unsupported_pp_cp_layouts_are_refused(parallel: dict, match: str) -> None:
    from mindfoundry.backends.torch.distributed import Layout
    from mindfoundry.backends.torch.model import Transformer
    from mindfoundry.backends.torch.parallelize import refuse_unsupported

    _, _, spec = worker.make_backend(model=FOUR)
    with pytest.raises(NotImplementedError, match=match):
        refuse_unsupported(Transformer(spec), Layout(**parallel))


@pytest.mark.parametrize("parallel, match", [
    ({"pp": 3}, "does not divide model.n_layers=4"),
    ({"cp": 3}, "divisible by 2\\*cp = 6"),
])
def test_layouts_that_do_not_divide_are_refused_by_the_layout_rules(parallel: dict, match: str) -> None:
    """The engine leaves divisibility to the one set of rules (mindfoundry.parallel.layout), checked at load and launch.
    """
    from mindfoundry.config.layout_rules import layout_problems
    from mindfoundry.config.parallel_config import Batch, Layout

    _, _, spec = worker.make_backend(model=FOUR)
    (problem,) = layout_problems(Layout(**parallel), spec.sizes(), Batch(seq_len=16, grad_accum=4))
    assert re.search(match, problem)


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


def test_checkpoint_pp_to_cp_pp_and_one_process(runs2: Path) -> None:
    """Full weights + moments saved by PP(2) after step 3 continue identically under CP(2), PP(2) and in one process."""
    backend, cfg, _ = worker.make_backend(model=FOUR)
    backend.load_weights(dict(np.load(runs2 / "ckpt_pp" / "weights.npz")))
    backend.load_optimizer_state(dict(np.load(runs2 / "ckpt_pp" / "optimizer.npz")), step=3)
    single = worker.train(backend, cfg, 4, 5)
    uninterrupted = reference(FOUR)["result"]
    final = backend.weights()
    diffs = {"single_vs_uninterrupted": rel(single["loss"], uninterrupted["loss"][3:])}
    for name in ("ckpt_cp", "ckpt_pp_resume"):
        diffs[f"{name}_loss_rel"] = rel(json.loads((runs2 / name / "result.json").read_text())["loss"], single["loss"])
        diffs[f"{name}_weights_abs"] = max(
            float(np.abs(w - final[k]).max()) for k, w in np.load(runs2 / name / "weights.npz").items()
        )
    print("\ncheckpoint PP(2) -> CP(2) / PP(2) / one process: " + ", ".join(f"{k}={v:.2e}" for k, v in diffs.items()))
    assert all(v < 1e-5 for k, v in diffs.items() if not k.endswith("weights_abs"))
    assert all(v < 1e-4 for k, v in diffs.items() if k.endswith("weights_abs"))
    pp = json.loads((runs2 / "ckpt_pp" / "result.json").read_text())
    assert rel(pp["loss"], uninterrupted["loss"][:3]) < 1e-5


#: the Trainer under torchrun: name -> parallel section (2 processes; the same global batch as one process)
TRAINER_LAYOUTS = {"fsdp": {"dp_shard": 2}, "pp": {"pp": 2}, "cp": {"cp": 2}}


@pytest.mark.parametrize("layout", list(TRAINER_LAYOUTS))
def test_trainer_under_torchrun_matches_one_process(tiny_prepared, tmp_path: Path, layout: str) -> None:
    """The whole Trainer with FSDP(2), PP(2) or CP(2) (per-rank loader slices, global token count, rank-0
    metrics and checkpoints, collective state gathering, dp-split / pipelined / context-parallel
    evaluation, from step 0) logs what one process logs."""
    from mindfoundry.checkpoint.reader import load_checkpoint
    from mindfoundry.train.metrics import read_metrics
    from mindfoundry.train.trainer import Trainer

    cfg, data = tiny_prepared
    cfg = cfg.model_copy(update={"backend": "torch"})
    single_dir, fsdp_dir = tmp_path / "single", tmp_path / "fsdp"
    single_dir.mkdir()
    fsdp_dir.mkdir()
    parallel = TRAINER_LAYOUTS[layout]
    dp = parallel.get("dp_shard", 1)
    fsdp = cfg.model_copy(
        update={
            "run_dir": str(fsdp_dir),
            "parallel": cfg.parallel.model_copy(update={**parallel, "world_size": 2}),
            "train": cfg.train.model_copy(
                update={"micro_batch_size": cfg.train.micro_batch_size // dp}
            ),  # same global batch
        }
    )
    launch(2, tmp_path / "out", [{"kind": "trainer", "config": fsdp.model_dump(mode="json")}])
    Trainer(cfg.model_copy(update={"run_dir": str(single_dir)}), data, single_dir, launch_layout(cfg)).run()

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
    w_two, w_one = (
        load_checkpoint(fsdp_dir / "checkpoints" / ckpts[-1]),
        load_checkpoint(single_dir / "checkpoints" / ckpts[-1]),
    )
    diffs = {
        "loss_rel": rel([r["loss"] for r in two], [r["loss"] for r in one]),
        "grad_norm_rel": rel([r["grad_norm"] for r in two], [r["grad_norm"] for r in one]),
        "val_loss_rel": rel(evals(fsdp_dir), evals(single_dir)),
        "ckpt_weights_abs": max(float(np.abs(w_two.weights[k] - w_one.weights[k]).max()) for k in w_one.weights),
        "ckpt_moments_abs": max(float(np.abs(w_two.optimizer[k] - w_one.optimizer[k]).max()) for k in w_one.optimizer),
    }
    print(f"\ntrainer {parallel} vs one process: " + ", ".join(f"{k}={v:.2e}" for k, v in diffs.items()))
    assert diffs["loss_rel"] < 1e-5 and diffs["grad_norm_rel"] < 1e-5 and diffs["val_loss_rel"] < 1e-5
    assert diffs["ckpt_weights_abs"] < 1e-4 and diffs["ckpt_moments_abs"] < 1e-4
    assert len(evals(fsdp_dir)) == len(evals(single_dir)) == 2  # step 0 and the end
