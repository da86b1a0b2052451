"""Dump folders of either format: finding their step/rank leaves, reading them, opening a writer.

Two formats share the step{N}/rank{R} layout: ours (index.jsonl + meta.json, :mod:`.dump`) and
MindStudio Probe's (dump.json, :mod:`.msprobe`). A leaf is whichever folder holds one of the two
marker files; `compare` and `locate` read both, so a dump written by msprobe's own
PrecisionDebugger compares with one of ours. A folder holding both kinds is refused: which of the
two a comparison should read would be a guess.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator, Mapping

from mindfoundry.debug.dump import INDEX_FILE, Dump, DumpError, DumpWriter, leaf_dir, read_native_dump
from mindfoundry.debug.msprobe import DUMP_JSON, MsprobeWriter, read_msprobe_dump

FORMATS = ("mindfoundry", "msprobe")
_MARKERS = {INDEX_FILE: "mindfoundry", DUMP_JSON: "msprobe"}


def leaf_format(leaf: Path) -> str | None:
    """'mindfoundry' or 'msprobe' for a leaf folder, None when it holds no dump."""
    kinds = [fmt for marker, fmt in _MARKERS.items() if (leaf / marker).is_file()]
    if len(kinds) > 1:
        raise DumpError(f"{leaf} mixes formats: it holds both {INDEX_FILE} (MindFoundry) and {DUMP_JSON} (msprobe); "
                        f"keep each dump in its own folder")
    return kinds[0] if kinds else None


def dump_leaves(root: Path) -> list[Path]:
    """Every (step, rank) folder under `root` (or `root` itself when it is one), sorted; all of one format."""
    root = Path(root)
    if not root.exists():
        raise DumpError(
            f"{root} does not exist: give a dump folder written by `mindfoundry dump`, debug.dump or msprobe"
        )
    if leaf_format(root):
        return [root]
    leaves = sorted(
        {p.parent for marker in _MARKERS for p in root.rglob(marker)}, key=lambda p: p.relative_to(root).parts
    )
    if not leaves:
        raise DumpError(f"{root} holds no dump (neither {INDEX_FILE} nor {DUMP_JSON} below it)")
    kinds: dict[str, list[Path]] = {}
    for leaf in leaves:
        kinds.setdefault(leaf_format(leaf), []).append(leaf)
    if len(kinds) > 1:
        example = "; ".join(f"{fmt}: {paths[0].relative_to(root)}" for fmt, paths in kinds.items())
        raise DumpError(
            f"{root} mixes MindFoundry and msprobe dumps ({example}); compare one format's folder at a time"
        )
    return leaves


def read_dump(path: Path) -> Dump:
    """One leaf of either format; with our tensor names either way."""
    path = Path(path)
    fmt = leaf_format(path)
    if fmt is None:
        raise DumpError(
            f"{path}: neither {INDEX_FILE} nor {DUMP_JSON}; point at a dump's step{{N}}/rank{{R}} folder or its root"
        )
    return read_native_dump(path) if fmt == "mindfoundry" else read_msprobe_dump(path)


def iter_dumps(root: Path) -> Iterator[Dump]:
    for leaf in dump_leaves(root):
        yield read_dump(leaf)


def holds_dump(root: Path, step: int, rank: int) -> bool:
    """Whether step/rank of this dump root is already written, in either format."""
    return leaf_format(leaf_dir(root, step, rank)) is not None


def open_writer(fmt: str, root: Path, step: int, rank: int, mode: str, meta: dict[str, Any],
                backend: str, classes: Mapping[str, str], micro_batches: int = 1) -> DumpWriter | MsprobeWriter:
    """A writer for one step/rank in the chosen format (`classes`: module -> class name, and the step's
    micro-batch count, for msprobe's entry names)."""
    if fmt == "msprobe":
        return MsprobeWriter(root, step, rank, mode, meta, backend, classes, micro_batches)
    if fmt != "mindfoundry":
        raise ValueError(f"dump format '{fmt}': choose one of {', '.join(FORMATS)}")
    return DumpWriter(root, step, rank, mode, meta)
