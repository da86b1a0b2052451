"""The one commit protocol: a folder is written whole, then committed; only committed folders are taken; every object
taken from a store is checked against what was committed.

On a local disk a folder is committed by one rename (:mod:`mindfoundry.atomic`). An object store has no rename and no
folder: objects become visible one by one, and a writer killed half way leaves some of them. So a folder is committed
by uploading its objects first and a small marker last, which holds (or seals) the sha256 and size of every object; a
reader takes nothing without the marker and checks every object it fetches against it -- an object changed, cut short
or deleted since the commit is found, not trained on. Removing a committed folder deletes its marker first, so a
removal cut short never leaves something that looks committed. (:class:`~mindfoundry.storage.location.Location`'s
``put_folder``, ``holds_commit`` and ``remove_folder`` are each medium's part of it.)

One kind of folder differs from another only in its :class:`~mindfoundry.storage.location.Seal`: prepared data, an
export and a `prepare` task are sealed by :data:`COMMIT` (``commit.json``, the listing itself); a checkpoint by its
own manifest and ``manifest.sha256`` (:mod:`mindfoundry.checkpoint.store`).

:func:`fetch` is a committed folder on this machine: a local one where it is, a store's copied into the node-local
cache (:mod:`.cache`), every object checked, and an earlier copy reused while the marker is unchanged.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from mindfoundry import atomic
from mindfoundry.errors import OutputExistsError
from mindfoundry.storage.cache import cache_folder, filling
from mindfoundry.storage.failures import ObjectMissingError, StorageError
from mindfoundry.storage.location import Location, Seal

COMMIT_FILE = "commit.json"
FORMAT = "mindfoundry.commit/1"
_CHUNK = 1 << 22


def sha256_file(path: Path) -> str:
    """The sha256 of a local file, read in chunks (bounded memory)."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(_CHUNK):
            digest.update(block)
    return digest.hexdigest()


def folder_listing(folder: Path, skip: tuple[str, ...] = ()) -> dict[str, dict[str, Any]]:
    """Every file below ``folder`` (but ``skip``), by its path relative to it: sha256 and size."""
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.relative_to(folder).as_posix() not in skip)
    return {f.relative_to(folder).as_posix(): {"sha256": sha256_file(f), "bytes": f.stat().st_size} for f in files}


class NotCommittedError(StorageError):
    """A folder has no commit marker: it is being written, was cut short, or was never there."""


class CommitJson(Seal):
    """The seal of prepared data, exports and `prepare`'s tasks: ``commit.json`` lists every other object."""

    marker = COMMIT_FILE
    listing_name = COMMIT_FILE

    def write(self, folder: Path) -> None:
        listing = folder_listing(folder, skip=(COMMIT_FILE,))
        (folder / COMMIT_FILE).write_text(json.dumps({"format": FORMAT, "objects": listing}, indent=1,
                                                     sort_keys=True))

    def listing(self, folder: Location) -> tuple[dict[str, dict[str, Any]], bytes]:
        try:
            raw = (folder / COMMIT_FILE).read_bytes()
        except (ObjectMissingError, FileNotFoundError):
            raise NotCommittedError(f"{folder} holds no {COMMIT_FILE}: it was never committed (a writer stopped "
                                    "before its end) or was removed; write it again") from None
        try:
            marker = json.loads(raw)
            objects = marker["objects"]
            if marker.get("format") != FORMAT or not isinstance(objects, dict):
                raise ValueError("not a MindFoundry commit marker")
        except (ValueError, KeyError, TypeError) as exc:
            raise StorageError(f"{folder / COMMIT_FILE} is damaged ({exc}): write the folder again") from None
        return objects, raw

    def error(self, message: str) -> Exception:
        return StorageError(message)


#: The seal of every folder that is not a checkpoint.
COMMIT = CommitJson()


def publish(local: Path, dest: Location, seal: Seal = COMMIT) -> None:
    """Commit the complete local folder ``local`` as ``dest``, replacing what was there (callers decide whether it
    may be replaced): renamed into place on a disk (``local`` is gone), its objects and then the marker on a store
    (``local`` is left: a writer may keep it as this node's copy)."""
    dest.put_folder(local, seal)


def is_committed(dest: Location, seal: Seal = COMMIT) -> bool:
    """Whether a committed folder is at ``dest`` (its objects are checked when they are fetched)."""
    return dest.holds_commit(seal)


def uncommit(dest: Location, seal: Seal = COMMIT) -> None:
    """Remove the committed folder ``dest`` (never leaving something that looks committed)."""
    dest.remove_folder(seal)


def _safe_relative(rel: str) -> bool:
    parts = rel.split("/")
    return bool(rel) and not rel.startswith("/") and ".." not in parts and "" not in parts


