"""The input shards of `prepare`: each source's files cut into read tasks, in corpus order.

A read task is a run of consecutive files of one source (about ``data.task_bytes`` of input, by default
a 64th of the corpus between 1 and 64 MiB; a bigger file is a task of its own), read with the ids the
whole source gives them. A built-in
source, and a source capped by ``max_documents`` / ``max_bytes`` (the cap counts from its first
document), is one task. Tasks are numbered in corpus order -- sources in config order, files in
reading order -- so every later stage can put documents back in that order from (task, row).

The plan also lists every file's size and version (modification time; an object's ETag): the read task refuses a
file that changed since (:class:`~mindfoundry.data.ingest.files.FileLedger`), and a `prepare` started again
compares its plan with the interrupted one's to know whether the finished tasks still hold.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from mindfoundry.config.data_config import DataConfig, SourceConfig
from mindfoundry.config.storage_config import StorageConfig
from mindfoundry.data.document import Document
from mindfoundry.data.images.sources import SUFFIXES
from mindfoundry.data.ingest.builtin import read_builtin
from mindfoundry.data.ingest.files import SourceStats, read_listed
from mindfoundry.data.ingest.listing import (
    SUPPORTED_SUFFIXES,
    FileLedger,
    Version,
    file_version,
    files_root,
    resolve_files,
)
from mindfoundry.storage.resolve import locate


@dataclass(frozen=True)
class InputTask:
    """One read task: source number ``source`` and its files ``(path or URL, size, version)`` (none for a built-in)."""

    source: int
    files: tuple[tuple[str, int, Version], ...]
    root: str

    def to_json(self) -> dict[str, Any]:
        return {"source": self.source, "files": [list(f) for f in self.files], "root": self.root}


#: ``data.task_bytes: null`` cuts the corpus into about this many read tasks (enough to keep a few dozen processes
#: busy to the end of a stage), each of at least :data:`MIN_TASK_BYTES` and at most :data:`MAX_TASK_BYTES` of input.
AUTO_TASKS = 64
MIN_TASK_BYTES = 1 << 20
MAX_TASK_BYTES = 64 << 20


def plan_inputs(data: DataConfig, storage: StorageConfig | None = None) -> tuple[list[InputTask], list[InputTask]]:
    """The read tasks of every text source and of every image source, each in corpus order (a bad path is an error
    here, before any work); URLs are reached with ``storage``. Both kinds are cut by one ``data.task_bytes``."""
    listed = [_listed_files(src, storage) for src in data.sources]
    size = data.task_bytes if data.task_bytes is not None else auto_task_bytes(
        sum(entry[1] for files, _ in listed for entry in files))
    tasks = [task for index, (files, root) in enumerate(listed) for task in _grouped(data, index, files, root, size)]
    text = [task for task in tasks if data.sources[task.source].modality == "text"]
    return text, [task for task in tasks if data.sources[task.source].modality != "text"]


def auto_task_bytes(total: int) -> int:
    """The read-task size ``data.task_bytes: null`` gives a corpus of ``total`` input bytes (outputs do not depend on
    it)."""
    return min(max(total // AUTO_TASKS, MIN_TASK_BYTES), MAX_TASK_BYTES)


def _listed_files(src: SourceConfig, storage: StorageConfig | None) -> tuple[list[tuple[str, int, Version]], str]:
    """A file source's files as listed now (path, size, version) and their root; none for a built-in."""
    if src.builtin is not None:
        return [], ""
    files = resolve_files(src.paths, storage, SUFFIXES if src.modality != "text" else SUPPORTED_SUFFIXES)
    return [(str(path), *file_version(path)) for path in files], str(files_root(files))


def _grouped(
    data: DataConfig, index: int, listed: list[tuple[str, int, Version]], root: str, task_bytes: int
) -> list[InputTask]:
    """Source ``index``'s read tasks: runs of its files of at least ``task_bytes`` (one for a built-in or capped
    source)."""
    src = data.sources[index]
    if src.builtin is not None or src.max_documents is not None or src.max_bytes is not None:
        return [InputTask(index, tuple(listed), root)]
    tasks: list[InputTask] = []
    group: list[tuple[str, int, Version]] = []
    size = 0
    for entry in listed:
        group.append(entry)
        size += entry[1]
        if size >= task_bytes:
            tasks.append(InputTask(index, tuple(group), root))
            group, size = [], 0
    if group:
        tasks.append(InputTask(index, tuple(group), root))
    return tasks


def read_source(data: DataConfig, index: int, stats: SourceStats,
                storage: StorageConfig | None = None) -> Iterator[Document]:
    """A whole source as read, in order (``prepare --preview``, benchmarks)."""
    files, root = _listed_files(data.sources[index], storage)
    yield from read_input(InputTask(index, tuple(files), root), data.sources[index], stats, storage)


def read_input(task: InputTask, src: SourceConfig, stats: SourceStats,
               storage: StorageConfig | None = None) -> Iterator[Document]:
    """The documents of one read task, as read (before cleaning), tagged with the source's category."""
    category = src.resolved_category()
    if src.builtin is not None:
        docs = read_builtin(src.builtin, stats=stats, max_documents=src.max_documents, max_bytes=src.max_bytes)
    else:
        ledger = FileLedger()
        for path, size, version in task.files:
            ledger.expect(locate(path, storage), size, version)
        stats.ledger = ledger
        docs = _capped(
            read_listed(
                [locate(p, storage) for p, _, _ in task.files],
                locate(task.root, storage),
                name=src.name,
                category=category,
                text_field=src.text_field,
                txt_mode=src.txt_mode,
                stats=stats,
                url_field=src.url_field,
            ),
            src.max_documents,
            src.max_bytes,
        )
    for doc in docs:
        doc.category = category
        yield doc


def _capped(docs: Iterator[Document], max_documents: int | None, max_bytes: int | None) -> Iterator[Document]:
    """First documents of a file source up to the caps (built-ins sample across the whole source instead)."""
    total = 0
    for i, doc in enumerate(docs):
        if (max_documents is not None and i >= max_documents) or (max_bytes is not None and total >= max_bytes):
            return
        total += len(doc.text.encode("utf-8"))
        yield doc
