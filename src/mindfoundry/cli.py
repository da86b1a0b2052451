"""Command line: `mindfoundry config|prepare|train|run ...`.

User errors (bad config, missing data, corrupted files, occupied run directory) print one clear
message and exit with status 2; tracebacks are reserved for bugs. Training exit codes: 0 done,
2 user error, 3 stopped by the anomaly policy, 70 crashed (after a last-gasp checkpoint when the
state was consistent), 75 pre-empted by SIGTERM/SIGINT (checkpoint written).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Sequence

from rich.console import Console
from rich.table import Table

from mindfoundry.cli_args import add_config_arguments, config_from_args
from mindfoundry.config.load import ConfigError, to_yaml
from mindfoundry.config.schema import RunConfig
from mindfoundry.cli_ckpt import add_ckpt_commands
from mindfoundry.cli_report import add_report_commands
from mindfoundry.cli_data import add_data_commands
from mindfoundry.cli_debug import add_debug_commands
from mindfoundry.cli_parallel import add_parallel_commands

console = Console(stderr=True, soft_wrap=True)  # never wrap: one problem = one line
EXIT_USER_ERROR = 2


def _user_errors() -> tuple[type[BaseException], ...]:
    """Exception types that mean 'fix your input', gathered from the modules that raise them."""
    from mindfoundry.backends.base import BackendUnavailable
    from mindfoundry.checkpoint.store import CheckpointError
    from mindfoundry.data.dataset.indexed import ShardError
    from mindfoundry.data.dataset.prepared import DataError
    from mindfoundry.data.ingest.files import DataSourceError
    from mindfoundry.data.prepare.tokenizer import TokenizerError
    from mindfoundry.debug.dump import DumpError
    from mindfoundry.debug.probe import ProbeError
    from mindfoundry.monitor.records import MetricsError
    from mindfoundry.train.rundir import RunDirError
    from mindfoundry.parallel.launch import LaunchError
    from mindfoundry.parallel.layout import LayoutError

    return (LayoutError, LaunchError, ConfigError, DataError, DataSourceError, ShardError, CheckpointError, RunDirError, BackendUnavailable,
            TokenizerError, MetricsError, DumpError, ProbeError, FileExistsError, FileNotFoundError)



def cmd_config(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    if args.action == "show":
        sys.stdout.write(to_yaml(cfg))
    else:
        console.print(f"[green]{args.config}: valid[/]")
    return 0


def cmd_prepare(args: argparse.Namespace) -> int:
    from mindfoundry.data.prepare.pipeline import prepare_data
    from mindfoundry.train.rundir import prepare_run_dir

    cfg = config_from_args(args)
    prepare_run_dir(cfg, resume=True, overwrite=False)  # claims RUN_DIR for this config (refuses another run's)
    prepare_data(cfg, overwrite=args.overwrite, log=console.print)
    return 0


def _train(cfg: RunConfig, args: argparse.Namespace):
    from mindfoundry.data.prepare.pipeline import prepare_data, wait_for_prepared
    from mindfoundry.model.spec import ModelSpec, flops_per_token, num_parameters
    from mindfoundry.parallel.layout import launched_rank
    from mindfoundry.train.rundir import prepare_run_dir
    from mindfoundry.train.trainer import Trainer, check_layout

    check_layout(cfg)
    resume = args.resume == "auto"
    if launched_rank() == 0:  # under torchrun/msrun one process claims the run dir and prepares the data
        run_dir = prepare_run_dir(cfg, resume=resume, overwrite=args.overwrite)
        data = prepare_data(cfg, log=console.print)
    else:  # the others wait for its atomic prepare and then only read
        run_dir, data = Path(cfg.run_dir), wait_for_prepared(cfg)
    spec = ModelSpec.from_config(cfg.model)
    console.print(f"model: {num_parameters(spec):,} parameters, {flops_per_token(spec, cfg.train.seq_len):,} FLOPs/token; "
                  f"backend {cfg.backend}; run dir {run_dir}")
    trainer = Trainer(cfg, data, run_dir, console)
    return trainer, data, trainer.run(resume=resume, stop_at_step=args.stop_at_step)


def cmd_train(args: argparse.Namespace) -> int:
    _, _, result = _train(config_from_args(args), args)
    if result.final_eval:
        console.print(f"step {result.step}: validation loss {result.final_eval.loss:.4f}, ppl {result.final_eval.perplexity:.2f}")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from mindfoundry.data.prepare.tokenizer import eos_id, pad_id
    from mindfoundry.eval.generate import generate

    cfg = config_from_args(args)
    trainer, data, result = _train(cfg, args)
    if result.step < cfg.train.steps:
        console.print(f"stopped at step {result.step} of {cfg.train.steps}; continue with --resume auto")
        return 0
    final = result.final_eval or trainer.evaluate()
    g = cfg.generate
    samples = []
    for i, prompt in enumerate(g.prompts):
        ids = data.tokenizer.encode(prompt).ids
        out = generate(result.backend, ids, window=cfg.train.seq_len, max_new_tokens=g.max_new_tokens,
                       temperature=g.temperature, top_k=g.top_k, eos_id=eos_id(data.tokenizer),
                       pad_id=pad_id(data.tokenizer), seed=cfg.seed + i)
        samples.append({"prompt": prompt, "completion": data.tokenizer.decode(out)})
    summary = {
        "run_dir": cfg.run_dir, "steps": result.step, "backend": cfg.backend,
        "initial": result.initial_eval.to_dict() if result.initial_eval else None,
        "final": final.to_dict(), "samples": samples,
    }
    Path(cfg.run_dir, "summary.json").write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    _print_summary(summary)
    from mindfoundry.report.render import write_report

    console.print(f"report: {write_report(cfg.run_dir, None, None)}")
    return 0


def cmd_smoke(args: argparse.Namespace) -> int:
    from mindfoundry.data.prepare.pipeline import prepare_data
    from mindfoundry.train.rundir import prepare_run_dir
    from mindfoundry.workflows.smoke import first_step_agreement, run_smoke

    cfg = config_from_args(args)
    prepare_run_dir(cfg, resume=True, overwrite=False)
    data = prepare_data(cfg, log=console.print)
    checks = run_smoke(cfg, data, args.steps, console)
    if args.compare_backend:
        checks.append(first_step_agreement(cfg, data))
    table = Table(title=f"smoke test: {args.steps} steps of {args.config} ({cfg.backend})")
    for col in ("check", "result", "value"):
        table.add_column(col)
    for c in checks:
        mark = "[green]PASS[/]" if c.passed else ("[red]FAIL[/]" if c.passed is False else "info")
        table.add_row(c.name, mark, c.value)
    Console().print(table)
    failed = [c for c in checks if c.passed is False]
    for c in failed:
        console.print(f"[red]FAIL[/] {c.name}: {c.value}. Likely cause: {c.hint}", highlight=False)
    return 1 if failed else 0


def cmd_convert(args: argparse.Namespace) -> int:
    from mindfoundry.checkpoint.convert import export_checkpoint, import_checkpoint

    src, dst = Path(args.source), Path(args.dest)
    out = export_checkpoint(src, dst) if src.is_dir() else import_checkpoint(src, dst)
    console.print(f"wrote {out}")
    return 0


def _print_summary(summary: dict) -> None:
    table = Table(title=f"held-out evaluation ({summary['run_dir']})")
    for col in ("", "loss", "perplexity", "bits/byte"):
        table.add_column(col)
    for label, key in (("untrained (step 0)", "initial"), (f"trained (step {summary['steps']})", "final")):
        r = summary[key]
        if r:
            table.add_row(label, f"{r['val_loss']:.4f}", f"{r['val_perplexity']:.2f}", f"{r['val_bits_per_byte']:.4f}")
    out = Console()
    out.print(table)
    for s in summary["samples"]:
        out.print(f"[bold]{s['prompt']!r}[/] -> {s['completion']!r}", highlight=False)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mindfoundry", description="Pretrain decoder-only LLMs on MindSpore.")
    sub = parser.add_subparsers(dest="command", required=True)


    p = sub.add_parser("config", help="validate or show a config")
    p.add_argument("action", choices=["validate", "show"])
    add_config_arguments(p)
    p.set_defaults(func=cmd_config)

    p = sub.add_parser("prepare", help="raw text -> tokenizer -> Megatron shards")
    add_config_arguments(p)
    p.add_argument("--overwrite", action="store_true", help="rebuild prepared data (old folder moved aside)")
    p.set_defaults(func=cmd_prepare)

    for name, func, text in (("train", cmd_train, "train (prepares data first if needed)"),
                             ("run", cmd_run, "prepare -> train -> evaluate -> sample")):
        p = sub.add_parser(name, help=text)
        add_config_arguments(p)
        p.add_argument("--resume", choices=["auto", "none"], default="none", help="auto: continue from the newest valid checkpoint")
        p.add_argument("--overwrite", action="store_true", help="start over in a run dir that holds a run (old run moved aside)")
        p.add_argument("--stop-at-step", type=int, default=None, metavar="N", help="checkpoint and stop after step N (continue later with --resume auto)")
        p.add_argument("--max-restarts", type=int, default=0, metavar="N",
                       help="restart a crashed run up to N times from its newest valid checkpoint")
        p.set_defaults(func=func)
    p = sub.add_parser("smoke", help="a few dozen real steps with pass/fail checks before the big run")
    add_config_arguments(p)
    p.add_argument("--steps", type=int, default=30, help="smoke steps (default 30)")
    p.add_argument("--compare-backend", action="store_true", help="also compare the first step of MindSpore and PyTorch")
    p.set_defaults(func=cmd_smoke)

    p = sub.add_parser("convert", help="checkpoint folder (full or sharded) <-> MindSpore .ckpt / PyTorch .pt; -> weights .safetensors")
    p.add_argument("source", help="RUN/checkpoints/step_N folder (export) or a .ckpt/.pt file (import)")
    p.add_argument("dest", help="output .ckpt/.pt file or .safetensors (weights alone) (export), or a run directory to import into")
    p.set_defaults(func=cmd_convert)
    add_data_commands(sub)
    add_ckpt_commands(sub)
    add_report_commands(sub)
    add_debug_commands(sub)
    add_parallel_commands(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from mindfoundry.train.anomaly import AnomalyStop
    from mindfoundry.workflows.supervise import EXIT_ANOMALY_STOP, EXIT_CRASHED, EXIT_PREEMPTED, supervise
    from mindfoundry.train.trainer import Preempted

    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    if getattr(args, "max_restarts", 0):
        return supervise(argv, args.max_restarts, console.print)
    try:
        return args.func(args)
    except ConfigError as exc:
        console.print(f"[red]config error:[/] {exc}", highlight=False)
        return EXIT_USER_ERROR
    except _user_errors() as exc:
        console.print(f"[red]error:[/] {exc}", highlight=False)
        return EXIT_USER_ERROR
    except Preempted as exc:
        console.print(f"[yellow]{exc}[/]", highlight=False)
        return EXIT_PREEMPTED
    except AnomalyStop as exc:
        console.print(f"[red]anomaly stop:[/] {exc}", highlight=False)
        return EXIT_ANOMALY_STOP
    except Exception:
        console.print_exception()
        return EXIT_CRASHED


if __name__ == "__main__":
    sys.exit(main())
