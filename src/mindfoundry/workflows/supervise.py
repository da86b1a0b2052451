"""`--max-restarts N`: rerun a crashed training process from its newest valid checkpoint.

The supervisor is a thin parent process: it starts the same command as a child, forwards stop
signals to it, and restarts it with `--resume auto` when it dies of a crash (an exception, or a
kill such as the OOM killer's SIGKILL). User errors, pre-emption and anomaly stops are final:
restarting them would only repeat the same outcome.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from typing import Callable, Sequence

EXIT_OK = 0
EXIT_USER_ERROR = 2
EXIT_ANOMALY_STOP = 3
EXIT_CRASHED = 70  # EX_SOFTWARE: an exception ended training (after a last-gasp checkpoint when possible)
EXIT_PREEMPTED = 75  # EX_TEMPFAIL: stopped by SIGTERM/SIGINT after checkpointing; resubmit with --resume auto
FINAL = {EXIT_OK, EXIT_USER_ERROR, EXIT_ANOMALY_STOP, EXIT_PREEMPTED}


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


def supervise(argv: Sequence[str], max_restarts: int, log: Callable[[str], None]) -> int:
    """Run `mindfoundry ARGV` as a child until it ends finally or the restarts are used up. A stop signal sent to
    the supervisor is forwarded to the child and ends the supervision, however the child then exits."""
    attempt = 0
    stopped: list[int] = []
    while True:
        proc = subprocess.Popen([sys.executable, "-m", "mindfoundry.cli", *child_argv(argv, attempt > 0)])

        def forward(signum: int, _frame) -> None:
            stopped.append(signum)
            proc.send_signal(signum)

        previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            rc = proc.wait()
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
        if rc in FINAL or stopped or attempt >= max_restarts:
            return rc if rc >= 0 else 128 - rc
        attempt += 1
        cause = f"signal {signal.Signals(-rc).name}" if rc < 0 else f"exit code {rc}"
        log(f"training ended with {cause}; restart {attempt}/{max_restarts} from the newest valid checkpoint")
