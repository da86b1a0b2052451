"""What every command group shares: the config path and `--set` overrides, and the console for messages."""

from __future__ import annotations

import argparse

from rich.console import Console

from mindfoundry.config.schema import RunConfig

#: Messages and progress go to stderr and never wrap: one problem = one line.
console = Console(stderr=True, soft_wrap=True)


def add_config_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", help="YAML run config, e.g. configs/demo.yaml")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config value (repeatable), e.g. train.steps=10")


def config_from_args(args: argparse.Namespace) -> RunConfig:
    """The validated, resolved config of a command's arguments, layout rules included (raises ConfigError)."""
    from mindfoundry.parallel.layout import load_run_config

    return load_run_config(args.config, args.set or [])
