"""`mindfoundry launch`: the engines' own launchers, per-rank logs, clear errors before anything starts."""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path

import pytest

from mindfoundry.cli.main import main
from mindfoundry.parallel.launch import LaunchError, LaunchPlan, check_port, command


def test_commands_for_both_launchers(tmp_path) -> None:
    plan = LaunchPlan("torch", 4, nnodes=2, node_rank=1, master_addr="10.0.0.1", master_port=29555, log_dir=tmp_path)
    cmd = command(plan, ["train", "c.yaml"])
    assert cmd[:3] == [sys.executable, "-m", "torch.distributed.run"]
    assert {"--nnodes=2", "--nproc-per-node=4", "--node-rank=1", "--master-addr=10.0.0.1", "--master-port=29555",
            f"--log-dir={tmp_path}"} <= set(cmd)
    assert cmd[-3].endswith("mindfoundry") and cmd[-2:] == ["train", "c.yaml"]
    ms = command(LaunchPlan("mindspore", 4, nnodes=2, master_port=29555, log_dir=tmp_path), ["train", "c.yaml"])
    assert Path(ms[0]).name == "msrun" and "--worker_num=8" in ms and "--local_worker_num=4" in ms and "--join=True" in ms
    with pytest.raises(LaunchError, match="node_rank"):
        command(LaunchPlan("torch", 2, nnodes=1, node_rank=1), ["train"])


def test_taken_port_is_named_with_a_free_one() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(LaunchError, match=f"port {port} on 127.0.0.1 is already in use.*--master-port"):
            check_port(LaunchPlan("torch", 2, master_port=port))


def test_layout_needing_more_processes_is_refused_before_training(tiny_run, tmp_path, capsys) -> None:
    cfg = tiny_run()
    assert main(["train", str(cfg), "--set", "parallel.dp_shard=2"]) == 2
    assert "the launcher started 1 process" in capsys.readouterr().err
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = str(s.getsockname()[1])
        assert main(["launch", "train", str(cfg), "--set", "parallel.dp_shard=2", "--set", "backend=torch", "--master-port", port]) == 2
    assert "already in use" in capsys.readouterr().err


def _losses(run: Path) -> list[float]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in rows if "loss" in r and "event" not in r]


@pytest.mark.slow
def test_fsdp_launch_equals_one_process_and_resumes_in_one(tiny_run, tmp_path) -> None:
    from mindfoundry.parallel.launch import free_port

    fsdp = tiny_run("fsdp")
    sets = ["--set", "backend=torch", "--set", "monitor.detail_every=0"]
    assert main(["launch", "train", str(fsdp), *sets, "--set", "parallel.dp_shard=2", "--master-port", str(free_port()),
                 "--stop-at-step", "4"]) == 0
    logs = list((tmp_path / "fsdp-logs").rglob("stdout.log"))
    assert len(logs) == 2  # one log per rank
    one = tiny_run("one")
    assert main(["train", str(one), *sets, "--set", "train.grad_accum=4"]) == 0  # the same global batch in one process
    # the FSDP(2) checkpoint of step 4 continues in one process (same global batch) to step 6
    assert main(["train", str(fsdp), *sets, "--set", "train.grad_accum=4", "--resume", "auto"]) == 0
    single, sharded = _losses(tmp_path / "one"), _losses(tmp_path / "fsdp")
    assert len(single) == len(sharded) == 6
    assert max(abs(a / b - 1) for a, b in zip(sharded, single)) < 1e-5
    # a step of the FSDP(2) layout replayed and dumped in one process, from the run's step-3 checkpoint
    assert main(["dump", str(fsdp), *sets, "--set", "parallel.dp_shard=2", "--steps", "4", "--resume", "auto",
                 "--out", str(tmp_path / "dump")]) == 0
    from mindfoundry.debug.dump_folders import read_dump

    assert read_dump(tmp_path / "dump" / "step4" / "rank0").meta["loss"] == pytest.approx(single[3], rel=1e-5)
