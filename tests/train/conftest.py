"""Fixtures the training tests share."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def mindspore_reference(corpus_dir: Path, tmp_path_factory) -> dict[int, float]:
    """The losses of the uninterrupted MindSpore run (test_recovery's config, checkpointing to its run directory) that
    every interrupted run of tests/train is held to: once per test run (shared by the workers), not per module."""
    from test_recovery import losses, run, write_config

    from mf_testing import shared_once

    def make(root: Path) -> dict[int, float]:
        proc = run("train", str(write_config(corpus_dir, root, "mindspore", "mindspore")))
        assert proc.returncode == 0, proc.stderr
        return losses(root / "mindspore")

    return shared_once(tmp_path_factory, "mindspore-reference", make)
