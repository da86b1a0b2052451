"""The one base class of every error that means "fix your input" (config, data, files, layout, launch).

Its message is written for the user: what is wrong, with the key, file or value, and what to do.
The command line catches this type alone, prints the message on one line and exits with status 2;
any other exception is a bug and keeps its traceback.
"""

from __future__ import annotations

import stat
from pathlib import Path


class MindFoundryError(Exception):
    """A user-facing error: ``str(exc)`` is shown as is, after ``label``."""

    #: What the command line prints before the message ("error: ...", "config error: ...").
    label = "error"


class OutputExistsError(MindFoundryError, FileExistsError):
    """An output path already holds something: nothing is overwritten, the user picks another path."""


class InputMissingError(MindFoundryError, FileNotFoundError):
    """An input file or folder the user named does not exist."""


def describe_path(path: Path) -> str:
    """What kind of thing ``path`` is, for a message: "a folder", "a named pipe (FIFO)", "missing", ..."""
    try:
        mode = path.lstat().st_mode
    except OSError:
        return "missing"
    kinds = ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISDIR, "a folder"), (stat.S_ISREG, "a regular file"),
             (stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
             (stat.S_ISBLK, "a block device"))
    return next((name for test, name in kinds if test(mode)), "not a regular file")
