"""Configs read with YAML 1.2's scalars (config/yaml12.py), and a mapping given to --set merges into its section:
the surprises of issue #36 (items 3 and 4), each decided once and tested here."""

from __future__ import annotations

from pathlib import Path

import pytest

from mf_testing import tiny_config
from mindfoundry.config.load import ConfigError, apply_overrides, load_config, validate
from mindfoundry.config.yaml12 import load_yaml


def written(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "c.yaml"
    path.write_text("data: {sources: [{name: c, paths: [x]}]}\n" + text, encoding="utf-8")
    return path


def test_sexagesimal_looking_values_are_strings_and_refused_where_a_number_is_meant(tmp_path: Path) -> None:
    """`steps: 1:30` was YAML 1.1's sexagesimal 90, accepted without a word."""
    with pytest.raises(ConfigError, match=r"train\.steps='1:30': Input should be a valid integer"):
        load_config(written(tmp_path, "train: {steps: 1:30}\n"))


def test_yes_no_on_off_are_words_a_name_keeps_and_a_switch_reads(tmp_path: Path) -> None:
    cfg = load_config(written(tmp_path, "name: no\nmonitor: {tensorboard: off, progress: yes}\n"))
    assert cfg.name == "no"  # YAML 1.1 made it False (and the config refused a boolean name)
    assert cfg.monitor.tensorboard is False and cfg.monitor.progress is True


def test_numbers_read_as_yaml_1_2_writes_them(tmp_path: Path) -> None:
    cfg = load_config(written(tmp_path, "seed: 010\ntrain: {steps: 1e3}\noptim: {lr: 1e-3}\n"))
    assert cfg.seed == 10 and cfg.train.steps == 1000 and cfg.optim.lr == 0.001  # 010 was octal 8; 1e-3 a string
    with pytest.raises(ConfigError, match=r"train\.steps=1500\.5"):
        load_config(written(tmp_path, "train: {steps: 1.5005e3}\n"))


def test_a_mapping_given_to_set_merges_into_the_section() -> None:
    """--set 'model={}' turned a small model into the 256-dim default; --set 'train={steps: 2, seq_len: 64}' reset the
    section's other keys."""
    base = tiny_config().model_dump(mode="json")
    tree = apply_overrides(tiny_config().model_dump(mode="json"), ["model={}", "train={steps: 2, seq_len: 32}"])
    cfg = validate(tree)
    assert cfg.model.model_dump(mode="json") == base["model"]
    assert cfg.train.steps == 2 and cfg.train.seq_len == 32
    assert (
        cfg.train.micro_batch_size == base["train"]["micro_batch_size"]
        and cfg.train.eval_every == base["train"]["eval_every"]
    )


def test_a_key_given_twice_is_an_error_naming_it_and_both_lines(tmp_path: Path) -> None:
    """A second `checkpoint:` block reset `every` 4 -> 100 and `config validate` said valid (issue #48)."""
    path = written(tmp_path, "checkpoint:\n  every: 4\ntrain: {steps: 8}\ncheckpoint:\n  every: 100\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert str(caught.value) == (f"config file '{path}' is not valid YAML at line 5, column 1: duplicate key "
                                 "'checkpoint' (first at line 2, again at line 5): a key is given once in a "
                                 "mapping; merge the two")
    with pytest.raises(ConfigError, match=r"duplicate key 'steps' \(first at line 2, again at line 2\)"):
        load_config(written(tmp_path, "train: {steps: 8, steps: 9}\n"))
    # a merge key's entries are there to be overridden
    assert load_yaml("a: &x {b: 1, c: 2}\nd:\n  <<: *x\n  b: 3\n") == {"a": {"b": 1, "c": 2}, "d": {"b": 3, "c": 2}}
