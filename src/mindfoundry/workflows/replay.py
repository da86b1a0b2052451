"""`mindfoundry dump`: replay a run's steps in a scratch folder and dump the chosen ones; the run is never touched.

The replay runs in one process whatever the run's layout (module hooks need it) on the same
global batch, accumulated; with ``resume`` it starts from the run's newest valid checkpoint before
the first dumped step, so that step is replayed exactly.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from pydantic import ValidationError
from rich.console import Console

from mindfoundry.config.load import ConfigError
from mindfoundry.config.parallel_config import ParallelConfig
from mindfoundry.config.schema import DumpConfig, RunConfig
from mindfoundry.config.selection import parse_selection
from mindfoundry.data.prepare.pipeline import prepare_data
from mindfoundry.errors import OutputExistsError
from mindfoundry.parallel.layout import launch_layout
from mindfoundry.train.trainer import Trainer


@dataclass(frozen=True)
class DumpChoice:
    """What the command line asks to dump; None keeps the config's debug.dump value."""

    steps: str | None = None
    mode: str | None = None
    modules: Sequence[str] | None = None
    directions: Sequence[str] | None = None
    format: str | None = None


def replay_config(cfg: RunConfig, choice: DumpChoice, out: Path) -> RunConfig:
    """The run's config with the chosen dumps, checkpoints off, in a scratch run dir, in one process."""
    chosen = {k: v for k, v in (("steps", choice.steps), ("mode", choice.mode), ("modules", choice.modules),
                                ("directions", choice.directions), ("format", choice.format)) if v}
    try:
        dump = DumpConfig.model_validate({**cfg.debug.dump.model_dump(), **chosen, "dir": str(out)})
    except ValidationError as exc:  # the field's own message (str(exc) ends with pydantic's help URL)
        raise ConfigError("; ".join(e["msg"].removeprefix("Value error, ") for e in exc.errors())) from None
    if not dump.steps:
        raise ConfigError("no steps to dump: pass --steps (e.g. --steps '1|50-60') or set debug.dump.steps")
    t = cfg.train
    return cfg.model_copy(deep=True, update={
        "run_dir": str(out / "replay"),
        # one process whatever the run's layout (hooks need it): the same global batch, accumulated
        "parallel": ParallelConfig(),
        "debug": cfg.debug.model_copy(update={"dump": dump}),
        "checkpoint": cfg.checkpoint.model_copy(update={"every": 0, "keep_last": 1, "dir": None}),
        "train": t.model_copy(update={"eval_every": 0, "grad_accum": t.grad_accum * cfg.parallel.layout().dp}),
        "monitor": cfg.monitor.model_copy(update={"tensorboard": False}),
    })


def replay_dump(cfg: RunConfig, choice: DumpChoice, out: Path, *, resume: bool, console: Console) -> tuple[str, int]:
    """Replay up to the last chosen step, dumping the chosen ones into `out`; returns (the steps dumped, the step
    reached)."""
    dcfg = replay_config(cfg, choice, out)
    if (out / "replay").exists():
        raise OutputExistsError(f"{out} holds an earlier dump: choose another --out (dumps are never overwritten)")
    (out / "replay").mkdir(parents=True)
    data = prepare_data(cfg, log=console.print)
    trainer = Trainer(dcfg, data, out / "replay", launch_layout(dcfg), console)
    steps = parse_selection(dcfg.debug.dump.steps)
    if resume:  # the newest checkpoint before the first dumped step, so that step is replayed
        trainer.resume_from, trainer.resume_before = Path(cfg.run_dir), min(lo for lo, _ in steps.ranges)
    result = trainer.run(resume=resume, stop_at_step=steps.last)
    return dcfg.debug.dump.steps, result.step
