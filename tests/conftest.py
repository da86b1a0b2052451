"""Fixtures shared across test folders: a small corpus of real text, tiny run configs."""

from __future__ import annotations

import json
import shutil
import sysconfig
from pathlib import Path

import pytest
import yaml

from mf_testing import shared_once, tiny_caption_tree, tiny_config, tiny_mae_tree, tiny_run_tree, write_digits
from mindfoundry.model.spec import ModelSpec


@pytest.fixture(scope="session", autouse=True)
def _private_peak_cache(tmp_path_factory) -> None:
    """Measured CPU peaks go to a folder of this test session (and to every process it starts), not the user's cache."""
    import os

    os.environ["MF_CACHE_DIR"] = str(tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """A real S3 server (moto_server) on a free port, for the whole session (see tests/s3_server.py)."""
    from s3_server import S3Server

    server = S3Server(tmp_path_factory.mktemp("s3") / "moto.log")
    yield server
    server.stop()


@pytest.fixture
def s3(s3_server, monkeypatch):
    """The S3 server, with this process's AWS variables pointing at it for the test."""
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    return s3_server


@pytest.fixture(scope="session")
def corpus_dir(tmp_path_factory) -> Path:
    """~120 real documents: Python stdlib modules as a .jsonl and a folder of .txt files. One folder for the whole
    test run, so that every worker's configs name the same files (the runs shared_once shares are then the runs each
    worker would have made)."""

    def make(root: Path) -> Path:
        stdlib = Path(sysconfig.get_paths()["stdlib"])
        files = (
            sorted((stdlib / "email").glob("*.py"))
            + sorted((stdlib / "json").glob("*.py"))
            + sorted((stdlib / "logging").glob("*.py"))
        )
        with open(root / "code.jsonl", "w", encoding="utf-8") as fh:
            for f in files:
                fh.write(json.dumps({"text": f.read_text(encoding="utf-8")}) + "\n")
        txt = root / "txt"
        txt.mkdir()
        for f in sorted((stdlib / "asyncio").glob("*.py"))[:40]:
            (txt / f"{f.stem}.txt").write_text(f.read_text(encoding="utf-8"), encoding="utf-8")
        return root

    return shared_once(tmp_path_factory, "corpus", make)


@pytest.fixture(scope="session")
def digits_prepared(tmp_path_factory) -> tuple[Path, Path]:
    """400 of scikit-learn's digits as an image-text folder, and that folder prepared once for the whole test run (the
    data of :func:`mf_testing.tiny_mae_tree`): (images, prepared data)."""

    def make(root: Path) -> tuple[Path, Path]:
        from mindfoundry.cli.main import main

        digits = write_digits(root, 400)
        config = root / "prepare.yaml"
        config.write_text(yaml.safe_dump(tiny_mae_tree(digits, root / "prepared", root / "run")))
        assert main(["prepare", str(config)]) == 0
        return digits, root / "prepared"

    return shared_once(tmp_path_factory, "digits", make)


@pytest.fixture(scope="session")
def digits_captioned(digits_prepared: tuple[Path, Path], tmp_path_factory) -> tuple[Path, Path]:
    """The same digits prepared for a captioner (its tokenizer holds <|image|>): (images, prepared data)."""

    def make(root: Path) -> tuple[Path, Path]:
        from mindfoundry.cli.main import main

        config = root / "prepare.yaml"
        config.write_text(yaml.safe_dump(tiny_caption_tree(digits_prepared[0], root / "prepared", root / "run")))
        assert main(["prepare", str(config)]) == 0
        return digits_prepared[0], root / "prepared"

    return shared_once(tmp_path_factory, "digits-captioned", make)


@pytest.fixture
def tiny_caption(digits_captioned: tuple[Path, Path], tmp_path: Path):
    """Factory writing a tiny captioner config on the shared prepared digits; returns its path."""

    return _config_writer(tmp_path, "caption", lambda run, **overrides: tiny_caption_tree(*digits_captioned, run,
                                                                                          **overrides))


@pytest.fixture
def tiny_mae(digits_prepared: tuple[Path, Path], tmp_path: Path):
    """Factory writing a tiny masked-autoencoder config on the shared prepared digits; returns its path."""

    return _config_writer(tmp_path, "mae", lambda run, **overrides: tiny_mae_tree(*digits_prepared, run, **overrides))


@pytest.fixture
def tiny_run(corpus_dir: Path, tmp_path: Path):
    """Factory writing a tiny config file; returns its path."""

    return _config_writer(tmp_path, "run", lambda run, **overrides: tiny_run_tree(corpus_dir, run, **overrides))


def _config_writer(tmp_path: Path, default: str, tree_for):
    """A factory ``make(name, **overrides)`` writing ``tree_for(tmp_path / name, **overrides)`` as
    ``tmp_path / name.yaml``; returns its path."""

    def make(name: str = default, **overrides) -> Path:
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(tree_for(tmp_path / name, **overrides)))
        return path

    return make


@pytest.fixture(scope="session")
def tiny_prepared_once(corpus_dir: Path, tmp_path_factory) -> Path:
    """The tiny corpus prepared once per session (a data folder to copy, never to change)."""
    from mindfoundry.config.load import validate
    from mindfoundry.data.prepare.pipeline import prepare_data

    cfg = validate(tiny_run_tree(corpus_dir, tmp_path_factory.mktemp("tiny-prepared") / "run"))
    return prepare_data(cfg, log=lambda _: None).root


@pytest.fixture
def tiny_prepared(tiny_run, tiny_prepared_once: Path, tmp_path: Path):
    """(config, PreparedData) of the tiny corpus in this test's tmp_path (run.yaml, run/data), free to change."""
    from mindfoundry.config.load import load_config
    from mindfoundry.data.prepare.pipeline import prepare_data

    cfg = load_config(tiny_run())
    shutil.copytree(tiny_prepared_once, cfg.data.output_dir)
    return cfg, prepare_data(cfg, log=lambda _: None)  # reuses the copy: same data config


@pytest.fixture
def make_config():
    """Factory: tiny_config(section=dict(...)) with per-test overrides."""
    return tiny_config


@pytest.fixture
def tiny():
    cfg = tiny_config()
    return cfg, ModelSpec.from_config(cfg.model)


def pytest_collection_modifyitems(config, items) -> None:
    """Slow tests (multi-process launches, multi-minute soaks) first, the rest in file order.

    `make test` runs the suite on two workers (pytest-xdist, `-n 2`), which hand out tests in collection order: a
    multi-minute test collected last would run alone while the other worker idles. Started first, the long tests
    spread over both workers and the short ones fill the gaps. The sort is stable, so every worker collects the
    same order (xdist requires it)."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
