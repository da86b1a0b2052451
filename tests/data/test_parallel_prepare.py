"""The staged `prepare` writes the same bytes however its tasks run: one process, a pool, any task size."""

from __future__ import annotations

import json
import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import psutil
import pytest

from mindfoundry.config.load import load_config
from mindfoundry.data.clean import curate
from mindfoundry.data.execute import resolve_workers
from mindfoundry.data.execute.stage import Stage, run_task
from mindfoundry.data.prepare.pipeline import data_identity, prepare_data
from mindfoundry.data.prepare.results import ReadResult

TIMING_KEYS = {"created", "timings", "prepared_by"}  # when it was made, how long it took, by which run
DEDUP_TIMING_KEYS = {"seconds", "documents_per_second"}


def without_timings(manifest: dict[str, Any]) -> dict[str, Any]:
    out = {key: value for key, value in manifest.items() if key not in TIMING_KEYS}
    out["dedup"] = {key: value for key, value in manifest["dedup"].items() if key not in DEDUP_TIMING_KEYS}
    return out


def output_files(folder: Path) -> dict[str, bytes]:
    """Every file of a prepared folder but the manifest, by relative path."""
    return {
        str(p.relative_to(folder)): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != "manifest.json"
    }


def assert_same_output(one: Path, two: Path) -> None:
    files = output_files(one)
    assert files.keys() == output_files(two).keys()
    m1, m2 = (json.loads((d / "manifest.json").read_text(encoding="utf-8")) for d in (one, two))
    assert sum(name.endswith((".bin", ".idx")) for name in files) == 4 * len(m1["sources"])  # 2 splits x (.bin, .idx)
    for name, data in files.items():
        assert (two / name).read_bytes() == data, name  # shards, tokenizer.json, drops.jsonl.gz
    assert m1["dedup"]["documents"] > 0 and m1["cleaning"]["totals"]
    assert without_timings(m1) == without_timings(m2)


@pytest.mark.parametrize("verify", ["signature", "exact"])  # "exact" also reads candidate texts back from the stores
def test_two_workers_and_small_tasks_write_byte_identical_data(tiny_run, monkeypatch, verify: str) -> None:
    monkeypatch.setattr(curate, "CHUNK_DOCUMENTS", 7)  # many chunks per task: drop-log lines must stay in order
    outputs, logs = {}, {}
    # one process and one task per source; two processes and a task per file of the 40-file source
    for workers, task_bytes in ((1, 64 * 2**20), (2, 2**16)):
        cfg = load_config(tiny_run(f"w{workers}", data__workers=workers, data__task_bytes=task_bytes))
        cfg.data.dedup.verify = verify
        logs[workers] = []
        prepare_data(cfg, log=logs[workers].append)
        outputs[workers] = Path(cfg.data.output_dir)
    assert_same_output(outputs[1], outputs[2])
    tasks = {w: next(line for line in logs[w] if line.startswith("read: ")) for w in (1, 2)}
    # one task per source; then code.jsonl is one task and the 40 asyncio files six runs of >= 64 KiB
    assert tasks[1].startswith("read: 2/2 tasks") and tasks[2].startswith("read: 7/7 tasks"), tasks
    # no terminal here: each stage reports one plain line of tasks and documents
    assert any(line.startswith("shards: 7/7 tasks, ") and " documents, " in line for line in logs[2])
    assert not (outputs[2].parent / ".data.work").exists()  # the work area is gone once the output is in place


def test_how_prepare_runs_is_not_part_of_the_data_identity(tiny_run) -> None:
    cfg = load_config(tiny_run("id"))
    prepare_data(cfg, log=lambda _: None)
    cfg.data.workers, cfg.data.task_bytes, cfg.data.executor = 2, 2**16, "ray"
    cfg.data.work_dir = str(Path(cfg.data.output_dir).parent / "elsewhere")
    logs: list[str] = []
    prepare_data(cfg, log=logs.append)
    assert data_identity(cfg) == data_identity(load_config(tiny_run("id")))
    assert logs == [f"reusing prepared data in {cfg.data.output_dir}"]
    assert resolve_workers(0) == os.cpu_count() and resolve_workers(3) == 3


def test_a_failed_task_ends_the_running_ones_at_once(tmp_path) -> None:
    """Two workers: task 0 fails while task 1 runs (it would for a minute); the failure reaches the driver at once
    and the worker running task 1 is ended, not waited for."""
    from mf_testing import FailOneStallOne
    from mindfoundry.data.execute.local import LocalExecutor
    from mindfoundry.data.execute.workdir import WorkDir

    pid_file = tmp_path / "stalled.pid"
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="task 0 failed"):
        list(LocalExecutor(2).run(FailOneStallOne(WorkDir(tmp_path / "work"), pid_file), [0, 1]))
    assert time.monotonic() - start < 20  # measured 1.2 s; the stalled task alone would take 60 s
    pid = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while not _ended(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _ended(pid)


def _ended(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


class _OneRead(Stage[ReadResult]):
    """One task that reports a fixed read result (and writes nothing)."""

    name, result_type = "one_read", ReadResult

    def tasks(self) -> int:
        return 1

    def run(self, task: int, out: Path) -> ReadResult:
        return ReadResult(documents=5, kept=4, stats={"chars": 120}, files=[{"path": "a.txt", "bytes": 120}],
                          notes=[], blocks={"normalize": {"seen": 5}}, lines=1, span_documents=3, span_entries=7)


def test_a_task_result_is_kept_and_read_back_as_it_was(tmp_path) -> None:
    """The typed result a task returns is what a resumed `prepare` reads back from its folder, its timing included;
    a result.json written before a field existed reads back with that field's default."""
    from mindfoundry.data.execute.workdir import WorkDir

    stage = _OneRead(WorkDir(tmp_path / "work"))
    result = run_task(stage, 0, own_process=False)
    assert result.timing is not None and result.timing.pid == os.getpid()
    assert stage.result(0) == result
    assert (result.counted("span"), result.counted("line")) == ((3, 7), None)
    older = {key: value for key, value in result.to_json().items() if not key.startswith("span_")}
    del older["timing"]["node"]
    assert ReadResult.from_json(older) == replace(result, span_documents=None, span_entries=None)
