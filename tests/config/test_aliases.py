"""MindFormers' parallel_config names and optim.warmup_ratio: accepted, shown in canonical form, conflicts refused."""

from __future__ import annotations

import pytest
import yaml

from mindfoundry.config.load import ConfigError, config_hash, load_config, to_yaml, validate

BASE = {"data": {"sources": [{"name": "c", "paths": ["x"]}]},
        "model": {"vocab_size": 512, "d_model": 64, "n_layers": 4, "n_heads": 4, "n_kv_heads": 4},
        "train": {"steps": 1000, "micro_batch_size": 2, "seq_len": 32}}


def tree(**sections) -> dict:
    return {**BASE, **{k: {**BASE.get(k, {}), **v} if isinstance(v, dict) else v for k, v in sections.items()}}


def test_mindformers_names_resolve_to_ours() -> None:
    """The source documents' 13B layout (data_parallel 2 x model_parallel 4, optimizer_shard, 4 gradient groups) and a
    pipeline, written the MindFormers way, validate to exactly the config written our way."""
    theirs = validate(
        tree(
            parallel={
                "data_parallel": 2,
                "model_parallel": 4,
                "pipeline_stage": 2,
                "micro_batch_num": 4,
                "use_seq_parallel": False,
                "optimizer_shard": True,
                "gradient_aggregation_group": 4,
            },
            optim={"warmup_ratio": 0.015},
            backend="mindspore",
        )
    )
    ours = validate(
        tree(
            parallel={
                "dp_replicate": 2,
                "tp": 4,
                "pp": 2,
                "sequence_parallel": False,
                "optimizer_shard": True,
                "grad_fusion_groups": 4,
            },
            train={"grad_accum": 4},
            optim={"warmup_steps": 15},
            backend="mindspore",
        )
    )
    assert theirs == ours and config_hash(theirs) == config_hash(ours)
    shown = yaml.safe_load(to_yaml(theirs))  # `config show`: the canonical form only
    assert (
        shown["parallel"]["tp"] == 4
        and "model_parallel" not in shown["parallel"]
        and "warmup_ratio" not in shown["optim"]
    )
    assert (shown["train"]["grad_accum"], shown["optim"]["warmup_steps"], shown["parallel"]["world_size"]) == (
        4,
        15,
        16,
    )


def test_the_same_value_under_both_names_is_accepted() -> None:
    cfg = validate(tree(parallel={"model_parallel": 2, "tp": 2}))
    assert cfg.parallel.tp == 2


@pytest.mark.parametrize(
    "sections,message",
    [
        (
            {"parallel": {"model_parallel": 4, "tp": 2}},
            "parallel.model_parallel=4 (MindFormers' name for parallel.tp) conflicts with parallel.tp=2: keep one of "
            "the two keys",
        ),
        (
            {"parallel": {"micro_batch_num": 8}, "train": {"grad_accum": 2}},
            "parallel.micro_batch_num=8 (MindFormers' name for train.grad_accum) conflicts with train.grad_accum=2",
        ),
        (
            {"optim": {"warmup_ratio": 0.02, "warmup_steps": 30}},
            "optim.warmup_ratio=0.02 and optim.warmup_steps=30 both set the warmup: keep one of the two keys",
        ),
        (
            {"optim": {"warmup_ratio": 2}},
            "optim.warmup_ratio=2: give the share of train.steps spent warming up, between 0 and 1",
        ),
        (
            {"parallel": {"gradient_aggregation_group": 4}},
            "parallel.grad_fusion_groups=4 (MindFormers' gradient_aggregation_group) sets MindSpore's gradient "
            "all-reduce fusion; the torch engine's FSDP2",
        ),
        (
            {"parallel": {"data_parallel": 0}},
            "parallel.dp_replicate",
        ),  # the canonical key's own rule, under its own name
    ],
)
def test_conflicts_and_bad_values_name_the_keys(sections: dict, message: str) -> None:
    t = tree(**sections)
    if "gradient_aggregation_group" in sections.get("parallel", {}):
        t["backend"] = "torch"
    with pytest.raises(ConfigError) as err:
        validate(t)
    assert message in str(err.value)


def test_warmup_ratio_follows_overridden_steps(tmp_path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(tree(optim={"warmup_ratio": 0.01})))
    assert load_config(path).optim.warmup_steps == 10
    assert load_config(path, ["train.steps=5000"]).optim.warmup_steps == 50
