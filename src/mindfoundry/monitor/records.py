"""Reading a run's metrics.jsonl the way every consumer must.

The file is append-only: a resumed run re-logs the steps after its checkpoint, so for each step the
LAST record wins. Records come in kinds told apart by their keys (step, eval, per-layer detail,
event); the helpers here return one kind each, deduplicated and in step order.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable, Mapping

from mindfoundry.errors import MindFoundryError

#: Per-module dicts of the detail records (one value per module group: embed, layers.i, norm, ...).
LAYER_KEYS = ("layer_grad_norm", "layer_weight_norm", "layer_update_ratio")
#: Zero-shot task scores of an evaluation record (eval.tasks): {task: accuracy} each.
TASK_KEYS = ("task_acc", "task_acc_norm")

Record = dict[str, Any]


class MetricsError(MindFoundryError, RuntimeError):
    """A run's metrics are missing, empty or unreadable (a user error: wrong folder, run not started)."""


def read_records(path: str | Path) -> list[Record]:
    """All records of a metrics.jsonl. A torn last line (a crash mid-write) is dropped; a torn line
    elsewhere means the file was edited or corrupted, which is an error naming the line."""
    path = Path(path)
    if not path.is_file():
        raise MetricsError(f"no metrics file at '{path}': is this a run directory, and has the run started training?")
    lines = path.read_text(encoding="utf-8").splitlines()
    records: list[Record] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as exc:
            if number == len(lines):
                break
            raise MetricsError(f"{path}:{number}: not a JSON record ({exc.msg}); the file is corrupted") from None
    return records


def _latest_per_step(records: Iterable[Record]) -> list[Record]:
    by_step: dict[int, Record] = {}
    for record in records:
        by_step[int(record["step"])] = record
    return [by_step[s] for s in sorted(by_step)]


def is_step_record(record: Record) -> bool:
    """A training step's record (loss, lr, grad norm, throughput...)."""
    return "loss" in record and "event" not in record


def step_records(records: Iterable[Record]) -> list[Record]:
    return _latest_per_step(r for r in records if is_step_record(r))


def eval_records(records: Iterable[Record]) -> list[Record]:
    """Held-out evaluations; step 0 is the untrained model."""
    return _latest_per_step(r for r in records if "val_loss" in r and "event" not in r)


def detail_records(records: Iterable[Record]) -> list[Record]:
    """Per-layer records (written every `monitor.detail_every` steps)."""
    return _latest_per_step(r for r in records if any(k in r for k in LAYER_KEYS) and "event" not in r)


def realized_shares(mixture: Mapping[str, Any]) -> dict[str, float]:
    """Category -> realized share from a record's "mixture": either the sampler's report
    ({"categories": {cat: {"realized": x, ...}}, ...}) or a plain {cat: share}."""
    rows = mixture.get("categories", mixture)
    out: dict[str, float] = {}
    for category, row in rows.items():
        share = row.get("realized") if isinstance(row, Mapping) else row
        if isinstance(share, (int, float)) and not isinstance(share, bool):
            out[str(category)] = float(share)
    return out


def event_records(records: Iterable[Record], *kinds: str) -> list[Record]:
    """Events (of the given kinds, or all), one per (step, event, kind/rule): a re-logged event after
    a resume replaces its earlier copy instead of appearing twice."""
    latest: dict[tuple, Record] = {}
    for record in records:
        if "event" in record and (not kinds or record["event"] in kinds):
            latest[(int(record["step"]), record["event"], record.get("kind"), record.get("rule"))] = record
    return sorted(latest.values(), key=lambda r: int(r["step"]))
