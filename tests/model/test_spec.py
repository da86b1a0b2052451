"""The framework-free model spec: names, sizes, FLOPs and init, checked against hand arithmetic."""

from __future__ import annotations

import numpy as np
import pytest

from mindfoundry.config.load import validate
from mindfoundry.model.spec import (
    ModelSpec,
    decays,
    flops_per_token,
    init_weights,
    num_parameters,
    parameter_shapes,
    rope_tables,
)


def spec(**model) -> ModelSpec:
    cfg = validate({"data": {"sources": [{"name": "c", "paths": ["x"]}]}, "model": model})
    return ModelSpec.from_config(cfg.model)


def test_parameter_names_and_count_by_hand() -> None:
    s = spec(vocab_size=1000, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=128, tie_embeddings=False)
    shapes = parameter_shapes(s)
    assert shapes["layers.1.attn.k_proj.weight"] == (32, 64)  # 2 kv heads * head_dim 16
    assert shapes["layers.0.mlp.down_proj.weight"] == (64, 128)
    assert list(shapes)[:2] == ["embed.weight", "layers.0.attn_norm.weight"]
    per_layer = 64 + 64 * 64 + 2 * 32 * 64 + 64 * 64 + 64 + 3 * 64 * 128
    assert num_parameters(s) == 1000 * 64 + 2 * per_layer + 64 + 1000 * 64
    tied = spec(vocab_size=1000, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=128)
    assert "lm_head.weight" not in parameter_shapes(tied)
    assert num_parameters(tied) == num_parameters(s) - 1000 * 64


def test_flops_per_token_is_6n_plus_attention() -> None:
    s = spec(vocab_size=1000, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=128)
    n_matmul = 2 * (64 * 64 + 2 * 32 * 64 + 64 * 64 + 3 * 64 * 128) + 1000 * 64  # projections + tied head
    assert flops_per_token(s, 128) == 6 * n_matmul + 12 * 2 * 64 * 128


def test_weight_decay_only_on_matrices() -> None:
    shapes = parameter_shapes(spec())
    assert not decays("norm.weight", shapes["norm.weight"])
    assert decays("layers.0.attn.q_proj.weight", shapes["layers.0.attn.q_proj.weight"])


def test_init_rule_and_determinism() -> None:
    s = spec(vocab_size=4096, d_model=256, n_layers=8, n_heads=8)
    w = init_weights(s, seed=7)
    assert np.std(w["embed.weight"]) == pytest.approx(0.02, rel=0.01)
    assert np.std(w["layers.3.attn.o_proj.weight"]) == pytest.approx(0.02 / np.sqrt(16), rel=0.02)
    assert np.std(w["layers.3.mlp.down_proj.weight"]) == pytest.approx(0.02 / np.sqrt(16), rel=0.02)
    assert np.all(w["layers.0.mlp_norm.weight"] == 1.0)
    again = init_weights(s, seed=7)
    assert all(np.array_equal(w[k], again[k]) for k in w)
    assert not np.array_equal(w["embed.weight"], init_weights(s, seed=8)["embed.weight"])


def test_rope_tables_rotate_half_convention() -> None:
    s = spec(d_model=64, n_heads=4)  # head_dim 16
    cos, sin = rope_tables(s, 10)
    assert cos.shape == (10, 16)
    assert np.allclose(cos[0], 1) and np.allclose(sin[0], 0)
    assert np.allclose(cos[:, :8], cos[:, 8:])  # each frequency appears in both halves
    assert sin[3, 0] == pytest.approx(np.sin(3.0), abs=1e-6)  # frequency 1 for the first pair