def fetch(dest: Location, into: Path, seal: Seal = COMMIT, *, reuse: bool = True) -> Path:
    """The committed folder ``dest`` on this machine: itself on a local disk; for a URL the local folder ``into``,
    every object downloaded and checked against ``seal``'s listing (size, sha256) and the marker kept beside them --
    or, with ``reuse``, an earlier copy whose marker is the same and whose files have the listed sizes. Errors are
    ``seal.error``'s, naming the object and the problem.

    Several processes may fetch into one folder at once: each downloads into a folder of its own and renames it into
    place; the one that finds ``into`` there already keeps that copy."""
    here = dest.local_folder()
    if here is not None:
        return here
    with filling(into):  # the processes of this node: one downloads, the others then find its copy
        return _fetch_into(dest, into, seal, reuse)


def refetch(dest: Location, into: Path, seal: Seal = COMMIT) -> Path | None:
    """``dest``'s copy in ``into`` fetched afresh, for a reader that found the copy damaged (a disk error in this
    node's cache): dropped, every object downloaded and checked again. None when ``dest`` is on this machine's disk:
    it is its own copy, and there is nothing to fetch."""
    if dest.local_folder() is not None:
        return None
    return fetch(dest, into, seal, reuse=False)


def _fetch_into(dest: Location, into: Path, seal: Seal, reuse: bool) -> Path:
    objects, raw = seal.listing(dest)
    if reuse and _intact_copy(into, seal, objects, raw):
        return into
    into.parent.mkdir(parents=True, exist_ok=True)
    tmp = into.parent / f".{into.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        for rel, meta in objects.items():
            _fetch_one(dest, rel, meta, tmp, seal)
        (tmp / seal.marker).write_bytes(raw)
        if reuse and _intact_copy(into, seal, objects, raw):  # another process fetched it meanwhile: its copy may be
            shutil.rmtree(tmp, ignore_errors=True)             # in use, never replaced
            return into
        if into.exists():  # an older or damaged copy: moved aside first (a process reading its open files keeps them)
            old = into.parent / f".{into.name}.old-{os.getpid()}"
            atomic.publish_folder(into, old)
            shutil.rmtree(old, ignore_errors=True)
        try:
            atomic.publish_folder(tmp, into)
        except OSError:  # another process put its copy in place first
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return into


def _fetch_one(dest: Location, rel: str, meta: Any, tmp: Path, seal: Seal) -> None:
    """One listed object of ``dest`` into ``tmp``, checked against its listing entry."""
    where = dest / rel if isinstance(rel, str) and _safe_relative(rel) else None
    if where is None or not isinstance(meta, dict) or not isinstance(meta.get("sha256"), str) or not isinstance(
            meta.get("bytes"), int):
        raise seal.error(f"{dest}: {seal.listing_name} lists {rel!r}, which is not a file inside the folder (a path "
                         "out of it, or a damaged entry): the folder was tampered with; write it again")
    target = tmp / rel
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        where.download(target)
    except ObjectMissingError:
        raise seal.error(f"{where}: file listed in {seal.listing_name} is missing") from None
    size = target.stat().st_size
    if size != meta["bytes"]:
        raise seal.error(f"{where}: size {size} bytes, {seal.listing_name} says {meta['bytes']} (truncated or "
                         "replaced)")
    if sha256_file(target) != meta["sha256"]:
        raise seal.error(f"{where}: sha256 does not match {seal.listing_name} (corrupted)")


def _intact_copy(into: Path, seal: Seal, objects: dict[str, Any], raw: bytes) -> bool:
    """Whether ``into`` is a copy of the commit whose marker is ``raw``, its files of the listed sizes (a copy whose
    bytes changed since is for its reader's checksums to find: :func:`fetch` with ``reuse=False`` replaces it)."""
    marker = into / seal.marker
    if not marker.is_file() or marker.read_bytes() != raw:
        return False
    return all((into / rel).is_file() and (into / rel).stat().st_size == meta.get("bytes")
               for rel, meta in objects.items())


@contextlib.contextmanager
def staged_folder(out: Location) -> Iterator[Path]:
    """A local folder to write the new folder ``out`` into: committed as ``out`` (:func:`publish`) when the block
    completes, removed when it fails. ``out`` must hold nothing yet (an empty folder may be there): an output is never
    written over, and nothing is written before that is known."""
    if out.exists() and not (out.is_dir() and not out.children()):
        raise OutputExistsError(f"{out} already exists and is not an empty folder: choose another output (nothing "
                                "was written)")
    tmp = _staging(out) / f".{out.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        yield tmp
        publish(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def staged_file(out: Location) -> Iterator[Path]:
    """A local path to write the file ``out`` at: put in place whole (renamed, or uploaded) when the block completes,
    removed when it fails."""
    folder = _staging(out)
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".tmp-{os.getpid()}-{out.name}"  # the name keeps its suffix: writers choose formats by it
    try:
        yield tmp
        out.put_file(tmp)
    finally:
        tmp.unlink(missing_ok=True)


def _staging(out: Location) -> Path:
    """Where ``out`` is written before it is put in place: beside it on a disk, in this node's cache for a URL."""
    return out.parent.staging(cache_folder("publish", str(out)))
