"""The trainer's checkpointed state: each component saves and restores its own entries of trainer_state.json.

trainer_state.json is one flat JSON object (docs/checkpoints.md). Every top-level key belongs to
exactly one component, which writes it (``entries``) and reads it back (``restore``); the trainer
only lists its components. A key an older checkpoint lacks leaves that component's defaults, so
checkpoints of earlier releases keep resuming (tests/checkpoint/test_legacy_resume.py). Only the
smallest state that rebuilds the rest is saved: the LR is a function of the step and the sample
order a function of (seed, position).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Protocol

from mindfoundry.config.schema import OptimConfig
from mindfoundry.train.schedule import Replan, learning_rate


class Component(Protocol):
    """A piece of trainer state that checkpoints itself."""

    def entries(self) -> dict[str, Any]:
        """This component's keys of trainer_state.json with their values (JSON-ready)."""
        ...

    def restore(self, state: Mapping[str, Any]) -> None:
        """Take this component's keys from a checkpoint's trainer state."""
        ...


class HasStateDict(Protocol):
    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...


@dataclass
class Keyed:
    """An object with ``state_dict``/``load_state_dict`` (anomaly monitor, loss scaler, health monitor) stored
    under one key."""

    key: str
    owner: HasStateDict

    def entries(self) -> dict[str, Any]:
        return {self.key: self.owner.state_dict()}

    def restore(self, state: Mapping[str, Any]) -> None:
        self.owner.load_state_dict(state.get(self.key, {}))


@dataclass
class Progress:
    """Where the optimizer is: steps attempted (they drive the LR schedule), AdamW updates applied (AdamW's t, behind
    `step` once updates were dropped), and the schedule's plan: the end it decays to and its re-plans
    (:mod:`.schedule`)."""

    step: int = 0
    adam_step: int = 0
    steps: int | None = None  # the train.steps the schedule decays to (None: a checkpoint that did not record it)
    replans: list[Replan] = field(default_factory=list)

    def entries(self) -> dict[str, Any]:
        plan = {"kind": "warmup_cosine", "step": self.step, "steps": self.steps,
                "replans": [[r.at, r.lr, r.until] for r in self.replans]}
        return {"adam_step": self.adam_step, "lr_schedule": plan}

    def restore(self, state: Mapping[str, Any]) -> None:
        self.step = int(state["step"])  # written by the checkpoint store beside these entries
        self.adam_step = int(state.get("adam_step", self.step))
        plan = state.get("lr_schedule") or {}
        self.steps = plan.get("steps")
        self.replans = [Replan(int(at), float(lr), int(until)) for at, lr, until in plan.get("replans", [])]

    def plan(self, steps: int, optim: OptimConfig) -> Replan | None:
        """Make ``steps`` the schedule's end; when it differs from the end the run was trained towards, re-plan the
        decay from this step (returned; None when nothing was re-planned)."""
        old, self.steps = self.steps, steps
        if old is None or old == steps or self.step < optim.warmup_steps:
            return None
        replan = Replan(self.step, learning_rate(self.step, old, optim, self.replans), steps)
        self.replans.append(replan)
        return replan


@dataclass
class DataPosition:
    """Where the data stream is: samples and tokens consumed, and the windows rollbacks skipped.

    The order itself is rebuilt from (seed, shuffle, position); a category mixture adds its own
    description (``mixture_state``, informational: the sampler is a function of the position too).
    """

    seed: int
    shuffle: bool
    consumed_samples: int = 0
    consumed_tokens: int = 0
    skipped_windows: list[list[int]] = field(default_factory=list)  # [start, end) sample positions
    mixture_state: Any = None  # callable position -> dict, for a mixture source

    def entries(self) -> dict[str, Any]:
        order: dict[str, Any] = {"seed": self.seed, "shuffle": self.shuffle, "position": self.consumed_samples}
        if self.mixture_state is not None:
            order["mixture"] = self.mixture_state(self.consumed_samples)
        return {"consumed_samples": self.consumed_samples, "consumed_tokens": self.consumed_tokens,
                "data_order": order, "skipped_windows": self.skipped_windows}

    def restore(self, state: Mapping[str, Any]) -> None:
        self.consumed_samples = int(state["consumed_samples"])
        self.consumed_tokens = int(state["consumed_tokens"])
        self.skipped_windows = [list(w) for w in state.get("skipped_windows", [])]


@dataclass
class Evaluations:
    """The held-out results a run carries along: the untrained model's (for the final summary) and the latest
    validation loss with the step it was measured at (`val_step`). A checkpoint's own evaluation is the one whose
    `val_step` is its step (:func:`mindfoundry.checkpoint.store.checkpoint_eval`: keep_best, the `best` pointer,
    `ckpt list`); a checkpoint written between evaluations carries the older loss along for the resumed run only."""

    initial: dict[str, Any] | None = None
    val_loss: float | None = None
    val_step: int | None = None

    def measured(self, loss: float, step: int) -> None:
        self.val_loss, self.val_step = loss, step

    def entries(self) -> dict[str, Any]:
        return {"val_loss": self.val_loss, "val_step": self.val_step, "initial_eval": self.initial}

    def restore(self, state: Mapping[str, Any]) -> None:
        self.initial = state.get("initial_eval")
        self.val_loss = state.get("val_loss")
        self.val_step = state.get(
            "val_step"
        )  # None in older checkpoints (release 0.1.0): their loss is of an unknown step


def save_state(components: list[Component]) -> dict[str, Any]:
    """Every component's entries in one dict; two components claiming one key is a bug."""
    out: dict[str, Any] = {}
    for component in components:
        entries = component.entries()
        clash = out.keys() & entries.keys()
        if clash:
            raise RuntimeError(f"trainer state keys {sorted(clash)} are claimed by two components")
        out.update(entries)
    return out


def restore_state(components: list[Component], state: Mapping[str, Any]) -> None:
    for component in components:
        component.restore(state)
