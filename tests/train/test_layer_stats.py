"""Per-module statistics against hand computation, and their records in a real (in-process) run."""

from __future__ import annotations

import numpy as np
import pytest

from mindfoundry.train.layer_stats import layer_grad_norms, layer_update_ratios, layer_weight_norms, module_of


def test_grouping_and_values_by_hand() -> None:
    assert module_of("layers.12.mlp.up_proj.weight") == "layers.12" and module_of("lm_head.weight") == "lm_head"
    names = ["embed.weight", "layers.0.attn.q_proj.weight", "layers.0.mlp_norm.weight", "norm.weight"]
    assert layer_grad_norms(names, np.array([9.0, 3.0, 4.0, 0.25])) == {
        "embed": 3.0,
        "layers.0": pytest.approx(np.sqrt(7.0)),
        "norm": 0.5,
    }
    before = {"layers.0.a": np.array([3.0, 4.0], np.float32), "layers.0.b": np.zeros(2, np.float32)}
    after = {"layers.0.a": np.array([3.0, 4.0], np.float32), "layers.0.b": np.array([0.0, 0.05], np.float32)}
    assert layer_weight_norms(before) == {"layers.0": 5.0}
    assert layer_update_ratios(before, after)["layers.0"] == pytest.approx(0.05 / 5.0, rel=1e-6)


@pytest.mark.parametrize("engine", ["mindspore", "torch"])
def test_engines_report_per_parameter_gradient_norms(make_config, engine: str) -> None:
    pytest.importorskip(engine)
    from mindfoundry.backends.base import create_backend
    from mindfoundry.model.spec import ModelSpec, init_weights
    from mindfoundry.parallel.layout import launch_layout
    from mindfoundry.train.schedule import step_scalars

    cfg = make_config(backend=engine)
    spec = ModelSpec.from_config(cfg.model)
    backend = create_backend(cfg, spec, launch_layout(cfg))
    backend.load_weights(init_weights(spec, 0))
    tokens = np.random.default_rng(0).integers(0, spec.vocab_size, (1, 4, 17)).astype(np.int32)
    out = backend.train_step(tokens[..., :-1], tokens[..., 1:], step_scalars(1, 10, cfg.optim, 64))
    assert out.grad_sq.shape == (len(init_weights(spec, 0)),)
    assert np.sqrt(out.grad_sq.sum()) == pytest.approx(out.grad_norm, rel=1e-5)
