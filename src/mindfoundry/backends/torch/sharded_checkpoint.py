"""``checkpoint.format: sharded``: every rank writes only its own shards, through torch.distributed.checkpoint.

The checkpoint folder (the commit, manifest, retention and the folder names are :mod:`mindfoundry.checkpoint.store`'s;
this module writes and reads the two shard folders it is handed)::

    step_N/model/shard-0000R-model-0000F-of-0000G.safetensors       rank R-1's pieces of the weights, file F of G
    step_N/optimizer/shard-0000R-model-0000F-of-0000G.safetensors   ... of the AdamW moments
    step_N/trainer_state.json, data_manifest.json, manifest.json, manifest.sha256   (rank 0)

The shard files are written by ``torch.distributed.checkpoint.save`` with its safetensors storage
(``HuggingFaceStorageWriter(save_distributed=True)``): plain safetensors files whose header records
each piece's offset in the full tensor (``DCP_SHARDING_INFO``), and no ``.metadata`` pickle, so a
sharded checkpoint keeps the "safetensors and JSON only" rule. A replicated tensor is written once
(DCP's de-duplication); a rank with nothing to write writes no file. Each rank splits its pieces
over up to 1 + LAYER_GROUPS files (file 1: embedding, final norm, head; then contiguous groups of
layers) because DCP's safetensors writer builds a whole file in host memory before writing it:
the transient memory of a save is about twice the largest file, not twice the rank's whole shard.

Names are the shared parameter names of the full format: ``NAME`` in ``model/`` (from
``get_model_state_dict``), ``exp_avg.NAME`` / ``exp_avg_sq.NAME`` in ``optimizer/`` (taken from
AdamW's per-parameter state, which has the parameter's layout). AdamW's step count is
``adam_step`` in trainer_state.json and its hyper-parameters come from the config, as in the full
format; DCP's own optimizer layout (``get_optimizer_state_dict``: ``state.NAME.exp_avg``, a step per
parameter, ``param_groups``) is not used, so a consolidated sharded checkpoint is exactly a full one.

Loading reshards: the targets are the loading layout's own tensors (DTensors of its mesh, or
plain tensors in one process) and DCP reads the overlapping pieces of every file into them.
"""

from __future__ import annotations

import math
import re
import warnings
from pathlib import Path
from typing import Mapping

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import HuggingFaceStorageReader, HuggingFaceStorageWriter
from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

from mindfoundry.backends.base import check_state_names

MOMENTS = ("exp_avg", "exp_avg_sq")
LAYER_GROUPS = 8  # files per rank and folder: 1 + at most this many groups of layers
_LAYER = re.compile(r"^(?:exp_avg\.|exp_avg_sq\.)?layers\.(\d+)\.")


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def _dcp(fn, state: dict, **kwargs) -> None:
    """dcp.save/dcp.load, in one process without its "assuming the intent is ... a single process" warning."""
    no_dist = not _distributed()
    with warnings.catch_warnings():
        if no_dist:
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        fn(state, no_dist=no_dist, **kwargs)


