"""Committing a folder where there is no rename, and taking only committed folders back.

On a local disk a folder is published by one rename (:mod:`mindfoundry.atomic`). An object store has no rename and no
folder: objects become visible one by one, and a writer killed half way leaves some of them. So a folder is committed
by uploading its objects first and a small marker last (``commit.json``: the sha256 and size of every object); a
reader takes nothing without the marker, and checks every object it fetches against it -- an object changed, cut
short or deleted since the commit is found, not trained on. Removing a committed folder deletes its marker first, so a
removal cut short never leaves something that looks committed.

:func:`fetch` copies a committed folder into the node-local cache (:mod:`.cache`), verified, and reuses an earlier
copy when the marker is unchanged: the rest of MindFoundry reads local files.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

from mindfoundry import atomic
from mindfoundry.storage.location import Location
from mindfoundry.storage.remote import ObjectMissingError, Remote, StorageError

COMMIT_FILE = "commit.json"
FORMAT = "mindfoundry.commit/1"
#: The marker a fetched copy keeps, to know whether the committed folder changed since.
FETCHED = ".fetched-commit.json"
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


def upload_folder(local: Path, dest: Remote, skip: tuple[str, ...] = ()) -> dict[str, dict[str, Any]]:
    """Upload every file below ``local`` (but ``skip``) under ``dest``, in a fixed order; return their listing."""
    listing = folder_listing(local, skip)
    for rel in listing:
        (dest / rel).upload(local / rel)
    return listing


def publish(local: Path, dest: Location) -> None:
    """Commit the folder ``local`` (written in full) as ``dest``: on a local disk by one rename; on a store as its
    objects, then :data:`COMMIT_FILE` (see the module docstring)."""
    if isinstance(dest, Path):
        atomic.publish_folder(local, dest)
        return
    listing = upload_folder(local, dest)
    (dest / COMMIT_FILE).write_text(json.dumps({"format": FORMAT, "objects": listing}, indent=1, sort_keys=True))


def is_committed(dest: Remote) -> bool:
    """Whether ``dest`` holds a commit marker (its objects are checked when they are fetched)."""
    return (dest / COMMIT_FILE).is_file()


def read_commit(dest: Remote) -> tuple[dict[str, Any], bytes]:
    """The marker of the committed folder ``dest`` and its bytes; :class:`NotCommittedError` when there is none."""
    try:
        raw = (dest / COMMIT_FILE).read_bytes()
    except ObjectMissingError:
        raise NotCommittedError(f"{dest} holds no {COMMIT_FILE}: it was never committed (a writer stopped before "
                                "its end) or was removed; write it again") from None
    try:
        marker = json.loads(raw)
        objects = marker["objects"]
        if marker.get("format") != FORMAT or not isinstance(objects, dict):
            raise ValueError("not a MindFoundry commit marker")
        for rel, meta in objects.items():
            if not _safe_relative(rel) or not isinstance(meta.get("sha256"), str) or not isinstance(meta["bytes"], int):
                raise ValueError(f"a bad entry {rel!r}")
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise StorageError(f"{dest / COMMIT_FILE} is damaged ({exc}): write the folder again") from None
    return marker, raw


class NotCommittedError(StorageError):
    """A folder on the store has no commit marker: it is being written, was cut short, or was never there."""


def _safe_relative(rel: str) -> bool:
    parts = rel.split("/")
    return bool(rel) and not rel.startswith("/") and ".." not in parts and "" not in parts


def fetch(dest: Remote, into: Path) -> Path:
    """The committed folder ``dest`` as the local folder ``into``: every object downloaded and checked against the
    marker (size, sha256), or an earlier copy reused when the marker is the same. Returns ``into``.

    Several processes may fetch into one folder at once: each downloads into a folder of its own and renames it into
    place; the one that finds ``into`` there already keeps that copy."""
    marker, raw = read_commit(dest)
    if (into / FETCHED).is_file() and (into / FETCHED).read_bytes() == raw:
        return into
    into.parent.mkdir(parents=True, exist_ok=True)
    tmp = into.parent / f".{into.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        for rel, meta in marker["objects"].items():
            target = tmp / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                (dest / rel).download(target)
            except ObjectMissingError:
                raise ObjectMissingError(f"{dest / rel} is listed in {dest / COMMIT_FILE} but missing: an object of "
                                         "the committed folder was deleted; write the folder again") from None
            size = target.stat().st_size
            if size != meta["bytes"] or sha256_file(target) != meta["sha256"]:
                what = f"{size:,} bytes, the marker says {meta['bytes']:,}" if size != meta["bytes"] else "sha256"
                raise StorageError(f"{dest / rel} does not match {dest / COMMIT_FILE} ({what}): the object changed "
                                   "or was damaged since it was committed; write the folder again")
        (tmp / FETCHED).write_bytes(raw)
        if (into / FETCHED).is_file() and (into / FETCHED).read_bytes() == raw:  # another process fetched it meanwhile
            shutil.rmtree(tmp, ignore_errors=True)  # (its copy may be in use: never replaced)
            return into
        if into.exists():  # an older copy: moved aside first (a process reading its open files keeps them)
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


def uncommit(dest: Remote) -> None:
    """Remove the committed folder ``dest``: its marker first (it is then no longer taken), then its objects."""
    (dest / COMMIT_FILE).delete()
    dest.delete_tree()
