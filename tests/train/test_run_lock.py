"""One writer per run directory: a second live writer is refused with nothing moved; a dead one's lock is taken over."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from mindfoundry.cli.main import main

HOLD = """
import sys, time
from pathlib import Path
from mindfoundry.train.run_lock import acquire
acquire(Path(sys.argv[1]))
print("held", flush=True)
time.sleep(600)
"""


def holder(run_dir: Path) -> subprocess.Popen:
    """Another process holding RUN_DIR's lock (as a running `train` does)."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(run_dir)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def tree(run_dir: Path) -> list[tuple[str, int]]:
    return sorted(
        (str(p.relative_to(run_dir)), p.stat().st_size) for p in run_dir.rglob("*") if p.is_file() and p.name != ".lock"
    )


def test_a_second_writer_is_refused_and_a_dead_ones_lock_taken_over(tiny_run, tmp_path, capsys) -> None:
    cfg = tiny_run(train__steps=2, train__eval_every=0)
    run_dir = tmp_path / "run"
    assert main(["prepare", str(cfg)]) == 0
    before = tree(run_dir)
    proc = holder(run_dir)
    try:
        for command in (
            ["train", str(cfg)],
            ["train", str(cfg), "--overwrite"],
            ["prepare", str(cfg)],
            ["run", str(cfg), "--resume", "auto"],
        ):
            capsys.readouterr()
            assert main(command) == 2, command
            err = capsys.readouterr().err
            assert f"is being written by pid {proc.pid} on " in err and "one writer per run" in err, err
            assert "nothing was written or moved" in err and "Traceback" not in err
            assert tree(run_dir) == before and not list(tmp_path.glob("run.old-*"))  # --overwrite moved nothing aside
        holder_info = json.loads((run_dir / ".lock").read_text())
        assert holder_info["pid"] == proc.pid
    finally:
        proc.send_signal(signal.SIGKILL)  # dies holding the lock: no clean-up ran
        proc.wait()
    capsys.readouterr()
    assert main(["train", str(cfg), "--set", "checkpoint.every=0"]) == 0
    out = capsys.readouterr()
    assert f"taking over the lock of pid {proc.pid} on " in out.out + out.err and "which is gone" in out.out + out.err
    assert (run_dir / ".lock").read_text() == ""  # a clean end leaves no holder to report


def test_stale_lock_file_of_unknown_content_is_taken_over(tmp_path) -> None:
    from mindfoundry.train.run_lock import RunLockedError, acquire, release

    (tmp_path / "r").mkdir()
    (tmp_path / "r" / ".lock").write_bytes(b"\x00garbage")  # a damaged lock file nobody holds
    messages: list[str] = []
    acquire(tmp_path / "r", messages.append)
    release(tmp_path / "r")
    assert messages == []  # no holder to name: taken without a message
    proc = holder(tmp_path / "r")
    try:
        with pytest.raises(RunLockedError, match=f"pid {proc.pid} .*one writer per run"):
            acquire(tmp_path / "r")
    finally:
        proc.kill()
        proc.wait()


def test_a_run_dir_that_cannot_hold_a_lock_file_is_one_line_not_a_traceback(tiny_run, capsys) -> None:
    """--set run_dir=/proc/self used to pass validation and end `train` with exit 70 and a FileNotFoundError."""
    cfg = tiny_run(train__steps=2, train__eval_every=0)
    for command in (
        ["train", str(cfg), "--set", "run_dir=/proc/self"],
        ["prepare", str(cfg), "--set", "run_dir=/proc/self"],
    ):
        capsys.readouterr()
        assert main(command) == 2, command
        err = capsys.readouterr().err
        assert "run directory '/proc/self' cannot hold the run's lock file .lock" in err and "Traceback" not in err, err
