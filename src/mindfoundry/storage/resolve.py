"""A path as the config or the command line gives it, turned into a :class:`~mindfoundry.storage.location.Location`
once: a URL (``s3://...``; any installed fsspec protocol) becomes a :class:`~mindfoundry.storage.remote.Remote` reached
with the ``storage`` settings, anything else (``file://`` stripped) a :class:`~mindfoundry.storage.local_path.Local`.
This is the one place that tells the two apart; everything above works with the Location it is handed.
"""

from __future__ import annotations

from pathlib import Path

from mindfoundry.config.section import url_protocol
from mindfoundry.config.storage_config import StorageConfig
from mindfoundry.storage.local_path import Local
from mindfoundry.storage.location import Location
from mindfoundry.storage.remote import Remote


def locate(path: str | Path | Location, storage: StorageConfig | None = None) -> Location:
    """``path`` as a :class:`Remote` (a URL, reached with ``storage``) or a :class:`Local` (module docstring)."""
    if isinstance(path, Location):
        return path
    if isinstance(path, Path):
        return Local(path)
    if url_protocol(path) is not None:
        return Remote(path, storage)
    return Local(path.removeprefix("file://"))
