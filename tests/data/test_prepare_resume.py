"""A staged `prepare` killed (SIGKILL, driver and workers) in the middle of a stage resumes: the tasks that finished
are kept and skipped, and the output is byte for byte an uninterrupted run's. Bad work areas are refused in one line."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from test_parallel_prepare import assert_same_output

from mf_testing import StopAt, small_disk, tiny_run_tree
from mindfoundry.cli.main import main
from mindfoundry.config.load import ConfigError, load_config
from mindfoundry.data.execute.workdir import WorkDirError
from mindfoundry.data.ingest.builtin import read_builtin
from mindfoundry.data.ingest.files import SourceStats
from mindfoundry.data.ingest.inputs import plan_inputs
from mindfoundry.data.ingest.listing import DataSourceError
from mindfoundry.data.prepare.pipeline import data_identity, prepare_data, work_dir
from mindfoundry.train.stop import Preempted

FILES = 12


@pytest.fixture(scope="module")
def news_files(tmp_path_factory) -> Path:
    """People's Daily paragraphs in 12 .jsonl files of 400 documents: 12 read tasks of about a second's work."""
    folder = tmp_path_factory.mktemp("news")
    docs = [doc.text for doc, _ in zip(read_builtin("peoples_daily", stats=SourceStats()), range(FILES * 400))]
    for i in range(FILES):
        with open(folder / f"part-{i:02d}.jsonl", "w", encoding="utf-8") as fh:
            fh.writelines(json.dumps({"text": t}, ensure_ascii=False) + "\n" for t in docs[i * 400:(i + 1) * 400])
    return folder


def config(tmp_path: Path, corpus_dir: Path, news: Path, name: str, workers: int) -> Path:
    tree = tiny_run_tree(corpus_dir, tmp_path / name)
    tree["data"]["sources"].append({"name": "news", "paths": [str(news)]})
    tree["data"].update(workers=workers, task_bytes=2**16)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(tree, allow_unicode=True))
    return path


def finished(work: Path, stage: str) -> int:
    folder = work / "stages" / stage
    return sum(1 for p in folder.glob("task-*") if ".tmp-" not in p.name) if folder.is_dir() else 0


def kill_when(cmd: list[str], work: Path, stage: str, least: int, total: int) -> None:
    """Start `prepare` and SIGKILL its whole process group once ``stage`` has finished ``least`` (not all) tasks."""
    proc = subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 300
        while finished(work, stage) < least:
            assert proc.poll() is None, proc.stderr.read().decode()
            assert time.monotonic() < deadline
            time.sleep(0.005)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert least <= finished(work, stage) < total, "the kill came after the stage ended: nothing to resume"


@pytest.mark.slow
def test_prepare_killed_in_two_stages_resumes_to_the_same_bytes(tmp_path, corpus_dir, news_files) -> None:
    whole = load_config(config(tmp_path, corpus_dir, news_files, "whole", workers=1))
    prepare_data(whole, log=lambda _: None)

    path = config(tmp_path, corpus_dir, news_files, "killed", workers=2)
    cfg = load_config(path)
    work = Path(work_dir(cfg))
    cmd = [sys.executable, "-m", "mindfoundry.cli", "prepare", str(path)]
    tasks = len(plan_inputs(cfg.data)[0])  # text read tasks: each news file, code.jsonl, asyncio in runs of >= 64 KiB
    assert tasks > FILES
    kill_when(cmd, work, "read", 3, tasks)
    kept_reads = {
        p.name: p.stat().st_mtime_ns for p in (work / "stages" / "read").glob("task-*") if ".tmp-" not in p.name
    }
    kill_when(cmd, work, "clean", 2, tasks)
    assert {name: (work / "stages" / "read" / name).stat().st_mtime_ns for name in kept_reads} == kept_reads

    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    log = proc.stdout + proc.stderr
    assert f"resuming the prepare in {work}: finished tasks are kept" in log
    assert f"read: {tasks}/{tasks} tasks ({tasks} done before)" in log, log  # nothing read twice
    resumed = re.search(rf"clean: {tasks}/{tasks} tasks \((\d+) done before\)", log)
    assert resumed and 2 <= int(resumed.group(1)) < tasks, log
    assert_same_output(Path(whole.data.output_dir), Path(cfg.data.output_dir))
    assert not work.exists()


def test_a_work_dir_that_is_not_ours_or_not_writable_is_refused(tiny_run, tmp_path) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("a user's file")
    cfg = load_config(tiny_run("foreign", data__work_dir=str(mine)))
    with pytest.raises(
        WorkDirError,
        match=rf"'{mine}' holds files that are not a MindFoundry prepare's \(e.g. 'notes.txt'\): "
        "choose an empty or new folder",
    ):
        prepare_data(cfg, log=lambda _: None)
    assert sorted(p.name for p in mine.iterdir()) == ["notes.txt"]  # nothing added, nothing removed

    blocked = tmp_path / "file"
    blocked.write_text("a file where the work folder should go")
    with pytest.raises(ConfigError, match=rf"data.work_dir='{blocked / 'work'}' cannot hold a folder: '{blocked}' is "
                       "a file, not a folder; choose a folder path"):  # refused when the config is read
        load_config(tiny_run("blocked", data__work_dir=str(blocked / "work")))


def test_a_second_prepare_on_the_same_work_dir_is_refused(tiny_run) -> None:
    cfg = load_config(tiny_run("twice"))
    from mindfoundry.data.execute.workdir import WorkDir

    first = WorkDir(work_dir(cfg))
    first.claim("x", "y", fresh=False, log=lambda _: None)
    try:
        with pytest.raises(
            WorkDirError, match=rf"another prepare \(pid {os.getpid()} on .*\) is working in '{work_dir(cfg)}'"
        ):
            prepare_data(cfg, log=lambda _: None)
    finally:
        first.release()
    logs: list[str] = []
    prepare_data(cfg, log=logs.append)  # the stale work of another identity is discarded, not trusted
    assert f"discarding the earlier prepare's work in {work_dir(cfg)} (the data config changed)" in logs


def test_a_full_disk_under_the_work_dir_is_one_line_and_writes_no_output(tiny_run, tmp_path, capsys) -> None:
    with small_disk(tmp_path / "disk", "300k") as disk:
        config = tiny_run("full", data__work_dir=str(disk / "work"))
        capsys.readouterr()
        assert main(["prepare", str(config)]) == 2
        err = capsys.readouterr().err
        lines = [line for line in err.splitlines() if line.strip()]
        assert lines[-1].startswith(
            f"error: no space left writing under '{disk / 'work'}': free space or set data.work_dir"
        )
        assert "finished tasks are kept and skipped" in lines[-1] and "Traceback" not in err
        assert not Path(load_config(config).data.output_dir).exists()
        assert not [p for p in (disk / "work" / "stages").rglob("*") if ".tmp-" in p.name]  # the failed attempt is gone


def test_a_corrupt_compressed_file_is_named_with_the_line_it_broke_at(tiny_run, tmp_path, corpus_dir) -> None:
    import gzip

    lines = (corpus_dir / "code.jsonl").read_bytes()
    whole = gzip.compress(lines * 3)
    broken = tmp_path / "broken.jsonl.gz"
    broken.write_bytes(whole[: len(whole) * 2 // 3])  # a download cut short
    cfg = load_config(tiny_run("corrupt", data__sources=[{"name": "code", "paths": [str(broken)]}]))
    with pytest.raises(
        DataSourceError, match=rf"{broken}: corrupt or truncated gzip data after line \d+ .*: replace the file"
    ):
        prepare_data(cfg, log=lambda _: None)
    assert not Path(cfg.data.output_dir).exists()
    read = Path(work_dir(cfg)) / "stages" / "read"
    assert [p.name for p in read.iterdir()] == []  # nothing half-written is left as if complete


def test_an_assembly_folder_a_killed_prepare_left_is_removed(tiny_run) -> None:
    cfg = load_config(tiny_run("leftover"))
    out = Path(cfg.data.output_dir)
    out.parent.mkdir(parents=True)
    dead = out.with_name(f".{out.name}.tmp-{2**22 + 12345}")  # above Linux's pid_max: no such process
    (dead / "train").mkdir(parents=True)
    (dead / "train" / "code.bin").write_bytes(b"half a shard")
    live = out.with_name(f".{out.name}.tmp-{os.getppid()}")  # a process that runs: not ours to remove
    live.mkdir()
    prepare_data(cfg, log=lambda _: None)
    assert not dead.exists() and live.is_dir()


def test_a_work_area_claim_stopped_at_any_file_operation_is_taken_over(tiny_run, monkeypatch) -> None:
    """A stop signal (or a kill) at any file operation of the work area's claim leaves what the next prepare takes
    over: CI once stopped one between the lock and ``workdir.json`` (``workdir.json.partial`` left), and the next
    start refused the folder as "not a MindFoundry prepare's" (exit 2)."""
    from mindfoundry.data.execute.workdir import WorkDir

    operations = 0
    while True:
        cfg = load_config(tiny_run(f"cut{operations}"))
        stop = StopAt(operations)
        with monkeypatch.context() as m:
            for name in ("fsync", "replace", "unlink"):  # the write probe's removal, the identity written aside
                m.setattr(os, name, stop.wrap(getattr(os, name)))
            work = WorkDir(work_dir(cfg))
            try:
                work.claim(data_identity(cfg), "plan", fresh=False, log=lambda _: None)
                finished = True
            except Preempted:
                finished = False
            work.release()
        prepared = prepare_data(cfg, log=lambda _: None)
        assert prepared.manifest["splits"]["train"]["documents"] == 55 and not work_dir(cfg).exists()
        if finished:
            break
        operations += 1
    assert operations == 4  # the probe's unlink; the identity's fsync aside, rename, folder fsync
