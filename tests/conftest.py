"""Fixtures shared across test folders: a small corpus of real text and a tiny run config."""

from __future__ import annotations

import json
import sysconfig
from pathlib import Path

import pytest
import yaml


@pytest.fixture(scope="session")
def corpus_dir(tmp_path_factory) -> Path:
    """~120 real documents: Python stdlib modules as a .jsonl and a folder of .txt files."""
    root = tmp_path_factory.mktemp("corpus")
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted((stdlib / "email").glob("*.py")) + sorted((stdlib / "json").glob("*.py")) + sorted((stdlib / "logging").glob("*.py"))
    with open(root / "code.jsonl", "w", encoding="utf-8") as fh:
        for f in files:
            fh.write(json.dumps({"text": f.read_text(encoding="utf-8")}) + "\n")
    txt = root / "txt"
    txt.mkdir()
    for f in sorted((stdlib / "asyncio").glob("*.py"))[:40]:
        (txt / f"{f.stem}.txt").write_text(f.read_text(encoding="utf-8"), encoding="utf-8")
    return root


def tiny_run_tree(corpus: Path, run_dir: Path, **overrides) -> dict:
    tree = {
        "name": "tiny",
        "run_dir": str(run_dir),
        "seed": 7,
        "model": {"vocab_size": 512, "d_model": 32, "n_layers": 2, "n_heads": 2, "max_seq_len": 64},
        "data": {"sources": [{"name": "code", "paths": [str(corpus / "code.jsonl")]},
                             {"name": "asyncio", "paths": [str(corpus / "txt")]}],
                 "validation_fraction": 0.1},
        "train": {"steps": 6, "micro_batch_size": 4, "grad_accum": 2, "seq_len": 32, "eval_every": 0, "eval_batches": 2},
        "optim": {"warmup_steps": 2, "lr": 1e-2},
        "checkpoint": {"every": 3, "keep_last": 5},
        "monitor": {"progress": False},
    }
    for key, value in overrides.items():
        section, field = key.split("__")
        tree[section][field] = value
    return tree


@pytest.fixture
def tiny_run(corpus_dir: Path, tmp_path: Path):
    """Factory writing a tiny config file; returns its path."""

    def make(name: str = "run", **overrides) -> Path:
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(tiny_run_tree(corpus_dir, tmp_path / name, **overrides)))
        return path

    return make
