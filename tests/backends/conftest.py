"""Shared fixtures for backend tests: a tiny resolved config and its spec."""

from __future__ import annotations

import pytest

from mindfoundry.config.load import validate
from mindfoundry.model.spec import ModelSpec


def tiny_config(**sections):
    tree = {
        "data": {"sources": [{"name": "c", "paths": ["x"]}]},
        "model": {"vocab_size": 300, "d_model": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "max_seq_len": 64},
        "train": {"micro_batch_size": 4, "seq_len": 16, "steps": 200},
        "optim": {"warmup_steps": 0, "lr": 3e-3},
    }
    for name, values in sections.items():
        tree[name] = {**tree.get(name, {}), **values}
    return validate(tree)


@pytest.fixture
def make_config():
    """Factory: tiny_config(section=dict(...)) with per-test overrides."""
    return tiny_config


@pytest.fixture
def tiny():
    cfg = tiny_config()
    return cfg, ModelSpec.from_config(cfg.model)
