"""The layout of this launch: the process count and rank the launcher (torchrun, msrun, an Ascend rank table) gave
this process, and :func:`launch_layout`, which checks the config's layout rules once more against that count and
returns the one resolved :class:`~mindfoundry.config.parallel_config.Layout` the run uses. Standard library only: the
engines and the CLI import this without any framework."""

from __future__ import annotations

import os
from typing import Mapping

from mindfoundry.config.layout_rules import checked_layout
from mindfoundry.config.parallel_config import Layout
from mindfoundry.config.schema import RunConfig
from mindfoundry.errors import MindFoundryError


class LayoutError(MindFoundryError, ValueError):
    """A layout that cannot run; the message lists every problem, one per line."""


def _launcher_number(env: Mapping[str, str] | None, names: tuple[str, ...]) -> int | None:
    """The first of the launcher's variables `names` that holds a number (this process's environment by default)."""
    env = os.environ if env is None else env
    return next((int(env[name]) for name in names if env.get(name, "").strip().isdigit()), None)


def launched_world_size(env: Mapping[str, str] | None = None) -> int | None:
    """Processes the launcher started: WORLD_SIZE (torchrun), MS_WORKER_NUM (msrun) or RANK_SIZE (Ascend rank table)."""
    return _launcher_number(env, ("WORLD_SIZE", "MS_WORKER_NUM", "RANK_SIZE"))


def launched_rank(env: Mapping[str, str] | None = None) -> int:
    """This process's global rank under the launcher: RANK (torchrun) or RANK_ID (msrun); 0 without one."""
    return _launcher_number(env, ("RANK", "RANK_ID")) or 0


def launched_local_rank(env: Mapping[str, str] | None = None) -> int:
    """This process's rank on its node (its device index): LOCAL_RANK (torchrun, msrun) or DEVICE_ID; 0 without one."""
    return _launcher_number(env, ("LOCAL_RANK", "DEVICE_ID")) or 0


def launched_scheduler(env: Mapping[str, str] | None = None) -> bool:
    """Whether this process is msrun's scheduler (MS_ROLE=MS_SCHED): msrun starts it with the workers' command, but it
    only serves the cluster's meta data and never trains."""
    env = os.environ if env is None else env
    return env.get("MS_ROLE") == "MS_SCHED"


def launch_layout(cfg: RunConfig, env: Mapping[str, str] | None = None) -> Layout:
    """The layout to run under the current launcher (one process when none), checked against every rule once: the
    object the engines are given (they refuse only what they cannot run). Raises LayoutError listing every problem."""
    layout, problems = checked_layout(cfg.parallel, cfg.model, cfg.train, launched_world_size(env) or 1)
    if problems:
        raise LayoutError("parallel layout does not fit this launch:\n  " + "\n  ".join(problems))
    return layout
