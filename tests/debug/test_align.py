"""Cross-engine alignment: a deliberately broken layer is found; identical runs pass; the CLI works."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("mindspore")
pytest.importorskip("torch")

from mindfoundry.backends.base import create_backend  # noqa: E402
from mindfoundry.cli.main import main  # noqa: E402
from mindfoundry.data.dataset.masking import MaskingRule  # noqa: E402
from mindfoundry.debug.compare import compare_trees  # noqa: E402
from mindfoundry.model.spec import ModelSpec, init_weights  # noqa: E402
from mindfoundry.parallel.layout import launch_layout  # noqa: E402
from mindfoundry.workflows.align import run_side  # noqa: E402


def _aligned(tmp_path: Path, perturb=None, mode: str = "tensor", objective: str = "clm"):
    """One step of both engines from the same weights and batch; `perturb(name, backend, weights)` breaks one.
    With the mlm objective the batch is masked (ids 0 and 1 are EOS and PAD, 299 the mask token) and padded."""
    from mf_testing import tiny_config

    ids = np.random.default_rng(0).integers(2, 299, (2, 2, 17)).astype(np.int32)
    batches = [(ids[..., :-1], ids[..., 1:])]
    if objective == "mlm":
        rule = MaskingRule(299, np.array([0, 1, 299]), np.arange(2, 299), 0.15, 0.8, 0.1, seed=3)
        ids[1, 1, 10:] = 1  # a padded tail: keys hidden from the other positions
        batches = [tuple(a.reshape(2, 2, 16) for a in rule.apply(ids[..., :-1].reshape(4, 16), np.arange(4)))]
    for name in ("mindspore", "torch"):
        cfg = tiny_config(train={"grad_accum": 2, "micro_batch_size": 2}, model={"objective": objective}).model_copy(
            update={"backend": name}
        )
        spec = ModelSpec.from_config(cfg.model)
        backend, weights = create_backend(cfg, spec, launch_layout(cfg)), init_weights(spec, 11)
        if perturb:
            perturb(name, backend, weights)
        backend.load_weights(weights)
        run_side(backend, cfg, batches, tmp_path / name, mode)
    [cmp] = compare_trees(tmp_path / "mindspore", tmp_path / "torch")
    return cmp


@pytest.mark.parametrize("objective", ["clm", "mlm"])
def test_identical_runs_pass_everything(tmp_path, objective: str) -> None:
    cmp = _aligned(tmp_path, objective=objective)
    assert cmp.counts() == {"pass": 294, "warning": 0, "error": 0} and cmp.passed()
    assert cmp.first_divergence() is None and cmp.lowest_cosine().cosine > 0.999999


def test_changed_rmsnorm_epsilon_is_the_first_divergence(tmp_path) -> None:
    def perturb(name, backend, _weights):
        if name == "torch":
            backend.model.layers[1].attn_norm.eps = 1e-2  # the MindSpore side keeps 1e-5

    cmp = _aligned(tmp_path, perturb)
    first = cmp.first_divergence()
    # the direction barely changes, the magnitude does: an error at the norm itself
    assert (first.name, first.verdict) == ("layers.1.attn_norm.forward.0.output.0", "error")
    assert first.cosine > 0.99 and first.rel_rmse > 0.05 and "the magnitudes differ" in first.reason
    assert all(r.verdict == "pass" for r in cmp.rows if r.seq < first.seq)  # nothing before it differs
    top = [m["module"] for m in cmp.worst_modules(5)]
    assert top[0] == "layers.1.attn_norm"
    assert not cmp.passed() and cmp.first_error() is not None  # the error grows downstream


def test_transposed_weight_is_found(tmp_path) -> None:
    def perturb(name, _backend, weights):
        if name == "mindspore":
            weights["layers.1.attn.o_proj.weight"] = weights["layers.1.attn.o_proj.weight"].T.copy()

    cmp = _aligned(tmp_path, perturb)
    first = cmp.first_divergence()
    assert (first.name, first.verdict) == ("param.layers.1.attn.o_proj.weight", "error")
    assert first.cosine < 0.1
    forward = next(r for r in cmp.rows if r.verdict != "pass" and r.kind == "forward_output")
    assert forward.name == "layers.1.attn.o_proj.forward.0.output.0"  # the first activation it spoils
    assert "layers.1.attn.o_proj" in [m["module"] for m in cmp.worst_modules(5)]


def _tamper(dump_root: Path, name: str, change) -> None:
    """Replace one tensor of a tensor-mode dump by ``change(array)`` (the index keeps its old statistics)."""
    [index] = dump_root.glob("step*/rank*/index.jsonl")
    record = next(r for r in map(json.loads, index.read_text().splitlines()) if r["name"] == name)
    path = index.parent / record["file"]
    np.save(path, change(np.load(path)))


def test_scrambled_gradient_is_an_error_and_the_first_divergence(tmp_path) -> None:
    """The reviewer's case: one gradient replaced by a shuffled, sign-flipped copy (same norm, cosine ~0)."""
    _aligned(tmp_path)
    name = "grad.layers.0.attn.q_proj.weight"
    rng = np.random.default_rng(1)
    _tamper(tmp_path / "mindspore", name, lambda g: -rng.permutation(g.ravel()).reshape(g.shape))
    [cmp] = compare_trees(tmp_path / "mindspore", tmp_path / "torch")
    first = cmp.first_divergence()
    assert (first.name, first.verdict) == (name, "error") and abs(first.cosine) < 0.1
    assert first.max_abs < 1e-3  # small values: the old absolute floor passed this tensor
    assert not cmp.passed() and cmp.counts()["error"] == 1


