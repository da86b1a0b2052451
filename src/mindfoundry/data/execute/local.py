"""``data.executor: local``: a stage's tasks on a pool of processes of this machine (the default; no Ray needed).

Workers start with ``forkserver`` (``spawn`` where unavailable), never ``fork``: the driver may
already run the tokenizers library's Rust thread pool, and forking a threaded process can
deadlock. The fork server imports :data:`PRELOAD` once, so starting the pool costs milliseconds
instead of re-importing numpy and tokenizers in every worker. With one worker every task runs in
this process, through the same :func:`~mindfoundry.data.execute.stage.run_task`.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
from collections.abc import Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait

from mindfoundry.data.execute.stage import R, Stage, run_task

#: Modules the stages live in, imported once by the fork server.
PRELOAD: tuple[str, ...] = ("mindfoundry.data.prepare.pipeline",)


def _install(workers: multiprocessing.SimpleQueue) -> None:
    """A worker's start: tell the driver its process id (so that a failed stage can end the running tasks at once),
    and tokenize on one thread: the pool is the parallelism, so N workers use N cores instead of N times the
    tokenizers library's all-core thread pool."""
    workers.put(os.getpid())
    os.environ["TOKENIZERS_PARALLELISM"] = "false"


def _terminate(workers: multiprocessing.SimpleQueue) -> None:
    """SIGTERM every worker that announced itself (one that already ended is skipped)."""
    while not workers.empty():
        try:
            os.kill(workers.get(), signal.SIGTERM)
        except ProcessLookupError:
            pass


def _context() -> multiprocessing.context.BaseContext:
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(list(PRELOAD))
    return ctx


class LocalExecutor:
    """Runs a stage's tasks on ``workers`` processes, started for the stage and ended with it (so a stage's
    memory figures are its own, and what one stage's tasks held is given back before the next); results come
    back as tasks finish."""

    kind = "local"

    def __init__(self, workers: int) -> None:
        self.workers = workers

    def __enter__(self) -> LocalExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def describe(self) -> str:
        return f"local, {self.workers} process{'es' if self.workers > 1 else ''}"

    def run(self, stage: Stage[R], tasks: Sequence[int]) -> Iterator[tuple[int, R]]:
        """``(task, result)`` of each of ``tasks``, in the order they finish."""
        if self.workers == 1 or not tasks:
            for task in tasks:
                yield task, run_task(stage, task, own_process=False)
            return
        context = _context()
        workers = context.SimpleQueue()
        pool = ProcessPoolExecutor(min(self.workers, len(tasks)), mp_context=context, initializer=_install,
                                   initargs=(workers,))
        pending: dict[Future[R], int] = {pool.submit(run_task, stage, task): task for task in tasks}
        try:
            while pending:
                finished, _ = wait(pending, return_when=FIRST_COMPLETED)
                for future in finished:
                    yield pending.pop(future), future.result()
        except BaseException:  # a failed task or a stop signal: do not wait for the running tasks to end
            _terminate(workers)
            raise
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
