"""Surviving failures through the CLI, as a cluster job experiences them: SIGKILL at random points
(also mid-checkpoint), SIGTERM pre-emption, crash supervision, NaN and spike drills."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
import yaml
from safetensors.numpy import load_file

pytest.importorskip("mindspore")

from mf_testing import tiny_run_tree  # noqa: E402
from mindfoundry.train.metrics import read_metrics  # noqa: E402

pytestmark = pytest.mark.slow
ENGINES = ["mindspore", pytest.param("torch", marks=pytest.mark.skipif(
    __import__("importlib").util.find_spec("torch") is None, reason="torch not installed"))]
STEPS = 16


def write_config(corpus: Path, root: Path, name: str, engine: str, **sections) -> Path:
    tree = tiny_run_tree(corpus, root / name)
    tree["backend"] = engine
    tree["train"]["steps"] = STEPS
    tree["checkpoint"] = {"every": 1, "keep_last": 2}
    for section, values in sections.items():
        tree[section] = {**tree.get(section, {}), **values}
    path = root / f"{name}.yaml"
    path.write_text(yaml.safe_dump(tree))
    return path


def cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "mindfoundry.cli", *args]


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(cmd(*args), capture_output=True, text=True, timeout=600, env=dict(os.environ, COLUMNS="200"))


def losses(run_dir: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_metrics(run_dir / "metrics.jsonl") if "loss" in r}


def last_step(run_dir: Path) -> int:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return 0
    return max((row.get("step", 0) for row in read_metrics(path) if "loss" in row), default=0)


def wait_for_step(run_dir: Path, step: int, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while last_step(run_dir) < step:
        assert proc.poll() is None, "training ended before the awaited step"
        assert time.time() < deadline, "training did not reach the awaited step in time"
        time.sleep(0.01)


@pytest.fixture
def reference(mindspore_reference: dict[int, float]) -> dict[str, dict[int, float]]:
    """The uninterrupted MindSpore run every interrupted one here is held to (tests/train/conftest.py)."""
    return {"mindspore": mindspore_reference}


def test_sigkill_at_random_points_then_resume_is_exact(reference, corpus_dir: Path, tmp_path: Path) -> None:
    """One MindSpore run SIGKILLed 3 times at random points (also inside a checkpoint write), each time resumed from
    what
    the kill left (the first kill hits a fresh run, the others a resumed one); the finished run's every loss equals the
    uninterrupted run's. (`bench/checkpoint.py --soak 50` kills 50 times on either engine; the torch engine's ranks are
    SIGKILLed 10 times in tests/parallel/test_launch.py.)"""
    engine = "mindspore"
    rng = random.Random(engine)
    interrupted = mid_write = 0
    config = write_config(corpus_dir, tmp_path, "soak", engine)
    run_dir = tmp_path / "soak"
    for trial in range(3):
        args = ("train", str(config)) + (("--resume", "auto") if trial else ())
        proc = subprocess.Popen(cmd(*args), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for_step(run_dir, last_step(run_dir) + rng.randint(1, STEPS // 6), proc)
        time.sleep(rng.uniform(0, 0.05))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        interrupted += last_step(run_dir) < STEPS
        ckpts = run_dir / "checkpoints"  # absent when the kill came before the first checkpoint
        mid_write += ckpts.is_dir() and any(p.name.startswith(".tmp-") for p in ckpts.iterdir())
    resumed = run("train", str(config), "--resume", "auto")
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed from" in resumed.stderr
    got = losses(run_dir)
    assert [got[s] for s in range(1, STEPS + 1)] == [reference[engine][s] for s in range(1, STEPS + 1)]
    assert interrupted == 3  # the kills really landed mid-run
    print(f"{engine}: {interrupted}/3 kills mid-run, {mid_write}/3 inside a checkpoint write")


def test_sigterm_checkpoints_the_step_and_a_second_signal_exits_at_once(
    corpus_dir: Path, tmp_path: Path, reference
) -> None:
    """SIGTERM in the loop: the step is checkpointed (the run's only checkpoint: every 0), exit 75. The resumed process
    gets two SIGINTs: the second exits at once (130), both lines naming SIGINT (MindSpore's runtime used to turn it into
    SIGTERM). The next resume finishes with the uninterrupted losses."""
    config = write_config(corpus_dir, tmp_path, "term", "mindspore", checkpoint={"every": 0, "keep_last": 2})
    run_dir = tmp_path / "term"
    proc = subprocess.Popen(cmd("train", str(config)), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wait_for_step(run_dir, 3, proc)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 75, err
    stopped = last_step(run_dir)
    assert 3 <= stopped < STEPS - 4
    assert f"stopped by SIGTERM at step {stopped}; checkpoint committed" in err
    assert [p.name for p in (run_dir / "checkpoints").iterdir() if p.name.startswith("step_")] == [
        f"step_{stopped:08d}"
    ]

    proc = subprocess.Popen(
        cmd("train", str(config), "--resume", "auto"), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    wait_for_step(run_dir, stopped + 2, proc)
    proc.send_signal(signal.SIGINT)
    # the second signal once the first is noted: two SIGINTs that reach the process before either is taken are one
    # signal to the kernel (on a loaded machine 50 ms between them was not always enough)
    first = "SIGINT received: checkpointing after this step"
    noted = "".join(iter_until(proc.stderr, first))
    assert first in noted, noted[-3000:]
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, noted + err  # 128 + SIGINT
    assert "second stop signal (SIGINT): exiting at once without a checkpoint (exit 130)" in err

    resumed = run("train", str(config), "--resume", "auto")
    assert resumed.returncode == 0 and "resumed from" in resumed.stderr, resumed.stderr
    got = losses(run_dir)
    assert [got[s] for s in range(1, STEPS + 1)] == [reference["mindspore"][s] for s in range(1, STEPS + 1)]


def iter_until(stream, text: str):
    """Lines of `stream` up to and including the first that contains `text` (or to its end)."""
    for line in stream:
        yield line
        if text in line:
            return


def wait_for(path: Path, proc: subprocess.Popen, contains: str = "", timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while not (path.exists() and contains in path.read_text(errors="replace")):
        if proc.poll() is not None:  # say why it ended: its exit code and what it printed
            _, err = proc.communicate()
            raise AssertionError(f"the process ended (exit {proc.returncode}) before {path} held {contains!r}: {err}")
        assert time.time() < deadline, f"{path} did not appear in time"
        time.sleep(0.01)


def test_stop_signals_during_start_up_exit_75_and_leave_the_run_resumable(
    corpus_dir: Path, tmp_path: Path, reference
) -> None:
    """A signal at three moments before the first step (run dir just claimed, data prepared, engine built and
    evaluating step 0): exit 75 each time, no checkpoint and no step written; then the run resumes to the
    uninterrupted losses. SIGINT is reported as SIGINT (MindSpore's runtime turned it into SIGTERM)."""
    config = write_config(corpus_dir, tmp_path, "startup", "mindspore")
    run_dir = tmp_path / "startup"
    moments = [(signal.SIGTERM, run_dir / "config.yaml", ""), (signal.SIGINT, run_dir / "data" / "manifest.json", ""),
               (signal.SIGTERM, run_dir / "metrics.jsonl", '"event": "start"')]
    for signum, path, contains in moments:
        proc = subprocess.Popen(
            cmd("train", str(config), "--resume", "auto"), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        wait_for(path, proc, contains)
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 75, err
        assert f"stopped by {signal.Signals(signum).name} before the first step" in err, err
        assert "Traceback" not in err
        assert last_step(run_dir) == 0
        assert not (run_dir / "checkpoints").exists() or not any((run_dir / "checkpoints").iterdir())
    resumed = run("train", str(config), "--resume", "auto")
    assert resumed.returncode == 0, resumed.stderr
    got = losses(run_dir)
    assert [got[s] for s in range(1, STEPS + 1)] == [reference["mindspore"][s] for s in range(1, STEPS + 1)]


STOP_DURING_ENGINE_IMPORT = """
import os, signal, sys, threading, time
from mindfoundry.cli.entry import main

def stop_while_importing() -> None:
    while "mindspore" not in sys.modules:  # the engine's import has begun (it takes over a second)
        time.sleep(0.001)
    time.sleep(0.2)
    os.kill(os.getpid(), signal.SIGTERM)

threading.Thread(target=stop_while_importing, daemon=True).start()
sys.argv[1:] = ["train", sys.argv[1]]
sys.exit(main())
"""


def test_a_stop_signal_during_the_engine_import_exits_75(corpus_dir: Path, tmp_path: Path) -> None:
    """SIGTERM while MindSpore's native extension is being imported: raised there, it left the extension half
    initialised
    and the process aborted at exit (status -6, a fatal Python error) instead of exiting 75 (the import is held)."""
    config = write_config(corpus_dir, tmp_path, "import", "mindspore")
    proc = subprocess.run(
        [sys.executable, "-c", STOP_DURING_ENGINE_IMPORT, str(config)], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 75, proc.stderr[-3000:]
    assert "stopped by SIGTERM before the first step" in proc.stderr and "Fatal Python error" not in proc.stderr
    assert last_step(tmp_path / "import") == 0


def test_a_signal_after_the_last_step_is_a_normal_completion(corpus_dir: Path, tmp_path: Path) -> None:
    """`run` evaluates, samples and writes its report after the last step: a SIGTERM then lets it finish, exit 0."""
    config = write_config(corpus_dir, tmp_path, "late", "torch")
    run_dir = tmp_path / "late"
    proc = subprocess.Popen(cmd("run", str(config)), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wait_for_step(run_dir, STEPS, proc)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert "SIGTERM received" in err and "stopped by" not in err
    assert (run_dir / "summary.json").is_file() and (run_dir / "report.html").is_file()
    assert (run_dir / "checkpoints" / "latest").read_text() == f"step_{STEPS:08d}\n"


def test_supervisor_restarts_a_killed_run(corpus_dir: Path, tmp_path: Path, reference) -> None:
    config = write_config(corpus_dir, tmp_path, "sup", "mindspore")
    run_dir = tmp_path / "sup"
    sup = subprocess.Popen(
        cmd("train", str(config), "--max-restarts", "2"), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    wait_for_step(run_dir, 4, sup)
    children = psutil.Process(sup.pid).children()
    assert len(children) == 1
    children[0].kill()  # what the OOM killer does
    _, err = sup.communicate(timeout=300)
    assert sup.returncode == 0, err
    assert "training ended with signal SIGKILL; restart 1/2" in err
    got = losses(run_dir)
    assert [got[s] for s in range(1, STEPS + 1)] == [reference["mindspore"][s] for s in range(1, STEPS + 1)]


def ckpt(run_dir: Path, step: int) -> tuple[dict, dict, dict]:
    path = run_dir / "checkpoints" / f"step_{step:08d}"
    state = json.loads((path / "trainer_state.json").read_text())
    return load_file(str(path / "model.safetensors")), load_file(str(path / "optimizer.safetensors")), state


@pytest.mark.parametrize("engine", ENGINES)
def test_injected_nan_is_skipped(engine: str, corpus_dir: Path, tmp_path: Path) -> None:
    config = write_config(
        corpus_dir, tmp_path, "nan", engine, debug={"inject_nan_at": [5]}, checkpoint={"every": 1, "keep_last": 20}
    )
    proc = run("train", str(config))
    assert proc.returncode == 0, proc.stderr
    run_dir = tmp_path / "nan"
    (w4, o4, _), (w5, o5, s5) = ckpt(run_dir, 4), ckpt(run_dir, 5)
    assert all(np.array_equal(w4[k], w5[k]) for k in w4)  # the NaN step changed no weight
    assert all(np.array_equal(o4[k], o5[k]) for k in o4)  # nor an optimizer moment
    assert (s5["adam_step"], s5["step"]) == (4, 5) and s5["anomaly"]["counts"]["nonfinite"] == 1
    records = read_metrics(run_dir / "metrics.jsonl")
    assert any(
        r.get("event") == "anomaly" and r["kind"] == "nonfinite" and r["step"] == 5 and r["action"] == "skipped"
        for r in records
    )
    final = losses(run_dir)
    assert np.isfinite(final[STEPS]) and final[STEPS] < final[1]


def test_injected_spike_rolls_back_and_skips_the_window(corpus_dir: Path, tmp_path: Path) -> None:
    config = write_config(corpus_dir, tmp_path, "spike", "mindspore", debug={"inject_spike_at": [8]},
                          anomaly={"policy": "rollback", "window": 3}, checkpoint={"every": 3, "keep_last": 5})
    proc = run("train", str(config))
    assert proc.returncode == 0, proc.stderr
    run_dir = tmp_path / "spike"
    events = [r for r in read_metrics(run_dir / "metrics.jsonl") if r.get("event") == "anomaly"]
    assert len(events) == 1 and events[0]["kind"] == "spike" and events[0]["step"] == 8
    per_step = 8  # micro_batch 4 x grad_accum 2 samples per step
    assert events[0]["action"] == f"rolled back to step_00000006, skipping samples [{6 * per_step}, {8 * per_step})"
    _, _, final = ckpt(run_dir, STEPS)
    assert final["skipped_windows"] == [[6 * per_step, 8 * per_step]]
    assert final["consumed_samples"] == (STEPS + 2) * per_step  # the skipped window was consumed, not trained on
    steps_logged = [r["step"] for r in read_metrics(run_dir / "metrics.jsonl") if "loss" in r]
    assert steps_logged[:10] == [1, 2, 3, 4, 5, 6, 7, 8, 7, 8]  # steps 7-8 re-run after the rollback, on new data


def test_anomaly_stop_gives_a_diagnosis(corpus_dir: Path, tmp_path: Path) -> None:
    config = write_config(corpus_dir, tmp_path, "stop", "mindspore", debug={"inject_nan_at": [3, 4, 5]},
                          anomaly={"max_consecutive": 3})
    proc = run("train", str(config))
    assert proc.returncode == 3
    assert "stopped at step 5 after 3 anomalous steps in a row (last: nonfinite" in proc.stderr
    assert "Traceback" not in proc.stderr
