"""`prepare` from and to object storage (a real S3 server, tests/s3_server.py) writes the bytes a local prepare writes:
sources read from s3:// (files, folders, globs; .jsonl, .txt, .gz), the output committed under s3:// (objects, then
commit.json), training reading it through the node-local cache."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest
from test_parallel_prepare import output_files, without_timings

from mindfoundry.config.load import load_config
from mindfoundry.data.dataset.prepared import DataError, local_copy, open_prepared
from mindfoundry.data.prepare.pipeline import prepare_data, work_dir
from mindfoundry.storage.commit import COMMIT_FILE
from mindfoundry.storage.resolve import locate


def comparable(manifest: dict[str, Any], urls: dict[str, str]) -> dict[str, Any]:
    """A manifest without its timings and with URLs written as the local paths they mirror (the identity hashes
    the paths: left out)."""
    text = json.dumps(without_timings(manifest))
    for url, local in urls.items():
        text = text.replace(url, local)
    out = json.loads(text)
    for key in ("identity", "data_config_sha256"):
        out.pop(key)
    return out


def s3_objects(s3, bucket: str, prefix: str) -> dict[str, bytes]:
    """Every object under ``prefix`` but the manifest and the commit marker, by path relative to it."""
    return {key[len(prefix) + 1:]: s3.get(bucket, key) for key in s3.keys(bucket, prefix + "/")
            if not key.endswith(("/manifest.json", "/" + COMMIT_FILE))}


def test_prepare_from_s3_to_s3_writes_the_objects_a_local_prepare_writes(s3, tiny_run, corpus_dir, tmp_path) -> None:
    """The local executor, its work area on this node's disk (the default for a URL output); with the work area in the
    bucket too: tests/data/test_prepare_ray_s3.py."""
    bucket = s3.bucket()
    s3.upload_tree(corpus_dir, bucket, "corpus")
    # a gzipped copy of the jsonl: streamed through gzip from a ranged read
    s3.put(bucket, "gz/code.jsonl.gz", gzip.compress((corpus_dir / "code.jsonl").read_bytes(), mtime=0))
    local = load_config(tiny_run("local", data__task_bytes=2**16))
    prepare_data(local, log=lambda _: None)

    remote_sources = [{"name": "code", "paths": [f"s3://{bucket}/gz/*.jsonl.gz"]},
                      {"name": "asyncio", "paths": [f"s3://{bucket}/corpus/txt"]}]
    overrides = {"data__sources": remote_sources, "data__output_dir": f"s3://{bucket}/data", "data__task_bytes": 2**16,
                 "data__cache_dir": str(tmp_path / "cache")}
    cfg = load_config(tiny_run("remote", **overrides))
    logs: list[str] = []
    data = prepare_data(cfg, log=logs.append)

    ours = output_files(Path(local.data.output_dir))
    theirs = s3_objects(s3, bucket, "data")
    assert theirs.keys() == ours.keys()
    for name, blob in ours.items():
        assert theirs[name] == blob, name  # shards, tokenizer.json, drops.jsonl.gz
    assert len([n for n in ours if n.endswith((".bin", ".idx"))]) == 8
    marker = json.loads(s3.get(bucket, "data/" + COMMIT_FILE))
    assert sorted(marker["objects"]) == sorted([*ours, "manifest.json"])
    urls = {f"s3://{bucket}/gz/*.jsonl.gz": str(corpus_dir / "code.jsonl"),
            f"s3://{bucket}/gz/code.jsonl.gz": str(corpus_dir / "code.jsonl"), f"s3://{bucket}/corpus": str(corpus_dir)}
    local_manifest = json.loads((Path(local.data.output_dir) / "manifest.json").read_text(encoding="utf-8"))
    remote_manifest = comparable(data.manifest, urls)
    for source in local_manifest["sources"]:  # the gzip object has its own size and hash; the rest are the same
        source["files"] = [{k: v for k, v in f.items() if k == "path"} for f in source["files"]]
    for source in remote_manifest["sources"]:
        source["files"] = [{k: v for k, v in f.items() if k == "path"} for f in source["files"]]
    assert remote_manifest == comparable(local_manifest, {})
    # the work area is gone, training reads the node-local copy
    assert work_dir(cfg).is_below(locate(tmp_path / "cache")) and not work_dir(cfg).exists()
    assert data.root == local_copy(cfg) and (data.root / COMMIT_FILE).read_bytes() == s3.get(bucket, "data/commit.json")
    assert data.root.is_relative_to(tmp_path / "cache")


def test_a_second_prepare_reuses_the_committed_output_and_a_restart_its_local_copy(s3, tiny_run, tmp_path) -> None:
    bucket = s3.bucket()
    cfg = load_config(tiny_run("remote", data__output_dir=f"s3://{bucket}/data", data__cache_dir=str(tmp_path / "c")))
    prepare_data(cfg, log=lambda _: None)
    copy = local_copy(cfg)
    stamp = (copy / "train").stat().st_mtime_ns
    logs: list[str] = []
    again = prepare_data(cfg, log=logs.append)
    assert logs == [f"reusing prepared data in s3://{bucket}/data"]
    assert again.root == copy and (copy / "train").stat().st_mtime_ns == stamp  # not fetched again
    # a shard of this node's copy damaged on its disk: dropped and fetched again, said in one line (its advice was
    # `prepare --overwrite`, which rebuilds the bucket's data)
    shard = next((copy / "train").glob("*.bin"))
    raw = bytearray(shard.read_bytes())
    raw[10] ^= 0x01
    shard.write_bytes(bytes(raw))
    logs.clear()
    fetched = open_prepared(cfg, logs.append)
    assert len(logs) == 1 and logs[0].startswith(f"this node's copy of s3://{bucket}/data was damaged ("), logs
    assert "changed since it was prepared" in logs[0] and logs[0].endswith("dropped and fetched again")
    assert (fetched.root / "train" / shard.name).read_bytes() == s3.get(bucket, f"data/train/{shard.name}")


def test_overwrite_of_a_url_output_keeps_the_old_objects_and_a_cluster_needs_a_url_work_dir(s3, tiny_run) -> None:
    bucket = s3.bucket()
    cfg = load_config(tiny_run("remote", data__output_dir=f"s3://{bucket}/data"))
    prepare_data(cfg, log=lambda _: None)
    before = {k: s3.get(bucket, k) for k in s3.keys(bucket, "data/")}
    prepare_data(cfg, overwrite=True, log=lambda _: None)
    aside = [k for k in s3.keys(bucket) if k.startswith("data.old-")]
    assert {"data/" + k.split("/", 1)[1]: s3.get(bucket, k) for k in aside} == before  # every old object, kept whole
    assert {k for k in s3.keys(bucket, "data/")} == set(before)  # and the new output committed in its place
    on_cluster = load_config(tiny_run("cluster", data__output_dir=f"s3://{bucket}/other", data__executor="ray",
                                      data__ray={"address": "auto"}))
    with pytest.raises(DataError, match="set data.work_dir to a URL too"):
        prepare_data(on_cluster, log=lambda _: None)
    assert s3.keys(bucket, "other/") == []


def test_a_work_area_in_a_bucket_is_held_by_one_prepare_at_a_time(s3, tmp_path) -> None:
    import socket
    import subprocess
    import sys
    import time as clock

    from mindfoundry.data.execute.workdir import LOCK, WorkDir, WorkDirError
    from mindfoundry.storage.claim import STALE_S
    from mindfoundry.storage.remote import Remote

    bucket = s3.bucket()
    work = WorkDir(Remote(f"s3://{bucket}/work"), str(tmp_path))

    def lease(pid: int, host: str, age: float) -> None:
        s3.put(bucket, f"work/{LOCK}", json.dumps({"pid": pid, "host": host, "start": 0, "command": "mindfoundry "
                                                   "prepare other.yaml", "time": clock.time() - age}).encode())

    lease(1, "another-node", 0)
    with pytest.raises(WorkDirError, match=r"another prepare \(pid 1 on another-node \(started .*: mindfoundry "
                                           r"prepare other.yaml\)\) is working in"):
        work.claim("identity", "plan", fresh=False, log=lambda _: None)
    # a lease its driver stopped renewing is a dead driver's: taken over, and released at the end
    lease(1, "another-node", STALE_S + 1)
    work.claim("identity", "plan", fresh=False, log=lambda _: None)
    held = json.loads(s3.get(bucket, f"work/{LOCK}"))
    assert (held["pid"], held["host"]) == (__import__("os").getpid(), socket.gethostname())
    work.release()
    assert s3.keys(bucket, f"work/{LOCK}") == []
    # a fresh lease of a process of this host that is gone (a killed prepare) is taken at once, not after STALE_S
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    lease(int(gone.stdout), socket.gethostname(), 29)
    work.claim("identity", "plan", fresh=False, log=lambda _: None)
    work.release()
