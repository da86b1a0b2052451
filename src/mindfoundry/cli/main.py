"""`mindfoundry COMMAND ...`: the parser of every command group, and the one place errors become exit codes.

A :class:`~mindfoundry.errors.MindFoundryError` (bad config, missing data, corrupted files, an
occupied run directory or output, a layout that does not fit) prints its one-line message and
exits with status 2; tracebacks are reserved for bugs (exit 70). Pre-emption exits 75, an
anomaly stop 3 (see :mod:`mindfoundry.cli.train_commands`).
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from mindfoundry.cli.args import console
from mindfoundry.cli.ckpt_commands import add_ckpt_commands
from mindfoundry.cli.commands import TRAINING_COMMANDS
from mindfoundry.cli.config_commands import add_config_commands
from mindfoundry.cli.data_commands import add_data_commands
from mindfoundry.cli.debug_commands import add_debug_commands
from mindfoundry.cli.parallel_commands import add_parallel_commands
from mindfoundry.cli.report_commands import add_report_commands
from mindfoundry.cli.train_commands import add_train_commands
from mindfoundry.errors import MindFoundryError
from mindfoundry.train.run_lock import release_all
from mindfoundry.train.stop import Preempted, signals
from mindfoundry.workflows.supervise import (
    EXIT_ANOMALY_STOP,
    EXIT_CRASHED,
    EXIT_PREEMPTED,
    EXIT_USER_ERROR,
    supervise,
    training_command,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mindfoundry", description="Pretrain decoder-only LLMs on MindSpore.")
    sub = parser.add_subparsers(dest="command", required=True)
    for add in (add_config_commands, add_train_commands, add_ckpt_commands, add_data_commands, add_report_commands,
                add_debug_commands, add_parallel_commands):
        add(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from mindfoundry.train.anomaly import AnomalyStop

    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    trains = argv[0] in TRAINING_COMMANDS  # this process trains (`launch train` only starts the launcher)
    if trains and args.max_restarts:
        return supervise(training_command(argv), args.max_restarts, console.print)
    if trains and not getattr(args, "dry_run", False):
        signals.install(console.print)  # stop signals, from here to the last line (mindfoundry.train.stop)
    try:
        return args.func(args)
    except MindFoundryError as exc:
        console.print(f"[red]{exc.label}:[/] {exc}", highlight=False)
        return EXIT_USER_ERROR
    except Preempted as exc:
        console.print(f"[yellow]{exc}[/]", highlight=False)
        return EXIT_PREEMPTED
    except AnomalyStop as exc:
        console.print(f"[red]anomaly stop:[/] {exc}", highlight=False)
        return EXIT_ANOMALY_STOP
    except Exception:
        if (stopped := signals.start_up_stop()) is not None:
            console.print(f"[yellow]{stopped}[/]", highlight=False)
            return EXIT_PREEMPTED
        console.print_exception()
        return EXIT_CRASHED
    finally:
        release_all()  # the command is over: its run directory is free for the next writer
        if signals.installed:
            signals.uninstall()
