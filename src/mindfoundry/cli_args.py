"""Arguments every config-taking command shares: the config path and `--set` overrides."""

from __future__ import annotations

import argparse

from mindfoundry.parallel.layout import load_run_config
from mindfoundry.config.schema import RunConfig


def add_config_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", help="YAML run config, e.g. configs/demo.yaml")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config value (repeatable), e.g. train.steps=10")


def config_from_args(args: argparse.Namespace) -> RunConfig:
    """The validated, resolved config of a command's arguments (raises ConfigError)."""
    return load_run_config(args.config, args.set or [])