def test_one_weight_off_by_a_thousandth_is_found_in_its_module(tmp_path) -> None:
    def perturb(name, _backend, weights):
        if name == "mindspore":
            w = weights["layers.1.mlp.up_proj.weight"]
            weights["layers.1.mlp.up_proj.weight"] = (
                w * (1 + 1e-3 * np.random.default_rng(2).standard_normal(w.shape))
            ).astype(w.dtype)

    cmp = _aligned(tmp_path, perturb)
    first = cmp.first_divergence()
    assert (first.name, first.verdict) == ("param.layers.1.mlp.up_proj.weight", "warning")
    assert first.rel_rmse == pytest.approx(1e-3, rel=0.05)
    assert cmp.worst_modules(1)[0]["module"] == "layers.1.mlp.up_proj"


def test_statistics_mode_finds_the_same_layer(tmp_path) -> None:
    def perturb(name, backend, _weights):
        if name == "torch":
            backend.model.layers[0].mlp_norm.eps = 1.0

    cmp = _aligned(tmp_path, perturb, mode="statistics")
    assert cmp.mode == "statistics"
    assert cmp.first_divergence().name == "layers.0.mlp_norm.forward.0.output.0"
    assert cmp.worst_modules(5)[0]["module"] == "layers.0.mlp_norm"


