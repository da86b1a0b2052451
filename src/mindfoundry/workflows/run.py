"""The workflows behind `prepare`, `train` and `run`: each chains the stages and returns what the CLI prints.

train: the launch is checked (the layout rules with the launcher's process count, once per
process), rank 0 claims the run directory and prepares the data while the other ranks wait for
its atomic commit, then the trainer runs. run: train, then the held-out evaluation, sample
generations, summary.json and the HTML report.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
from rich.console import Console

from mindfoundry.backends.base import check_device, create_backend
from mindfoundry.config.parallel_config import Layout
from mindfoundry.config.schema import RunConfig
from mindfoundry.data.dataset.masking import TEXTS, masking_for
from mindfoundry.data.dataset.packing import IGNORE_INDEX
from mindfoundry.data.dataset.prepared import PreparedData, prepared_location
from mindfoundry.data.prepare.output import claim_output
from mindfoundry.data.prepare.pipeline import prepare_data, wait_for_prepared
from mindfoundry.data.tokenizer import eos_id
from mindfoundry.eval.captioning import greedy_caption
from mindfoundry.eval.fill_mask import fill_masks
from mindfoundry.eval.sampling import generate
from mindfoundry.model.spec import ModelSpec, flops_per_token, num_parameters, spec_for
from mindfoundry.parallel.layout import launch_layout, launched_rank, launched_scheduler
from mindfoundry.parallel.planner import (
    CPU_FIXED_OVERHEAD,
    DEFAULT_FIXED_OVERHEAD,
    check_host_fit,
    estimate,
    format_bytes,
    memory_options,
)
from mindfoundry.train.rundir import HASH_FILE, claim_run_dir
from mindfoundry.train.trainer import Trainer, TrainResult
from mindfoundry.workflows.evaluate import probe_digits


def check_launch(cfg: RunConfig) -> Layout:
    """The layout under this launch (one process without a launcher); LayoutError before anything is written,
    and on CPU MemoryFitError when the estimated peak exceeds this machine's memory.

    A tp=2 config started as one process is refused here instead of silently training on one device;
    whether the engine implements the layout is its own check, when the backend is created. A device the engine
    cannot reach is refused here too, before any data is prepared."""
    layout = launch_layout(cfg)
    if cfg.device not in ("cpu", "auto"):  # (cpu is always there; auto takes what is)
        check_device(cfg)
    spec = spec_for(cfg.model)
    if cfg.device == "cpu" and isinstance(spec, ModelSpec):  # (the planner models the language models' memory)
        check_host_fit(spec, layout, cfg.train.micro_batch_size, cfg.train.seq_len,
                       cfg.train.precision, processes=layout.world_size, memory=cfg.memory)
    return layout


def dry_start(cfg: RunConfig) -> list[str]:
    """What `train --dry-run` checks and reports: the launch layout and the memory it needs (errors as for a
    real start), the model's size, and what the run directory holds; nothing is written."""
    layout = check_launch(cfg)
    spec = spec_for(cfg.model)
    run_dir = Path(cfg.run_dir)
    state = "holds a run" if (run_dir / HASH_FILE).is_file() else "is new" if not run_dir.exists() else "exists"
    t = cfg.train
    overhead = CPU_FIXED_OVERHEAD if cfg.device == "cpu" else DEFAULT_FIXED_OVERHEAD
    if isinstance(spec, ModelSpec):
        est = estimate(spec, layout, t.micro_batch_size, t.seq_len, t.precision,
                       **memory_options(cfg.memory, spec.n_layers), num_micro_batches=t.grad_accum,
                       fixed_overhead_bytes=overhead)
        planned = f"planned peak {format_bytes(est.total)} per process (activations {format_bytes(est.activations)})"
    else:
        planned = f"no planned peak: the planner models language models, not model.objective={cfg.model.objective}"
    return [
        f"model: {num_parameters(spec):,} parameters, {flops_per_token(spec, cfg.train.seq_len):,} FLOPs/token; "
        f"backend {cfg.backend}",
        f"layout: {layout}; global batch {layout.global_batch(cfg.train)} "
        f"{'images' if cfg.model.is_image else f'sequences of {cfg.train.seq_len}'}",
        f"memory: {cfg.memory.describe(spec.n_layers)}; {planned}",
        f"run dir {run_dir} {state}; data {cfg.data.output_dir}",
        "dry run: the config, the launch and the memory check pass; nothing was written",
    ]


def prepare(cfg: RunConfig, *, overwrite: bool = False, log: Callable[[str], None] = print) -> PreparedData:
    """Claim RUN_DIR for this config (refusing another run's) and prepare its data (reused when unchanged)."""
    claim_run_dir(cfg, resume=True, overwrite=False, log=log)
    return prepare_data(cfg, overwrite=overwrite, log=log)


@dataclass
class TrainedRun:
    trainer: Trainer
    data: PreparedData
    result: TrainResult


