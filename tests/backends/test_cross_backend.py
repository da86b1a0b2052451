"""MindSpore and PyTorch are numerically interchangeable: same weights + same batch -> same numbers."""

from __future__ import annotations

import numpy as np
import pytest

from mf_testing import markov_batches

pytest.importorskip("mindspore")
pytest.importorskip("torch")

from mindfoundry.backends.base import create_backend  # noqa: E402
from mindfoundry.model.spec import ModelSpec, init_weights, module_boundaries  # noqa: E402
from mindfoundry.parallel.layout import launch_layout  # noqa: E402
from mindfoundry.train.schedule import step_scalars  # noqa: E402


def engines(make_config, **sections):
    out = {}
    for name in ("mindspore", "torch"):
        cfg = make_config(**sections).model_copy(update={"backend": name})
        spec = ModelSpec.from_config(cfg.model)
        backend = create_backend(cfg, spec, launch_layout(cfg))
        backend.load_weights(init_weights(spec, 11))  # one set of initial weights for both
        out[name] = (backend, cfg)
    return out




def test_ten_steps_agree(make_config) -> None:
    eng = engines(make_config, train={"grad_accum": 2, "micro_batch_size": 2})
    batches = markov_batches(300, 10, (2, 2, 16))
    losses = {name: [] for name in eng}
    norms = {name: [] for name in eng}
    for t in range(1, 11):
        ids, labels = batches[t - 1, ..., :-1], batches[t - 1, ..., 1:]
        for name, (backend, cfg) in eng.items():
            out = backend.train_step(ids, labels, step_scalars(t, 10, cfg.optim, labels.size))
            losses[name].append(out.loss)
            norms[name].append(out.grad_norm)
    ms_l, pt_l = np.array(losses["mindspore"]), np.array(losses["torch"])
    assert abs(ms_l[0] / pt_l[0] - 1) < 1e-5  # first-step loss
    assert abs(norms["mindspore"][0] / norms["torch"][0] - 1) < 1e-4  # first-step global grad norm
    assert np.all(np.abs(ms_l / pt_l - 1) < 1e-4)  # the whole curve
    assert ms_l[-1] < ms_l[0] - 0.5  # and it is a curve: the model learns
    w_ms, w_pt = eng["mindspore"][0].weights(), eng["torch"][0].weights()
    assert max(float(np.abs(w_ms[k] - w_pt[k]).max()) for k in w_ms) < 1e-4
    o_ms, o_pt = eng["mindspore"][0].optimizer_state(), eng["torch"][0].optimizer_state()
    assert o_ms.keys() == o_pt.keys()


def test_block_outputs_agree(make_config) -> None:
    eng = engines(make_config)
    ids = markov_batches(300, 1, (1, 2, 16))[0, 0, :, :-1]
    outs = {name: backend.module_outputs(ids) for name, (backend, _) in eng.items()}
    spec = ModelSpec.from_config(eng["torch"][1].model)
    assert set(outs["torch"]) == set(outs["mindspore"]) == set(module_boundaries(spec))
    for name in module_boundaries(spec):
        a, b = outs["mindspore"][name].ravel().astype(np.float64), outs["torch"][name].ravel().astype(np.float64)
        cosine = a @ b / np.linalg.norm(a) / np.linalg.norm(b)
        assert cosine > 0.99999, name
