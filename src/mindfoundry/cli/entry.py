"""The program's entry point (the `mindfoundry` script and `python -m mindfoundry.cli`).

A training command routes SIGINT (:func:`mindfoundry.train.stop.route_sigint`) before anything else
is imported: numpy's BLAS starts a thread at import, and every thread must inherit the blocked
signal. Only the standard library and that module are imported before.
"""

from __future__ import annotations

import os
import sys
import threading

from mindfoundry.cli.commands import TRAINING_COMMANDS
from mindfoundry.train.stop import route_sigint, signals


def main() -> int:
    argv = sys.argv[1:]
    if argv and argv[0] in TRAINING_COMMANDS:
        route_sigint()
    # imported only now, deliberately: the parser's imports start numpy's threads, which must inherit the routed signal
    from mindfoundry.checkpoint.committer import COMMIT_THREAD
    from mindfoundry.cli.main import main as run_command
    from mindfoundry.workflows.supervise import record_exit

    code = run_command(argv)
    record_exit(code, at_start=signals.start_up_stop() is not None)  # for a supervisor (--max-restarts): how it ended
    if any(thread.name.startswith(COMMIT_THREAD) for thread in threading.enumerate()):
        # a commit still in flight past checkpoint.stop_grace_s: the interpreter's exit would tear that daemon thread
        # down inside native code (safetensors, fsync), which aborts the process ("FATAL: exception not rethrown",
        # SIGABRT) instead of exiting with `code`. Nothing is lost: an unfinished commit was never committed.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code
