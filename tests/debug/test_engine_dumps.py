"""Dumps through module hooks on both engines: same names, same numbers, faults located exactly."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("mindspore")
pytest.importorskip("torch")

from mindfoundry.backends.base import create_backend  # noqa: E402
from mindfoundry.debug.dump import DumpWriter  # noqa: E402
from mindfoundry.debug.dump_folders import read_dump  # noqa: E402
from mindfoundry.debug.locate import locate_overflow  # noqa: E402
from mindfoundry.debug.probe import Injection, Probe  # noqa: E402
from mindfoundry.debug.stats import tensor_stats  # noqa: E402
from mindfoundry.model.spec import ModelSpec, init_weights  # noqa: E402
from mindfoundry.parallel.layout import launch_layout  # noqa: E402
from mindfoundry.train.schedule import step_scalars  # noqa: E402

ALL = ("forward", "backward", "params", "grads", "optimizer")


def _batch() -> tuple[np.ndarray, np.ndarray]:
    ids = np.random.default_rng(0).integers(0, 300, (2, 2, 17)).astype(np.int32)  # 2 micro-batches
    return ids[..., :-1], ids[..., 1:]


@pytest.fixture(scope="module")
def engines():
    from mf_testing import tiny_config

    out = {}
    for name in ("mindspore", "torch"):
        cfg = tiny_config(train={"grad_accum": 2, "micro_batch_size": 2}).model_copy(update={"backend": name})
        spec = ModelSpec.from_config(cfg.model)
        out[name] = (create_backend(cfg, spec, launch_layout(cfg)), cfg, spec)
    return out


def _reset(engine) -> None:
    backend, _, spec = engine
    backend.load_weights(init_weights(spec, 11))
    backend.load_optimizer_state({k: np.zeros_like(v) for k, v in backend.optimizer_state().items()}, 0)


def test_both_engines_dump_the_same_tensors(engines, tmp_path) -> None:
    ids, labels = _batch()
    dumps, outs = {}, {}
    for name, engine in engines.items():
        _reset(engine)
        backend, cfg, _ = engine
        plain = backend.train_step(ids, labels, step_scalars(1, 10, cfg.optim, labels.size))  # compiled step
        _reset(engine)
        w = DumpWriter(tmp_path / name, 1, 0, "tensor", {"backend": name})
        outs[name] = backend.train_step(
            ids, labels, step_scalars(1, 10, cfg.optim, labels.size), Probe(w, directions=ALL)
        )
        assert outs[name].loss == pytest.approx(plain.loss, rel=1e-6)  # the hooked debug step computes the same step
        assert outs[name].grad_norm == pytest.approx(plain.grad_norm, rel=1e-5)
        w.close()
        dumps[name] = read_dump(w.dir)
    ms, pt = dumps["mindspore"], dumps["torch"]
    names = [r["name"] for r in ms.records]
    assert sorted(names) == sorted(r["name"] for r in pt.records)  # no mapping file: the engines share names
    assert len(names) == 294 and len(set(names)) == len(names)
    for must in (
        "layers.1.attn.q_proj.forward.1.output.0",
        "layers.0.mlp.backward.0.grad_input.0",
        "model.forward.0.output.0",
        "grad.layers.1.mlp.down_proj.weight",
        "exp_avg_sq.embed.weight",
        "loss.forward.1.output.0",
    ):
        assert must in names
    # the two micro-batch losses add up to the step's loss
    loss = sum(r["mean"] for r in ms.records if r["kind"] == "loss")
    assert loss == pytest.approx(outs["mindspore"].loss, rel=1e-6)
    by_name = pt.by_name()
    worst = 0.0
    for r in ms.records:
        a, b = np.asarray(ms.array(r), np.float64), np.asarray(pt.array(by_name[r["name"]]), np.float64)
        assert a.shape == b.shape, r["name"]
        worst = max(worst, float(np.abs(a - b).max() / (np.abs(b).max() + 1e-12)))
        assert tensor_stats(ms.array(r))["norm"] == pytest.approx(r["norm"], rel=1e-6)  # index stats = the stored array
    assert worst < 1e-4  # every forward/backward tensor agrees across engines


@pytest.mark.parametrize("name", ["mindspore", "torch"])
@pytest.mark.parametrize("module,direction", [("layers.1.mlp", "forward"), ("layers.0.attn.v_proj", "backward"),
                                              ("layers.1.attn_norm", "backward"), ("embed", "forward")])
def test_injected_inf_is_located_exactly(engines, tmp_path, name, module, direction) -> None:
    _reset(engines[name])
    backend, cfg, _ = engines[name]
    before = backend.weights()
    ids, labels = _batch()
    w = DumpWriter(tmp_path, 1, 0, "statistics", {})
    out = backend.train_step(
        ids, labels, step_scalars(1, 10, cfg.optim, labels.size), Probe(w, inject=Injection(module, direction))
    )
    w.close()
    assert not out.applied  # the non-finite update was dropped...
    after = backend.weights()
    assert all(np.array_equal(before[k], after[k]) for k in before)  # ...so the state is the step's input
    found = locate_overflow(read_dump(w.dir))
    assert (found.module, found.direction) == (module, direction)
    assert found.record["inf"] == found.record["count"] and found.given["nan"] + found.given["inf"] == 0


def test_trainer_dumps_chosen_steps_and_locates_an_injected_fault(tiny_run, tmp_path) -> None:
    from mindfoundry.cli.main import main

    cfg = tiny_run(debug__dump={"steps": "1|3", "mode": "tensor", "modules": ["layers.1.*"]},
                   debug__inject_inf={"step": 2, "module": "layers.0.mlp.up_proj", "direction": "backward"})
    assert main(["train", str(cfg), "--set", "train.steps=4", "--set", "checkpoint.every=0"]) == 0
    run = tmp_path / "run"
    events = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    dumps = [e for e in events if e.get("event") == "dump"]
    assert [e["step"] for e in dumps] == [1, 3]
    step1 = read_dump(run / "dump" / "step1" / "rank0")
    assert step1.meta["backend"] == "mindspore" and step1.meta["mode"] == "tensor"
    assert all(r["module"].startswith("layers.1.") or r["module"] == "loss" for r in step1.records)
    overflow = [e for e in events if e.get("event") == "overflow"]
    assert len(overflow) == 1 and overflow[0]["step"] == 2
    assert (overflow[0]["module"], overflow[0]["direction"]) == ("layers.0.mlp.up_proj", "backward")
    report = json.loads((run / "overflow" / "step2" / "rank0" / "overflow.json").read_text())
    assert report["tensor"] == "layers.0.mlp.up_proj.backward.0.grad_input.0"
    steps = {e["step"]: e for e in events if "loss" in e and "event" not in e}
    assert steps[2]["applied"] is False and steps[3]["applied"] is True  # skipped, then training went on
    # the locator on request, over the dumps already written: exit 1 names the module, exit 0 when clean
    assert main(["locate", str(run / "overflow")]) == 1
    assert main(["locate", str(run / "dump")]) == 0


def test_hookable_modules_are_the_spec_names(engines) -> None:
    from mindfoundry.backends.mindspore.probe_hooks import hookable_modules as ms_modules
    from mindfoundry.backends.torch.probe_hooks import hookable_modules as pt_modules
    from mindfoundry.model.spec import module_classes, module_names

    spec = engines["torch"][2]
    for modules in (pt_modules(engines["torch"][0].model), ms_modules(engines["mindspore"][0].model)):
        assert list(modules) == module_names(spec)
        assert {name: type(m).__name__ for name, m in modules.items()} == module_classes(spec)  # msprobe entry names


def test_overflow_error_stop_ends_training_at_the_first_overflow_naming_the_module(tiny_run, tmp_path, capsys) -> None:
    from mindfoundry.cli.main import main

    cfg = tiny_run(debug__overflow={"error_stop": True},
                   debug__inject_inf={"step": 2, "module": "layers.0.mlp.up_proj", "direction": "backward"})
    assert main(["train", str(cfg), "--set", "train.steps=4", "--set", "checkpoint.every=1"]) == 2
    err = capsys.readouterr().err
    assert (
        "step 2: loss" in err
        and "overflow located: layers.0.mlp.up_proj" in err
        and "debug.overflow.error_stop is on" in err
    )
    run = tmp_path / "run"
    events = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [e["module"] for e in events if e.get("event") == "overflow"] == ["layers.0.mlp.up_proj"]
    assert max(e["step"] for e in events if "loss" in e and "event" not in e) == 1  # stopped before step 2's record
    assert sorted(p.name for p in (run / "checkpoints").iterdir() if p.name.startswith("step_")) == ["step_00000001"]


def test_dump_step_zero_is_refused_and_the_old_locate_key_still_loads(tmp_path) -> None:
    from mindfoundry.config.load import ConfigError, validate

    tree = {"data": {"sources": [{"name": "c", "paths": ["x"]}]}}
    with pytest.raises(
        ConfigError,
        match="debug.dump.steps='0|5': step 0 is not a training step: dump steps count optimizer steps from 1",
    ):
        validate({**tree, "debug": {"dump": {"steps": "0|5"}}})
    old = validate({**tree, "debug": {"locate_overflow": False}})  # a run's config.yaml written before debug.overflow
    assert old.debug.overflow.enable is False and old.debug.overflow.error_stop is False
    assert (
        validate({**tree, "debug": {"locate_overflow": False, "overflow": {"enable": True}}}).debug.overflow.enable
        is True
    )
