"""fp16 mixed precision on both engines: float16 matmuls really run, the numbers stay close to fp32,
parameters stay float32, and dynamic loss scaling turns a float16 overflow into a dropped step."""

from __future__ import annotations

import math

import numpy as np
import pytest

from mf_testing import markov_batches

pytest.importorskip("mindspore")

from mindfoundry.backends.base import create_backend  # noqa: E402
from mindfoundry.debug.probe import Probe  # noqa: E402
from mindfoundry.model.spec import ModelSpec, init_weights  # noqa: E402
from mindfoundry.parallel.layout import launch_layout  # noqa: E402
from mindfoundry.train.loss_scale import DynamicLossScaler  # noqa: E402
from mindfoundry.train.schedule import step_scalars  # noqa: E402

HAS_TORCH = __import__("importlib").util.find_spec("torch") is not None




def _engine(make_config, backend: str, precision: str):
    cfg = make_config(train={"grad_accum": 2, "micro_batch_size": 2, "precision": precision}).model_copy(
        update={"backend": backend}
    )
    spec = ModelSpec.from_config(cfg.model)
    return create_backend(cfg, spec, launch_layout(cfg)), cfg, spec


@pytest.fixture(scope="module")
def ms_engines():
    from mf_testing import tiny_config

    return {p: _engine(tiny_config, "mindspore", p) for p in ("fp32", "fp16")}


def _reset(engine) -> None:
    backend, _, spec = engine
    backend.load_weights(init_weights(spec, 11))
    backend.load_optimizer_state({k: np.zeros_like(v) for k, v in backend.optimizer_state().items()}, 0)


def _batch(t: int = 0) -> tuple[np.ndarray, np.ndarray]:
    b = markov_batches(300, t + 1, (2, 2, 16))[t]
    return b[..., :-1], b[..., 1:]


def _rel(a: float, b: float) -> float:
    return abs(a / b - 1)


def test_mindspore_fp16_step_is_close_to_fp32_but_really_fp16(ms_engines) -> None:
    ids, labels = _batch()
    outs, weights = {}, {}
    for p, engine in ms_engines.items():
        _reset(engine)
        backend, cfg, _ = engine
        scale = 2.0**16 if p == "fp16" else 1.0
        outs[p] = backend.train_step(ids, labels, step_scalars(1, 10, cfg.optim, labels.size, loss_scale=scale))
        weights[p] = backend.weights()
    f32, f16 = outs["fp32"], outs["fp16"]
    assert f16.applied and f32.applied
    assert f16.loss != f32.loss  # float16 matmuls changed the arithmetic
    assert _rel(f16.loss, f32.loss) < 1e-2 and _rel(f16.grad_norm, f32.grad_norm) < 1e-2
    assert _rel(f16.loss, f32.loss) < 1e-4  # what it actually is at this size (measured ~1e-6)
    lr = step_scalars(1, 10, ms_engines["fp32"][1].optim, labels.size).lr
    for name in weights["fp32"]:  # the update (AdamW on fp32 master weights) agrees, except where a
        diff = np.abs(weights["fp16"][name] - weights["fp32"][name])  # near-zero gradient changed sign:
        assert diff.max() <= 2 * lr * 1.001, name  # Adam's first step is ~lr*sign(g) there
        assert diff.mean() < 1e-5 and (diff > 1e-4).mean() < 0.01, name  # measured: < 0.3% of elements


def test_mindspore_fp16_keeps_fp32_parameters_and_module_outputs(ms_engines) -> None:
    import mindspore as ms

    backend, _, _ = ms_engines["fp16"]
    _reset(ms_engines["fp16"])
    assert {p.dtype for p in backend.params.values()} == {ms.float32}
    assert {p.dtype for p in list(backend.optimizer.exp_avg) + list(backend.optimizer.exp_avg_sq)} == {ms.float32}
    assert set(backend.params) == set(ms_engines["fp32"][0].params)  # names unchanged: layers.0.attn.q_proj.weight ...
    _reset(ms_engines["fp32"])
    ids = _batch()[0][0]
    half, full = backend.module_outputs(ids), ms_engines["fp32"][0].module_outputs(ids)  # PYNATIVE hooks
    assert set(half) == set(full)
    for name in full:
        assert half[name].dtype == np.float32
        a, b = half[name].ravel().astype(np.float64), full[name].ravel().astype(np.float64)
        assert a @ b / np.linalg.norm(a) / np.linalg.norm(b) > 0.9999, name
    assert not np.array_equal(half["norm"], full["norm"])
    logits = backend.logits(ids)
    assert logits.dtype == np.float32


def test_mindspore_fp16_debug_step_matches_the_compiled_step(ms_engines) -> None:
    """The eager PYNATIVE debug path (Probe) runs the same fp16 Cells as the compiled step."""
    backend, cfg, _ = ms_engines["fp16"]
    ids, labels = _batch()
    scalars = step_scalars(1, 10, cfg.optim, labels.size, loss_scale=2.0**16)
    _reset(ms_engines["fp16"])
    compiled = backend.train_step(ids, labels, scalars)
    _reset(ms_engines["fp16"])
    eager = backend.train_step(ids, labels, scalars, Probe(None))
    assert eager.applied and eager.loss == pytest.approx(compiled.loss, rel=1e-5)
    assert eager.grad_norm == pytest.approx(compiled.grad_norm, rel=1e-4)


def _train(engine, steps: int, scaler: DynamicLossScaler | None) -> list:
    backend, cfg, _ = engine
    batches = markov_batches(300, steps, (2, 2, 16))
    outs = []
    for t in range(steps):
        ids, labels = batches[t, ..., :-1], batches[t, ..., 1:]
        scale = scaler.scale if scaler else 1.0
        out = backend.train_step(ids, labels, step_scalars(t + 1, steps, cfg.optim, labels.size, loss_scale=scale))
        if scaler:
            scaler.update(found_nonfinite=not math.isfinite(out.grad_norm))
        outs.append(out)
    return outs


