"""Checkpoint shard folders written rank by rank under MindSpore's semi-auto parallel, merged into full arrays.

A semi-auto run's ranks each hold slices of the parameters and of the AdamW moments. Its sharded
checkpoint (``checkpoint.format: sharded``) keeps them as written, one file per rank, beside the
strategy file MindSpore compiled (the layouts of :mod:`mindfoundry.parallel.tensor_layout`)::

    step_00000300/model/strategy.json          parallel_layout_item per parameter
    step_00000300/model/rank_0.safetensors     rank 0's slices under the shared names
    ...
    step_00000300/optimizer/rank_0.safetensors exp_avg.NAME / exp_avg_sq.NAME slices (laid out as NAME)

:func:`read_rank_slices` turns one such folder into the full tensors of the single-device format, so a
cluster run continues on one device, on the torch engine, or goes through ``export`` (framework-free:
numpy and safetensors only). :func:`write_rank_slices` is the other direction, one rank's share of
full arrays; the tests build a cluster's folders with it and MindSpore's own
``transform_checkpoints`` agrees with the merge.
"""

from __future__ import annotations

import json
import re
from contextlib import ExitStack
from pathlib import Path
from typing import Mapping

import numpy as np
from safetensors import SafetensorError, safe_open

from mindfoundry.checkpoint.store import CheckpointError, write_safetensors
from mindfoundry.parallel.tensor_layout import (
    STRATEGY_FILE,
    TensorLayout,
    TensorLayoutError,
    merge_slices,
    rank_file_name,
    rank_slice,
    read_strategy,
    strategy_json,
)

__all__ = [
    "STRATEGY_FILE",
    "holds_rank_slices",
    "read_rank_slices",
    "stored_shapes",
    "write_rank_slices",
    "write_strategy",
]
_RANK_FILE = re.compile(r"^rank_(\d+)\.safetensors$")
_MOMENTS = ("exp_avg.", "exp_avg_sq.")


def rank_file(folder: Path, rank: int) -> Path:
    return folder / rank_file_name(rank)


def holds_rank_slices(folder: str | Path) -> bool:
    """Whether a shard folder is in this rank-slice form (else torch.distributed.checkpoint's)."""
    return (Path(folder) / STRATEGY_FILE).is_file()


def layout_of(name: str, layouts: Mapping[str, TensorLayout]) -> TensorLayout | None:
    """A tensor's layout: its own entry, else (an AdamW moment) its parameter's."""
    if name in layouts:
        return layouts[name]
    for prefix in _MOMENTS:
        if name.startswith(prefix):
            return layouts.get(name[len(prefix):])
    return None


def write_rank_slices(
    folder: str | Path, arrays: Mapping[str, np.ndarray], layouts: Mapping[str, TensorLayout], rank: int
) -> Path:
    """Write rank `rank`'s slices of the full `arrays` (tensors its stage does not hold are left out)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    own = {}
    for name, full in arrays.items():
        lay = layout_of(name, layouts)
        if lay is None:
            raise CheckpointError(f"'{name}' has no layout in the strategy: the strategy is for another model")
        if rank in lay.ranks():
            own[name] = rank_slice(full, lay, rank)
    out = rank_file(folder, rank)
    write_safetensors(out, own)
    return out


def write_strategy(folder: str | Path, layouts: Mapping[str, TensorLayout]) -> Path:
    out = Path(folder) / STRATEGY_FILE
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(strategy_json(layouts), indent=1), encoding="utf-8")
    return out


def _rank_files(folder: Path) -> dict[int, Path]:
    files = {int(m.group(1)): p for p in folder.iterdir() if (m := _RANK_FILE.match(p.name))}
    if not files:
        raise CheckpointError(f"{folder}: a strategy file but no rank_N.safetensors slices")
    return dict(sorted(files.items()))


def _layouts(folder: Path) -> dict[str, TensorLayout]:
    try:
        return read_strategy(folder / STRATEGY_FILE)
    except TensorLayoutError as exc:
        raise CheckpointError(str(exc)) from None


def _layout_for(name: str, layouts: Mapping[str, TensorLayout], folder: Path) -> TensorLayout:
    lay = layout_of(name, layouts)
    if lay is None:
        raise CheckpointError(f"{folder}: '{name}' is in the rank files but not in {STRATEGY_FILE}: the strategy file "
                              "belongs to another run")
    return lay


def stored_shapes(folder: str | Path) -> dict[str, tuple[int, ...]]:
    """Full name -> shape of the tensors of a rank-slice folder, from the file headers (no tensor is read)."""
    folder = Path(folder)
    layouts = _layouts(folder)
    out: dict[str, tuple[int, ...]] = {}
    for path in _rank_files(folder).values():
        with safe_open(str(path), framework="numpy") as f:
            for name in f.keys():
                if name not in out:
                    out[name] = _layout_for(name, layouts, folder).full_shape(tuple(f.get_slice(name).get_shape()))
    return out


def read_rank_slices(folder: str | Path) -> dict[str, np.ndarray]:
    """Every tensor of a rank-slice shard folder, merged to its full shape (bit for bit; replicas checked equal).

    The rank files are read tensor by tensor, so besides the result only one tensor's slices are in memory."""
    folder = Path(folder)
    layouts = _layouts(folder)
    with ExitStack() as stack:
        files = {}
        for rank, path in _rank_files(folder).items():
            try:
                files[rank] = stack.enter_context(safe_open(str(path), framework="numpy"))
            except (SafetensorError, OSError) as exc:
                raise CheckpointError(f"{path}: unreadable slice file ({exc})") from None
        held_by = {}
        for rank, f in files.items():
            for name in f.keys():
                held_by.setdefault(name, []).append(rank)
        merged = {}
        for name in sorted(held_by):
            lay = _layout_for(name, layouts, folder)
            if lay.ranks().start not in held_by[name]:
                raise CheckpointError(
                    f"{folder}: '{name}' is missing from {rank_file(folder, lay.ranks().start).name} "
                    f"(pipeline stage {lay.stage} starts at that rank): copy every rank's file into the folder"
                )
            try:
                held = {r: files[r].get_tensor(name) for r in held_by[name]}
                merged[name] = merge_slices(held, lay, lay.full_shape(held[lay.ranks().start].shape), name)
            except TensorLayoutError as exc:
                raise CheckpointError(f"{folder}: {exc}") from None
            except SafetensorError as exc:
                raise CheckpointError(f"{folder}: unreadable slice of '{name}' ({exc})") from None
    return merged
