"""The mixture-of-experts part of the model spec and config: names, sizes, FLOPs, init, validation."""

from __future__ import annotations

import numpy as np
import pytest

from mf_testing import tiny_config
from mindfoundry.config.load import ConfigError, validate
from mindfoundry.model.spec import (
    ModelSpec,
    decays,
    flops_per_token,
    init_weights,
    is_moe_layer,
    module_names,
    moe_capacity,
    num_active_parameters,
    num_parameters,
    parameter_shapes,
)

DENSE = dict(vocab_size=1000, d_model=64, n_layers=4, n_heads=4, n_kv_heads=2, ffn_dim=128)


def spec(**model) -> ModelSpec:
    cfg = validate({"data": {"sources": [{"name": "c", "paths": ["x"]}]}, "model": model})
    return ModelSpec.from_config(cfg.model)


def test_moe_blocks_and_parameter_names() -> None:
    s = spec(**DENSE, moe={"num_experts": 8, "top_k": 2, "every": 2})
    assert [i for i in range(4) if is_moe_layer(s, i)] == [1, 3]  # every 2nd block, starting with the 2nd
    shapes = parameter_shapes(s)
    assert shapes["layers.1.mlp.router.weight"] == (8, 64)
    assert shapes["layers.1.mlp.experts.gate_proj.weight"] == (8, 128, 64)
    assert shapes["layers.1.mlp.experts.up_proj.weight"] == (8, 128, 64)
    assert shapes["layers.1.mlp.experts.down_proj.weight"] == (8, 64, 128)
    assert "layers.1.mlp.gate_proj.weight" not in shapes and shapes["layers.0.mlp.gate_proj.weight"] == (128, 64)
    assert [n for n in shapes if n.startswith("layers.1.mlp")] == [
        "layers.1.mlp_norm.weight", "layers.1.mlp.router.weight", "layers.1.mlp.experts.gate_proj.weight",
        "layers.1.mlp.experts.up_proj.weight", "layers.1.mlp.experts.down_proj.weight"]
    assert all(decays(n, shape) for n, shape in shapes.items() if ".mlp." in n)
    names = module_names(s)
    assert names[names.index("layers.1.mlp"):names.index("layers.2")] == [
        "layers.1.mlp", "layers.1.mlp.router", "layers.1.mlp.experts", "layers.1.mlp.experts.gate_proj",
        "layers.1.mlp.experts.up_proj", "layers.1.mlp.experts.down_proj"]
    assert "layers.0.mlp.gate_proj" in names and "layers.0.mlp.router" not in names


def test_dense_spec_is_unchanged_by_the_moe_section() -> None:
    dense, explicit = spec(**DENSE), spec(**DENSE, moe={"num_experts": 0, "top_k": 4, "every": 3})
    assert parameter_shapes(dense) == parameter_shapes(explicit)
    assert module_names(dense) == module_names(explicit)
    assert num_active_parameters(dense) == num_parameters(dense)
    assert flops_per_token(dense, 128) == flops_per_token(explicit, 128)
    a, b = init_weights(dense, 3), init_weights(explicit, 3)
    assert all(np.array_equal(a[k], b[k]) for k in a)


def test_moe_counts_and_flops_by_hand() -> None:
    dense = spec(**DENSE)
    s = spec(**DENSE, moe={"num_experts": 8, "top_k": 2, "every": 2})
    expert = 3 * 64 * 128  # one SwiGLU expert = one dense MLP
    assert num_parameters(s) == num_parameters(dense) + 2 * (8 * 64 + 7 * expert)  # 2 MoE blocks: router + 7 more MLPs
    assert num_active_parameters(s) == num_parameters(dense) + 2 * (8 * 64 + expert)  # router + top_k=2 experts
    assert flops_per_token(s, 128) == flops_per_token(dense, 128) + 6 * 2 * (8 * 64 + expert)


def test_moe_init() -> None:
    s = spec(vocab_size=512, d_model=256, n_layers=8, n_heads=8, ffn_dim=512, moe={"num_experts": 4, "top_k": 1})
    w = init_weights(s, seed=7)
    assert np.std(w["layers.0.mlp.experts.gate_proj.weight"]) == pytest.approx(0.02, rel=0.01)
    assert np.std(w["layers.0.mlp.experts.down_proj.weight"]) == pytest.approx(0.02 / np.sqrt(16), rel=0.01)  # residual
    assert np.std(w["layers.0.mlp.router.weight"]) == pytest.approx(0.002, rel=0.05)  # small: near-uniform routing
    experts = w["layers.0.mlp.experts.up_proj.weight"]
    assert not np.array_equal(experts[0], experts[1])  # the experts start different


@pytest.mark.parametrize("moe, message", [
    ({"num_experts": 4, "top_k": 5}, "top_k=5 exceeds num_experts=4"),
    ({"num_experts": 1}, "num_experts=1"),
    ({"num_experts": 4, "every": 0}, "every"),
    ({"num_experts": 4, "aux_loss_weight": -1}, "aux_loss_weight"),
    ({"num_experts": 4, "capacity_factor": 0}, r"model.moe.capacity_factor=0: Input should be greater than 0"),
    ({"capacity_factor": 1.25}, r"capacity_factor=1.25 limits experts, but the model is dense"),
])
def test_moe_config_validation(moe: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        tiny_config(model={"moe": moe})


def test_moe_cross_field_rules() -> None:
    with pytest.raises(ConfigError, match="model.moe.every=3 exceeds model.n_layers=2"):
        tiny_config(model={"moe": {"num_experts": 4, "every": 3}})  # 2 layers
    with pytest.raises(ConfigError, match=r"parallel.ep=4 does not divide model.moe.num_experts=6: use ep in \{1, 2\}"):
        tiny_config(model={"moe": {"num_experts": 6}}, parallel={"dp_shard": 4, "ep": 4})
    with pytest.raises(ConfigError, match="parallel.ep=2 spreads experts, but the model is dense"):
        tiny_config(parallel={"dp_shard": 2, "ep": 2})
    assert tiny_config(model={"moe": {"num_experts": 4}}, parallel={"dp_shard": 2, "ep": 2}).parallel.ep == 2


def test_capacity_per_sequence() -> None:
    """ceil(c * top_k * S / E), never above S (a position's top_k experts are distinct)."""
    moe = {"num_experts": 8, "top_k": 2}
    assert moe_capacity(spec(moe=moe), 512) is None  # no limit by default
    assert moe_capacity(spec(moe={**moe, "capacity_factor": 1.25}), 512) == 160
    assert moe_capacity(spec(moe={**moe, "capacity_factor": 1.25}), 13) == 5  # ceil(4.0625)
    assert moe_capacity(spec(moe={**moe, "capacity_factor": 8.0}), 512) == 512
