"""Write aside, make durable, rename into place: how every writer publishes a file or a folder.

A reader, a resumed run or a second process sees a file or a folder whole or not at all: it is written under a
name nobody reads (``NAME.partial`` for a file; a hidden temporary folder for a folder), its bytes are fsynced,
one ``os.replace`` gives it its name, and the folder holding it is fsynced so the rename itself survives a power
cut. Every writer (run claims, checkpoints and their pointers, dumps, prepared data, exports, prepare's stage
results) goes through these functions, so durability is the same everywhere. Imports nothing of MindFoundry's:
the lowest layer, beside ``errors``.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

#: Suffix of a file being written aside (a reader never opens it; a stop mid-write leaves only it behind).
PARTIAL = ".partial"


def disk_full(exc: OSError) -> bool:
    """Whether a failed write ran out of space (a full disk or a quota): each writer turns it into its own one-line
    error saying what to free or move."""
    return exc.errno in (errno.ENOSPC, errno.EDQUOT)


def fsync_path(path: Path) -> None:
    """Make a file's bytes, or a folder's entries (a rename inside it), durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(folder: Path) -> None:
    """Make every file and folder below ``folder``, and ``folder`` itself, durable (before a rename publishes it)."""
    for path in sorted(folder.rglob("*")) + [folder]:
        fsync_path(path)


def write_bytes(path: Path, data: bytes) -> None:
    """``path`` holds ``data`` entirely, or keeps what it held: written to ``path.partial``, fsynced, renamed over
    ``path``, and the folder fsynced."""
    aside = path.with_name(path.name + PARTIAL)
    with open(aside, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(aside, path)
    fsync_path(path.parent)


def write_text(path: Path, text: str) -> None:
    """:func:`write_bytes` of ``text`` in UTF-8."""
    write_bytes(path, text.encode("utf-8"))


def publish_files(pairs: list[tuple[Path, Path]]) -> None:
    """Rename each written-aside, fsynced file onto its final name in one folder, in the order given, then fsync the
    folder: for a set of files read together (a shard's ``.bin`` and ``.idx``), whose reader pairs them by name. A
    final name that holds an older file is removed first, all of them before any rename, so a crash between the
    renames never pairs an old file with a new one."""
    for _, final in pairs:
        final.unlink(missing_ok=True)
    for written, final in pairs:
        os.replace(written, final)
    fsync_path(pairs[-1][1].parent)


def publish_folder(tmp: Path, final: Path) -> None:
    """Give the folder ``tmp`` (written in full) the name ``final`` (which must not hold a folder with entries):
    everything below it fsynced, one rename, the parent folder fsynced."""
    fsync_tree(tmp)
    os.replace(tmp, final)
    fsync_path(final.parent)
