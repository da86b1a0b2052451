"""The one type of every place MindFoundry reads or writes: a :class:`Location`, a local path or an object-storage URL.

Every layer lists, reads, writes, commits and fetches through a Location's methods and never asks which kind it holds:
the two kinds differ only inside ``storage/`` (:class:`~mindfoundry.storage.local_path.Local` on this machine's disk,
:class:`~mindfoundry.storage.remote.Remote` through fsspec), where each method does what its medium allows -- a write
is an atomic rename on a disk and one PUT on a store; a folder is committed by a rename on a disk and by a marker
object written last on a store (:mod:`.commit`); a committed folder is read where it is on a disk and from a verified
copy in this node's cache for a store.

A Location names a file or a folder the same way a path does (``/``, ``name``, ``parent``); what is not there is
missing, not an error, until it is read.
"""

from __future__ import annotations

import io
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: A file's version as listed: its modification time in ns on a local disk, its ETag (which changes with the content)
#: on object storage.
Version = int | str


class Claim(ABC):
    """A held claim on a location (:meth:`Location.claim`; the kinds are :mod:`.claim`'s): :meth:`release` gives it
    up (a process that dies drops it too). ``previous``: the record of the holder this claim was taken over from ({}
    when there was none or it ended cleanly)."""

    previous: dict[str, Any] = {}

    @abstractmethod
    def release(self) -> None: ...


class Seal(ABC):
    """How one kind of committed folder is sealed: the marker written last (and deleted first) and the listing of its
    objects with their sha256 that a fetch checks them against (:mod:`.commit`)."""

    #: The marker's file name: its presence on a store is what makes the folder committed.
    marker: str
    #: How messages name the listing ("commit.json", "the manifest").
    listing_name: str

    @abstractmethod
    def write(self, folder: Path) -> None:
        """Seal the complete local ``folder`` before it is put on a store: write its marker (nothing where the writer
        of the folder already wrote it)."""

    @abstractmethod
    def listing(self, folder: Location) -> tuple[dict[str, dict[str, Any]], bytes]:
        """Every file of the committed ``folder`` (relative path -> ``{"sha256", "bytes"}``) and the marker's bytes;
        :meth:`error` when it was never committed or its marker is damaged."""

    @abstractmethod
    def error(self, message: str) -> Exception:
        """The error a problem with this kind of folder is raised as (the message names the file and the fix)."""


