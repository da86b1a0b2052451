"""MindFormers users' vocabulary: its ``parallel_config`` names in the ``parallel`` section and ``optim.warmup_ratio``.

A team coming from MindFormers writes ``parallel: {data_parallel: 2, model_parallel: 4, optimizer_shard: true,
gradient_aggregation_group: 4}``; :func:`canonical` turns such a tree into our keys before validation, so the
resolved config (``config show``, a run's ``config.yaml``, its identity hash) has one form whatever was
written. An alias and its canonical key given together with different values is an error naming both; the
same value twice is accepted. ``optim.warmup_ratio`` (a share of ``train.steps``, 0.01-0.02 in the source
documents) becomes ``optim.warmup_steps`` = round(ratio * train.steps), after ``--set`` overrides.
"""

from __future__ import annotations

import copy
from typing import Any

from mindfoundry.config.schema import TrainConfig

#: MindFormers parallel_config name (under ``parallel``) -> our dotted key. ``optimizer_shard`` is already ours.
PARALLEL_ALIASES: dict[str, str] = {
    "data_parallel": "parallel.dp_replicate",
    "model_parallel": "parallel.tp",
    "pipeline_stage": "parallel.pp",
    "micro_batch_num": "train.grad_accum",  # the pipeline's micro-batches are train.grad_accum micro-batches
    "expert_parallel": "parallel.ep",
    "context_parallel": "parallel.cp",
    "use_seq_parallel": "parallel.sequence_parallel",
    "gradient_aggregation_group": "parallel.grad_fusion_groups",
}

_UNSET = object()


def canonical(tree: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """(``tree`` with every alias moved to its canonical key, the conflicts found as messages). A copy when anything
    moved."""
    problems: list[str] = []
    parallel, optim = tree.get("parallel"), tree.get("optim")
    aliased = isinstance(parallel, dict) and any(k in parallel for k in PARALLEL_ALIASES)
    ratio = isinstance(optim, dict) and "warmup_ratio" in optim
    if not (aliased or ratio):
        return tree, problems
    tree = copy.deepcopy(tree)
    if aliased:
        for alias, target in PARALLEL_ALIASES.items():
            if alias in tree["parallel"]:
                _move(tree, f"parallel.{alias}", tree["parallel"].pop(alias), target, problems)
    if ratio:
        _warmup(tree, tree["optim"].pop("warmup_ratio"), problems)
    return tree, problems


def _move(tree: dict[str, Any], alias: str, value: Any, target: str, problems: list[str]) -> None:
    section, key = target.split(".")
    holder = tree.setdefault(section, {})
    if not isinstance(holder, dict):
        return  # validation names the section that is not a mapping
    current = holder.get(key, _UNSET)
    if current is not _UNSET and current != value:
        problems.append(f"{alias}={value!r} (MindFormers' name for {target}) conflicts with {target}={current!r}: "
                        "keep one of the two keys")
        return
    holder[key] = value


def _warmup(tree: dict[str, Any], ratio: Any, problems: list[str]) -> None:
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 <= ratio <= 1:
        problems.append(
            f"optim.warmup_ratio={ratio!r}: give the share of train.steps spent warming up, between 0 and 1 "
            "(e.g. 0.01-0.02), or optim.warmup_steps"
        )
        return
    if "warmup_steps" in tree["optim"]:
        problems.append(
            f"optim.warmup_ratio={ratio} and optim.warmup_steps={tree['optim']['warmup_steps']!r} both set the "
            "warmup: keep one of the two keys"
        )
        return
    train = tree.get("train")
    default = TrainConfig.model_fields["steps"].default
    steps = train.get("steps", default) if isinstance(train, dict) else default
    if isinstance(steps, int) and not isinstance(steps, bool):
        tree["optim"]["warmup_steps"] = round(ratio * steps)
    # a malformed train.steps: validation names it

