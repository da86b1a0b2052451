"""What storage raises: one line naming the place, the cause and the fix (a user's input to correct, not a bug)."""

from __future__ import annotations

from mindfoundry.errors import InputMissingError, MindFoundryError


class StorageError(MindFoundryError, OSError):
    """A store or a disk refused or failed an operation; the message names the location, the cause and the fix."""


class ObjectMissingError(StorageError, InputMissingError):
    """An object (or every object under a prefix) that should be there is not."""
