"""`mindfoundry config validate|show CONFIG`: check a config, or print it fully resolved."""

from __future__ import annotations

import argparse
import sys

from mindfoundry.cli.args import add_config_arguments, config_from_args, console
from mindfoundry.config.load import to_yaml


def cmd_config(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    if args.action == "show":
        sys.stdout.write(to_yaml(cfg))
    else:
        console.print(f"[green]{args.config}: valid[/]")
    return 0


def add_config_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("config", help="validate or show a config")
    p.add_argument("action", choices=["validate", "show"])
    add_config_arguments(p)
    p.set_defaults(func=cmd_config)
