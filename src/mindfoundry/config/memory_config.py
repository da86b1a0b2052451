"""The `memory` section: what the step trades compute for memory with (see docs/memory.md).

None of these options changes the arithmetic of a step: a run may switch them between resumes
(the section is outside the run identity, like `monitor`), and checkpoints move freely between runs
with and without them. Which blocks are recomputed is decided here, once, by
:meth:`MemoryConfig.recomputed_layers`; both engines and the planner ask it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from mindfoundry.config.section import Section

Recompute = Literal["none", "selective", "full"]

#: What `selective` recomputes, in the words the docs, `plan` and the report use. Both engines keep the
#: same tensors (the projections' outputs and the norms) and recompute the same parts (Megatron's choice).
SELECTIVE_RECOMPUTES = "the attention core (scores, mask, softmax, probs @ v) and the SwiGLU activation silu(gate) * up"


class MemoryConfig(Section):
    """Activation memory: recompute, offload to host memory, the loss over the vocabulary in chunks."""

    recompute: Recompute = Field(
        "none",
        description="none: keep every activation for the backward; full: keep only each recomputed block's input and "
        "run its forward again in the backward (~1/3 more compute); selective: recompute "
        + SELECTIVE_RECOMPUTES
        + ", keep the projections' outputs and the norms (a few % more compute).",
    )
    recompute_layers: Literal["all"] | int | list[int] = Field(
        "all", description="Blocks that recompute: all; N = the first N blocks; or a list of block indices (0-based)."
    )
    offload_activations: bool = Field(
        False,
        description="Move the activations saved for the backward to host memory and back (torch engine: "
        "save_on_cpu with pinned buffers; MindSpore: Cell.offload). Accelerators only: on device cpu they already are "
        "in host memory.",
    )
    loss_chunk: int = Field(
        0,
        ge=0,
        le=2**20,
        description="Sequence positions per chunk of the output head and loss: the (micro_batch x chunk x "
        "vocab) logits of one chunk exist at a time, recomputed in the backward, instead of the whole micro-batch's; 0 "
        "= off.",
    )

    @field_validator("recompute_layers")
    @classmethod
    def _layers(cls, v: str | int | list[int]) -> str | int | list[int]:
        if isinstance(v, bool):
            raise ValueError("give all, a number of leading blocks, or a list of block indices, not true/false")
        if isinstance(v, int) and v < 1:
            raise ValueError(f"{v} leading blocks: give at least 1, or set memory.recompute: none")
        if isinstance(v, list):
            if not v:
                raise ValueError("an empty list recomputes nothing: list block indices, or set memory.recompute: none")
            if any(i < 0 for i in v):
                raise ValueError(f"block indices are 0-based and not negative: {[i for i in v if i < 0]}")
            if len(set(v)) != len(v):
                raise ValueError(
                    f"block {sorted(i for i in set(v) if v.count(i) > 1)} listed twice: list each block once"
                )
        return v

    def recomputed_layers(self, n_layers: int) -> tuple[int, ...]:
        """The indices of the blocks that recompute (empty with recompute: none); ValueError naming the key for a
        block the model does not have (config validation reports it through :func:`memory_problems`)."""
        if self.recompute == "none":
            return ()
        chosen = self.recompute_layers
        if chosen == "all":
            return tuple(range(n_layers))
        if isinstance(chosen, int):
            if chosen > n_layers:
                raise ValueError(f"memory.recompute_layers={chosen}: the model has {n_layers} blocks; "
                                 f"use at most {n_layers}, or all")
            return tuple(range(chosen))
        missing = sorted(i for i in chosen if i >= n_layers)
        if missing:
            raise ValueError(
                f"memory.recompute_layers lists block {', '.join(map(str, missing))}, which does not exist: "
                f"the model has {n_layers} blocks (0-{n_layers - 1})"
            )
        return tuple(sorted(chosen))

    def describe(self, n_layers: int) -> str:
        """One line for the console, `smoke` and the report: e.g. 'full recompute (blocks 0-3 of 8), loss in chunks of
        256'."""
        parts = []
        if self.recompute != "none":
            layers = self.recomputed_layers(n_layers)
            which = ("all blocks" if len(layers) == n_layers else
                     f"block{'s' if len(layers) > 1 else ''} {_ranges(layers)} of {n_layers}")
            parts.append(f"{self.recompute} recompute ({which})")
        if self.offload_activations:
            parts.append("activations offloaded to host")
        if self.loss_chunk:
            parts.append(f"loss in chunks of {self.loss_chunk} positions")
        return ", ".join(parts) or "no recompute, no offload, whole-vocabulary loss"


def _ranges(indices: tuple[int, ...]) -> str:
    """(0, 1, 2, 5) -> '0-2, 5'."""
    out, start = [], None
    for i, value in enumerate(indices):
        if start is None:
            start = value
        if i + 1 == len(indices) or indices[i + 1] != value + 1:
            out.append(str(start) if start == value else f"{start}-{value}")
            start = None
    return ", ".join(out)
