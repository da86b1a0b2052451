"""Everything a report shows about one run directory, read once, without an engine."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from mindfoundry.monitor.health import HealthConfig, evaluate
from mindfoundry.monitor.records import (
    MetricsError,
    Record,
    detail_records,
    eval_records,
    event_records,
    read_records,
    step_records,
)

METRICS_FILE = "metrics.jsonl"  # as train/rundir.py (not imported: it pulls in the config schema)


@dataclass
class RunData:
    """One run's records by kind, its config, data manifest, summary and newest trainer state."""

    path: Path
    label: str
    steps: list[Record]
    evals: list[Record]
    details: list[Record]
    events: list[Record]
    health: list[Record]
    config_text: str = ""
    config: dict[str, Any] = field(default_factory=dict)
    manifest: dict[str, Any] | None = None
    data_dir: Path | None = None
    summary: dict[str, Any] | None = None
    trainer_state: dict[str, Any] | None = None

    @property
    def start(self) -> Record | None:
        """The first start (or resume) event: backend, parameters, FLOPs/token."""
        return next((e for e in self.events if e["event"] in ("start", "resume")), None)

    @property
    def backend(self) -> str | None:
        start = self.start or {}
        return start.get("backend") or self.config.get("backend")

    def series(self, key: str, records: list[Record] | None = None) -> tuple[list[int], list[float]]:
        """(steps, values) of one metric, skipping records without a number (NaN/Inf are stored as null)."""
        pairs = [(int(r["step"]), float(r[key])) for r in (self.steps if records is None else records)
                 if isinstance(r.get(key), (int, float)) and not isinstance(r.get(key), bool)]
        return [s for s, _ in pairs], [v for _, v in pairs]

    def has(self, key: str) -> bool:
        return any(isinstance(r.get(key), (int, float)) for r in self.steps)


def _json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None


def _newest_checkpoint_file(run_dir: Path, name: str) -> dict[str, Any] | None:
    """A JSON file of the newest committed checkpoint that has it (trainer_state.json holds the
    versions; data_manifest.json the data provenance, when the data folder is gone)."""
    checkpoints = run_dir / "checkpoints"
    latest = checkpoints / "latest"
    newest = [checkpoints / latest.read_text(encoding="utf-8").strip()] if latest.is_file() else []
    for step_dir in newest + sorted(checkpoints.glob("step_*"), reverse=True):
        found = _json(step_dir / name)
        if found is not None:
            return found
    return None


def _manifest(run_dir: Path, config: dict[str, Any]) -> tuple[dict[str, Any] | None, Path | None]:
    """The data manifest and the prepared folder it is in (None when only a checkpoint's copy is left)."""
    output_dir = (config.get("data") or {}).get("output_dir")
    for folder in ([Path(output_dir)] if output_dir else []) + [run_dir / "data"]:
        found = _json(folder / "manifest.json")
        if found is not None:
            return found, folder
    return _newest_checkpoint_file(run_dir, "data_manifest.json"), None


def _health(records: list[Record], config: dict[str, Any]) -> list[Record]:
    """Recorded health findings, plus what the rules find offline for rules the run did not record
    (runs from before the live monitor, or with it disabled)."""
    monitor = config.get("monitor") or {}
    cfg = HealthConfig(**monitor["health"]) if isinstance(monitor.get("health"), dict) else HealthConfig()
    warmup = int((config.get("optim") or {}).get("warmup_steps") or 0)
    recorded = event_records(records, "health")
    seen = {r["rule"] for r in recorded}
    offline = [e.to_dict() for e in evaluate(records, cfg, warmup) if e.rule not in seen]
    return sorted(recorded + offline, key=lambda r: int(r["step"]))


def load_run(run_dir: str | Path) -> RunData:
    """Read a run directory; a missing or empty metrics.jsonl is a MetricsError saying why."""
    path = Path(run_dir)
    if not path.is_dir():
        raise MetricsError(f"run directory '{path}' does not exist")
    records = read_records(path / METRICS_FILE)
    steps = step_records(records)
    if not steps:
        raise MetricsError(f"'{path / METRICS_FILE}' has no training step yet: nothing to report")
    config_text = (path / "config.yaml").read_text(encoding="utf-8") if (path / "config.yaml").is_file() else ""
    config = (yaml.safe_load(config_text) if config_text else None) or {}
    manifest, data_dir = _manifest(path, config)
    return RunData(
        path=path, label=path.resolve().name, steps=steps, evals=eval_records(records), details=detail_records(records),
        events=event_records(records), health=_health(records, config), config_text=config_text, config=config,
        manifest=manifest, data_dir=data_dir, summary=_json(path / "summary.json"),
        trainer_state=_newest_checkpoint_file(path, "trainer_state.json"),
    )
