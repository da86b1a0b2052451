"""What a run checkpoints and where: the snapshot taken on the training thread, its commit in the background, the
checkpoint to resume from.

Every rank takes part in the snapshot (gathering the full state, or writing its shards); rank 0 hands it to the
:class:`~mindfoundry.checkpoint.committer.Committer`, which commits it to ``checkpoint.dir`` (a folder, or a URL) while
training goes on. The console says "saved step N (committing)" when training moves on and "committed step N" when the
checkpoint counts; metrics.jsonl gets a ``checkpoint`` event (the seconds training stood still) and a
``checkpoint_committed`` event (the seconds of the background work).

A checkpoint carries what it needs to be used on its own -- the prepared data's manifest, the run's resolved config
(secrets left out) and its tokenizer -- so that evaluating, generating or exporting a checkpoint copied anywhere, a
bucket included, needs nothing else.
"""

from __future__ import annotations

import importlib
import json
import platform
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

import mindfoundry
from mindfoundry.backends.base import Backend
from mindfoundry.checkpoint.committer import Committer
from mindfoundry.checkpoint.directory import CheckpointDir, Retention
from mindfoundry.checkpoint.run_files import checkpoint_dir_of
from mindfoundry.config.load import to_yaml
from mindfoundry.config.schema import RunConfig
from mindfoundry.data.dataset.prepared import TOKENIZER, DataError, PreparedData, data_changes
from mindfoundry.storage.location import Location
from mindfoundry.train.metrics import MetricsLogger

#: Files every checkpoint holds beside the tensors and the trainer state.
DATA_MANIFEST, RUN_CONFIG, RUN_TOKENIZER = "data_manifest.json", "config.yaml", TOKENIZER


def versions(backend: Backend) -> dict[str, str]:
    """The versions a checkpoint was written with: MindFoundry, Python, numpy and the engine."""
    out = {"mindfoundry": mindfoundry.__version__, "python": platform.python_version(), "numpy": np.__version__}
    engine = importlib.import_module(backend.name)  # already imported by the backend
    out[backend.name] = engine.__version__
    return out


class RunCheckpoints:
    """The checkpoints of one run, seen from one rank (see the module docstring)."""

    def __init__(self, cfg: RunConfig, data: PreparedData, backend: Backend, say: Callable[[str], None]) -> None:
        self.cfg, self.data, self.backend, self.say = cfg, data, backend, say
        self.directory = CheckpointDir.of_run(cfg)
        c = cfg.checkpoint
        self.retention = Retention(c.keep_last, c.keep_every, c.keep_best)
        self.committer = Committer(self.directory, self.retention, say) if backend.rank == 0 else None

    def trainer_state(self, parts: dict[str, Any], run_identity: str) -> dict[str, Any]:
        """trainer_state.json: the state components' entries (``parts``), and what the checkpoint was written by and
        for."""
        return {**parts, "rng": {"note": "no in-graph randomness; data order = f(seed, position); init = f(seed)"},
                "run_identity": run_identity, "data_manifest_sha256": self.data.manifest_sha256,
                "backend": self.backend.name, "versions": versions(self.backend)}

    def files(self) -> dict[str, bytes]:
        """The small files every checkpoint carries (see the module docstring)."""
        return {DATA_MANIFEST: self.data.manifest_bytes, RUN_CONFIG: to_yaml(self.cfg).encode("utf-8"),
                RUN_TOKENIZER: self.data.tokenizer_bytes}

    def save(self, step: int, state: Callable[[], Mapping[str, Any]]) -> Location | None:
        """Snapshot step ``step`` (collective) and start its commit (rank 0; the other ranks get None). ``state``
        gives the trainer state, asked on rank 0 only."""
        if self.cfg.checkpoint.format == "sharded":  # every rank writes its shards into rank 0's folder
            if self.committer is None:
                self.backend.save_sharded(None)  # collective: the folder comes from rank 0
                return None
            return self.committer.submit(step, None, None, state(), self.files(), writer=self.backend.save_sharded)
        weights, optimizer = self.backend.weights(), self.backend.optimizer_state()  # collective under sharding
        if self.committer is None:
            return None
        return self.committer.submit(step, weights, optimizer, state(), self.files())

    def log_commits(self, logger: MetricsLogger) -> None:
        """Record the commits that ended; raise the error of one that failed (on rank 0)."""
        if self.committer is None or not self.committer.wait(0):  # none, or still in flight
            return
        for done in self.committer.finished():
            logger.log({"step": done.step, "event": "checkpoint_committed", "path": str(done.location),
                        "seconds": round(done.seconds, 4)})

    def settle(self, logger: MetricsLogger, timeout: float | None = None) -> bool:
        """Wait for the commit in flight (at most ``timeout`` seconds) and record it; False when it is still running."""
        if self.committer is None:
            return True
        if not self.committer.wait(timeout):
            return False
        self.log_commits(logger)
        return True

    def resumable(self, resume_from: Path | None, before_step: int | None) -> tuple[Path | None, Location | None,
                                                                                   list[str]]:
        """The newest checkpoint that verifies (as a local folder, and where it lives), with notes on newer ones
        skipped; of another run's directory with ``resume_from`` (``mindfoundry dump --resume auto``)."""
        directory = checkpoint_dir_of(resume_from) if resume_from is not None else self.directory
        path, skipped = directory.find_resumable(before_step)
        return path, (directory.origin(path) if path is not None else None), skipped

    def check_data(self, path: Path, origin: object) -> None:
        """Refuse to resume checkpoint ``path`` (from ``origin``) on data other than it was trained on: another
        tokenizer, other shards; the message says what changed and what to do."""
        manifest = path / DATA_MANIFEST
        if not manifest.is_file():  # imported by `mindfoundry convert FILE RUN_DIR`: nothing to hold the data to
            return
        changes = data_changes(json.loads(manifest.read_text(encoding="utf-8")), self.data.manifest)
        if changes:
            raise DataError(f"{origin} was trained on other data than {self.data.root} holds now: "
                            f"{'; '.join(changes)}. Restore the sources and prepare again (the checkpoint's "
                            "data_manifest.json lists every source file with its sha256), or start a new run from "
                            f"these weights: --set model.init_from={origin} with another run_dir")

    def clean_interrupted(self) -> list[str]:
        """What killed writers left in ``checkpoint.dir`` (rank 0, at start-up), removed."""
        return self.directory.clean_interrupted() if self.committer is not None else []
