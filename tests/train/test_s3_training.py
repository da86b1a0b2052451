"""Training with ``checkpoint.dir`` on object storage (a real S3 server behind a TCP proxy, tests/s3_server.py),
through the CLI: SIGKILLed between steps and in the middle of an upload, ``--resume auto`` continues from the newest
committed checkpoint and the losses equal an uninterrupted run's bit for bit; a link that dies under an upload is
retried with backoff, then reported in one line with nothing committed half."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest
from test_recovery import STEPS, cmd, last_step, losses, wait_for_step, write_config

from s3_server import TcpProxy

pytestmark = pytest.mark.slow


def env_for(s3, proxy: TcpProxy) -> dict[str, str]:
    """The AWS variables of a training process that reaches the S3 server through ``proxy``."""
    return {**os.environ, **s3.env(), "AWS_ENDPOINT_URL": proxy.endpoint, "COLUMNS": "200"}


def committed_steps(s3, bucket: str) -> set[int]:
    return {int(k.split("/")[1][5:]) for k in s3.keys(bucket, "ckpt/") if k.endswith("/manifest.sha256")}


def uncommitted_steps(s3, bucket: str) -> set[int]:
    found = {int(k.split("/")[1][5:]) for k in s3.keys(bucket, "ckpt/step_")}
    return found - committed_steps(s3, bucket)


def wait_until(condition, proc: subprocess.Popen, what: str, timeout: float = 180) -> None:
    deadline = time.time() + timeout
    while not condition():
        assert proc.poll() is None, f"training ended before {what}: {proc.stderr.read() if proc.stderr else ''}"
        assert time.time() < deadline, f"no {what} in time"
        time.sleep(0.02)


def test_killed_between_steps_and_during_an_upload_resumes_exactly(s3, mindspore_reference, corpus_dir,
                                                                     tmp_path) -> None:
    bucket = s3.bucket()
    config = write_config(corpus_dir, tmp_path, "run", "mindspore",
                          checkpoint={"dir": f"s3://{bucket}/ckpt", "every": 2, "keep_last": 2})
    run_dir = tmp_path / "run"
    fast = TcpProxy(s3.port)
    # (a) SIGKILL between steps: after step 4's checkpoint is committed, while step 5 runs
    proc = subprocess.Popen(cmd("train", str(config)), env=env_for(s3, fast), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    wait_until(lambda: 4 in committed_steps(s3, bucket), proc, "committed step 4")
    wait_for_step(run_dir, 5, proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed_at = last_step(run_dir)
    assert killed_at < STEPS
    # (b) SIGKILL while a checkpoint's objects are being uploaded (a slow link: 0.4 s per chunk sent)
    slow = TcpProxy(s3.port, delay_s=0.4)
    proc = subprocess.Popen(cmd("train", str(config), "--resume", "auto"), env=env_for(s3, slow),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wait_until(lambda: any(step > killed_at - 1 for step in uncommitted_steps(s3, bucket)), proc,
               "checkpoint half uploaded")
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    half = uncommitted_steps(s3, bucket)
    assert half, "the kill did not land inside an upload"
    newest = max(committed_steps(s3, bucket))
    # resumed: from the newest committed checkpoint; the half-uploaded one removed; every loss the uninterrupted run's
    done = subprocess.run(cmd("train", str(config), "--resume", "auto"), env=env_for(s3, fast), capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert f"resumed from s3://{bucket}/ckpt/step_{newest:08d} (step {newest}," in done.stderr
    assert f"removed step_{min(half):08d} (objects without a commit marker)" in done.stderr
    assert "saved step 16 (committing)" in done.stderr and "committed step 16" in done.stderr
    got = losses(run_dir)
    assert [got[s] for s in range(1, STEPS + 1)] == [mindspore_reference[s] for s in range(1, STEPS + 1)]
    assert uncommitted_steps(s3, bucket) == set() and committed_steps(s3, bucket) == {14, 16}
    assert not s3.client().list_multipart_uploads(Bucket=bucket).get("Uploads")
    for proxy in (fast, slow):
        proxy.close()


def test_a_link_cut_under_an_upload_is_retried_then_one_line(s3, corpus_dir, tmp_path) -> None:
    bucket = s3.bucket()
    config = write_config(corpus_dir, tmp_path, "cut", "torch",
                          checkpoint={"dir": f"s3://{bucket}/ckpt", "every": 2, "keep_last": 2},
                          storage={"retries": 2, "connect_timeout_s": 2, "read_timeout_s": 5})
    proxy = TcpProxy(s3.port, delay_s=0.2)
    proc = subprocess.Popen(cmd("train", str(config)), env=env_for(s3, proxy), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    wait_until(lambda: 2 in committed_steps(s3, bucket) and 4 in uncommitted_steps(s3, bucket), proc,
               "step 4 half uploaded")
    before = proxy.connections
    proxy.cut()
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 2, err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith(f"error: the connection to {proxy.endpoint} kept breaking while uploading to "
                               f"s3://{bucket}/ckpt/step_00000004/"), lines[0]
    assert "2 retries with backoff did not get through" in lines[0] and "nothing was committed half" in lines[0]
    assert proxy.connections - before >= 3  # the first attempt and two retries, at least
    assert committed_steps(s3, bucket) == {2}  # step 4 never counts
    assert "mf-test-secret" not in err
    proxy.close()


def test_two_ranks_fetch_url_shards_once_per_node_and_a_restart_reuses_them(s3, tiny_run, tmp_path) -> None:
    from mindfoundry.cli.main import main
    from mindfoundry.config.load import load_config
    from mindfoundry.data.prepare.pipeline import prepare_data
    from mindfoundry.parallel.launch import free_port

    bucket = s3.bucket()
    config = tiny_run("ranks", data__output_dir=f"s3://{bucket}/data")
    prepare_data(load_config(config, [f"data.cache_dir={tmp_path / 'preparing'}"]), log=lambda _: None)
    shard = "data/train/code.bin"
    before = s3.gets(bucket, shard)
    node = tmp_path / "node"
    sets = ["--set", "backend=torch", "--set", "parallel.dp_replicate=2", "--set", f"data.cache_dir={node}"]
    assert main(["launch", "train", str(config), *sets, "--master-port", str(free_port())]) == 0
    assert s3.gets(bucket, shard) - before == 1  # two ranks, one node: one download
    assert (tmp_path / "node" / "data").is_dir()
    assert main(["launch", "train", str(config), *sets, "--master-port", str(free_port()), "--resume", "auto"]) == 0
    assert s3.gets(bucket, shard) - before == 1  # the restart found the copy (its marker unchanged): no download
