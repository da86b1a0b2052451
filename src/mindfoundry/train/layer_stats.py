"""Per-module statistics from host-side numbers: gradient norm, weight norm, update-to-weight ratio.

Both engines return per-parameter squared gradient norms with every step (they are computed for
the global norm anyway); weights are compared before and after a step on the host. Parameters are
grouped by module boundary (embed, layers.i, norm, lm_head), the granularity at which
practitioners read these numbers.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np


def module_of(name: str) -> str:
    """`layers.3.attn.q_proj.weight` -> `layers.3`; `embed.weight` -> `embed`."""
    parts = name.split(".")
    return ".".join(parts[:2]) if parts[0] == "layers" else parts[0]


def _group_sq(values: Mapping[str, float]) -> dict[str, float]:
    out: dict[str, float] = {}
    for name, sq in values.items():
        out[module_of(name)] = out.get(module_of(name), 0.0) + float(sq)
    return out


def layer_grad_norms(names: list[str], grad_sq: np.ndarray) -> dict[str, float]:
    return {m: float(np.sqrt(v)) for m, v in _group_sq(dict(zip(names, grad_sq))).items()}


def layer_weight_norms(weights: Mapping[str, np.ndarray]) -> dict[str, float]:
    sq = {n: float(np.square(w, dtype=np.float64).sum()) for n, w in weights.items()}
    return {m: float(np.sqrt(v)) for m, v in _group_sq(sq).items()}


def layer_update_ratios(before: Mapping[str, np.ndarray], after: Mapping[str, np.ndarray]) -> dict[str, float]:
    """||W_after - W_before|| / ||W_before|| per module (typically ~1e-3 in healthy training)."""
    delta = _group_sq({n: float(np.square(after[n].astype(np.float64) - before[n]).sum()) for n in before})
    base = _group_sq({n: float(np.square(w, dtype=np.float64).sum()) for n, w in before.items()})
    return {m: float(np.sqrt(delta[m] / base[m])) if base[m] > 0 else float("nan") for m in base}
