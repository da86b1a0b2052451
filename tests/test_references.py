"""Every dotted name `mindfoundry.x.y` that the sources and docs mention exists: a module renamed or removed leaves
no stale reference behind (config/parallel.py named `mindfoundry.parallel.rules`, which never existed)."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
NAME = re.compile(r"mindfoundry(?:\.[A-Za-z_]\w*)+")
#: Format tags that look like dotted names but are strings written into files.
FORMAT_TAGS = {"mindfoundry.mindrecord", "mindfoundry.prepare", "mindfoundry.split", "mindfoundry.commit"}


def resolves(name: str) -> bool:
    """The longest importable module prefix of `name`, then its attributes."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def test_every_dotted_reference_resolves() -> None:
    files = [*(REPO / "src").rglob("*.py"), *(REPO / "docs").glob("*.md"), REPO / "README.md"]
    names = {m.group(0) for f in files for m in NAME.finditer(f.read_text(encoding="utf-8"))} - FORMAT_TAGS
    assert len(names) > 150  # measured: 207
    assert sorted(n for n in names if not resolves(n)) == []
    assert not resolves("mindfoundry.parallel.rules") and not resolves("mindfoundry.eval.generate")
