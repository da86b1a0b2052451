"""Local multi-process execution for ``prepare``: an ordered, bounded process pool, and progress.

The per-document work of ``prepare`` (cleaning blocks, MinHash signatures, tokenization) is a
pure function of one document; everything order-dependent (reading, dedup decisions where the
first copy wins, the tokenizer's round-robin over sources, writing shards) stays in the parent.
So the parent reads a source, cuts it into chunks, and :class:`WorkerPool` runs a task on each
chunk in worker processes, handing the results back **in submission order**: the output is
byte-identical to a single process. Only a few chunks per worker are in flight at a time, so
memory stays bounded however large the corpus.

Workers start with ``forkserver`` (``spawn`` where unavailable), never ``fork``: the parent may
already run the tokenizers library's Rust thread pool, and forking a threaded process can
deadlock. The fork server imports :data:`PRELOAD` once, so the pool of each pass starts in
milliseconds instead of re-importing numpy, datasketch and tokenizers in every worker.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from contextlib import contextmanager
from typing import Any, Generic, TypeVar

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

C = TypeVar("C")
T = TypeVar("T")
R = TypeVar("R")

#: Modules the worker tasks live in, imported once by the fork server.
PRELOAD: tuple[str, ...] = ("mindfoundry.data.prepare",)
#: Chunks in flight per worker: one running, one queued so a worker never waits on the parent.
IN_FLIGHT_PER_WORKER = 2
#: Without a terminal, a pass still reports at least this often (long passes are not silent).
PLAIN_EVERY_S = 30.0


def resolve_workers(workers: int) -> int:
    """The number of processes for ``data.workers`` (0 = every core)."""
    return workers if workers > 0 else os.cpu_count() or 1


_context: Any = None  # the pass's context, installed once in each worker process


def _install(context: Any) -> None:
    global _context
    # The pool is the parallelism: each worker tokenizes on one thread, so N workers use N cores
    # instead of N times the tokenizers library's all-core thread pool.
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    _context = context


def _call(task: Callable[[Any, T], R], item: T) -> R:
    return task(_context, item)


def _start_method() -> multiprocessing.context.BaseContext:
    """``forkserver`` with :data:`PRELOAD` imported once, else ``spawn``; never ``fork`` (see above)."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(list(PRELOAD))
    return ctx


class WorkerPool(Generic[C]):
    """Runs ``task(context, item)`` over items, in order, on ``workers`` processes.

    ``context`` (configuration, pre-pass decisions, a tokenizer path) is pickled once per worker
    rather than with every item; ``task`` must be a module-level function. With one worker
    everything runs in this process, through the same tasks, so both paths share one code path.
    """

    def __init__(self, workers: int, context: C) -> None:
        self.workers = workers
        self.context = context
        self._executor = (
            ProcessPoolExecutor(workers, mp_context=_start_method(), initializer=_install, initargs=(context,))
            if workers > 1 else None
        )

    def __enter__(self) -> WorkerPool[C]:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)

    def map(self, task: Callable[[C, T], R], items: Iterable[T], *, window: int | None = None) -> Iterator[R]:
        """``task`` of each item, in the order of ``items``, read lazily.

        ``window`` (default :data:`IN_FLIGHT_PER_WORKER` per worker) bounds the items submitted
        but not yet consumed: the parent reads ahead only that far.
        """
        if self._executor is None:
            return (task(self.context, item) for item in items)
        return self._ordered(task, items, window or IN_FLIGHT_PER_WORKER * self.workers)

    def _ordered(self, task: Callable[[C, T], R], items: Iterable[T], window: int) -> Iterator[R]:
        assert self._executor is not None
        pending: deque[Future[R]] = deque()
        try:
            for item in items:
                pending.append(self._executor.submit(_call, task, item))
                if len(pending) >= window:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        finally:  # a consumer that stops early (the tokenizer's byte budget) leaves nothing queued
            for future in pending:
                future.cancel()


class PassProgress:
    """Documents processed per source in one pass; see :meth:`DocumentProgress.stage`."""

    def __init__(self, title: str, names: Sequence[str], log: Callable[[str], None], bars: Progress | None,
                 totals: dict[str, int]) -> None:
        self.title = title
        self.counts = dict.fromkeys(names, 0)
        self._log = log
        self._bars = bars
        self._tasks = {name: bars.add_task(f"{title}: {name}", total=totals.get(name)) for name in names} if bars else {}
        self._open_ended = {name for name in names if name not in totals}
        self.start = self._reported = time.perf_counter()

    def advance(self, name: str, documents: int) -> None:
        """``documents`` more of source ``name`` went through the pass."""
        self.counts[name] += documents
        if self._bars is not None:
            self._bars.advance(self._tasks[name], documents)
        elif time.perf_counter() - self._reported >= PLAIN_EVERY_S:
            self._reported = time.perf_counter()
            self._log(f"{self.title}: {self._summary()} documents so far")

    def close(self) -> None:
        if self._bars is not None:
            for name in self._open_ended:  # first pass over the source: now its size is known
                self._bars.update(self._tasks[name], total=self.counts[name])
        else:
            self._log(f"{self.title}: {self._summary()} documents in {time.perf_counter() - self.start:.1f}s")

    def _summary(self) -> str:
        return ", ".join(f"{name} {n:,}" for name, n in self.counts.items())


class DocumentProgress:
    """Progress of ``prepare``'s passes: rich bars (documents per source) when stderr is a terminal,
    otherwise one plain line per pass (and one every :data:`PLAIN_EVERY_S` seconds during it),
    so logs and CI output stay readable.

    A source's count from an earlier pass becomes its bar's total in later passes: every full
    pass reads the same documents.
    """

    def __init__(self, log: Callable[[str], None]) -> None:
        self._log = log
        self._bars = Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("documents"), TimeElapsedColumn(),
            console=Console(stderr=True),
        ) if sys.stderr.isatty() else None
        self._totals: dict[str, int] = {}

    def __enter__(self) -> DocumentProgress:
        if self._bars is not None:
            self._bars.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bars is not None:
            self._bars.stop()

    @contextmanager
    def stage(self, title: str, names: Sequence[str]) -> Iterator[PassProgress]:
        """One pass over the sources ``names``: advance it as chunks come back."""
        stage = PassProgress(title, names, self._log, self._bars, self._totals)
        yield stage
        stage.close()
        for name, n in stage.counts.items():
            self._totals[name] = max(self._totals.get(name, 0), n)
