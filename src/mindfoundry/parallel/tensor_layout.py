"""Which slice of a tensor each rank holds under MindSpore's semi-auto parallel, and the merge back.

MindSpore describes how a parameter is spread over the devices with a *tensor layout*, the
``parallel_layout_item`` entries of the strategy file a semi-auto run writes
(``strategy_ckpt_config={"save_file": ".../strategy.json"}``; JSON when the name ends in ``.json``):

- ``dev_matrix``: the devices of one pipeline stage as a grid, outermost first; local rank r has the
  row-major coordinates of r in it (the last dimension varies fastest);
- ``tensor_map``: one entry per tensor dimension, ``-1`` (whole) or the index, *counted from the
  right* of ``dev_matrix``, of the grid dimension it is split along (in equal contiguous chunks);
- ``opt_weight_shard_size`` (parallel optimizer): the ranks that hold the same model-parallel slice
  are taken in rank order, in groups of that many (``-1``: all of them), and the i-th rank of a group
  holds the i-th of as many equal pieces of the slice's first dimension; ``0`` when not sharded;
- pipeline stages: a merged strategy file (``mindspore.merge_pipeline_strategys``) prefixes each name
  with its stage, ``"1-layers.3.attn.q_proj.weight"``; stage s holds global ranks
  ``s*prod(dev_matrix) ..``.

This is MindSpore's own arithmetic (``mindspore/parallel/_tensor.py``), written out with numpy so
that a checkpoint written rank by rank on a cluster merges here without MindSpore; the tests hold
both against ``mindspore.transform_checkpoints`` on the same files. Uneven splits
(``param_split_shape``) and ``field`` (host-side embedding tables) are refused by name.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from mindfoundry.errors import MindFoundryError

#: The strategy file beside a folder of rank slices, and each rank's slice file (mindfoundry.checkpoint.rank_slices).
STRATEGY_FILE = "strategy.json"


def rank_file_name(rank: int) -> str:
    return f"rank_{rank}.safetensors"


class TensorLayoutError(MindFoundryError, ValueError):
    """A strategy file or a set of rank slices that does not describe a tensor; the message names it."""


@dataclass(frozen=True)
class TensorLayout:
    """How one parameter is spread over the ranks (one MindSpore ``ParallelLayouts``)."""

    dev_matrix: tuple[int, ...]
    tensor_map: tuple[int, ...]
    opt_shard_size: int = 0  # 0: not sharded by the parallel optimizer; -1: over all replicas
    stage: int = 0  # pipeline stage that holds it (the lowest, when a file lists it on several)

    @property
    def stage_devices(self) -> int:
        return math.prod(self.dev_matrix)

    def ranks(self) -> range:
        """The global ranks that hold a slice."""
        return range(self.stage * self.stage_devices, (self.stage + 1) * self.stage_devices)

    def _axes(self) -> tuple[int | None, ...]:
        """Per tensor dimension, the grid axis (index into dev_matrix) it is split along, None when whole."""
        return tuple(None if d == -1 else len(self.dev_matrix) - 1 - d for d in self.tensor_map)

    def splits(self) -> tuple[int, ...]:
        """Model-parallel pieces per tensor dimension."""
        return tuple(1 if axis is None else self.dev_matrix[axis] for axis in self._axes())

    def _coordinates(self, local: int) -> list[int]:
        out = []
        for size in reversed(self.dev_matrix):
            out.append(local % size)
            local //= size
        return out[::-1]

    def _chunk(self, local: int) -> tuple[int, ...]:
        """The model-parallel chunk index per tensor dimension of local rank `local`."""
        coords = self._coordinates(local)
        return tuple(0 if axis is None else coords[axis] for axis in self._axes())

    @property
    def opt_pieces(self) -> int:
        """How many pieces the parallel optimizer cuts each slice's first dimension into (1: not sharded)."""
        if self.opt_shard_size == 0:
            return 1
        replicas = self.stage_devices // math.prod(self.splits())
        size = replicas if self.opt_shard_size == -1 else self.opt_shard_size
        if size < 1 or replicas % size:
            raise TensorLayoutError(
                f"opt_weight_shard_size {self.opt_shard_size} does not divide the {replicas} "
                f"replicas of a slice (dev_matrix {list(self.dev_matrix)}, tensor_map {list(self.tensor_map)})"
            )
        return size

    def _opt_piece(self, local: int) -> int:
        """Which of the :attr:`opt_pieces` of its slice's first dimension local rank `local` holds.

        The ranks holding the same slice differ only in the grid axes the tensor is not split along; in rank order
        they count up in those coordinates (mixed radix), and each group of opt_pieces of them splits it."""
        pieces = self.opt_pieces
        if pieces == 1:
            return 0
        coords, split_axes = self._coordinates(local), set(self._axes())
        index = 0
        for axis, size in enumerate(self.dev_matrix):
            if axis not in split_axes:
                index = index * size + coords[axis]
        return index % pieces

    def check(self, shape: tuple[int, ...], name: str) -> None:
        """Refuse a layout that does not split `shape` evenly (MindSpore's strategy files only hold even splits)."""
        if len(self.tensor_map) != len(shape):
            raise TensorLayoutError(
                f"'{name}': tensor_map {list(self.tensor_map)} has {len(self.tensor_map)} entries, the "
                f"tensor has {len(shape)} dimensions {list(shape)}: the strategy file is for another model"
            )
        if any(d < -1 or d >= len(self.dev_matrix) for d in self.tensor_map):
            raise TensorLayoutError(
                f"'{name}': tensor_map {list(self.tensor_map)} points outside dev_matrix {list(self.dev_matrix)}"
            )
        if any(n % k for n, k in zip(shape, self.splits())):
            raise TensorLayoutError(f"'{name}': shape {list(shape)} does not split evenly {list(self.splits())} ways")
        pieces = self.opt_pieces
        first = shape[0] // self.splits()[0] if shape else 1
        if first % pieces:
            raise TensorLayoutError(
                f"'{name}': the parallel optimizer's {pieces} pieces do not divide the slice's first dimension {first}"
            )

    def full_shape(self, local_shape: tuple[int, ...]) -> tuple[int, ...]:
        """The full tensor's shape from the shape of one rank's slice."""
        full = [k * n for k, n in zip(self.splits(), local_shape)]
        if full:
            full[0] *= self.opt_pieces
        return tuple(full)

    def region(self, shape: tuple[int, ...], rank: int) -> tuple[slice, ...]:
        """The index region of the full tensor that global rank `rank` holds."""
        local = rank - self.stage * self.stage_devices
        if not 0 <= local < self.stage_devices:
            raise TensorLayoutError(f"rank {rank} holds nothing of a tensor on pipeline stage {self.stage} (ranks "
                                    f"{self.ranks().start}-{self.ranks().stop - 1})")
        out = []
        for n, k, c in zip(shape, self.splits(), self._chunk(local)):
            out.append(slice(c * (n // k), (c + 1) * (n // k)))
        if out:
            piece, first = self._opt_piece(local), out[0]
            step = (first.stop - first.start) // self.opt_pieces
            out[0] = slice(first.start + piece * step, first.start + (piece + 1) * step)
        return tuple(out)


def rank_slice(full: np.ndarray, layout: TensorLayout, rank: int) -> np.ndarray:
    """What global rank `rank` holds of `full` (a copy)."""
    return np.ascontiguousarray(full[layout.region(full.shape, rank)])


def merge_slices(
    slices: Mapping[int, np.ndarray], layout: TensorLayout, shape: tuple[int, ...], name: str
) -> np.ndarray:
    """The full tensor from the slices of every rank of its stage; replicas must agree bit for bit."""
    layout.check(shape, name)
    missing = [r for r in layout.ranks() if r not in slices]
    if missing:
        raise TensorLayoutError(
            f"'{name}': no slice from rank(s) {missing[:8]} (stage {layout.stage} has ranks "
            f"{layout.ranks().start}-{layout.ranks().stop - 1}): copy every rank's file into the folder"
        )
    first = slices[layout.ranks().start]
    full = np.empty(shape, dtype=first.dtype)
    seen: dict[tuple, int] = {}
    for rank in layout.ranks():
        region = layout.region(shape, rank)
        part = slices[rank]
        expect = tuple(s.stop - s.start for s in region)
        if tuple(part.shape) != expect:
            raise TensorLayoutError(
                f"'{name}': rank {rank}'s slice has shape {list(part.shape)}, the strategy says {list(expect)}"
            )
        key = tuple((s.start, s.stop) for s in region)
        if key in seen:
            if not np.array_equal(full[region], part, equal_nan=True):
                raise TensorLayoutError(
                    f"'{name}': ranks {seen[key]} and {rank} hold different copies of the same slice "
                    "(replicas must be identical): the files come from different steps or one is damaged"
                )
            continue
        seen[key] = rank
        full[region] = part
    return full


# -- MindSpore's strategy file (JSON form) ------------------------------------------------------
def _stage_and_name(key: str) -> tuple[int, str]:
    head, sep, rest = key.partition("-")
    return (int(head), rest) if sep and head.isdigit() else (0, key)


def layouts_from_strategy(data: Mapping[str, Any], source: str = "strategy file") -> dict[str, TensorLayout]:
    """Parameter name -> layout from a parsed MindSpore strategy JSON (``parallel_layout_item``)."""
    items = data.get("parallel_layout_item") if isinstance(data, Mapping) else None
    if not isinstance(items, Mapping) or not items:
        raise TensorLayoutError(f"{source}: no 'parallel_layout_item' entries: not a MindSpore strategy file "
                                "(written by strategy_ckpt_config={'save_file': '....json'})")
    out: dict[str, TensorLayout] = {}
    for key, item in items.items():
        stage, name = _stage_and_name(key)
        try:
            if item.get("field", 0) or any(item.get("param_split_shape") or []):
                raise TensorLayoutError(f"{source}: '{name}' is split unevenly (field {item.get('field', 0)}, "
                                        f"param_split_shape {item.get('param_split_shape')}): merge it with "
                                        "mindspore.transform_checkpoints instead")
            lay = TensorLayout(tuple(int(d) for d in item["dev_matrix"]), tuple(int(d) for d in item["tensor_map"]),
                               int(item.get("opt_weight_shard_size", 0)), stage)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            if isinstance(exc, TensorLayoutError):
                raise
            raise TensorLayoutError(f"{source}: entry '{key}' is not a tensor layout ({exc!r})") from None
        if name not in out or stage < out[name].stage:  # a parameter on several stages: the lowest holds it
            out[name] = lay
    return out


def strategy_json(layouts: Mapping[str, TensorLayout]) -> dict[str, Any]:
    """The MindSpore strategy JSON of `layouts` (stage-prefixed names when there is more than one stage)."""
    staged = any(lay.stage for lay in layouts.values())
    items = {}
    for name, lay in layouts.items():
        splits = lay.splits()
        step = (
            math.prod(splits) if lay.opt_shard_size else 0
        )  # the model-parallel size: ranks between opt group members
        items[f"{lay.stage}-{name}" if staged else name] = {
            "dev_matrix": list(lay.dev_matrix),
            "tensor_map": list(lay.tensor_map),
            "param_split_shape": [],
            "indices_offset": [],
            "field": 0,
            "opt_weight_shard_step": step,
            "opt_weight_shard_size": lay.opt_shard_size,
        }
    return {"current_stage": 1 if staged else 0, "parallel_strategy_item": {}, "parallel_layout_item": items}


def read_strategy(path: str | Path) -> dict[str, TensorLayout]:
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise TensorLayoutError(
            f"{path}: missing (a semi-auto checkpoint folder holds its strategy file beside the rank slices)"
        ) from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TensorLayoutError(
            f"{path}: not JSON ({exc}); MindSpore writes JSON strategy files when save_file ends in .json"
        ) from None
    return layouts_from_strategy(data, str(path))
