"""The one base class of every error that means "fix your input" (config, data, files, layout, launch).

Its message is written for the user: what is wrong, with the key, file or value, and what to do.
The command line catches this type alone, prints the message on one line and exits with status 2;
any other exception is a bug and keeps its traceback.
"""

from __future__ import annotations


class MindFoundryError(Exception):
    """A user-facing error: ``str(exc)`` is shown as is, after ``label``."""

    #: What the command line prints before the message ("error: ...", "config error: ...").
    label = "error"


class OutputExistsError(MindFoundryError, FileExistsError):
    """An output path already holds something: nothing is overwritten, the user picks another path."""


class InputMissingError(MindFoundryError, FileNotFoundError):
    """An input file or folder the user named does not exist."""
