"""A :class:`~mindfoundry.storage.location.Location` on this machine's disk: a path, written through
:mod:`mindfoundry.atomic` (aside, fsynced, renamed), so a reader sees a file or a folder whole or not at all."""

from __future__ import annotations

import glob
import io
import os
import shutil
from collections.abc import Callable
from pathlib import Path

from mindfoundry import atomic
from mindfoundry.errors import describe_path
from mindfoundry.storage.claim import FileClaim
from mindfoundry.storage.failures import StorageError
from mindfoundry.storage.location import Claim, Location, Seal, Version

#: Prefix of a folder :meth:`Local.remove_folder` is deleting (a kill mid-delete leaves only a hidden folder).
DELETING = ".deleting-"


class Local(Location):
    """A file or folder on this machine (see the module docstring); ``path`` as the config gave it."""

    __slots__ = ("path",)

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def parent(self) -> Local:
        return Local(self.path.parent)

    def __truediv__(self, part: str) -> Local:
        return Local(self.path / part)

    def relative_to(self, other: Location) -> str:
        if not isinstance(other, Local):
            raise ValueError(f"{self} is not under {other}")
        return self.path.relative_to(other.path).as_posix()

    def is_below(self, other: Location) -> bool:
        """Whether this path is ``other`` or inside it, once both are resolved (links, ``..``, the working folder)."""
        return isinstance(other, Local) and self.path.resolve().is_relative_to(other.path.resolve())

    def __str__(self) -> str:
        return str(self.path)

    def __fspath__(self) -> str:
        """A local location is a path: it opens wherever a path does (``Path(loc)``, ``open(loc)``)."""
        return str(self.path)

    # -- reading -------------------------------------------------------------------------------------------------
    def exists(self) -> bool:
        return self.path.exists()

    def is_file(self) -> bool:
        return self.path.is_file()

    def is_dir(self) -> bool:
        return self.path.is_dir()

    def absolute(self) -> Local:
        return Local(os.path.abspath(self.path))

    def describe(self) -> str:
        return describe_path(self.path)

    def size_and_version(self) -> tuple[int, Version]:
        st = self.path.stat()
        return st.st_size, st.st_mtime_ns

    def permissions(self) -> int | None:
        return self.path.stat().st_mode & 0o777

    def read_bytes(self) -> bytes:
        return self.path.read_bytes()

    def open(self) -> io.BufferedIOBase:
        return open(self.path, "rb")

    def files(self) -> list[Location]:
        return sorted(Local(p) for p in self.path.rglob("*") if p.is_file())

    def children(self) -> list[str]:
        return sorted(p.name for p in self.path.iterdir()) if self.path.is_dir() else []

    def glob(self, pattern: str) -> list[Location]:
        return [Local(p) for p in sorted(glob.glob(pattern.removeprefix("file://"), recursive=True))]

    def download(self, local: Path) -> None:
        shutil.copyfile(self.path, local)

    # -- writing -------------------------------------------------------------------------------------------------
    def write_bytes(self, data: bytes) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        atomic.write_bytes(self.path, data)

    def put_file(self, local: Path) -> None:
        atomic.publish_files([(local, self.path)])

    def delete(self) -> None:
        self.path.unlink(missing_ok=True)

    def delete_tree(self) -> None:
        if self.path.is_dir() and not self.path.is_symlink():
            shutil.rmtree(self.path)
        else:
            self.path.unlink(missing_ok=True)

    def check_writable(self) -> None:
        try:
            made = not self.path.exists()
            self.path.mkdir(parents=True, exist_ok=True)
            probe = self.path / f".write-probe-{os.getpid()}"
            probe.write_bytes(b"ok")
            probe.unlink()
            if made:  # a check writes nothing that stays
                self.path.rmdir()
        except OSError as exc:
            error = StorageError(f"cannot write to the folder '{self}' ({exc.strerror or type(exc).__name__}): "
                                 "choose a folder path on a writable disk")
            error.errno, error.strerror = exc.errno, exc.strerror  # a full disk stays one (atomic.disk_full)
            raise error from None

    def check_reachable(self) -> None:
        return None

    # -- committed folders ---------------------------------------------------------------------------------------
    def put_folder(self, local: Path, seal: Seal) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        replaced = None
        if self.path.is_dir() and not any(self.path.iterdir()):
            self.path.rmdir()  # an empty folder made beforehand holds nothing to keep
        elif self.path.exists():  # kept until the new folder is in place: a kill in between loses neither
            replaced = self._aside()
        atomic.publish_folder(local, self.path)
        if replaced is not None:
            shutil.rmtree(replaced, ignore_errors=True)

    def move_folder(self, target: Location, seal: Seal) -> None:
        self._rename(target.local_path("a folder moved from a disk", "it is renamed on the same disk"))

    def holds_commit(self, seal: Seal) -> bool:
        return self.path.is_dir() and any(self.path.iterdir())

    def remove_folder(self, seal: Seal) -> None:
        if not self.path.exists():
            return
        shutil.rmtree(self._aside(), ignore_errors=True)  # a kill during the delete leaves a hidden folder, never half

    def _aside(self) -> Path:
        """This folder renamed to a hidden name beside it (being replaced or deleted); that name."""
        doomed = self.path.with_name(f"{DELETING}{self.path.name}-{os.getpid()}")
        self._rename(doomed)
        return doomed

    def _rename(self, target: Path) -> None:
        """The one rename of a committed folder (moved aside, or to a new name): atomic on one disk."""
        os.replace(self.path, target)

    def claim(self, *, shared: bool = False) -> Claim:
        return FileClaim(self.path, shared=shared)

    def abort_uploads(self) -> int:
        return 0

    def local_path(self, key: str, why: str) -> Path:
        return self.path

    def local_folder(self) -> Path | None:
        return self.path

    def staging(self, elsewhere: Path) -> Path:
        return self.path

    def on_io_threads(self, call: Callable[[], None]) -> None:
        return None