@pytest.mark.slow
def test_align_and_compare_cli(tiny_run, tmp_path, capsys) -> None:
    cfg = tiny_run()
    out = tmp_path / "al"
    assert main(["align", str(cfg), "--steps", "2", "--out", str(out)]) == 0
    summary = json.loads((out / "align.json").read_text())
    assert summary["passed"] and len(summary["steps"]) == 2
    assert summary["steps"][0]["loss_rel_err"] < 1e-5 and summary["steps"][1]["grad_norm_rel_err"] < 1e-4
    assert summary["first_divergence"] is None and summary["lowest_cosine"]["cosine"] > 0.99999
    assert (
        (out / "compare.html").is_file()
        and (out / "compare_step1.csv").is_file()
        and (out / "compare_step2.csv").is_file()
    )
    assert main(["align", str(cfg), "--steps", "1", "--out", str(out)]) == 2  # never overwrites
    # compare the two engines' dumps directly
    assert main(["compare", str(out / "mindspore-fp32"), str(out / "torch-fp32"), "--out", str(tmp_path / "cmp")]) == 0
    assert {p.name for p in (tmp_path / "cmp").iterdir()} == {"step1-rank0.csv", "step2-rank0.csv", "compare.html"}
    # bad input: one line, exit 2
    capsys.readouterr()
    assert main(["compare", str(tmp_path / "missing"), str(out / "torch-fp32")]) == 2
    assert main(["align", str(cfg), "--b", "jax"]) == 2
    assert main(["dump", str(cfg), "--steps", "1", "--modules", "layer.*"]) == 2
    err = capsys.readouterr().err
    assert "missing does not exist" in err and "side 'jax'" in err and "match no module" in err


@pytest.mark.slow
def test_dump_command_replays_without_touching_the_run(tiny_run, tmp_path) -> None:
    cfg = tiny_run()
    assert main(["train", str(cfg), "--set", "train.steps=3"]) == 0
    run = tmp_path / "run"
    before = sorted(p.relative_to(run) for p in run.rglob("*") if p.is_file())
    out = tmp_path / "dump"
    assert main(["dump", str(cfg), "--set", "train.steps=5", "--steps", "4|5", "--resume", "auto", "--out", str(out),
                 "--directions", "forward", "params"]) == 0
    assert sorted(p.relative_to(run) for p in run.rglob("*") if p.is_file()) == before  # the run is untouched
    from mindfoundry.debug.dump_folders import read_dump

    d4 = read_dump(out / "step4" / "rank0")
    assert {r["kind"] for r in d4.records} == {"forward_input", "forward_output", "loss", "param"}
    replay = [json.loads(line) for line in (out / "replay" / "metrics.jsonl").read_text().splitlines()]
    assert next(e for e in replay if e.get("event") == "resume")["step"] == 3  # continued from the run's checkpoint
    step4 = next(e for e in replay if e.get("step") == 4 and "loss" in e and "event" not in e)
    assert step4["loss"] == pytest.approx(d4.meta["loss"])


@pytest.mark.parametrize("a,b", [("mindspore", "mindspore:fp16"), ("torch", "torch:bf16")])
def test_precision_comparison_shows_what_mixed_precision_costs(tmp_path, a, b) -> None:
    from mf_testing import tiny_config
    from mindfoundry.workflows.align import Side

    ids = np.random.default_rng(0).integers(0, 300, (2, 2, 17)).astype(np.int32)
    batches = [(ids[..., :-1], ids[..., 1:])]
    outs = {}
    for side in (Side.parse(a), Side.parse(b)):
        cfg = side.config(tiny_config(train={"grad_accum": 2, "micro_batch_size": 2}))
        spec = ModelSpec.from_config(cfg.model)
        backend = create_backend(cfg, spec, launch_layout(cfg))
        backend.load_weights(init_weights(spec, 11))
        outs[side.label] = run_side(backend, cfg, batches, tmp_path / side.label, "tensor")[0]
    low_a, low_b = (outs[k] for k in outs)
    assert abs(low_a.loss / low_b.loss - 1) < 1e-4 and abs(low_a.grad_norm / low_b.grad_norm - 1) < 1e-2
    [cmp] = compare_trees(tmp_path / Side.parse(a).label, tmp_path / Side.parse(b).label)
    assert cmp.first_error() is None  # mixed precision costs accuracy, it does not break the model...
    introduced = cmp.worst_modules(5)[0]["introduced"]
    assert 1e-5 < introduced < 5e-2  # ...yet the reduced precision is visible module by module
    grads = [r for r in cmp.rows if r.kind == "grad"]
    assert len(grads) == 20 and max(r.norm_rel_diff for r in grads) < 0.02  # fp16 gradients are recorded unscaled
