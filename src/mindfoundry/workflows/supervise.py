"""`--max-restarts N`: rerun a crashed training job from its newest valid checkpoint.

The supervisor is a thin parent process: it starts the job (one training process for `train`, the
launcher with all its ranks for `launch`), forwards stop signals to it, and starts it again with
`--resume auto` when a process of it died of a crash (an exception, or a kill such as the OOM
killer's SIGKILL). User errors, pre-emption and anomaly stops are final: restarting them would only
repeat the same outcome; so is any end after the supervisor itself was told to stop.

How each process ended is read from exit files, not from the launcher's status (torchrun reports 1
for any failure): every training process writes its exit code into ``$MINDFOUNDRY_EXIT_DIR`` as its
last act (:func:`record_exit`); a process that wrote none was killed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable, Mapping, Sequence

from mindfoundry.parallel.layout import launched_rank, launched_scheduler
from mindfoundry.workflows.launch_output import LauncherOutput

EXIT_OK = 0
EXIT_USER_ERROR = 2
EXIT_ANOMALY_STOP = 3
EXIT_CRASHED = 70  # EX_SOFTWARE: an exception ended training (after a last-gasp checkpoint when possible)
EXIT_PREEMPTED = 75  # EX_TEMPFAIL: stopped by SIGTERM/SIGINT after checkpointing; resubmit with --resume auto
FINAL = {EXIT_OK, EXIT_USER_ERROR, EXIT_ANOMALY_STOP, EXIT_PREEMPTED}
EXIT_DIR_ENV = "MINDFOUNDRY_EXIT_DIR"


#: Written after the exit code when a stop signal ended the process before its first step (nothing was written).
AT_START = "start-up"


def record_exit(code: int, at_start: bool = False) -> None:
    """Under a supervisor: write this process's exit code as `rank-R-PID` into its exit folder, with :data:`AT_START`
    when a stop signal ended it before its first step. msrun's scheduler (which runs the workers' command but never
    trains, and has no rank of its own) writes nothing: its exit, e.g. after noticing a worker that msrun reaped, would
    otherwise be read as rank 0's."""
    folder = os.environ.get(EXIT_DIR_ENV)
    if folder and Path(folder).is_dir() and not launched_scheduler():
        text = f"{code} {AT_START}" if at_start else str(code)
        Path(folder, f"rank-{launched_rank()}-{os.getpid()}").write_text(text, encoding="utf-8")


def read_exits(folder: Path) -> tuple[dict[int, int], frozenset[int]]:
    """Each rank's exit code from an exit folder, and the ranks a stop signal ended before their first step."""
    exits, at_start = {}, set()
    for f in folder.iterdir():
        rank, (code, *rest) = int(f.name.split("-")[1]), f.read_text(encoding="utf-8").split()
        exits[rank] = int(code)
        if rest == [AT_START]:
            at_start.add(rank)
    return exits, frozenset(at_start)


def child_argv(argv: Sequence[str], restart: bool) -> list[str]:
    """The child's arguments: without --max-restarts; on a restart with --resume auto and without --overwrite."""
    out: list[str] = []
    skip = False
    for i, arg in enumerate(argv):
        if skip:
            skip = False
            continue
        if arg == "--max-restarts" or (restart and arg == "--resume"):
            skip = True
            continue
        if arg.startswith("--max-restarts=") or (restart and (arg.startswith("--resume=") or arg == "--overwrite")):
            continue
        out.append(arg)
    return out + (["--resume", "auto"] if restart else [])


def training_command(argv: Sequence[str]) -> Callable[[int], list[str]]:
    """`mindfoundry ARGV` in one process; attempts after the first resume."""
    return lambda attempt: [sys.executable, "-m", "mindfoundry.cli", *child_argv(argv, attempt > 0)]


def _outcome(rc: int, exits: dict[int, int], processes: int, at_start: frozenset[int] = frozenset()
             ) -> tuple[bool, int, str]:
    """(restart?, the job's exit status, why) from the job's status and each rank's exit code (by global rank;
    on a node of a multi-node job, that node's ranks). Ranks in ``at_start`` were stopped by a signal before their
    first step: beside a killed rank that is the launcher stopping the survivors of a crash, which restarts."""
    killed = processes - len(exits)
    crashed = {r: c for r, c in exits.items() if c not in FINAL}
    if processes == 1:
        why = f"signal {signal.Signals(-rc).name}" if rc < 0 else f"exit code {rc}"
    else:
        why = ", ".join(
            [f"rank {r} exit code {c}" for r, c in sorted(crashed.items())]
            + [f"{killed} rank(s) killed"] * bool(killed)
        )
    stops = {r: c for r, c in exits.items() if c != EXIT_OK}  # user error, anomaly stop or pre-emption (no crash)
    if rc == 0 or not (killed or crashed):  # every process ended finally: the lowest rank's word is the job's
        return False, exits[min(stops or exits)] if exits else rc, why
    if stops and not crashed and not (killed and set(stops) <= at_start):  # a rank stopped for good and the launcher
        return (
            False,
            stops[min(stops)],
            why,
        )  # reaped the others (msrun kills them on any non-zero exit): the stop is the
        # job's; an agreed stop was checkpointed first
    return True, (rc if rc >= 0 else 128 - rc) if processes == 1 else EXIT_CRASHED, why


def supervise(command: Callable[[int], list[str]], max_restarts: int, log: Callable[[str], None], processes: int = 1,
              env: Mapping[str, str] | None = None, launcher: bool = False) -> int:
    """Run `command(attempt)` (in `env`, default this process's) until it ends finally or the restarts are used up;
    `processes` training processes report their exits. A stop signal sent to the supervisor is forwarded and ends
    the supervision. With `launcher` (torchrun, msrun) the launcher's error stream passes through
    :class:`~mindfoundry.workflows.launch_output.LauncherOutput`: a failing rank's error line is not buried in the
    launcher's report."""
    attempt = 0
    stopped: list[int] = []
    while True:
        with tempfile.TemporaryDirectory(prefix="mindfoundry-exits-") as folder:
            proc = subprocess.Popen(
                command(attempt), env={**(os.environ if env is None else env), EXIT_DIR_ENV: folder},
                stderr=subprocess.PIPE if launcher else None, text=launcher or None, errors="replace",
            )
            pump = LauncherOutput(sys.stderr).pump(proc.stderr) if launcher else None

            def forward(signum: int, _frame) -> None:
                stopped.append(signum)
                proc.send_signal(signum)

            previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
            try:
                rc = proc.wait()
                if pump is not None:
                    pump.join()
            finally:
                for s, handler in previous.items():
                    signal.signal(s, handler)
            exits, at_start = read_exits(Path(folder))
        restart, status, why = _outcome(rc, exits, processes, at_start)
        if not restart or stopped or attempt >= max_restarts:
            return status
        attempt += 1
        log(f"training ended with {why}; restart {attempt}/{max_restarts} from the newest valid checkpoint")
