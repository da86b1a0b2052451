"""``data.executor: ray``: a stage's tasks as Ray tasks, on a local Ray instance or a cluster of machines.

Ray Core only: each task is ``ray.remote(run_task)`` with the resources ``data.ray`` asks for; Ray
places it on any node and retries it (``max_retries``) when its worker process or node dies, and
a retry finds the earlier attempt's folder discarded or its result committed
(:mod:`.workdir`). Tasks read and write the work area and the output folder, so on several
machines both must be shared storage (the same path on every node). ``address``:

- ``local``: start a Ray instance on this machine for this `prepare` (``data.workers`` CPUs, 0 = all: resolved by
  :func:`mindfoundry.data.execute.resolve_workers`);
- ``auto``: join the cluster this machine belongs to (``ray start --head`` / ``ray start --address=...``);
- ``ray://HOST:10001`` (Ray Client) or ``HOST:6379``: join that cluster.

The ``ray`` package is the ``ray`` extra (``pip install 'mindfoundry[ray]'``), imported only here.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import Any

from mindfoundry.config.data_config import RayConfig
from mindfoundry.data.execute.stage import R, Stage, TaskResult, run_task
from mindfoundry.errors import MindFoundryError


class RayExecutorError(MindFoundryError, RuntimeError):
    """Ray is missing or its cluster cannot be reached."""


class RayExecutor:
    """Runs stages' tasks on a Ray cluster (see the module docstring); results come back as tasks finish."""

    kind = "ray"

    def __init__(self, settings: RayConfig, workers: int) -> None:
        self.settings = settings
        self.workers = workers
        self._ray: Any = None
        self.cpus = 0

    def __enter__(self) -> RayExecutor:
        try:
            import ray
        except ImportError as exc:
            raise RayExecutorError(f"data.executor: ray needs the ray package ({exc}): pip install 'mindfoundry[ray]' "
                                   "(or set data.executor: local)") from None
        address = self.settings.address
        if address not in ("local", "auto"):
            _check_reachable(address)
        if address == "local":  # an instance of this process's own, reachable from this machine only
            os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        try:
            if address == "local":  # "local": a new instance even where another runs here (no address would join it)
                ray.init(address="local", num_cpus=self.workers, include_dashboard=False, log_to_driver=False,
                         object_store_memory=self.settings.object_store_mb * 2**20, configure_logging=False)
            else:
                ray.init(address=address, log_to_driver=False, configure_logging=False)
        except (ConnectionError, TimeoutError, RuntimeError, ValueError) as exc:
            raise _unreachable(address, _first_line(exc)) from None
        self._ray = ray
        self.cpus = int(ray.cluster_resources().get("CPU", 1))
        return self

    def __exit__(self, *exc: object) -> None:
        if self._ray is not None:
            self._ray.shutdown()
            self._ray = None

    def describe(self) -> str:
        return f"ray at {self.settings.address}, {self.cpus} CPUs"

    def run(self, stage: Stage[R], tasks: Sequence[int]) -> Iterator[tuple[int, R]]:
        """``(task, result)`` of each of ``tasks``, in the order they finish; at most a few per CPU in flight."""
        ray = self._ray
        # SPREAD: tasks go round the nodes (each reads and writes shared storage) rather than filling the driver's first
        options: dict[str, Any] = {
            "num_cpus": self.settings.num_cpus_per_task,
            "max_retries": self.settings.max_retries,
            "scheduling_strategy": "SPREAD",
        }
        if self.settings.memory_per_task_mb is not None:
            options["memory"] = self.settings.memory_per_task_mb * 2**20
        remote = ray.remote(_run_on_node).options(**options)
        shipped = ray.put(stage)
        window = max(2 * self.cpus, 1)
        queue = list(tasks)[::-1]
        pending: dict[Any, int] = {}
        try:
            while queue or pending:
                while queue and len(pending) < window:
                    task = queue.pop()
                    pending[remote.remote(shipped, task)] = task
                finished, _ = ray.wait(list(pending), num_returns=1)
                for ref in finished:
                    task = pending.pop(ref)
                    yield task, self._get(ref)
        finally:
            for ref in pending:
                ray.cancel(ref, force=True)

    def _get(self, ref: Any) -> Any:
        """A task's result; a user-facing error it raised is raised as itself (not wrapped in Ray's)."""
        try:
            return self._ray.get(ref)
        except self._ray.exceptions.RayTaskError as exc:
            cause = exc.cause
            if isinstance(cause, MindFoundryError):
                raise cause from None
            raise


def _run_on_node(stage: Stage, task: int) -> TaskResult:
    """:func:`run_task` in a Ray worker; its timing also names the Ray node it ran on."""
    import ray

    result = run_task(stage, task)
    assert result.timing is not None  # run_task measured it
    return replace(result, timing=replace(result.timing, node=ray.get_runtime_context().get_node_id()))


#: Seconds to wait for a cluster's port to answer (ray.init itself retries an unreachable HOST:PORT for ever).
CONNECT_TIMEOUT_S = 10.0


def _check_reachable(address: str) -> None:
    """Refuse, in seconds and in one line, an address whose port nothing listens on."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        raise _unreachable(address, exc.strerror or str(exc)) from None


def _unreachable(address: str, why: str) -> RayExecutorError:
    return RayExecutorError(f"cannot reach the Ray cluster at data.ray.address={address!r} ({why}): start it "
                            "(`ray start --head` on one node, `ray start --address=HEAD:6379` on the others), "
                            "fix the address, or set data.ray.address: local")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
