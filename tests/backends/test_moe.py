"""The mixture-of-experts FFN on both engines: the numpy reference, each other, gradients, hooks and dumps."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("mindspore")
pytest.importorskip("torch")

import numpy_reference as ref  # noqa: E402  (tests/backends is the rootdir of this module)

from mf_testing import tiny_config  # noqa: E402
from mindfoundry.backends.base import create_backend  # noqa: E402
from mindfoundry.data.dataset.packing import IGNORE_INDEX  # noqa: E402
from mindfoundry.model.spec import ModelSpec, init_weights, module_classes, module_names, moe_capacity  # noqa: E402
from mindfoundry.parallel.layout import launch_layout  # noqa: E402
from mindfoundry.train.schedule import step_scalars  # noqa: E402

MOE = {"moe": {"num_experts": 4, "top_k": 2}}
STEPS = 5


def batches() -> tuple[np.ndarray, np.ndarray]:
    """STEPS steps of 2 micro-batches x 2 learnable sequences of 16; some sequences end in padding."""
    rng = np.random.default_rng(0)
    table = rng.integers(0, 300, 300)
    tokens = np.empty((STEPS, 2, 2, 17), np.int64)
    tokens[..., 0] = rng.integers(0, 300, (STEPS, 2, 2))
    for t in range(1, 17):
        tokens[..., t] = table[tokens[..., t - 1]]
    ids, labels = tokens[..., :-1].copy(), tokens[..., 1:].copy()
    labels[:, 0, 1, -5:] = IGNORE_INDEX  # padded tail: the aux term still covers every position
    ids[:, 0, 1, -5:] = 0
    return ids, labels


@pytest.fixture(scope="module")
def engines():
    out = {}
    for name in ("mindspore", "torch"):
        cfg = tiny_config(model=MOE, train={"grad_accum": 2, "micro_batch_size": 2}).model_copy(
            update={"backend": name}
        )
        spec = ModelSpec.from_config(cfg.model)
        backend = create_backend(cfg, spec, launch_layout(cfg))
        backend.load_weights(init_weights(spec, 11))
        out[name] = (backend, cfg, spec)
    return out


def reference_loss(spec: ModelSpec, weights: dict, ids: np.ndarray, labels: np.ndarray) -> float:
    """The step objective of model/spec.py: (sum over micro-batches of nll_sum + w * N * aux) / valid tokens."""
    total = 0.0
    for m in range(ids.shape[0]):
        logits, aux = ref.forward(spec, weights, ids[m], with_aux=True)
        keep = labels[m] != IGNORE_INDEX
        total += ref.mean_nll(logits, labels[m]) * keep.sum() + spec.moe_aux_loss_weight * ids[m].size * aux
    return total / (labels != IGNORE_INDEX).sum()


def test_forward_eval_and_first_loss_match_numpy(engines) -> None:
    ids, labels = batches()
    spec = engines["torch"][2]
    weights = init_weights(spec, 11)
    want_logits, aux = ref.forward(spec, weights, ids[0, 0], with_aux=True)
    assert 2 <= aux < 2.1  # top_k=2 at perfect balance; a near-uniform router at init
    nll_sum = ref.mean_nll(want_logits, labels[0, 0]) * (labels[0, 0] != IGNORE_INDEX).sum()
    want_loss = reference_loss(spec, weights, ids[0], labels[0])
    for name, (backend, cfg, _) in engines.items():
        backend.load_weights(weights)
        logits = backend.logits(ids[0, 0])
        assert np.abs(logits - want_logits).max() < 1e-5 * np.abs(want_logits).max(), name
        nll, count, _ = backend.eval_batch(ids[0, 0], labels[0, 0])  # evaluation: the LM loss alone
        assert count == (labels[0, 0] != IGNORE_INDEX).sum() and nll == pytest.approx(nll_sum, rel=1e-5), name
        out = backend.train_step(
            ids[0], labels[0], step_scalars(1, STEPS, cfg.optim, int((labels[0] != IGNORE_INDEX).sum()))
        )
        assert out.loss == pytest.approx(want_loss, rel=1e-5), name  # the training loss includes the aux term


def test_engines_train_the_same_moe(engines) -> None:
    ids, labels = batches()
    losses: dict[str, list[float]] = {name: [] for name in engines}
    for name, (backend, cfg, spec) in engines.items():
        backend.load_weights(init_weights(spec, 11))
        backend.load_optimizer_state({k: np.zeros_like(v) for k, v in backend.optimizer_state().items()}, 0)
        for t in range(1, STEPS + 1):
            valid = int((labels[t - 1] != IGNORE_INDEX).sum())
            losses[name].append(
                backend.train_step(ids[t - 1], labels[t - 1], step_scalars(t, STEPS, cfg.optim, valid)).loss
            )
    ms, pt = np.array(losses["mindspore"]), np.array(losses["torch"])
    w_ms, w_pt = engines["mindspore"][0].weights(), engines["torch"][0].weights()
    params = max(float(np.abs(w_ms[k] - w_pt[k]).max()) for k in w_ms)
    print(
        f"\nMoE MindSpore vs torch: first loss rel {abs(ms[0] / pt[0] - 1):.2e}, losses rel "
        f"{np.abs(ms / pt - 1).max():.2e}, params after {STEPS} steps {params:.2e}"
    )
    assert abs(ms[0] / pt[0] - 1) < 1e-5
    assert np.all(np.abs(ms / pt - 1) < 1e-5)
    assert params < 1e-4
    assert pt[-1] < pt[0] - 0.3  # it learns
    moved = init_weights(engines["torch"][2], 11)
    assert not np.array_equal(w_pt["layers.0.mlp.router.weight"], moved["layers.0.mlp.router.weight"])


def test_aux_gradient_matches_finite_differences() -> None:
    """torch in float64: d(step loss)/d(router and expert weights) against central differences of the numpy objective.
    """
    import torch

    from mindfoundry.backends.torch.model import Transformer, aux_loss_sum, token_nll

    cfg = tiny_config(model={**MOE, "moe": {**MOE["moe"], "aux_loss_weight": 0.5}})  # a large weight: a visible term
    spec = ModelSpec.from_config(cfg.model)
    weights = {k: v.astype(np.float64) for k, v in init_weights(spec, 5).items()}
    ids, labels = (a[0, :1] for a in batches())  # one micro-batch of 2 sequences
    model = Transformer(spec).double()
    model.load_state_dict({k: torch.from_numpy(v) for k, v in weights.items()})
    model.train()
    logits = model(torch.from_numpy(ids[0]))
    nll, _ = token_nll(logits, torch.from_numpy(labels[0]))
    valid = int((labels != IGNORE_INDEX).sum())
    ((nll + aux_loss_sum(model)) / valid).backward()
    grads = dict(model.named_parameters())
    rng = np.random.default_rng(1)
    for name in ("layers.0.mlp.router.weight", "layers.1.mlp.router.weight", "layers.1.mlp.experts.up_proj.weight"):
        for _ in range(3):
            idx = tuple(int(rng.integers(0, n)) for n in weights[name].shape)
            eps = 1e-6
            plus, minus = dict(weights), dict(weights)
            plus[name], minus[name] = weights[name].copy(), weights[name].copy()
            plus[name][idx] += eps
            minus[name][idx] -= eps
            numeric = (reference_loss(spec, plus, ids, labels) - reference_loss(spec, minus, ids, labels)) / (2 * eps)
            got = float(grads[name].grad[idx])
            assert got == pytest.approx(numeric, rel=1e-4, abs=1e-9), (name, idx)


def test_hookable_modules_are_the_spec_names() -> None:
    from mindfoundry.backends.mindspore.model import Transformer as MsTransformer
    from mindfoundry.backends.mindspore.probe_hooks import hookable_modules as ms_modules
    from mindfoundry.backends.torch.model import Transformer as PtTransformer
    from mindfoundry.backends.torch.probe_hooks import hookable_modules as pt_modules

    spec = ModelSpec.from_config(
        tiny_config(model={"n_layers": 4, "moe": {"num_experts": 3, "top_k": 1, "every": 2}}).model
    )
    for modules in (pt_modules(PtTransformer(spec)), ms_modules(MsTransformer(spec))):
        assert list(modules) == module_names(spec)
        assert {name: type(m).__name__ for name, m in modules.items()} == module_classes(spec)


def test_both_engines_dump_a_moe_step(engines, tmp_path) -> None:
    """The hooked debug step of a MoE model: every module fires on both engines, the same names, the same
    numbers except inside mlp.experts (torch runs experts on routed rows, MindSpore on every token)."""
    from mindfoundry.debug.dump import DumpWriter
    from mindfoundry.debug.dump_folders import read_dump
    from mindfoundry.debug.probe import Probe

    ids, labels = batches()
    valid = int((labels[0] != IGNORE_INDEX).sum())
    dumps, losses = {}, {}
    for name, (backend, cfg, spec) in engines.items():
        backend.load_weights(init_weights(spec, 11))
        backend.load_optimizer_state({k: np.zeros_like(v) for k, v in backend.optimizer_state().items()}, 0)
        writer = DumpWriter(tmp_path / name, 1, 0, "tensor", {"backend": name})
        losses[name] = backend.train_step(ids[0], labels[0], step_scalars(1, STEPS, cfg.optim, valid),
                                          Probe(writer, directions=("forward", "backward", "grads"))).loss
        writer.close()
        dumps[name] = read_dump(writer.dir)
    spec = engines["torch"][2]
    assert losses["mindspore"] == pytest.approx(
        reference_loss(spec, init_weights(spec, 11), ids[0], labels[0]), rel=1e-5
    )
    assert losses["torch"] == pytest.approx(losses["mindspore"], rel=1e-5)
    ms, pt = dumps["mindspore"], dumps["torch"]
    names = sorted(r["name"] for r in ms.records)
    assert names == sorted(r["name"] for r in pt.records)
    fired = {r["module"] for r in ms.records}
    assert set(module_names(spec)) <= fired  # the root, the MoE blocks and their mlp included
    by_name = pt.by_name()
    compared = 0
    for r in ms.records:
        a, b = np.asarray(ms.array(r), np.float64), np.asarray(pt.array(by_name[r["name"]]), np.float64)
        if ".mlp.experts" in r["name"] and ".weight" not in r["name"]:
            continue  # engine-specific shapes (see model/spec.py module_names)
        assert a.shape == b.shape, r["name"]
        assert np.abs(a - b).max() <= 1e-4 * (np.abs(b).max() + 1e-12), r["name"]
        compared += 1
    assert compared > 200


def test_torch_refuses_moe_layouts_it_cannot_run() -> None:
    from mindfoundry.backends.torch.distributed import Layout
    from mindfoundry.backends.torch.expert_parallel import check_moe_layout
    from mindfoundry.backends.torch.model import Transformer

    moe = Transformer(ModelSpec.from_config(tiny_config(model=MOE).model))
    dense = Transformer(ModelSpec.from_config(tiny_config().model))
    check_moe_layout(moe, Layout(dp_shard=2, ep=2))
    check_moe_layout(moe, Layout(dp_replicate=2, dp_shard=2, ep=2))
    check_moe_layout(
        dense, Layout(tp=2)
    )  # ep on a dense model is the layout rules' (refused at launch: test_layout.py)
    with pytest.raises(NotImplementedError, match="ep: 4"):
        check_moe_layout(moe, Layout(dp_shard=4, ep=2))
    for layout in (Layout(tp=2), Layout(pp=2), Layout(cp=2)):
        with pytest.raises(NotImplementedError, match="mixture-of-experts"):
            check_moe_layout(moe, layout)


# -- capacity (model.moe.capacity_factor): MindSpore routes tokens into per-expert buffers --------------------------
CAPACITY = {"moe": {"num_experts": 4, "top_k": 2, "capacity_factor": 0.75}}  # 6 of a sequence's 32 pairs per expert


@pytest.fixture(scope="module")
def capacity_engines(engines):  # after `engines`: MindSpore's device is set by the first backend of the session
    out = {}
    for name in ("mindspore", "torch"):
        cfg = tiny_config(model=CAPACITY, train={"grad_accum": 2, "micro_batch_size": 2}).model_copy(
            update={"backend": name}
        )
        spec = ModelSpec.from_config(cfg.model)
        out[name] = (create_backend(cfg, spec, launch_layout(cfg)), cfg, spec)
    return out


def test_capacity_drops_the_late_pairs_on_both_engines(capacity_engines) -> None:
    """Both engines equal the numpy reference (pair by pair, per sequence) with pairs dropped, and train alike."""
    ids, labels = batches()
    spec = capacity_engines["torch"][2]
    assert moe_capacity(spec, 16) == 6
    weights = init_weights(spec, 11)
    want = ref.forward(spec, weights, ids[0, 0])
    unlimited = ref.forward(ModelSpec.from_config(tiny_config(model=MOE).model), weights, ids[0, 0])
    assert np.abs(want - unlimited).max() > 1e-3  # pairs were dropped: a different function
    losses: dict[str, list[float]] = {}
    for name, (backend, cfg, _) in capacity_engines.items():
        backend.load_weights(weights)
        logits = backend.logits(ids[0, 0])
        assert np.abs(logits - want).max() < 1e-6 * np.abs(want).max(), (
            name
        )  # measured 2.1e-7 (MindSpore), 2.3e-7 (torch)
        losses[name] = []
        for t in range(1, STEPS + 1):
            valid = int((labels[t - 1] != IGNORE_INDEX).sum())
            losses[name].append(
                backend.train_step(ids[t - 1], labels[t - 1], step_scalars(t, STEPS, cfg.optim, valid)).loss
            )
    assert losses["mindspore"][0] == pytest.approx(reference_loss(spec, weights, ids[0], labels[0]), rel=1e-5)
    ms, pt = np.array(losses["mindspore"]), np.array(losses["torch"])
    assert np.all(np.abs(ms / pt - 1) < 1e-5)
    w_ms, w_pt = capacity_engines["mindspore"][0].weights(), capacity_engines["torch"][0].weights()
    assert max(float(np.abs(w_ms[k] - w_pt[k]).max()) for k in w_ms) < 1e-4
    assert pt[-1] < pt[0] - 0.3


def test_mindspore_runs_experts_on_capacity_rows_only(capacity_engines, engines) -> None:
    """The routed MoE's experts see E * capacity rows per sequence (not E * S), and a capacity that can never be
    reached is the unlimited model: same logits as every expert on every token."""
    import mindspore as ms

    ids = batches()[0][0, 0]  # 2 sequences of 16
    for backends, rows in ((capacity_engines, 2 * 6), (engines, 2 * 16)):
        backend = backends["mindspore"][0]
        seen = []
        cell = dict(backend.model.cells_and_names())["layers.0.mlp.experts.gate_proj"]
        ms.set_context(mode=ms.PYNATIVE_MODE)
        handle = cell.register_forward_hook(lambda _c, inputs, _o: seen.append(tuple(inputs[0].shape)))
        try:
            backend.model(ms.Tensor(ids.astype(np.int32)))
        finally:
            handle.remove()
            ms.set_context(mode=ms.GRAPH_MODE)
        assert seen == [(4, rows, 64)]
    full = tiny_config(model={"moe": {**MOE["moe"], "capacity_factor": 2.0}}).model_copy(
        update={"backend": "mindspore"}
    )
    spec = ModelSpec.from_config(full.model)
    assert moe_capacity(spec, 16) == 16
    routed, dense = create_backend(full, spec, launch_layout(full)), engines["mindspore"][0]
    for backend in (routed, dense):
        backend.load_weights(init_weights(spec, 11))
    a, b = routed.logits(ids), dense.logits(ids)
    # the same products on rows of the same shapes, gathered: bit-identical on a Xeon; on an AMD EPYC the matmul's
    # blocking for the two row counts differs in one rounding: measured 1.19e-07 (one float32 ulp of logits ~1.4)
    np.testing.assert_allclose(a, b, rtol=0, atol=1.2e-7)