class Location(ABC):
    """A file or folder, local or at a URL (see the module docstring)."""

    # -- naming --------------------------------------------------------------------------------------------------
    @property
    @abstractmethod
    def name(self) -> str:
        """The last part of the path."""

    @property
    @abstractmethod
    def parent(self) -> Location:
        """The folder holding this one."""

    @abstractmethod
    def __truediv__(self, part: str) -> Location:
        """The file or folder ``part`` (a relative path, ``/``-separated) below this folder."""

    def with_name(self, name: str) -> Location:
        """The file or folder beside this one named ``name``."""
        return self.parent / name

    @abstractmethod
    def relative_to(self, other: Location) -> str:
        """This location's path below ``other``, ``/``-separated (ValueError when it is not below)."""

    def is_below(self, other: Location) -> bool:
        """Whether this location is ``other`` or inside it."""
        try:
            self.relative_to(other)
        except ValueError:
            return False
        return True

    @abstractmethod
    def __str__(self) -> str:
        """How messages name it: the absolute path, or the URL."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self)!r})"  # never the storage settings: they may hold a secret

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and str(other) == str(self)

    def __hash__(self) -> int:
        return hash((type(self).__name__, str(self)))

    def __lt__(self, other: Location) -> bool:
        return str(self) < str(other)

    # -- reading -------------------------------------------------------------------------------------------------
    @abstractmethod
    def exists(self) -> bool:
        """Whether a file, or a folder (on a store: any object under the prefix), is there."""

    @abstractmethod
    def is_file(self) -> bool: ...

    @abstractmethod
    def is_dir(self) -> bool: ...

    @abstractmethod
    def absolute(self) -> Location:
        """The same location named independently of the working folder (a URL is already)."""

    @abstractmethod
    def describe(self) -> str:
        """What is here, for a message: "a folder", "a regular file", "a named pipe (FIFO)", "missing", ..."""

    @abstractmethod
    def size_and_version(self) -> tuple[int, Version]:
        """The file's size and :data:`Version` now (an :class:`~mindfoundry.errors.InputMissingError` when missing)."""

    @abstractmethod
    def permissions(self) -> int | None:
        """The file's permission bits on a disk (what a user's tools will be allowed); None on a store (objects have
        none)."""

    @abstractmethod
    def read_bytes(self) -> bytes: ...

    def read_text(self, encoding: str = "utf-8") -> str:
        return self.read_bytes().decode(encoding)

    @abstractmethod
    def open(self) -> io.BufferedIOBase:
        """The file as a seekable binary stream, read as it goes (an object is never downloaded whole first)."""

    @abstractmethod
    def files(self) -> list[Location]:
        """Every file below this folder (at any depth), sorted; none when there are none."""

    @abstractmethod
    def children(self) -> list[str]:
        """The names directly inside this folder, sorted (none when it is missing)."""

    @abstractmethod
    def glob(self, pattern: str) -> list[Location]:
        """The files and folders matching ``pattern`` (a glob of this location's form; ``**`` recurses), sorted."""

    @abstractmethod
    def download(self, local: Path) -> None:
        """This file's bytes into the local file ``local`` (whose folder exists)."""

    # -- writing -------------------------------------------------------------------------------------------------
    @abstractmethod
    def write_bytes(self, data: bytes) -> None:
        """This file holds ``data`` entirely, or keeps what it held (written aside and renamed; one PUT)."""

    def write_text(self, text: str) -> None:
        self.write_bytes(text.encode("utf-8"))

    @abstractmethod
    def put_file(self, local: Path) -> None:
        """The local file ``local``, written in full, as this file: renamed into place on a disk (``local`` is gone;
        it must be on the same disk: see :meth:`staging`), uploaded to a store."""

    @abstractmethod
    def delete(self) -> None:
        """Remove this file (nothing when it is already gone)."""

    @abstractmethod
    def delete_tree(self) -> None:
        """Remove this folder and everything below it (nothing when it is already gone)."""

    @abstractmethod
    def check_writable(self) -> None:
        """Write and remove a probe inside this folder (made if missing): a place that cannot hold a folder, or that
        these credentials may not write, is one line here, before any work."""

    @abstractmethod
    def check_reachable(self) -> None:
        """A missing bucket, refused credentials or an unreachable endpoint told in one line (a disk: nothing)."""

    # -- committed folders (the protocol is :mod:`.commit`'s; these are the medium's parts of it) ---------------------
    @abstractmethod
    def put_folder(self, local: Path, seal: Seal) -> None:
        """Make the complete local folder ``local`` this folder, replacing what was here: on a disk one rename
        (``local`` is consumed; a folder it replaces is moved aside first and removed once the new one is in place);
        on a store the marker of what was here deleted first, every file of ``local`` uploaded, their sizes checked,
        then ``seal``'s marker last."""

    @abstractmethod
    def move_folder(self, target: Location, seal: Seal) -> None:
        """This committed folder as ``target`` (of the same kind, where nothing is): one rename on a disk; on a store
        every object copied inside the store (the marker's copy last), then this folder removed (its marker first)."""

    @abstractmethod
    def holds_commit(self, seal: Seal) -> bool:
        """Whether a committed folder is here: on a disk the folder itself with anything in it (its rename was the
        commit), on a store ``seal``'s marker object."""

    @abstractmethod
    def remove_folder(self, seal: Seal) -> None:
        """Remove a committed folder so that a removal cut short never leaves something that looks committed: renamed
        aside first on a disk, its marker deleted first on a store."""

    @abstractmethod
    def claim(self, *, shared: bool = False) -> Claim:
        """Hold this file as the lock of what it guards (:mod:`.claim`): an flock on a disk, a renewed lease on a store;
        ``shared``: a reader's claim, which other readers may hold and a writer may not. Raises
        :class:`~mindfoundry.storage.claim.ClaimHeldError` naming the live holder."""

    @abstractmethod
    def abort_uploads(self) -> int:
        """Abort unfinished multipart uploads below this prefix a killed writer left; how many (a disk has none)."""

    @abstractmethod
    def local_path(self, key: str, why: str) -> Path:
        """This location as a path of this machine, for what only a local disk can do; a URL is refused in one line
        naming ``key`` (the setting or flag that gave it) and ``why``."""

    @abstractmethod
    def local_folder(self) -> Path | None:
        """This folder on this machine's disk, when it is there (None for a URL): for :mod:`.commit`'s fetch, which
        reads a disk's folder where it is and a store's from a verified copy."""

    @abstractmethod
    def staging(self, elsewhere: Path) -> Path:
        """Where folders to be put inside this folder are written first: this folder itself on a disk (one rename then
        puts each in place), ``elsewhere`` (a node-local folder) for a URL."""

    @abstractmethod
    def on_io_threads(self, call: Callable[[], None]) -> None:
        """Run ``call`` on the threads this location's I/O runs on besides the caller's (a store's client runs its
        requests on a thread of its own; a disk's I/O is the caller's), without waiting for it."""

