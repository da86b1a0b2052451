"""PyTorch's own checkpoint file (`.pt`) <-> the engine-neutral checkpoint contents.

The `.pt` is a plain dict that `torch.load(..., weights_only=True)` reads safely:
``{"model": state_dict, "optimizer": AdamW state_dict, "trainer": {counters}}``. The optimizer part
is in torch.optim.AdamW's own layout for the MindFoundry parameter groups (decay, no-decay), so
``optimizer.load_state_dict(blob["optimizer"])`` works on a model built by this package.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

import numpy as np
import torch

from mindfoundry.config.schema import OptimConfig, RunConfig
from mindfoundry.model.spec import decays, parameter_shapes, spec_for

COUNTERS = ("step", "consumed_samples", "consumed_tokens")


def _group_order(shapes: Mapping[str, tuple[int, ...]]) -> list[str]:
    """Parameter order of build_adamw: module order within groups, decayed matrices first, then 1-D parameters."""
    return [n for n, s in shapes.items() if decays(n, s)] + [n for n, s in shapes.items() if not decays(n, s)]


def _groups(optim: OptimConfig, n_decay: int, n_total: int) -> list[dict]:
    """torch.optim.AdamW's param_groups as state_dict() writes them (load_state_dict takes hyper-parameters from here).
    """
    common = {
        "lr": optim.lr,
        "betas": (optim.beta1, optim.beta2),
        "eps": optim.eps,
        "amsgrad": False,
        "foreach": True,
        "maximize": False,
        "capturable": False,
        "differentiable": False,
        "fused": None,
        "decoupled_weight_decay": True,
    }
    return [dict(common, weight_decay=optim.weight_decay, params=list(range(n_decay))),
            dict(common, weight_decay=0.0, params=list(range(n_decay, n_total)))]


def export_native(weights: Mapping[str, np.ndarray], optimizer: Mapping[str, np.ndarray], state: Mapping, path: Path,
                  cfg: RunConfig) -> None:
    """Write the `.pt`; the run config gives the module order and AdamW settings torch expects."""
    shapes = parameter_shapes(spec_for(cfg.model))
    order = _group_order(shapes)
    step = float(state["step"])
    opt_state = {
        i: {"step": torch.tensor(step), "exp_avg": torch.from_numpy(np.asarray(optimizer[f"exp_avg.{n}"])),
            "exp_avg_sq": torch.from_numpy(np.asarray(optimizer[f"exp_avg_sq.{n}"]))}
        for i, n in enumerate(order)
    }
    n_decay = sum(1 for n, s in shapes.items() if decays(n, s))
    blob = {
        "model": {n: torch.from_numpy(np.asarray(weights[n])) for n in shapes},
        "optimizer": {"state": opt_state, "param_groups": _groups(cfg.optim, n_decay, len(order))},
        "optimizer_param_names": order,
        "trainer": {k: int(state[k]) for k in COUNTERS if k in state},
    }
    torch.save(blob, path)


def import_native(path: Path) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], dict[str, int]]:
    blob = torch.load(path, map_location="cpu", weights_only=True)
    weights = {n: t.float().numpy() for n, t in blob["model"].items()}
    opt = blob["optimizer"]
    optimizer = {}
    for i, name in enumerate(blob["optimizer_param_names"]):
        st = opt["state"].get(i) or {}
        for key in ("exp_avg", "exp_avg_sq"):
            optimizer[f"{key}.{name}"] = st[key].float().numpy() if key in st else np.zeros_like(weights[name])
    return weights, optimizer, dict(blob.get("trainer", {}))
