"""Hostile configs: seeded fuzzing of validation and of a dry train start, and YAML built to hang or exhaust memory.

Every case must end, within a time limit, either accepted or with a user error (exit 2) that names
the key; a traceback, a hang or a silently accepted non-finite/out-of-range value is a failure.
"""

from __future__ import annotations

import copy
import math
import random
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from mf_testing import tiny_run_tree
from mindfoundry.cli.main import main
from mindfoundry.config.load import validate
from mindfoundry.errors import MindFoundryError
from mindfoundry.workflows.run import dry_start

HOSTILE: list[Any] = [2**40, 2**64, -(2**63), -1, 0, 1, math.inf, -math.inf, math.nan, 1e308, -0.0, 3.5, True, None,
                      "", "\x00", "x" * 300, "auto", [], {}, [1] * 5, {"a": 1}, "../../../../etc/passwd", "1e3"]
#: Ordinary values, so that many fuzzed configs are valid and reach the dry start.
PLAUSIBLE: list[Any] = [2, 8, 64, 1000, 0.1, 1e-4, 0.9, False, "fp32", "fp16"]
#: Values no field may accept.
NEVER_VALID = (math.inf, -math.inf, 2**64, -(2**63), "\x00", "x" * 300)
CASES = 600
LIMIT_S = 5  # per case; measured: the slowest case takes 0.007 s


class Hang(Exception):
    pass


def _on_alarm(*_):
    raise Hang()


def leaf_paths(tree: Any, path: tuple = ()) -> list[tuple]:
    if isinstance(tree, dict):
        return [p for k, v in tree.items() for p in leaf_paths(v, path + (k,))] or [path]
    if isinstance(tree, list) and tree and isinstance(tree[0], dict):
        return [p for i, v in enumerate(tree) for p in leaf_paths(v, path + (i,))]
    return [path]


#: Keys left at their defaults in the tiny tree: fuzzed too, by adding them.
EXTRA = [
    ("seed",),
    ("run_dir",),
    ("model", "init_std"),
    ("model", "rope_theta"),
    ("model", "d_model"),
    ("model", "n_layers"),
    ("model", "vocab_size"),
    ("optim", "lr"),
    ("optim", "weight_decay"),
    ("data", "workers"),
    ("data", "output_dir"),
    ("train", "precision"),
    ("checkpoint", "every"),
    ("anomaly", "loss_spike"),
    ("parallel", "dp_shard"),
]


def _set(tree: dict, path: tuple, value: Any) -> None:
    node: Any = tree
    for key in path[:-1]:
        node = node.setdefault(key, {}) if isinstance(node, dict) else node[key]
    node[path[-1]] = value


def _key(path: tuple) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else (f".{p}" if i else p) for i, p in enumerate(path))


def _run(tree: dict) -> tuple[str, str]:
    """('ok' | 'error', message) of validating and dry-starting one config tree, within LIMIT_S."""
    signal.signal(signal.SIGALRM, _on_alarm)
    signal.alarm(LIMIT_S)
    try:
        dry_start(validate(tree))
        return "ok", ""
    except MindFoundryError as exc:
        return "error", str(exc)
    finally:
        signal.alarm(0)


