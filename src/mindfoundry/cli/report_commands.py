"""`mindfoundry report RUN_DIR [--compare RUN_B] [-o FILE]`: one self-contained HTML file of a run."""

from __future__ import annotations

import argparse

from mindfoundry.cli.args import console, local_path


def cmd_report(args: argparse.Namespace) -> int:
    from mindfoundry.report.render import write_report  # matplotlib loads only for this command

    path = write_report(args.run_dir, args.compare, args.output)
    console.print(f"wrote {path}", highlight=False)
    return 0


def add_report_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "report", help="write one self-contained HTML report of a run (plots, health events, data, config)"
    )
    p.add_argument("run_dir", type=local_path("a run directory is a local folder"),
                   help="the run directory (holds metrics.jsonl)")
    p.add_argument(
        "--compare",
        metavar="RUN_B",
        default=None,
        type=local_path("a run directory is a local folder"),
        help="a second run directory to overlay on the same axes (e.g. the other engine, or before/after a change)",
    )
    p.add_argument("-o", "--output", metavar="FILE", default=None, type=local_path("the report is written as a local "
                                                                                 "file (copy it where it is read)"),
                   help="output file (default RUN_DIR/report.html, or RUN_DIR/report-vs-NAME.html with --compare)")
    p.set_defaults(func=cmd_report)
