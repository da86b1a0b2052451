"""The on-disk dump format: one folder per (step, rank), tensors streamed to disk one at a time.

Layout::

    DUMP/step{N}/rank{R}/meta.json      what was dumped: backend, precision, mode, step, loss, ...
    DUMP/step{N}/rank{R}/index.jsonl    one line per tensor, in execution order (`seq`)
    DUMP/step{N}/rank{R}/tensors/       tensor mode only: {seq:06d}.npy per tensor

Tensor names are engine-independent because both engines share module and parameter names::

    layers.1.attn.forward.0.input.0          first positional input of call 0 (micro-batch 0)
    layers.1.attn.forward.0.output.0         its output
    layers.1.attn.backward.0.grad_output.0   gradient arriving at the output (backward call 0)
    layers.1.attn.backward.0.grad_input.0    gradient the module sends to its input
    param.NAME / grad.NAME                   a parameter before the step / its accumulated gradient
    exp_avg.NAME / exp_avg_sq.NAME           AdamW moments after the step
    loss.forward.0.output.0                  the (scaled) loss of micro-batch 0

Each index line holds the name, module, kind, shape, dtype and :func:`tensor_stats`, so the
statistics mode needs no tensor files and `compare` can still judge it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mindfoundry import atomic
from mindfoundry.debug.stats import tensor_stats
from mindfoundry.debug.torch_files import TorchFileError, read_pt
from mindfoundry.errors import MindFoundryError, OutputExistsError

INDEX_FILE = "index.jsonl"
META_FILE = "meta.json"
TENSOR_DIR = "tensors"
MODES = ("statistics", "tensor")


class DumpError(MindFoundryError, ValueError):
    """A dump folder that is missing, ambiguous or damaged."""


def leaf_dir(root: Path, step: int, rank: int) -> Path:
    return Path(root) / f"step{step}" / f"rank{rank}"


def claim_leaf(root: Path, step: int, rank: int, mode: str, marker: str, tensor_dir: str) -> Path:
    """The step{N}/rank{R} folder a writer of either format fills, created (with its tensor folder in tensor
    mode); refused when ``marker``, the format's index file, shows a dump is already there."""
    if mode not in MODES:
        raise ValueError(f"dump mode '{mode}': choose one of {', '.join(MODES)}")
    leaf = leaf_dir(root, step, rank)
    if (leaf / marker).exists():
        raise OutputExistsError(f"{leaf} already holds a dump: choose another dump folder or remove it")
    (leaf / tensor_dir if mode == "tensor" else leaf).mkdir(parents=True, exist_ok=True)
    return leaf


class DumpWriter:
    """Streams one step's tensors of one rank: each `record` computes statistics, writes the index
    line (flushed) and, in tensor mode, the array; nothing is kept in memory between calls."""

    def __init__(self, root: Path, step: int, rank: int, mode: str, meta: dict[str, Any]):
        self.dir = claim_leaf(root, step, rank, mode, INDEX_FILE, TENSOR_DIR)
        self.mode, self.step, self.rank = mode, step, rank
        self.meta = {"step": step, "rank": rank, "mode": mode, **meta}
        self.count = 0
        self._index = open(self.dir / INDEX_FILE, "w", encoding="utf-8")

    def record(self, name: str, module: str, kind: str, array: np.ndarray, dtype: str | None = None) -> dict[str, Any]:
        """Write one tensor; `dtype` names the engine's dtype when the array was upcast to reach numpy (bf16)."""
        a = np.asarray(array)
        entry: dict[str, Any] = {"seq": self.count, "name": name, "module": module, "kind": kind,
                                 "shape": list(a.shape), "dtype": dtype or str(a.dtype), **tensor_stats(a)}
        if self.mode == "tensor":
            rel = f"{TENSOR_DIR}/{self.count:06d}.npy"
            np.save(self.dir / rel, np.ascontiguousarray(a))
            entry["file"] = rel
        self._index.write(json.dumps(entry) + "\n")
        self._index.flush()
        self.count += 1
        return entry

    def close(self, **extra: Any) -> Path:
        """Finish the index and write meta.json last (its presence marks a complete dump)."""
        self._index.close()
        meta = {**self.meta, **extra, "tensors": self.count}
        atomic.write_text(self.dir / META_FILE, json.dumps(meta, indent=2) + "\n")
        return self.dir


@dataclass
class Dump:
    """One (step, rank) dump read back; `records` are in execution order."""

    path: Path
    meta: dict[str, Any]
    records: list[dict[str, Any]]

    def by_name(self) -> dict[str, dict[str, Any]]:
        return {r["name"]: r for r in self.records}

    def array(self, record: dict[str, Any]) -> np.ndarray | None:
        """The stored tensor (.npy memory-mapped; .pt, msprobe's PyTorch files, read without torch), or None in
        statistics mode."""
        if "file" not in record:
            return None
        path = self.path / record["file"]
        if not path.is_file():
            raise DumpError(f"{path} is listed in the dump's index but missing: the dump is incomplete")
        if path.suffix == ".pt":
            try:
                return read_pt(path)
            except TorchFileError as e:
                raise DumpError(f"{e}: the dump is damaged") from None
        return np.load(path, mmap_mode="r")


def read_native_dump(path: Path) -> Dump:
    """Read one leaf folder of our format; a missing meta.json means the writer was interrupted."""
    path = Path(path)
    index, meta_file = path / INDEX_FILE, path / META_FILE
    if not index.is_file():
        raise DumpError(f"{path}: no {INDEX_FILE}; point at a dump's step{{N}}/rank{{R}} folder or its root")
    if not meta_file.is_file():
        raise DumpError(f"{path}: {META_FILE} is missing, so the dump was interrupted before it finished; dump again")
    meta = json.loads(meta_file.read_text(encoding="utf-8"))
    records = []
    with open(index, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                raise DumpError(f"{index}:{lineno} is not valid JSON: the dump is damaged; dump again") from None
    if len(records) != meta.get("tensors", len(records)):
        raise DumpError(
            f"{index} lists {len(records)} tensors but {META_FILE} says {meta['tensors']}: the dump is damaged"
        )
    return Dump(path, meta, records)