def test_fuzzed_configs_end_in_a_verdict_naming_the_key(corpus_dir: Path, tmp_path: Path) -> None:
    base = tiny_run_tree(corpus_dir, tmp_path / "run")
    paths = leaf_paths(base) + [p for p in EXTRA if p not in leaf_paths(base)]
    rng = random.Random(16)
    outcomes = {"ok": 0, "error": 0}
    slowest = 0.0
    for case in range(CASES):
        tree = copy.deepcopy(base)
        chosen = rng.sample(paths, rng.choice((1, 1, 1, 2, 3)))
        values = [rng.choice(HOSTILE if rng.random() < 0.6 else PLAUSIBLE) for _ in chosen]
        for path, value in zip(chosen, values):
            _set(tree, path, copy.deepcopy(value))
        t0 = time.perf_counter()
        verdict, message = _run(tree)  # any other exception (a traceback) or Hang fails the test here
        slowest = max(slowest, time.perf_counter() - t0)
        outcomes[verdict] += 1
        if verdict == "error":
            assert all(len(line) <= 500 for line in message.splitlines()), (chosen, values, message[:300])
            if len(chosen) == 1:  # one bad value: the message names its key
                assert _key(chosen[0]) in message or _key(chosen[0][:-1]) in message, (chosen, values, message)
        for path, value in zip(chosen, values):
            if any(value is v or value == v for v in NEVER_VALID if not isinstance(v, float) or not math.isnan(v)):
                assert verdict == "error", (case, path, value)
    assert outcomes == {"ok": 56, "error": 544}  # seeded: both verdicts exercised, the same cases every run
    assert slowest < LIMIT_S


@pytest.mark.parametrize(
    "name,text,expect",
    [
        # "billion laughs": 9 anchors, each a list of 9 aliases of the previous (9^9 values once expanded)
        (
            "bomb",
            "a0: &a0 [x,x,x,x,x,x,x,x,x]\n"
            + "".join(f"a{i}: &a{i} [{','.join([f'*a{i - 1}'] * 9)}]\n" for i in range(1, 9))
            + "model: *a8\n",
            "expands to more than 100,000 values",
        ),
        ("deep", "model: " + "[" * 20000 + "]" * 20000 + "\n", "nests deeper than 64 levels (at line 1"),
        ("binary", "\udcff\x00\x01", "is not UTF-8 text"),
        ("scalar", "42\n", "must hold a mapping of sections"),
        ("tabs", "model:\n\t- x\n", "is not valid YAML at line 2"),
    ],
)
def test_hostile_yaml_files_are_refused_fast(tmp_path: Path, capsys, name: str, text: str, expect: str) -> None:
    path = tmp_path / f"{name}.yaml"
    path.write_bytes(text.encode("utf-8", "surrogateescape"))
    for command in (["config", "validate", str(path)], ["train", str(path), "--dry-run"]):
        t0 = time.perf_counter()
        assert main(command) == 2
        assert time.perf_counter() - t0 < 2  # the bomb and the 20,000-deep nesting used to hang or recurse
        err = capsys.readouterr().err
        assert expect in err and "Traceback" not in err and len(err) < 1000, err


def test_out_of_range_values_name_key_and_range(corpus_dir: Path, tmp_path: Path) -> None:
    base = tiny_run_tree(corpus_dir, tmp_path / "run")
    for path, value, expect in [
        (("seed",), 2**32, "seed=4294967296: Input should be less than 4294967296"),
        (("optim", "lr"), math.inf, "optim.lr=inf: Input should be a finite number"),
        (("model", "init_std"), math.inf, "model.init_std=inf: Input should be a finite number"),
        (("model", "rope_theta"), math.nan, "model.rope_theta=nan: Input should be a finite number"),
        (("data", "workers"), 1_000_000, "data.workers=1000000: 1000000 processes on a machine with"),
        (("model", "d_model"), 2**40, "model.d_model=1099511627776: Input should be less than or equal to 65536"),
        (("train", "steps"), 2**64, "integers in a config must be within ±2**53"),
        (("run_dir",), "runs/\x00x", "holds a control character"),
        (("run_dir",), "runs/" + "x" * 300, "has a 300-byte folder name: at most 200"),
    ]:
        tree = copy.deepcopy(base)
        _set(tree, path, value)
        verdict, message = _run(tree)
        assert verdict == "error" and expect in message, (path, value, message)
    tree = copy.deepcopy(base)
    _set(tree, ("model", "d_model"), 16384)
    _set(tree, ("model", "n_heads"), 128)
    _set(tree, ("model", "n_layers"), 200)
    verdict, message = _run(tree)  # valid, but not on this machine: refused before anything is allocated
    assert verdict == "error" and "this run needs about" in message and "and this machine has" in message
