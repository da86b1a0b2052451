"""Fixtures shared across test folders: a small corpus of real text, tiny run configs."""

from __future__ import annotations

import json
import sysconfig
from pathlib import Path

import pytest
import yaml

from mf_testing import tiny_config, tiny_run_tree
from mindfoundry.model.spec import ModelSpec


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


@pytest.fixture
def tiny_run(corpus_dir: Path, tmp_path: Path):
    """Factory writing a tiny config file; returns its path."""

    def make(name: str = "run", **overrides) -> Path:
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(tiny_run_tree(corpus_dir, tmp_path / name, **overrides)))
        return path

    return make


@pytest.fixture
def make_config():
    """Factory: tiny_config(section=dict(...)) with per-test overrides."""
    return tiny_config


@pytest.fixture
def tiny():
    cfg = tiny_config()
    return cfg, ModelSpec.from_config(cfg.model)
