"""How `prepare`'s stages run: the stage interface, the work area, progress, and the two executors."""

from __future__ import annotations

import os

from mindfoundry.config.data_config import DataConfig
from mindfoundry.data.execute.local import LocalExecutor
from mindfoundry.data.execute.ray_cluster import RayExecutor
from mindfoundry.data.execute.stage import Executor


def resolve_workers(workers: int) -> int:
    """The number of processes for ``data.workers`` (0 = every core)."""
    return workers if workers > 0 else os.cpu_count() or 1


def create_executor(data: DataConfig) -> Executor:
    """The executor ``data.executor`` names (entered as a context manager by the caller)."""
    if data.executor == "ray":
        return RayExecutor(data.ray, resolve_workers(data.workers))
    return LocalExecutor(resolve_workers(data.workers))
