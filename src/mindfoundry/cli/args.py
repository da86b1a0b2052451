"""What every command group shares: the config path and `--set` overrides, and the console for messages."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from rich.console import Console

from mindfoundry.config.schema import RunConfig
from mindfoundry.config.storage_config import StorageConfig

#: Messages and progress go to stderr and never wrap: one problem = one line.
console = Console(stderr=True, soft_wrap=True)


def restarts(text: str) -> int:
    """`--max-restarts N`: a whole number, 0 or more (argparse names the option in its error)."""
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value}: must be 0 or more")
    return value


def add_max_restarts(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--max-restarts", type=restarts, default=0, metavar="N",
                   help=f"restart {what} up to N times from the newest valid checkpoint when it crashes or is killed")


def local_path(why: str) -> Callable[[str], str]:
    """An argparse type for a path that only a local disk can serve: a URL is refused naming the argument and ``why``
    (argparse exits 2 with the message)."""

    def checked(text: str) -> str:
        from mindfoundry.storage.failures import StorageError
        from mindfoundry.storage.resolve import locate

        try:
            locate(text).local_path("it", why)
        except StorageError as exc:
            raise argparse.ArgumentTypeError(str(exc).removeprefix("it ")) from None
        return text

    return checked


def add_config_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", type=local_path("the config file is read from a local disk: copy it here first"),
                   help="YAML run config, e.g. configs/demo.yaml")
    p.add_argument(
        "--set", action="append", metavar="KEY=VALUE", help="override a config value (repeatable), e.g. train.steps=10"
    )


def config_from_args(args: argparse.Namespace) -> RunConfig:
    """The validated, resolved config of a command's arguments, layout rules included (raises ConfigError)."""
    from mindfoundry.config.load import load_config

    return load_config(args.config, args.set or [])


def add_storage_arguments(p: argparse.ArgumentParser) -> None:
    """``--set storage.KEY=VALUE`` for a command that takes paths or URLs but no config."""
    p.add_argument(
        "--set", action="append", metavar="storage.KEY=VALUE",
        help="how URLs are reached, as the config's storage section says it (repeatable), e.g. "
        "storage.endpoint_url=https://obs.cn-north-4.myhuaweicloud.com; AWS_* variables apply too")


def storage_from_args(args: argparse.Namespace) -> StorageConfig | None:
    """The storage settings of a command without a config (raises ConfigError naming a bad key); None when none were
    given (the defaults, the AWS variables and a run's own settings apply)."""
    from mindfoundry.config.load import storage_settings

    return storage_settings(args.set) if args.set else None
