"""A path as the config gives it: a local folder or file (:class:`~pathlib.Path`) or an object-storage URL
(:class:`~mindfoundry.storage.remote.Remote`).

Everything that takes a path from the config turns it into a :data:`Location` here, once, with the ``storage``
settings; below that, code asks ``isinstance(loc, Remote)`` where the two differ (a commit without rename, a fetch
into the node-local cache) and is otherwise the same.
"""

from __future__ import annotations

from pathlib import Path
from typing import Union

from mindfoundry.config.section import url_protocol
from mindfoundry.config.storage_config import StorageConfig
from mindfoundry.storage.remote import Remote

Location = Union[Path, Remote]


def is_url(path: str | Path | Remote) -> bool:
    """Whether ``path`` names object storage (``s3://...``; ``file://`` is local)."""
    return isinstance(path, Remote) or (isinstance(path, str) and url_protocol(path) is not None)


def locate(path: str | Path | Remote, storage: StorageConfig | None = None) -> Location:
    """``path`` as a :class:`Remote` (a URL, reached with ``storage``) or a local :class:`Path` (no ``file://``)."""
    if isinstance(path, (Path, Remote)):
        return path
    if url_protocol(path) is not None:
        return Remote(path, storage)
    return Path(path.removeprefix("file://")) if path.startswith("file://") else Path(path)
