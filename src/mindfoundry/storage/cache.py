"""The node-local cache: where objects fetched from a store, and uploads being staged, live on this machine.

One folder per machine (``data.cache_dir``, else ``$MF_CACHE_DIR``, else ``$XDG_CACHE_HOME/mindfoundry``, else
``~/.cache/mindfoundry``), shared by every process of the machine: the ranks of a launch fill a fetched folder once
(:func:`filling` holds a file lock while one of them does) and a restart finds it again.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
from collections.abc import Iterator
from pathlib import Path

from mindfoundry import locks


def cache_root(configured: str | None = None) -> Path:
    """This machine's MindFoundry cache folder (see the module docstring; the one place that resolves it)."""
    if configured:
        return Path(configured)
    root = os.environ.get("MF_CACHE_DIR") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / (
        "mindfoundry")
    return Path(root)


def cache_folder(kind: str, url: str, configured: str | None = None) -> Path:
    """The cache folder of ``url`` for one use (``kind``: "data", "work", ...): readable, and unique per URL."""
    tail = re.sub(r"[^A-Za-z0-9._-]+", "_", url.split("://", 1)[-1])[-60:].strip("_") or "root"
    digest = hashlib.sha256(url.encode("utf-8")).hexdigest()[:12]
    return cache_root(configured) / kind / f"{tail}-{digest}"


@contextlib.contextmanager
def filling(folder: Path) -> Iterator[None]:
    """Hold this machine's lock on filling ``folder``: one process fills it, the others wait and then find it full."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    with locks.waiting(folder.parent / f".{folder.name}.lock"):
        yield
