"""The MindSpore engine: parameter-name contract, forward and loss against numpy, AdamW arithmetic,
gradient accumulation, padding mask, and the overfit check."""

from __future__ import annotations

import math

import numpy as np
import pytest

ms = pytest.importorskip("mindspore")

from numpy_reference import forward, mean_nll  # noqa: E402

from mindfoundry.backends.base import create_backend  # noqa: E402
from mindfoundry.data.dataset.packing import IGNORE_INDEX  # noqa: E402
from mindfoundry.model.spec import ModelSpec, init_weights, parameter_shapes  # noqa: E402
from mindfoundry.parallel.layout import launch_layout  # noqa: E402
from mindfoundry.train.schedule import step_scalars  # noqa: E402


def batch(rng: np.random.Generator, vocab: int, a: int, b: int, s: int) -> tuple[np.ndarray, np.ndarray]:
    tokens = rng.integers(0, vocab, (a, b, s + 1)).astype(np.int32)
    return tokens[..., :-1], tokens[..., 1:]


@pytest.mark.parametrize("tie", [True, False])
def test_parameter_names_follow_the_spec(make_config, tie: bool) -> None:
    cfg = make_config(model={"tie_embeddings": tie})
    spec = ModelSpec.from_config(cfg.model)
    backend = create_backend(cfg, spec, launch_layout(cfg))
    assert {n: w.shape for n, w in backend.weights().items()} == parameter_shapes(spec)
    assert set(backend.optimizer_state()) == {
        f"{m}.{n}" for m in ("exp_avg", "exp_avg_sq") for n in parameter_shapes(spec)
    }


def test_forward_and_loss_match_numpy_reference(tiny) -> None:
    cfg, spec = tiny
    backend = create_backend(cfg, spec, launch_layout(cfg))
    weights = init_weights(spec, seed=3)
    weights = {k: v * 5 if k.endswith("proj.weight") else v for k, v in weights.items()}  # sharper attention
    backend.load_weights(weights)
    ids, labels = batch(np.random.default_rng(0), spec.vocab_size, 1, 2, 16)
    expected = forward(spec, weights, ids[0])
    got = backend.logits(ids[0])
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
    labels = labels[0].copy()
    labels[1, 10:] = IGNORE_INDEX  # padded tail
    nll, count, _ = backend.eval_batch(ids[0], labels)
    assert count == 2 * 16 - 6
    assert nll / count == pytest.approx(mean_nll(expected, labels), rel=1e-5)


