"""`data.executor: ray`: a real Ray cluster of two (simulated) nodes writes what one local process writes, a worker
killed in the middle of a task is retried, and an address nobody listens on is one line."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest
from test_parallel_prepare import assert_same_output

from mindfoundry.cli.main import main
from mindfoundry.config.load import load_config
from mindfoundry.data.execute.ray_cluster import RayExecutorError
from mindfoundry.data.prepare.pipeline import prepare_data, work_dir

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def two_nodes():
    """A Ray cluster of two nodes of 2 CPUs each on this machine (ray.cluster_utils, as Ray's own tests simulate one).
    """
    from ray.cluster_utils import Cluster

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "object_store_memory": 96 * 2**20,
                                                            "include_dashboard": False})
    cluster.add_node(num_cpus=2, object_store_memory=96 * 2**20)
    yield cluster.address
    cluster.shutdown()


class KillFirstAttempt(threading.Thread):
    """Watches a stage's folder of the work area and SIGKILLs the process of the first task attempt it sees
    (an attempt folder is named task-N.tmp-HOST-PID): a worker dying in the middle of a task."""

    def __init__(self, stage: Path) -> None:
        super().__init__(daemon=True)
        self.stage, self.killed, self.stop = stage, [], threading.Event()

    def run(self) -> None:
        while not self.stop.is_set() and not self.killed:
            for attempt in self.stage.glob("task-*.tmp-*") if self.stage.is_dir() else []:
                pid = int(attempt.name.rsplit("-", 1)[1])
                os.kill(pid, signal.SIGKILL)
                self.killed.append((attempt.name, pid))
                return
            time.sleep(0.005)


@pytest.mark.slow
def test_two_ray_nodes_write_what_one_process_writes_and_a_killed_worker_is_retried(two_nodes, tiny_run) -> None:
    # a built-in source is one read task that reads all of People's Daily (~2 s): long enough to be killed in
    news = {"name": "news", "builtin": "peoples_daily", "max_documents": 2000}
    overrides = {"data__task_bytes": 2**16}
    local = load_config(tiny_run("local", **overrides))
    local.data.sources.append(local.data.sources[0].model_validate(news))
    prepare_data(local, log=lambda _: None)

    on_ray = load_config(
        tiny_run("ray", data__executor="ray", data__workers=4, data__ray={"address": two_nodes}, **overrides)
    )
    on_ray.data.sources.append(on_ray.data.sources[0].model_validate(news))
    killer = KillFirstAttempt(Path(work_dir(on_ray)) / "stages" / "read")
    killer.start()
    logs: list[str] = []
    try:
        data = prepare_data(on_ray, log=logs.append)
    finally:
        killer.stop.set()
    assert killer.killed, "no read task attempt was seen to kill"
    assert_same_output(Path(local.data.output_dir), Path(on_ray.data.output_dir))
    timings = data.manifest["timings"]
    assert timings["executor"].startswith(f"ray at {two_nodes}, 4 CPUs")
    assert timings["stages"]["read"]["tasks"] == 8
    assert {stage["nodes"] for stage in timings["stages"].values() if stage["tasks"] - stage["skipped"] > 1} == {
        2
    }  # both worked
    assert not work_dir(on_ray).exists()


def test_an_unreachable_ray_address_is_one_line_in_seconds(tiny_run, capsys) -> None:
    config = str(tiny_run("noray"))
    start = time.perf_counter()
    code = main(["prepare", config, "--set", "data.executor=ray", "--set", "data.ray.address=127.0.0.1:1"])
    err = capsys.readouterr().err
    assert code == 2 and time.perf_counter() - start < 20  # ray.init alone retries such an address for ever
    assert "cannot reach the Ray cluster at data.ray.address='127.0.0.1:1' (Connection refused): start it" in err
    with pytest.raises(RayExecutorError, match="set data.ray.address: local"):
        prepare_data(load_config(tiny_run("noray2", data__executor="ray", data__ray={"address": "ray://127.0.0.1:1"})),
                     log=lambda _: None)


@pytest.mark.slow
def test_the_cli_starts_a_ray_instance_of_its_own_with_address_local(tiny_run) -> None:
    """`data.executor: ray` with the default `data.ray.address: local`, as a user runs it: the CLI in a process of its
    own starts Ray on this machine, prepares, and stops it; the bytes are one local process's."""
    import subprocess
    import sys

    local = load_config(tiny_run("plain"))
    prepare_data(local, log=lambda _: None)
    config = tiny_run("own")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mindfoundry.cli",
            "prepare",
            str(config),
            "--set",
            "data.executor=ray",
            "--set",
            "data.workers=2",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, RAY_ADDRESS=""),
    )
    assert proc.returncode == 0, proc.stderr
    assert "prepare: 2 read tasks over 2 sources, ray at local, 2 CPUs" in proc.stdout + proc.stderr
    assert_same_output(Path(local.data.output_dir), Path(load_config(config).data.output_dir))