def train(cfg: RunConfig, *, resume: bool, overwrite: bool, stop_at_step: int | None, console: Console) -> TrainedRun:
    """Check the launch, claim the run dir and prepare the data (rank 0), then train to the end or `stop_at_step`."""
    layout = check_launch(cfg)
    if (
        launched_scheduler()
    ):  # msrun's scheduler: it joins the cluster as its meta server (in the engine) and never trains;
        create_backend(
            cfg, spec_for(cfg.model), layout
        )  # it must not claim the run dir that rank 0 claims
        raise SystemExit(0)  # not reached: MindSpore ends the scheduler process when the job ends
    with contextlib.ExitStack() as held:
        if launched_rank() == 0:  # under torchrun/msrun one process claims the run dir and prepares the data
            run_dir = claim_run_dir(cfg, resume=resume, overwrite=overwrite, layout=layout, log=console.print)
            data = prepare_data(cfg, log=console.print)
            # and holds the data while the job trains: a `prepare --overwrite` of it is refused, naming this process
            held.callback(claim_output(prepared_location(cfg), shared=True).release)
        else:  # the others wait for its atomic prepare and then only read
            run_dir, data = Path(cfg.run_dir), wait_for_prepared(cfg)
        spec = spec_for(cfg.model)
        console.print(
            f"model: {num_parameters(spec):,} parameters, {flops_per_token(spec, cfg.train.seq_len):,} FLOPs/token; "
            f"backend {cfg.backend}; run dir {run_dir}"
        )
        trainer = Trainer(cfg, data, run_dir, layout, console)
        return TrainedRun(trainer, data, trainer.run(resume=resume, stop_at_step=stop_at_step))


#: Validation images a finished captioner's summary captions (evenly spaced over the split).
CAPTIONS_SHOWN = 6


def deliverables(cfg: RunConfig, trained: TrainedRun) -> dict[str, Any]:
    """What a finished run shows of its model: text samples (clm, mlm); an encoder's digits probe (mae); a captioner's
    captions of validation images beside their own, and its held-out loss with shuffled images (caption)."""
    backend = trained.result.backend
    if cfg.model.objective == "mae":
        return {"probe": {"digits": probe_digits(backend, cfg)}}
    if cfg.model.objective != "caption":
        return {"samples": samples(cfg, trained)}
    heldout = trained.trainer.held_out.samples
    tokenizer, eos, shown = trained.data.tokenizer, eos_id(trained.data.tokenizer), []
    for i in np.linspace(0, len(heldout) - 1, min(CAPTIONS_SHOWN, len(heldout))).round().astype(np.int64):
        pixels, labels = heldout.get_batch(np.array([i]))
        ids = greedy_caption(backend, pixels[0], cfg.train.seq_len, eos)
        shown.append({"caption": tokenizer.decode([t for t in labels[0].tolist() if t not in (IGNORE_INDEX, eos)]),
                      "generated": tokenizer.decode(ids)})
    return {"captions": shown,
            # the samples the final evaluation scored, each caption with another image
            "shuffled_images": trained.trainer.held_out.with_shuffled_images().score(
                backend, trained.trainer.loader.global_micro_batch, cfg.train.eval_samples).to_dict("")}


def samples(cfg: RunConfig, trained: TrainedRun) -> list[dict[str, str]]:
    """Continuations of cfg.generate's prompts by the trained model (seeded per prompt); for the mlm objective, the
    prompts with masked tokens and the model's fill of them."""
    g, tokenizer = cfg.generate, trained.data.tokenizer
    masking = masking_for(cfg, tokenizer, TEXTS)
    if masking is not None:
        return fill_masks(trained.result.backend, tokenizer, list(g.prompts), masking, cfg.train.seq_len)
    out = []
    for i, prompt in enumerate(g.prompts):
        ids = generate(
            trained.result.backend,
            tokenizer.encode(prompt).ids,
            max_seq_len=cfg.model.max_seq_len,
            max_new_tokens=g.max_new_tokens,
            temperature=g.temperature,
            top_k=g.top_k,
            eos_id=eos_id(tokenizer),
            seed=cfg.seed + i,
        )
        out.append({"prompt": prompt, "completion": tokenizer.decode(ids)})
    return out


@dataclass
class RunSummary:
    """What `mindfoundry run` produced: the summary.json content and the report, or the step it stopped at."""

    trained: TrainedRun
    summary: dict[str, Any] | None = None
    report: Path | None = None


def run(cfg: RunConfig, *, resume: bool, overwrite: bool, stop_at_step: int | None, console: Console) -> RunSummary:
    """prepare -> train -> held-out evaluation -> samples -> RUN_DIR/summary.json -> RUN_DIR/report.html.

    A run stopped before train.steps (``stop_at_step``) returns without a summary: it continues with
    --resume auto."""
    trained = train(cfg, resume=resume, overwrite=overwrite, stop_at_step=stop_at_step, console=console)
    result = trained.result
    if result.step < cfg.train.steps:
        return RunSummary(trained)
    final = result.final_eval or trained.trainer.evaluate()
    summary = {
        "run_dir": cfg.run_dir, "steps": result.step, "backend": cfg.backend,
        "initial": result.initial_eval.to_dict() if result.initial_eval else None,
        "final": final.to_dict(),
        **deliverables(cfg, trained),
    }
    Path(cfg.run_dir, "summary.json").write_text(
        json.dumps(summary, indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
    )
    from mindfoundry.report.render import write_report  # matplotlib loads only when a report is written

    return RunSummary(trained, summary, write_report(cfg.run_dir, None, None))
