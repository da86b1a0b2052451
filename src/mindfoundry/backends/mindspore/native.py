"""MindSpore's own checkpoint file (`.ckpt`) <-> the engine-neutral checkpoint contents.

The `.ckpt` holds the weights under the shared names, the AdamW moments as `exp_avg.NAME` /
`exp_avg_sq.NAME`, and the integer trainer counters, so `mindspore.load_checkpoint` +
`load_param_into_net` restore a MindFoundry MindSpore model (and its AdamW cell) directly.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

import mindspore as ms
import numpy as np

from mindfoundry.config.schema import RunConfig

#: Integer trainer counters carried in the native file (MindSpore stores them as scalar tensors).
COUNTERS = ("step", "consumed_samples", "consumed_tokens")


def export_native(weights: Mapping[str, np.ndarray], optimizer: Mapping[str, np.ndarray], state: Mapping, path: Path,
                  cfg: RunConfig) -> None:
    """`cfg` is unused: names carry everything, and the AdamW cell takes its settings from the run config."""
    tensors = [{"name": n, "data": ms.Tensor(np.asarray(a))} for n, a in {**weights, **optimizer}.items()]
    ms.save_checkpoint(tensors, str(path), append_dict={k: int(state[k]) for k in COUNTERS if k in state})


def import_native(path: Path) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], dict[str, int]]:
    loaded = {name: value.asnumpy() for name, value in ms.load_checkpoint(str(path)).items()}
    counters = {k: int(loaded.pop(k)) for k in COUNTERS if k in loaded}
    optimizer = {k: v for k, v in loaded.items() if k.startswith(("exp_avg.", "exp_avg_sq."))}
    weights = {k: v for k, v in loaded.items() if k not in optimizer}
    return weights, optimizer, counters
