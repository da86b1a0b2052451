"""Claiming a run directory survives a stop at any file operation: the next start adopts the folder.

CI once caught a SIGTERM landing between config.yaml and config.sha256: the next `train --resume auto`
refused its own run as "not a MindFoundry run" (exit 2). Here the claim is stopped at each of its file
operations in turn, the way the start-up signal handler stops it (Preempted raised where the process is).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mf_testing import StopAt, tiny_config
from mindfoundry.config.load import to_yaml
from mindfoundry.train.run_identity import run_identity
from mindfoundry.train.run_lock import LOCK_FILE, release
from mindfoundry.train.rundir import CONFIG_FILE, HASH_FILE, claim_run_dir
from mindfoundry.train.stop import Preempted


@pytest.mark.parametrize("resume", [False, True])
def test_a_claim_stopped_at_any_file_operation_is_adopted_by_the_next_start(
    resume: bool, tmp_path: Path, monkeypatch
) -> None:
    operations = 0
    while True:
        cfg = tiny_config(run_dir=str(tmp_path / f"stopped_at_{operations}"))  # a fresh folder each time
        run_dir = Path(cfg.run_dir)
        stop = StopAt(operations)
        with monkeypatch.context() as m:
            m.setattr(os, "fsync", stop.wrap(os.fsync))  # after a file's bytes are written aside; after a rename
            m.setattr(os, "replace", stop.wrap(os.replace))
            try:
                claim_run_dir(cfg, resume=resume, overwrite=False, log=lambda _: None)
                finished = True
            except Preempted:
                finished = False
        # what a start after the stop does: adopt the folder and finish the claim
        assert claim_run_dir(cfg, resume=resume, overwrite=False, log=lambda _: None) == run_dir
        assert (run_dir / CONFIG_FILE).read_text(encoding="utf-8") == to_yaml(cfg)
        assert (run_dir / HASH_FILE).read_text() == run_identity(cfg) + "\n"
        assert sorted(p.name for p in run_dir.iterdir()) == sorted([LOCK_FILE, CONFIG_FILE, HASH_FILE])
        release(run_dir)
        if finished:
            break
        operations += 1
    assert (
        operations == 6
    )  # two files, each written aside and fsynced, renamed, the folder fsynced (mindfoundry.atomic)