def test_mindspore_fp16_learns_like_fp32(ms_engines) -> None:
    _reset(ms_engines["fp16"])
    _reset(ms_engines["fp32"])
    f16 = _train(ms_engines["fp16"], 30, DynamicLossScaler())  # 2**16 throughout (2**18 overflows at this size)
    f32 = _train(ms_engines["fp32"], 30, None)
    assert all(o.applied for o in f16)
    l16, l32 = np.array([o.loss for o in f16]), np.array([o.loss for o in f32])
    assert l16[-1] < l16[0] - 2.0  # it learns (5.72 -> ~3.0)
    assert np.abs(l16 / l32 - 1).max() < 1e-2  # and tracks fp32 (measured: < 1e-3 over 30 steps)
    assert {w.dtype for w in ms_engines["fp16"][0].weights().values()} == {np.dtype(np.float32)}


def test_mindspore_overflowing_scale_drops_the_step_then_recovers(ms_engines) -> None:
    """A 2**40 loss scale overflows float16 in the backward pass: the update is dropped in-graph
    (weights and moments untouched, loss still reported unscaled), the scale backs off, training resumes."""
    engine = ms_engines["fp16"]
    backend, cfg, _ = engine
    _reset(engine)
    before, moments = backend.weights(), backend.optimizer_state()
    ids, labels = _batch()
    reference = ms_engines["fp32"][0]
    _reset(ms_engines["fp32"])
    fp32_loss = reference.train_step(ids, labels, step_scalars(1, 10, cfg.optim, labels.size)).loss

    scaler = DynamicLossScaler(init_scale=2.0**40)
    first = backend.train_step(ids, labels, step_scalars(1, 10, cfg.optim, labels.size, loss_scale=scaler.scale))
    assert not first.applied and not math.isfinite(first.grad_norm)
    assert first.loss == pytest.approx(fp32_loss, rel=1e-4)  # the loss itself is fine, and unscaled
    assert all(np.array_equal(before[k], v) for k, v in backend.weights().items())
    assert all(np.array_equal(moments[k], v) for k, v in backend.optimizer_state().items())
    scaler.update(found_nonfinite=True)
    assert scaler.scale == 2.0**39

    applied_at = None
    for t in range(2, 40):
        out = backend.train_step(ids, labels, step_scalars(t, 40, cfg.optim, labels.size, loss_scale=scaler.scale))
        scaler.update(found_nonfinite=not math.isfinite(out.grad_norm))
        if out.applied and applied_at is None:
            applied_at = t
    assert applied_at is not None and scaler.scale < 2.0**20  # backed off below the overflow threshold
    assert out.loss < first.loss - 0.5  # and then trained (the same batch, so it is memorised)


@pytest.mark.skipif(not HAS_TORCH, reason="torch not installed")
def test_torch_fp16_autocast_tracks_fp32_and_mindspore(ms_engines) -> None:
    from mf_testing import tiny_config

    outs = {}
    for backend_name, precision in (("torch", "fp32"), ("torch", "fp16"), ("mindspore", "fp16")):
        engine = ms_engines[precision] if backend_name == "mindspore" else _engine(tiny_config, backend_name, precision)
        _reset(engine)
        scaler = DynamicLossScaler() if precision == "fp16" else None
        outs[backend_name, precision] = _train(engine, 5, scaler)
    l32 = np.array([o.loss for o in outs["torch", "fp32"]])
    l16 = np.array([o.loss for o in outs["torch", "fp16"]])
    m16 = np.array([o.loss for o in outs["mindspore", "fp16"]])
    assert not np.array_equal(l16, l32)  # autocast really ran float16
    assert np.allclose(l16, l32, rtol=1e-2)
    assert np.allclose(m16, l16, rtol=1e-3)  # the two engines' fp16 recipes agree (measured ~1e-6)
    g16, gm = outs["torch", "fp16"][0].grad_norm, outs["mindspore", "fp16"][0].grad_norm
    assert _rel(gm, g16) < 1e-3


@pytest.mark.skipif(not HAS_TORCH, reason="torch not installed")
def test_torch_overflowing_scale_drops_the_step() -> None:
    from mf_testing import tiny_config

    engine = _engine(tiny_config, "torch", "fp16")
    backend, cfg, _ = engine
    _reset(engine)
    before = backend.weights()
    ids, labels = _batch()
    out = backend.train_step(ids, labels, step_scalars(1, 10, cfg.optim, labels.size, loss_scale=2.0**40))
    assert not out.applied and not math.isfinite(out.grad_norm) and math.isfinite(out.loss)
    assert all(np.array_equal(before[k], v) for k, v in backend.weights().items())
    out = backend.train_step(ids, labels, step_scalars(1, 10, cfg.optim, labels.size, loss_scale=2.0**16))
    assert out.applied and math.isfinite(out.grad_norm)


@pytest.mark.skipif(not HAS_TORCH, reason="torch not installed")
def test_torch_refuses_a_device_without_fp16_autocast() -> None:
    import torch

    from mindfoundry.backends.base import BackendUnavailable
    from mindfoundry.backends.torch.train_step import autocast_for

    assert (
        autocast_for(torch.device("cpu"), "fp16")().fast_dtype == torch.float16
    )  # CPU autocast has float16 (torch >= 2.3)
    with pytest.raises(BackendUnavailable, match="train.precision=fp16: .* use train.precision: fp32"):
        autocast_for(torch.device("meta"), "fp16")  # no autocast at all on this device type