def _moments(params: Mapping[str, torch.Tensor], optimizer: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    """exp_avg.NAME / exp_avg_sq.NAME in the parameters' layout; zeros before the first update."""
    out = {}
    for name, p in params.items():
        st = optimizer.state.get(p, {})
        for key in MOMENTS:
            out[f"{key}.{name}"] = st[key] if key in st else torch.zeros_like(p)
    return out


def file_index(names: list[str]) -> dict[str, int]:
    """Which of a rank's files (1-based, the same on every rank) holds each tensor: 1 for those outside the
    layers, then layers in LAYER_GROUPS contiguous groups."""
    layers = {int(m.group(1)) for n in names if (m := _LAYER.match(n))}
    per = -(-len(layers) // LAYER_GROUPS) if layers else 1
    return {n: 2 + int(m.group(1)) // per if (m := _LAYER.match(n)) else 1 for n in names}


def _folders(folders: tuple[Path, Path] | None) -> tuple[Path, Path]:
    """Rank 0's two shard folders on every rank (collective with several processes)."""
    if not _distributed():
        if folders is None:
            raise ValueError("save_sharded needs the checkpoint's shard folders in a single process")
        return Path(folders[0]), Path(folders[1])
    box = [tuple(map(str, folders)) if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return Path(box[0][0]), Path(box[0][1])


def save(model: torch.nn.Module, params: Mapping[str, torch.Tensor], optimizer: torch.optim.Optimizer,
         folders: tuple[Path, Path] | None, full_shapes: Mapping[str, tuple[int, ...]]) -> None:
    """Write this rank's shards of the weights and moments into `folders` (weights, moments).

    Collective: every rank calls it; rank 0 passes the checkpoint's (temporary) shard folders and the
    others None. When it returns, every rank's files are written and fsynced. `full_shapes`: the
    whole model's parameters (a pipeline rank holds some only; the file split covers all).
    """
    weights_dir, moments_dir = _folders(folders)
    weights = {n: t for n, t in get_model_state_dict(model).items() if n in params}  # this rank's layout (DTensors)
    moment_names = [f"{k}.{n}" for n in full_shapes for k in MOMENTS]
    for folder, state, names in (
        (weights_dir, weights, list(full_shapes)),
        (moments_dir, _moments(params, optimizer), moment_names),
    ):
        writer = HuggingFaceStorageWriter(str(folder), fqn_to_index_mapping=file_index(names), save_distributed=True)
        _dcp(dcp.save, state, storage_writer=writer)
    if _distributed():
        dist.barrier()  # dcp.save already gathered every rank's write results; explicit for the reader


def _metadata(folder: Path) -> dict:
    """DCP's name -> TensorStorageMetadata of a shard folder, read from the safetensors headers; refuses a tensor
    whose pieces do not cover it (a shard file missing)."""
    if not folder.is_dir():
        raise ValueError(f"{folder} is missing")
    meta = HuggingFaceStorageReader(str(folder)).read_metadata().state_dict_metadata
    for name, md in meta.items():
        covered = sum(math.prod(chunk.sizes) for chunk in md.chunks)
        if covered < math.prod(md.size):  # DCP writes a replicated tensor once: pieces never overlap
            raise ValueError(f"{folder}: the pieces of '{name}' hold {covered} of its {math.prod(md.size)} values "
                             "(a shard file is missing)")
    return meta


def stored_shapes(folder: Path) -> dict[str, tuple[int, ...]]:
    """Global name -> shape of the tensors of a shard folder."""
    return {name: tuple(md.size) for name, md in _metadata(folder).items()}


def _check(folder: Path, full_shapes: Mapping[str, tuple[int, ...]], what: str) -> None:
    """The folder holds exactly the model's tensors, at the model's shapes (else check_state_names' message)."""
    stored = {n: np.broadcast_to(np.zeros((), np.float32), s) for n, s in stored_shapes(folder).items()}  # shapes only
    check_state_names(full_shapes, stored, what, full_shapes)


def load(model: torch.nn.Module, params: Mapping[str, torch.Tensor], optimizer: torch.optim.Optimizer,
         folders: tuple[Path, Path], adam_step: int, full_shapes: Mapping[str, tuple[int, ...]]) -> None:
    """Read a sharded checkpoint's (weights, moments) folders into this layout (collective). `full_shapes`: the whole
    model's parameter shapes."""
    weights_dir, moments_dir = map(Path, folders)
    _check(weights_dir, full_shapes, "weights")
    moment_shapes = {f"{k}.{n}": s for n, s in full_shapes.items() for k in MOMENTS}
    _check(moments_dir, moment_shapes, "optimizer state")
    state = get_model_state_dict(model)  # targets in this rank's layout; DCP reads the overlapping pieces
    _dcp(
        dcp.load,
        {n: t for n, t in state.items() if n in params},
        storage_reader=HuggingFaceStorageReader(str(weights_dir)),
    )
    set_model_state_dict(model, state)
    moments = {f"{key}.{name}": torch.zeros_like(p) for name, p in params.items() for key in MOMENTS}
    _dcp(dcp.load, moments, storage_reader=HuggingFaceStorageReader(str(moments_dir)))
    for name, p in params.items():
        optimizer.state[p] = {"step": torch.tensor(float(adam_step)),
                              "exp_avg": moments[f"exp_avg.{name}"], "exp_avg_sq": moments[f"exp_avg_sq.{name}"]}


def read_full(folder: Path) -> dict[str, np.ndarray]:
    """A shard folder consolidated into full arrays in this process (export, other engines)."""
    folder = Path(folder)
    state = {name: torch.empty(md.size, dtype=md.properties.dtype) for name, md in _metadata(folder).items()}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(state, storage_reader=HuggingFaceStorageReader(str(folder)), no_dist=True)  # in this process only
    return {name: t.numpy() for name, t in state.items()}