def test_adamw_matches_torch_formula(tiny) -> None:
    """Two steps of the compiled update against AdamW written out in float64 (torch.optim.AdamW's math). The optimizer
    is an nn.Optimizer (what MindSpore's parallel optimizer shards) holding only its moments besides the base class's
    step counter and unused rate."""
    cfg, spec = tiny
    create_backend(cfg, spec, launch_layout(cfg))  # sets GRAPH_MODE on the CPU, as in training
    from mindfoundry.backends.mindspore.train_step import AdamW, scalar

    rng = np.random.default_rng(1)
    w0 = rng.standard_normal((3, 4)).astype(np.float32)
    n0 = rng.standard_normal(4).astype(np.float32)
    params = [ms.Parameter(ms.Tensor(w0), name="mat"), ms.Parameter(ms.Tensor(n0), name="vec")]
    o = cfg.optim
    opt = AdamW(params, o.beta1, o.beta2, o.eps, o.weight_decay)
    assert isinstance(opt, ms.nn.Optimizer)
    assert sorted(p.name for p in opt.get_parameters()) == sorted(
        ["exp_avg.mat", "exp_avg.vec", "exp_avg_sq.mat", "exp_avg_sq.vec", "global_step", "learning_rate", "mat", "vec"]
    )
    ref = {"w": w0.astype(np.float64), "n": n0.astype(np.float64)}
    m = {k: np.zeros_like(v) for k, v in ref.items()}
    v = {k: np.zeros_like(val) for k, val in ref.items()}
    update = ms.jit(opt.construct)
    for t, grad_scale in (
        (1, 1.0),
        (2, 0.25),
    ):  # the scale the step folds unscale and clip into multiplies each gradient
        raw = {"w": rng.standard_normal((3, 4)).astype(np.float32), "n": rng.standard_normal(4).astype(np.float32)}
        sc = step_scalars(t, 10, o, valid_tokens=1)
        update((ms.Tensor(raw["w"]), ms.Tensor(raw["n"])), scalar(grad_scale), scalar(sc.lr), scalar(sc.step_size),
               scalar(sc.bias_correction2_sqrt), ms.Tensor(True))
        grads = {k: g * grad_scale for k, g in raw.items()}
        for k in ref:
            decay = o.weight_decay if k == "w" else 0.0  # no decay on 1-D parameters
            ref[k] *= 1 - sc.lr * decay
            m[k] = o.beta1 * m[k] + (1 - o.beta1) * grads[k]
            v[k] = o.beta2 * v[k] + (1 - o.beta2) * grads[k] ** 2
            denom = np.sqrt(v[k]) / math.sqrt(1 - o.beta2**t) + o.eps
            ref[k] -= sc.lr / (1 - o.beta1**t) * m[k] / denom
    np.testing.assert_allclose(params[0].asnumpy(), ref["w"], rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(params[1].asnumpy(), ref["n"], rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(opt.exp_avg_sq[0].asnumpy(), v["w"], rtol=1e-5)
    # a dropped step touches nothing, even with non-finite gradients; lr 0 (a cosine ending at 0) moves no weight
    before = [t.asnumpy().copy() for t in (*params, *opt.exp_avg, *opt.exp_avg_sq)]
    bad = (ms.Tensor(np.full((3, 4), np.inf, np.float32)), ms.Tensor(np.full(4, np.nan, np.float32)))
    update(bad, scalar(1.0), scalar(sc.lr), scalar(sc.step_size), scalar(sc.bias_correction2_sqrt), ms.Tensor(False))
    assert all(np.array_equal(a, t.asnumpy()) for a, t in zip(before, (*params, *opt.exp_avg, *opt.exp_avg_sq)))
    update(
        (ms.Tensor(raw["w"]), ms.Tensor(raw["n"])),
        scalar(1.0),
        scalar(0.0),
        scalar(0.0),
        scalar(sc.bias_correction2_sqrt),
        ms.Tensor(True),
    )
    assert [np.array_equal(a, p.asnumpy()) for a, p in zip(before, params)] == [True, True]
    assert not np.array_equal(before[2], opt.exp_avg[0].asnumpy())  # the moments still move, as in torch


def test_gradient_accumulation_equals_one_big_batch(make_config) -> None:
    """2 micro-batches of 2 == 1 batch of 4 (token-mean loss over the global batch, padding excluded)."""
    rng = np.random.default_rng(2)
    cfg_big = make_config(train={"micro_batch_size": 4, "grad_accum": 1})
    cfg_acc = make_config(train={"micro_batch_size": 2, "grad_accum": 2})
    spec = ModelSpec.from_config(cfg_big.model)
    ids, labels = batch(rng, spec.vocab_size, 1, 4, 16)
    labels[0, 3, 5:] = IGNORE_INDEX
    valid = int((labels != IGNORE_INDEX).sum())
    results = []
    for cfg, shape in ((cfg_big, (1, 4, 16)), (cfg_acc, (2, 2, 16))):
        backend = create_backend(cfg, spec, launch_layout(cfg))
        backend.load_weights(init_weights(spec, 0))
        out = backend.train_step(ids.reshape(shape), labels.reshape(shape), step_scalars(1, 10, cfg.optim, valid))
        results.append((out, backend.weights()))
    (big, w_big), (acc, w_acc) = results
    assert acc.loss == pytest.approx(big.loss, rel=1e-6)
    assert acc.grad_norm == pytest.approx(big.grad_norm, rel=1e-5)
    for name in w_big:
        # Adam divides by sqrt(v): elements with near-zero gradients amplify 1e-7 summation-order
        # differences, so compare updates at ~1/300 of the step size (lr 3e-3); measured 3.35e-06 on a Xeon and
        # 9.75e-06 on an AMD EPYC (one element of 12,288)
        np.testing.assert_allclose(w_acc[name], w_big[name], rtol=0, atol=1e-5)


def test_host_looped_accumulation_is_the_in_graph_loop_bit_for_bit(make_config) -> None:
    """grad_accum > 1 runs one compiled micro-batch graph in a host loop (AccumulatingStep); the step that unrolls the
    micro-batches in one graph (TrainStep) must give the same floats: losses, norms, per-parameter squared norms,
    weights and moments, over steps with padding, clipping and a dropped (non-finite) update."""
    from mindfoundry.backends.mindspore.model import LossCell
    from mindfoundry.backends.mindspore.train_step import AccumulatingStep, TrainStep

    rng = np.random.default_rng(5)
    cfg = make_config(train={"micro_batch_size": 2, "grad_accum": 3}, optim={"clip_norm": 0.5})
    spec = ModelSpec.from_config(cfg.model)
    batches = [batch(rng, spec.vocab_size, 3, 2, 16) for _ in range(3)]
    for _, labels in batches:
        labels[1, 0, 9:] = IGNORE_INDEX
    runs = []
    for unrolled in (False, True):
        backend = create_backend(cfg, spec, launch_layout(cfg))
        assert isinstance(backend.step_cell, AccumulatingStep)
        if unrolled:
            backend.step_cell = TrainStep(LossCell(backend.model), backend.optimizer, 3, backend.clip)
        backend.load_weights(init_weights(spec, 0))
        outs = []
        for step, (ids, labels) in enumerate(batches, start=1):
            valid = int((labels != IGNORE_INDEX).sum())
            grad_limit = 1e-3 if step == 2 else math.inf  # step 2's update is dropped, as a non-finite one would be
            outs.append(
                backend.train_step(ids, labels, step_scalars(step, 10, cfg.optim, valid, grad_limit=grad_limit))
            )
        runs.append((outs, backend.weights(), backend.optimizer_state()))
    (host, w_host, m_host), (graph, w_graph, m_graph) = runs
    assert [o.applied for o in host] == [True, False, True]
    assert [(o.loss, o.grad_norm, o.applied) for o in host] == [(o.loss, o.grad_norm, o.applied) for o in graph]
    assert all(np.array_equal(a.grad_sq, b.grad_sq) for a, b in zip(host, graph))
    for mine, theirs in ((w_host, w_graph), (m_host, m_graph)):
        assert all(np.array_equal(mine[k], theirs[k]) for k in theirs)


def test_clipping_reports_the_unclipped_norm_and_limits_the_update(make_config) -> None:
    rng = np.random.default_rng(4)
    spec = ModelSpec.from_config(make_config().model)
    ids, labels = batch(rng, spec.vocab_size, 1, 4, 16)
    outs = {}
    for clip in (None, 1e-3):
        cfg = make_config(optim={"clip_norm": clip, "weight_decay": 0.0})
        backend = create_backend(cfg, spec, launch_layout(cfg))
        backend.load_weights(init_weights(spec, 0))
        outs[clip] = (
            backend.train_step(ids, labels, step_scalars(1, 10, cfg.optim, labels.size)),
            backend.optimizer_state(),
        )
    (free, st_free), (clipped, st_clip) = outs[None], outs[1e-3]
    assert free.grad_norm == pytest.approx(clipped.grad_norm, rel=1e-6)  # the reported norm is pre-clip
    # after one step exp_avg = (1-beta1) * g, so the clipped first moment is scaled by clip/norm
    ratio = np.linalg.norm(np.concatenate([v.ravel() for k, v in st_clip.items() if k.startswith("exp_avg.")])) / \
        np.linalg.norm(np.concatenate([v.ravel() for k, v in st_free.items() if k.startswith("exp_avg.")]))
    assert ratio == pytest.approx(1e-3 / (free.grad_norm + 1e-6), rel=1e-4)


def test_overfits_one_repeated_batch(tiny) -> None:
    """The acceptance check: loss on one repeated batch below 0.5 within 200 steps."""
    cfg, spec = tiny
    backend = create_backend(cfg, spec, launch_layout(cfg))
    backend.load_weights(init_weights(spec, cfg.seed))
    ids, labels = batch(np.random.default_rng(5), spec.vocab_size, 1, 4, 16)
    losses = [backend.train_step(ids, labels, step_scalars(t, 200, cfg.optim, labels.size)).loss for t in range(1, 201)]
    assert losses[0] == pytest.approx(math.log(spec.vocab_size), abs=0.1)  # uniform at init
    assert min(losses) < 0.5
    assert next(i for i, loss in enumerate(losses) if loss < 0.5) < 200


def hand_vs_automatic(core, part: int | None, *inputs, grads: int) -> list[float]:
    """max |hand - automatic| / max |automatic| for each of the first `grads` inputs' gradients of sum(out * w), out
    being
    core(...) or its output number `part`, differentiated through the core's own bprop (a call) and automatically (its
    construct called as a method, which skips the bprop)."""
    from mindspore import nn, ops

    class Loss(nn.Cell):
        def __init__(self, automatic: bool):
            super().__init__()
            self.automatic = automatic

        def construct(self, *args):
            out = core.construct(*args[:-1]) if self.automatic else core(*args[:-1])
            if part is not None:
                out = out[part]
            return (out * args[-1]).sum()

    auto, hand = (ops.grad(Loss(automatic), grad_position=tuple(range(grads)))(*inputs) for automatic in (True, False))
    return [float(np.abs(h.asnumpy() - a.asnumpy()).max() / np.abs(a.asnumpy()).max()) for a, h in zip(auto, hand)]


@pytest.mark.parametrize("mask_kind", ["causal", "padding"])
def test_attention_core_backward_equals_automatic_differentiation(mask_kind: str) -> None:
    """The core's hand-written backward (recomputed probabilities, row sums over the head channels) gives the
    gradients MindSpore's automatic differentiation of the same forward gives, under grouped-query heads."""
    from mindspore import Tensor

    from mindfoundry.backends.mindspore.attention import AttentionCore

    b, kv, group, s, d = 2, 2, 3, 16, 8
    rng = np.random.default_rng(0)
    q, k, v = (Tensor(rng.standard_normal(shape).astype(np.float32)) for shape in
               ((b, kv, group * s, d), (b, kv, s, d), (b, kv, s, d)))
    w = Tensor(rng.standard_normal((b, kv, group * s, d)).astype(np.float32))
    if mask_kind == "causal":
        mask = np.triu(np.full((s, s), -1e9, np.float32), 1)
    else:  # mlm: padding keys hidden, each position keeping itself
        mask = np.where((np.arange(s) >= 11)[None, None, None, None, :] & ~np.eye(s, dtype=bool), -1e9, 0.0).astype(
            np.float32
        )
        mask = np.concatenate([mask, np.zeros_like(mask)])  # the second row has no padding
    errors = hand_vs_automatic(AttentionCore(group), None, q, k, v, Tensor(mask), w, grads=3)
    assert max(errors) <= 4e-7  # measured 3.3e-7 (causal), 3.6e-7 (padding)


def test_rmsnorm_backward_equals_automatic_differentiation() -> None:
    """RMSNorm's hand-written backward (row sums as a product with the weight) gives the automatic gradients."""
    from mindspore import Tensor

    from mindfoundry.backends.mindspore.norm import RMSNormCore

    rng = np.random.default_rng(0)
    x, w = (Tensor(rng.standard_normal((2, 16, 64)).astype(np.float32)) for _ in range(2))
    weight = Tensor((1 + 0.1 * rng.standard_normal(64)).astype(np.float32))
    errors = hand_vs_automatic(RMSNormCore(1e-5), 0, x, weight, w, grads=2)
    assert max(errors) <= 2e-7  # measured 7.0e-8 (x), 1.6e-7 (weight)
