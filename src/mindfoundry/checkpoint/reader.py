"""Reading a checkpoint folder, whichever form holds it: the two full files, a MindSpore cluster's rank slices, or
torch.distributed.checkpoint's shards.

The format switch and the readers live here, in the checkpoint layer, so callers ask for a checkpoint and get full
arrays (or, with ``tensors=False``, the trainer state for an engine that reads its own shards): no caller hands in a
reader, and the engine-neutral backend interface knows no torch format. Consolidating DCP shards needs torch (its
reader), imported only when such a checkpoint is read.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load_file

from mindfoundry.backends.base import BackendUnavailable
from mindfoundry.checkpoint.rank_slices import holds_rank_slices, read_rank_slices
from mindfoundry.checkpoint.store import (
    MODEL_DIR,
    MODEL_FILE,
    OPTIMIZER_FILE,
    STATE_FILE,
    Checkpoint,
    CheckpointError,
    is_sharded,
    shard_folders,
    verify_checkpoint,
)
from mindfoundry.errors import MindFoundryError

#: The shard forms a checkpoint folder can hold (an engine's ``shard_format`` names the one it reads itself).
RANK_SLICES, DCP = "rank_slices", "torch.distributed.checkpoint"


def shard_format(path: str | Path) -> str | None:
    """Which engine's shard form a checkpoint folder holds: :data:`RANK_SLICES` (MindSpore semi-auto: per-rank slices
    and the strategy file), :data:`DCP`, or None for the full format. An engine whose ``shard_format`` matches reads
    its own pieces; any other gets the folder consolidated into full arrays."""
    if not is_sharded(path):
        return None
    return RANK_SLICES if holds_rank_slices(Path(path) / MODEL_DIR) else DCP


def load_checkpoint(path: str | Path, *, verify: bool = True, tensors: bool = True) -> Checkpoint:
    """Verify (unless the caller just did, e.g. through find_resumable), then read a checkpoint folder: full arrays
    from any form (a sharded one consolidated in this process), or only the trainer state with ``tensors=False``
    (an engine that reshards a checkpoint itself)."""
    path = Path(path)
    if verify:
        verify_checkpoint(path)
    weights: dict[str, np.ndarray] = {}
    optimizer: dict[str, np.ndarray] = {}
    if tensors and is_sharded(path):
        weights, optimizer = _read_sharded(path)
    elif tensors:
        try:
            weights = load_file(str(path / MODEL_FILE))
            optimizer = load_file(str(path / OPTIMIZER_FILE))
        except SafetensorError as exc:
            raise CheckpointError(f"{path}: unreadable safetensors ({exc})") from None
    state = json.loads((path / STATE_FILE).read_text(encoding="utf-8"))
    return Checkpoint(path=path, weights=weights, optimizer=optimizer, state=state)


def _read_sharded(path: Path) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """A sharded checkpoint's weights and moments as full arrays."""
    folders = shard_folders(path)
    if shard_format(path) == RANK_SLICES:  # merged here without an engine
        return read_rank_slices(folders[0]), read_rank_slices(folders[1])
    try:
        return read_dcp_folder(folders[0]), read_dcp_folder(folders[1])
    except MindFoundryError:  # torch not installed: its own message
        raise
    except (OSError, RuntimeError, ValueError, SafetensorError) as exc:
        raise CheckpointError(f"{path}: unreadable sharded checkpoint ({exc})") from None


def read_dcp_folder(folder: Path) -> dict[str, np.ndarray]:
    """One shard folder written by torch.distributed.checkpoint, consolidated into full arrays by torch's own reader
    (whichever engine reads it)."""
    try:
        from mindfoundry.backends.torch.sharded_checkpoint import read_full
    except ModuleNotFoundError as exc:
        raise BackendUnavailable(
            f"{folder.parent} is a sharded checkpoint (written by the torch engine); reading it needs "
            f"{exc.name}: pip install 'mindfoundry[torch]'"
        ) from None
    return read_full(folder)
