"""The run directory: one run per folder, never silently mixed with or overwriting another."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

from mindfoundry import atomic
from mindfoundry.checkpoint.directory import CheckpointDir
from mindfoundry.config.load import read_yaml, to_yaml, validate
from mindfoundry.config.parallel_config import Layout
from mindfoundry.config.schema import RunConfig
from mindfoundry.errors import MindFoundryError
from mindfoundry.storage.resolve import locate
from mindfoundry.train.run_identity import Change, is_this_run, refusal, resume_changes, run_identity
from mindfoundry.train.run_lock import LOCK_FILE, acquire, claim_checkpoints, release

CONFIG_FILE = "config.yaml"
HASH_FILE = "config.sha256"
METRICS_FILE = "metrics.jsonl"


class RunDirError(MindFoundryError, RuntimeError):
    """The run directory holds something this command must not touch."""


def _has_trained(run_dir: Path, checkpoints: CheckpointDir) -> bool:
    """Training has written something (before that, only prepared data lives here)."""
    return bool(checkpoints.committed()) or (run_dir / METRICS_FILE).exists()


def _holds_anything(run_dir: Path) -> bool:
    """Whether RUN_DIR holds more than its lock file and the identity a stopped claim was writing."""
    return run_dir.is_dir() and any(p.name not in (LOCK_FILE, HASH_FILE + atomic.PARTIAL) for p in run_dir.iterdir())


def _write_whole(path: Path, text: str) -> None:
    """PATH holds TEXT entirely or keeps what it held: a stop (signal, kill) mid-write leaves only PATH.partial."""
    atomic.write_text(path, text)


def _claim(run_dir: Path, cfg: RunConfig) -> None:
    """Mark RUN_DIR as this config's run. The identity is written first: it is what makes the folder a MindFoundry
    run, so a start-up stopped between the two files leaves a run the next start adopts (and writes the config of)
    instead of a folder with a config.yaml it must refuse as foreign."""
    _write_whole(run_dir / HASH_FILE, run_identity(cfg) + "\n")
    _write_whole(run_dir / CONFIG_FILE, to_yaml(cfg))


def claim_run_dir(cfg: RunConfig, *, resume: bool, overwrite: bool, layout: Layout | None = None,
                  log: Callable[[str], None] = print) -> Path:
    """Lock RUN_DIR for this process, then create or adopt it; refuse a folder holding a different (or any,
    without --resume) run, and one another live process writes (before anything is moved or written).

    --overwrite moves the old run aside to RUN_DIR.old-TIMESTAMP instead of deleting it, so nothing
    already written is lost. ``layout`` (the launch's) also recognises a run directory of a release before 0.2.
    """
    run_dir = Path(cfg.run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise RunDirError(f"run_dir '{run_dir}' is a file, not a folder: choose a folder path")
    checkpoints = CheckpointDir.of_run(cfg)
    if not checkpoints.root.is_below(locate(run_dir)):
        # outside the run dir: neither moved aside with it nor claimed by its lock, so claimed on its own
        checkpoints.root.check_writable()
        claim_checkpoints(checkpoints.root)
        if checkpoints.committed() and (overwrite or not resume):
            raise RunDirError(f"checkpoint.dir {checkpoints.root} already holds checkpoints: pass --resume auto to "
                              "continue that run, or give this run another checkpoint.dir (--overwrite moves a run "
                              "directory aside, not the objects of a bucket)")
    acquire(run_dir, log)
    stored = run_dir / HASH_FILE
    if _holds_anything(run_dir):
        if overwrite:
            aside = run_dir.with_name(f"{run_dir.name}.old-{time.strftime('%Y%m%d-%H%M%S')}")
            run_dir.rename(aside)  # still locked: nobody writes the old run while it moves
            release(run_dir)
            acquire(run_dir, log)
        elif not stored.is_file():
            raise RunDirError(
                f"run directory '{run_dir}' is not empty and is not a MindFoundry run: choose an empty or new run_dir"
            )
        elif _has_trained(run_dir, checkpoints):
            changes = _changes_since(run_dir, cfg)
            if changes is None and not is_this_run(stored.read_text().strip(), cfg, layout):
                raise RunDirError(f"run directory '{run_dir}' holds a different run (its {CONFIG_FILE} is unreadable, "
                                  "so which keys differ is unknown): use another run_dir, or pass --overwrite to move "
                                  "the old run aside")
            if changes and any(not change.accepted for change in changes):
                raise RunDirError(f"run directory '{run_dir}' holds a different run: {refusal(changes)}. Use another "
                                  "run_dir, start a new run from its weights with model.init_from, or pass --overwrite "
                                  "to move the old run aside")
            if not resume:
                raise RunDirError(
                    f"run directory '{run_dir}' already holds a run of this config: pass --resume auto to continue it, "
                    "or --overwrite to start over (the old run is moved aside)"
                )
            if changes:
                log("continuing the run with changed settings: " + ", ".join(map(str, changes)))
    _claim(run_dir, cfg)
    return run_dir


def _changes_since(run_dir: Path, cfg: RunConfig) -> list[Change] | None:
    """What differs between the run's stored config and ``cfg`` (None when the stored config cannot be read)."""
    try:
        old = validate(read_yaml(run_dir / CONFIG_FILE))
    except (MindFoundryError, OSError):
        return None
    return resume_changes(old, cfg)
