"""`prepare` on worker processes writes exactly what one process writes."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from mindfoundry.config.load import load_config
from mindfoundry.data.clean import curate
from mindfoundry.data.workers import resolve_workers
from mindfoundry.data.prepare.pipeline import data_identity, prepare_data

TIMING_KEYS = {"created", "timings"}
DEDUP_TIMING_KEYS = {"seconds", "documents_per_second"}


def without_timings(manifest: dict[str, Any]) -> dict[str, Any]:
    out = {key: value for key, value in manifest.items() if key not in TIMING_KEYS}
    out["dedup"] = {key: value for key, value in manifest["dedup"].items() if key not in DEDUP_TIMING_KEYS}
    return out


@pytest.mark.parametrize("verify", ["signature", "exact"])  # "exact" also rereads the corpus through the pool
def test_two_workers_write_byte_identical_data(tiny_run, monkeypatch, verify: str) -> None:
    monkeypatch.setattr(curate, "CHUNK_DOCUMENTS", 7)  # many chunks per source: results must come back in order
    outputs, logs = {}, {}
    for workers in (1, 2):
        cfg = load_config(tiny_run(f"w{workers}", data__workers=workers))
        cfg.data.dedup.verify = verify
        logs[workers] = []
        prepare_data(cfg, log=logs[workers].append)
        outputs[workers] = Path(cfg.data.output_dir)

    one, two = outputs[1], outputs[2]
    files = sorted(str(p.relative_to(one)) for p in one.rglob("*") if p.is_file())
    assert files == sorted(str(p.relative_to(two)) for p in two.rglob("*") if p.is_file())
    shards = [f for f in files if f.endswith((".bin", ".idx"))]
    assert len(shards) == 8  # 2 sources x 2 splits x (.bin, .idx)
    for name in [*shards, "tokenizer.json"]:
        assert (one / name).read_bytes() == (two / name).read_bytes(), name
    m1, m2 = (json.loads((d / "manifest.json").read_text(encoding="utf-8")) for d in (one, two))
    assert m1["dedup"]["documents"] > 0 and m1["cleaning"]["totals"]
    assert without_timings(m1) == without_timings(m2)
    # no terminal here: each pass reports one plain line of documents per source
    assert any(line.startswith("shards: code ") and " documents in " in line for line in logs[2])


def test_workers_is_not_part_of_the_data_identity(tiny_run) -> None:
    cfg = load_config(tiny_run("id"))
    prepare_data(cfg, log=lambda _: None)
    cfg.data.workers = 2
    logs: list[str] = []
    prepare_data(cfg, log=logs.append)
    assert data_identity(cfg) == data_identity(load_config(tiny_run("id")))
    assert logs == [f"reusing prepared data in {cfg.data.output_dir}"]
    assert resolve_workers(0) == os.cpu_count() and resolve_workers(3) == 3
