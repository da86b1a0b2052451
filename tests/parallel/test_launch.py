"""`mindfoundry launch`: the engines' own launchers, per-rank logs, clear errors before anything starts."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import psutil
import pytest

from mindfoundry.cli.main import main
from mindfoundry.parallel.launch import LaunchError, LaunchPlan, check_port, command
from mindfoundry.train.metrics import read_metrics


def test_commands_for_both_launchers(tmp_path) -> None:
    plan = LaunchPlan("torch", 4, nnodes=2, node_rank=1, master_addr="10.0.0.1", master_port=29555, log_dir=tmp_path)
    cmd = command(plan, ["train", "c.yaml"])
    assert cmd[:3] == [sys.executable, "-m", "torch.distributed.run"]
    assert {"--nnodes=2", "--nproc-per-node=4", "--node-rank=1", "--master-addr=10.0.0.1", "--master-port=29555",
            f"--log-dir={tmp_path}"} <= set(cmd)
    assert cmd[-3].endswith("mindfoundry") and cmd[-2:] == ["train", "c.yaml"]
    ms = command(LaunchPlan("mindspore", 4, nnodes=2, master_port=29555, log_dir=tmp_path), ["train", "c.yaml"])
    assert (
        Path(ms[0]).name == "msrun" and "--worker_num=8" in ms and "--local_worker_num=4" in ms and "--join=True" in ms
    )
    with pytest.raises(LaunchError, match="node_rank"):
        command(LaunchPlan("torch", 2, nnodes=1, node_rank=1), ["train"])


@pytest.mark.parametrize("rc,exits,processes,expected", [
    (-9, {}, 1, (True, 137, "signal SIGKILL")),  # the OOM killer: restart
    (70, {0: 70}, 1, (True, 70, "exit code 70")),  # a crash: restart
    (2, {0: 2}, 1, (False, 2, "exit code 2")),  # a user error is final
    (1, {0: 70}, 2, (True, 70, "rank 0 exit code 70, 1 rank(s) killed")),  # torchrun: a rank died, the other crashed
    (1, {0: 75, 1: 75}, 2, (False, 75, "")),  # an agreed stop
    (1, {1: 75}, 2, (False, 75, "1 rank(s) killed")),  # msrun killed rank 0 after rank 1 left: still the agreed stop
    (1, {0: 0}, 2, (True, 70, "1 rank(s) killed")),  # a rank killed at the very end: the restart only confirms the end
    (0, {0: 0, 1: 0}, 2, (False, 0, "")),
])
def test_the_supervisor_judges_a_job_by_each_ranks_exit(rc: int, exits: dict, processes: int, expected: tuple) -> None:
    from mindfoundry.workflows.supervise import _outcome

    assert _outcome(rc, exits, processes) == expected


def test_a_rank_killed_during_start_up_restarts_though_the_launcher_stopped_the_other(tmp_path) -> None:
    """Rank 0 SIGKILLed while the attempt started; torchrun SIGTERMed rank 1, which stopped before its first step
    (exit 75). That is a crash, not an agreed stop: the supervisor used to end the job with 75 and a restart budget
    left (seen twice in tests/parallel's ten-kill run)."""
    from mindfoundry.workflows.supervise import AT_START, _outcome, read_exits

    (tmp_path / "rank-1-4242").write_text(f"75 {AT_START}")
    exits, at_start = read_exits(tmp_path)
    assert exits == {1: 75} and at_start == {1}
    assert _outcome(1, exits, 2, at_start) == (True, 70, "1 rank(s) killed")
    assert _outcome(1, exits, 2) == (False, 75, "1 rank(s) killed")  # after steps: msrun reaping an agreed stop


def test_exit_files_come_from_training_ranks_only(tmp_path, monkeypatch) -> None:
    """msrun runs our command as its scheduler too: that process has no rank and records no exit (it once wrote one as
    'rank 0', and its error after msrun reaped the workers replaced rank 0's agreed stop: a flaky exit 70 for 75)."""
    from mindfoundry.workflows.supervise import EXIT_DIR_ENV, record_exit

    monkeypatch.setenv(EXIT_DIR_ENV, str(tmp_path))
    monkeypatch.setenv("RANK_ID", "1")
    monkeypatch.setenv("MS_ROLE", "MS_WORKER")
    record_exit(75)
    monkeypatch.setenv("MS_ROLE", "MS_SCHED")
    monkeypatch.delenv("RANK_ID")
    record_exit(70)
    assert [(p.name.split("-")[:2], p.read_text()) for p in tmp_path.iterdir()] == [(["rank", "1"], "75")]


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
        assert (
            main(
                [
                    "launch",
                    "train",
                    str(cfg),
                    "--set",
                    "parallel.dp_shard=2",
                    "--set",
                    "backend=torch",
                    "--master-port",
                    port,
                ]
            )
            == 2
        )
    assert "already in use" in capsys.readouterr().err


def _losses(run: Path) -> list[float]:
    rows = read_metrics(run / "metrics.jsonl")
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


def _rank_processes(config: Path, rank_variable: str = "RANK") -> dict[int, psutil.Process]:
    """The live training processes of a launch of `config`, by rank (the launcher's workers; not msrun's scheduler).
    Matched by the config's whole path, so that a test running beside this one (pytest -n) never has its ranks taken for
    ours. Processes that end while they are looked at are passed over."""
    out = {}
    for proc in psutil.process_iter():
        try:
            cmdline, env = proc.cmdline(), proc.environ()
        except psutil.Error:  # gone, a zombie, or not ours
            continue
        if ("train" in cmdline and str(config) in cmdline and "launch" not in cmdline
                and rank_variable in env and env.get("MS_ROLE") != "MS_SCHED"):
            out[int(env[rank_variable])] = proc
    return out


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _max_step(run: Path) -> int:
    path = run / "metrics.jsonl"
    if not path.exists():
        return 0
    return max((row.get("step", 0) for row in read_metrics(path) if "loss" in row), default=0)


TORCH_DP = [
    "--set",
    "backend=torch",
    "--set",
    "monitor.detail_every=0",
    "--set",
    "parallel.dp_replicate=2",
    "--set",
    "train.steps=60",
]


@pytest.fixture(scope="module")
def torch_dp_reference(corpus_dir: Path, tmp_path_factory) -> list[float]:
    """The 60 losses of an uninterrupted 2-rank data-parallel torch job under torchrun (TORCH_DP)."""
    import yaml

    from mf_testing import shared_once, tiny_run_tree
    from mindfoundry.parallel.launch import free_port

    def make(root: Path) -> list[float]:
        (root / "reference.yaml").write_text(yaml.safe_dump(tiny_run_tree(corpus_dir, root / "reference")))
        port = str(free_port())
        assert main(["launch", "train", str(root / "reference.yaml"), *TORCH_DP, "--master-port", port]) == 0
        return _losses(root / "reference")

    expected = shared_once(tmp_path_factory, "torch-dp", make)
    assert len(expected) == 60
    return expected


@pytest.mark.slow
def test_launch_max_restarts_survives_ten_rank_kills_with_the_uninterrupted_losses(
    tiny_run, tmp_path, torch_dp_reference
) -> None:
    """2 data-parallel torch ranks under torchrun; 10 times a random rank is SIGKILLed at a random moment (after
    the job made progress since the last kill): the other rank writes a last-gasp checkpoint when it holds the
    whole untorn state, the supervisor restarts the job from the newest valid checkpoint, and the finished run's
    losses are the uninterrupted run's, bit for bit."""
    import random
    import subprocess
    import time

    from mindfoundry.parallel.launch import free_port

    sets, expected = [*TORCH_DP, "--set", "checkpoint.every=3"], torch_dp_reference

    config, run = tiny_run("killed"), tmp_path / "killed"
    log = tmp_path / "job.log"  # a file, not a pipe: ten attempts' output would fill a pipe nobody reads yet
    job = subprocess.Popen([sys.executable, "-m", "mindfoundry.cli", "launch", "train", str(config), *sets,
                            "--master-port", str(free_port()), "--max-restarts", "10"],
                           stdout=subprocess.DEVNULL, stderr=log.open("w"))
    rng = random.Random(19)
    t0 = time.time()
    kills, reached = [], 0
    deadline = time.time() + 600
    while len(kills) < 10 and job.poll() is None and time.time() < deadline:
        ranks = _rank_processes(config)
        if len(ranks) < 2 or _max_step(run) <= reached:  # wait for this attempt to make progress
            time.sleep(0.02)
            continue
        time.sleep(rng.uniform(0, 0.3))
        victim = rng.choice(sorted(ranks))
        reached = _max_step(run)
        try:
            ranks[victim].kill()
        except psutil.Error:  # it ended on its own meanwhile
            continue
        kills.append((victim, reached))
        print(f"{time.time() - t0:.1f}s kill rank {victim} at step {reached}", flush=True)
        while any(_alive(p) for p in ranks.values()) and time.time() < deadline:
            time.sleep(0.02)  # this attempt's workers are gone before the next kill is aimed
    job.wait(timeout=600)
    err = log.read_text(errors="replace")
    assert job.returncode == 0, err[-3000:]
    assert len(kills) == 10 and err.count("from the newest valid checkpoint") == 10, (kills, err[-3000:])
    got = _losses(tmp_path / "killed")
    by_step = {}
    for row in read_metrics(run / "metrics.jsonl"):
        if "loss" in row and "event" not in row:
            by_step[row["step"]] = row["loss"]  # a step re-run after a restart keeps its latest value
    assert len(got) >= 60 and [by_step[s] for s in range(1, 61)] == expected  # the same floats
    print(f"kills (rank, step reached): {kills}; last-gasp checkpoints: {err.count('writing a last-gasp checkpoint')}")


@pytest.mark.slow
def test_a_signalled_rank_stops_every_rank_after_the_same_step(tiny_run, tmp_path, torch_dp_reference) -> None:
    """SIGTERM to rank 1 alone: the ranks agree at the step boundary, every rank stops after the same step, rank 0
    checkpoints it, the job exits 75 (every rank's word); `--resume auto` finishes with the uninterrupted losses."""
    import subprocess
    import time

    from mindfoundry.parallel.launch import free_port

    sets = [*TORCH_DP, "--set", "checkpoint.every=0"]
    config, run = tiny_run("signalled"), tmp_path / "signalled"
    log = tmp_path / "job.log"
    job = subprocess.Popen([sys.executable, "-m", "mindfoundry.cli", "launch", "train", str(config), *sets,
                            "--master-port", str(free_port())], stdout=subprocess.DEVNULL, stderr=log.open("w"))
    deadline = time.time() + 300
    while _max_step(run) < 3:
        assert job.poll() is None and time.time() < deadline
        time.sleep(0.02)
    _rank_processes(config)[1].send_signal(15)
    assert job.wait(timeout=300) == 75
    err = log.read_text(errors="replace")
    stopped = _max_step(run)
    assert 3 <= stopped < 60
    assert f"[default0]:stopped by a stop signal on another rank at step {stopped}; checkpoint committed" in err, err[
        -3000:
    ]
    assert f"[default1]:stopped by SIGTERM at step {stopped}; checkpoint committed" in err
    assert [p.name for p in (run / "checkpoints").glob("step_*")] == [f"step_{stopped:08d}"]
    assert main(["launch", "train", str(config), *sets, "--master-port", str(free_port()), "--resume", "auto"]) == 0
    got = {}
    for row in read_metrics(run / "metrics.jsonl"):
        if "loss" in row and "event" not in row:
            got[row["step"]] = row["loss"]
    assert [got[s] for s in range(1, 61)] == torch_dp_reference


@pytest.mark.slow
def test_msrun_launch_restarts_after_a_killed_rank_and_stops_on_a_signalled_one(tiny_run, tmp_path) -> None:
    """`launch` with msrun (MindSpore data parallel) from a PATH without this Python's folder (msrun starts ranks as
    `python SCRIPT`), one `--max-restarts 1` job: SIGKILL to rank 1 after step 5: msrun ends the job and the supervisor
    restarts it from the newest valid checkpoint. SIGTERM to rank 1 of the restarted job once it logged a step: both
    ranks stop after the same step (MindSpore's all-reduce of the stop flag), rank 0 checkpoints it, and the job exits
    75, which is final (no restart). `--resume auto` then finishes. Every step's loss equals an uninterrupted msrun
    run's. (One job for both drills: each msrun start costs ~25 s of cluster set-up and compile here.)"""
    import os
    import subprocess
    import time

    from mindfoundry.parallel.launch import free_port

    bindir = str(Path(sys.executable).parent)
    env = dict(os.environ, PATH=os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep) if p != bindir),
               MS_NODE_TIMEOUT="8")  # seconds before the scheduler declares the killed rank dead (default 30)
    steps = 10
    sets = ["--set", "backend=mindspore", "--set", "monitor.detail_every=0", "--set", "parallel.dp_replicate=2",
            "--set", f"train.steps={steps}", "--set", "checkpoint.every=4"]
    run, log = tmp_path / "drilled", tmp_path / "drilled.log"

    def launch(name: str, *extra: str) -> subprocess.Popen:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "mindfoundry.cli",
                "launch",
                "train",
                str(tmp_path / f"{name}.yaml"),
                *sets,
                "--master-port",
                str(free_port()),
                *extra,
            ],
            stdout=subprocess.DEVNULL,
            stderr=(tmp_path / f"{name}.log").open("a"),
            env=env,
        )

    def logged_steps() -> list[int]:
        """The steps of the loss records so far, in the order written (a restarted attempt re-logs steps)."""
        path = run / "metrics.jsonl"
        rows = read_metrics(path) if path.exists() else ()
        return [row["step"] for row in rows if "loss" in row and "event" not in row]

    def rank_1_once(ready, job: subprocess.Popen) -> psutil.Process:
        """Rank 1 of the job's current attempt, once `ready()` holds."""
        deadline = time.time() + 300
        while not ready() or 1 not in (ranks := _rank_processes(tmp_path / "drilled.yaml", "RANK_ID")):
            assert job.poll() is None and time.time() < deadline, log.read_text(errors="replace")[-3000:]
            time.sleep(0.02)
        return ranks[1]

    def losses(name: str) -> list[float]:
        got = {}
        for row in read_metrics(tmp_path / name / "metrics.jsonl"):
            if "loss" in row and "event" not in row:
                got[row["step"]] = row["loss"]  # a step re-run after a restart keeps its latest value
        return [got[s] for s in range(1, steps + 1)]

    for name in ("reference", "drilled"):
        tiny_run(name)
    assert launch("reference").wait(timeout=300) == 0, (tmp_path / "reference.log").read_text()[-3000:]
    expected = losses("reference")

    job = launch("drilled", "--max-restarts", "1")
    rank_1_once(lambda: max(logged_steps(), default=0) >= 5, job).send_signal(9)  # the step-4 checkpoint exists
    restarted = "restart 1/1 from the newest valid checkpoint"
    rank_1_once(lambda: restarted in log.read_text(errors="replace"), job)
    # the restarted attempt has logged a step: its ranks are in the training loop (the first attempt may have logged
    # steps past 5 before the kill took, so the highest step says nothing about the new attempt)
    before = len(logged_steps())
    rank_1_once(lambda: len(logged_steps()) > before, job).send_signal(15)
    assert job.wait(timeout=300) == 75, log.read_text(errors="replace")[-3000:]
    text = log.read_text(errors="replace")
    assert text.count(restarted) == 1 and "restart 2" not in text  # the agreed stop is not restarted
    stopped = logged_steps()[-1]
    assert 5 <= stopped < steps
    assert f"step_{stopped:08d}" == max(p.name for p in (run / "checkpoints").glob("step_*"))
    worker_logs = {r: (tmp_path / "drilled-logs" / f"worker_{r}.log").read_text(errors="replace") for r in (0, 1)}
    assert f"stopped by a stop signal on another rank at step {stopped}; checkpoint committed" in worker_logs[0]
    assert f"stopped by SIGTERM at step {stopped}; checkpoint committed" in worker_logs[1]
    assert launch("drilled", "--resume", "auto").wait(timeout=300) == 0, log.read_text(errors="replace")[-3000:]
    assert losses("drilled") == expected
