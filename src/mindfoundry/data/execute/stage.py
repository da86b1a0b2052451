"""A stage of the staged `prepare`: independent tasks, each writing a folder of its own, and how one task runs.

A :class:`Stage` says how many tasks it has and what one task does (:meth:`Stage.run`: read the
earlier stages' outputs, write into the folder it is given, return a small typed result, a
:class:`TaskResult`, kept as JSON beside the task's files). It is
one method, like datatrove's pipeline blocks, so an executor (:mod:`.local`, :mod:`.ray_cluster`)
needs to know nothing about documents: it ships a stage and a task number to a process and
:func:`run_task` there does the bookkeeping every task shares -- an attempt folder, the timing
and memory figures, the completion marker (:mod:`.workdir`).
"""

from __future__ import annotations

import os
import resource
import shutil
import socket
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar, Generic, Protocol, TypeVar

from mindfoundry.data.execute.workdir import WorkDir, space_problem


@dataclass(frozen=True)
class Timing:
    """How long a task ran where (left out of everything compared across runs)."""

    seconds: float
    cpu_s: float
    peak_rss_mib: float
    host: str
    pid: int
    node: str | None = None  # the Ray node, under the Ray executor


R = TypeVar("R", bound="TaskResult")


@dataclass(frozen=True)
class TaskResult:
    """What one task reports to the driver and keeps in its folder's result.json: counts and sizes that the next
    stages and the manifest read by name. Subclasses add their fields (JSON values: numbers, strings, lists and
    mappings of them); ``documents`` (what the task went through, for progress) and ``timing`` (set by
    :func:`run_task`) are every result's."""

    documents: int = field(default=0, kw_only=True)
    timing: Timing | None = field(default=None, kw_only=True)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls: type[R], value: dict[str, Any]) -> R:
        """The result :meth:`to_json` gave (a field added later takes its default in an older result)."""
        timing = value.get("timing")
        return cls(**{k: v for k, v in value.items() if k != "timing"}, timing=Timing(**timing) if timing else None)

    @classmethod
    def of(cls: type[R], work: WorkDir, stage: str, task: int) -> R:
        """The result a finished task of ``stage`` kept."""
        return cls.from_json(work.result(stage, task))


class Stage(ABC, Generic[R]):
    """A set of tasks whose outputs the next stages read (see the module docstring).

    Subclasses set :attr:`name` (the stage's folder and progress title) and :attr:`result_type` (what :meth:`run`
    returns) and write :meth:`tasks` and :meth:`run`. A stage object travels to the workers by pickling, so it holds
    only settings and paths.
    """

    name: ClassVar[str]
    result_type: ClassVar[type[TaskResult]]

    def __init__(self, work: WorkDir) -> None:
        self.work = work

    @abstractmethod
    def tasks(self) -> int:
        """How many tasks the stage has (tasks are numbered from 0)."""

    @abstractmethod
    def run(self, task: int, out: Path) -> R:
        """Do task ``task``, writing its files into ``out``; return its result, which :meth:`result` reads back
        later, also after a resume."""

    def output(self, task: int) -> Path:
        """The folder a finished task of this stage wrote."""
        return self.work.task(self.name, task)

    def result(self, task: int) -> R:
        return self.result_type.of(self.work, self.name, task)  # type: ignore[return-value]


class Executor(Protocol):
    """What runs a stage's tasks: on this machine's processes (:mod:`.local`) or on a Ray cluster
    (:mod:`.ray_cluster`). Entered for the whole `prepare`; results come back as tasks finish."""

    kind: str

    def __enter__(self) -> Executor: ...

    def __exit__(self, *exc: object) -> None: ...

    def describe(self) -> str:
        """Where the tasks run, for the log and the manifest."""
        ...

    def run(self, stage: Stage[R], tasks: Sequence[int]) -> Iterator[tuple[int, R]]:
        """``(task, result)`` of each of ``tasks``, in the order they finish."""
        ...


def _reset_peak_rss() -> None:
    """Restart the kernel's high-water mark of this process (VmHWM), so a task's peak is its own."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
    except OSError:
        pass


def _peak_rss_mib() -> float:
    """The peak resident memory of this process since the last reset, in MiB."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_task(stage: Stage[R], task: int, own_process: bool = True) -> R:
    """Run one task of ``stage`` in this process and commit its folder; its result, with its :class:`Timing`.

    ``own_process``: the process runs tasks only (a worker), so its peak memory is reset per task;
    in the driver (one worker) it is not, and the figure is the driver's peak so far.
    """
    if stage.work.done(stage.name, task):  # an earlier attempt finished (a retried task whose result was lost)
        return stage.result(task)
    if own_process:
        _reset_peak_rss()
    start, cpu = time.perf_counter(), time.process_time()
    attempt = stage.work.attempt(stage.name, task)
    try:
        result = stage.run(task, attempt)
        result = replace(result, timing=Timing(
            seconds=round(time.perf_counter() - start, 3), cpu_s=round(time.process_time() - cpu, 3),
            peak_rss_mib=round(_peak_rss_mib(), 1), host=socket.gethostname(), pid=os.getpid()))
        stage.work.commit(stage.name, task, attempt, result.to_json())
    except OSError as exc:
        shutil.rmtree(attempt, ignore_errors=True)
        raise space_problem(exc, stage.work.scratch) or exc
    except BaseException:
        shutil.rmtree(attempt, ignore_errors=True)
        raise
    return result
