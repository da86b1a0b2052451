"""The `memory` section: which blocks recompute (one rule, asked by engines and planner) and every bad value's message.
"""

from __future__ import annotations

import pytest

from mf_testing import tiny_config
from mindfoundry.config.load import ConfigError
from mindfoundry.config.memory_config import MemoryConfig


@pytest.mark.parametrize("section,layers", [
    ({}, ()),
    ({"recompute": "full"}, (0, 1, 2, 3)),
    ({"recompute": "selective", "recompute_layers": 2}, (0, 1)),
    ({"recompute": "full", "recompute_layers": [3, 1]}, (1, 3)),
])
def test_recomputed_layers(section, layers) -> None:
    assert MemoryConfig(**section).recomputed_layers(4) == layers


def test_describe_names_mode_blocks_and_chunks() -> None:
    memory = MemoryConfig(recompute="full", recompute_layers=[0, 1, 2, 5], loss_chunk=256)
    assert memory.describe(8) == "full recompute (blocks 0-2, 5 of 8), loss in chunks of 256 positions"
    assert MemoryConfig().describe(8) == "no recompute, no offload, whole-vocabulary loss"


@pytest.mark.parametrize(
    "overrides,message",
    [
        (
            {"memory": {"recompute": "full", "recompute_layers": [5]}},
            "memory.recompute_layers lists block 5, which does not exist: the model has 2 blocks (0-1)",
        ),
        (
            {"memory": {"recompute": "full", "recompute_layers": 3}},
            "memory.recompute_layers=3: the model has 2 blocks; use at most 2",
        ),
        ({"memory": {"recompute_layers": [1]}}, "has no effect with memory.recompute: none"),
        ({"memory": {"recompute": "full", "recompute_layers": [0, 0]}}, "block [0] listed twice"),
        ({"memory": {"recompute": "full", "recompute_layers": 0}}, "0 leading blocks: give at least 1"),
        (
            {"memory": {"recompute": "partial"}},
            "memory.recompute='partial': Input should be 'none', 'selective' or 'full'",
        ),
        (
            {"memory": {"loss_chunk": 17}},
            "memory.loss_chunk=17 exceeds train.seq_len=16: a chunk holds at most one sequence's",
        ),
        (
            {"memory": {"offload_activations": True}},
            "with device: cpu: offloading moves activations from an accelerator",
        ),
        (
            {"memory": {"offload_activations": True}, "device": "cuda", "backend": "mindspore"},
            "on the mindspore backend: MindSpore's Cell.offload needs lazy-inline blocks on Ascend",
        ),
    ],
)
def test_bad_memory_settings_name_the_key_and_the_fix(overrides, message) -> None:
    with pytest.raises(ConfigError) as err:
        tiny_config(**overrides)
    assert message in str(err.value)


def test_offload_on_an_accelerator_passes_validation() -> None:
    assert tiny_config(memory={"offload_activations": True}, device="cuda", backend="torch").memory.offload_activations
