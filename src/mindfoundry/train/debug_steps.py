"""The trainer's precision-debugging duties: dumps on chosen steps, fault injection, overflow location.

Kept out of the loop itself: the trainer asks for a probe before a step and hands back the result.
A dumped (or injected) step runs through the engine's hooked debug path; every other step runs the
compiled step untouched, so debugging costs nothing on the steps it does not look at.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Callable

import numpy as np

from mindfoundry.backends.base import Backend, StepOutput, StepScalars
from mindfoundry.config.load import config_hash
from mindfoundry.config.schema import RunConfig
from mindfoundry.config.selection import parse_selection
from mindfoundry.debug.dump import INDEX_FILE, DumpWriter, leaf_dir, read_native_dump
from mindfoundry.debug.dump_folders import holds_dump, open_writer
from mindfoundry.debug.locate import Overflow, locate_overflow
from mindfoundry.debug.probe import Injection, Probe, ProbeError, check_injection, select_modules
from mindfoundry.model.spec import module_classes, module_names, spec_for

OVERFLOW_DIR = "overflow"


class StepDebugger:
    """Decides which steps are dumped or injected, and locates the first non-finite tensor of a failed step."""

    def __init__(
        self, cfg: RunConfig, run_dir: Path, rank: int = 0, log: Callable[[str], None] = print, world_size: int = 1
    ):
        d = cfg.debug
        self.cfg, self.rank, self.log = cfg, rank, log
        # hooked debug steps run in one process; a multi-process run is replayed by `mindfoundry dump`
        self.single_process = world_size == 1
        if not self.single_process and (d.dump.steps or d.inject_inf is not None):
            raise ProbeError(
                f"debug.dump.steps / debug.inject_inf run in a single process, not under a {world_size}-process "
                "launch: train without them and replay the steps with `mindfoundry dump CONFIG --steps ... --resume "
                "auto` (one process, from this run's checkpoint, whatever its layout)"
            )
        self.steps = parse_selection(d.dump.steps)
        ranks = parse_selection(d.dump.ranks, "ranks")
        self.dump_rank = not ranks or rank in ranks
        self.root = Path(d.dump.dir) if d.dump.dir else Path(run_dir) / "dump"
        self.overflow_root = Path(run_dir) / OVERFLOW_DIR
        self._injected: set[int] = set()
        self._drilled: set[tuple[str, int]] = set()
        spec = spec_for(cfg.model)
        self.classes = module_classes(spec)  # msprobe's entry names carry the class
        self._check(module_names(spec))

    def _check(self, names: list[str]) -> None:
        """Fail before training, not at the dumped step: patterns must match, the injected module must exist."""
        d, inj = self.cfg.debug.dump, self.cfg.debug.inject_inf
        if self.steps and {"forward", "backward"} & set(d.directions):
            select_modules(d.modules, names)
        if inj is not None:
            check_injection(inj.module, names)

    def _meta(self, backend: Backend, purpose: str) -> dict[str, Any]:
        return {"backend": backend.name, "precision": self.cfg.train.precision, "purpose": purpose,
                "config_hash": config_hash(self.cfg), "model": self.cfg.model.model_dump()}

    def injection(self, step: int) -> Injection | None:
        """The configured fault for this step, once per process (a re-run of the step for location repeats it)."""
        inj = self.cfg.debug.inject_inf
        if inj is None or inj.step != step or step in self._injected:
            return None
        self._injected.add(step)
        return Injection(inj.module, inj.direction, math.inf if inj.value == "inf" else math.nan)

    def loss_multiplier(self, step: int) -> float:
        """Fault drills (debug.inject_nan_at, inject_spike_at): the loss and gradients of this step multiplied by NaN
        or the spike factor, once each per process (1.0 elsewhere)."""
        d = self.cfg.debug
        for kind, steps, value in (("nan", d.inject_nan_at, math.nan), ("spike", d.inject_spike_at, d.spike_factor)):
            if step in steps and (kind, step) not in self._drilled:
                self._drilled.add((kind, step))
                return value
        return 1.0

    def probe(
        self, step: int, backend: Backend, injection: Injection | None, grad_unscale: float = 1.0
    ) -> Probe | None:
        """A probe for this step: dumping when selected (and not already dumped), and/or injecting."""
        writer = None
        if step in self.steps and self.dump_rank:
            d = self.cfg.debug.dump
            if holds_dump(self.root, step, self.rank):
                self.log(
                    f"step {step}: {leaf_dir(self.root, step, self.rank)} exists (a resumed run repeats this step); "
                    "not dumped again"
                )
            else:
                writer = open_writer(
                    d.format,
                    self.root,
                    step,
                    self.rank,
                    d.mode,
                    {**self._meta(backend, "dump"), "loss_scale": 1.0 / grad_unscale},
                    backend.name,
                    self.classes,
                    self.cfg.train.grad_accum,
                )  # a debug step runs in one process: its micro-batches
        if writer is None and injection is None:
            return None
        d = self.cfg.debug.dump
        return Probe(writer, d.modules, d.directions, injection, grad_unscale)

    @staticmethod
    def finish(probe: Probe | None, out: StepOutput) -> Path | None:
        if probe is None or probe.writer is None:
            return None
        return probe.writer.close(loss=out.loss, grad_norm=out.grad_norm, applied=out.applied)

    def locate(self, step: int, backend: Backend, ids: np.ndarray, labels: np.ndarray, scalars: StepScalars,
               injection: Injection | None) -> tuple[Overflow | None, Path]:
        """Re-run a failed step (its update was dropped, so the state is the step's input) with a
        statistics dump of every module, forward and backward, and find the first non-finite tensor."""
        leaf = leaf_dir(self.overflow_root, step, self.rank)
        if (leaf / INDEX_FILE).exists():  # a repeated step (resume, rollback): keep the first report
            return locate_overflow(read_native_dump(leaf)), leaf
        writer = DumpWriter(self.overflow_root, step, self.rank, "statistics",
                            {**self._meta(backend, "overflow"), "loss_scale": 1.0 / scalars.grad_unscale})
        probe = Probe(writer, ("*",), ("forward", "backward", "params", "grads"), injection, scalars.grad_unscale)
        out = backend.train_step(ids, labels, scalars, probe)
        writer.close(loss=out.loss, grad_norm=out.grad_norm, applied=out.applied)
        found = locate_overflow(read_native_dump(leaf))
        report = found.to_dict() if found else {"message": "the re-run step was finite: the fault did not reproduce"}
        (leaf / "overflow.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
        return found, leaf
