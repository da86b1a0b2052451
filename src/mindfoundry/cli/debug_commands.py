"""`mindfoundry dump|compare|align`: precision debugging from the command line.

dump     replays a run's first steps (or continues from its newest checkpoint) in a scratch folder,
         dumping the chosen steps; the run itself is never touched.
locate   the first non-finite tensor of each dumped step (the overflow locator on request).
compare  two dumps, tensor by tensor: verdicts, first divergence, top-5 modules, CSV and HTML.
align    the same weights and batches through two engines (or precisions), dumped and compared.
Exit status of locate, compare and align: 0 clean/pass, 1 non-finite/fail, 2 bad input.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from mindfoundry.cli.args import add_config_arguments, config_from_args, console, local_path
from mindfoundry.config.load import ConfigError
from mindfoundry.debug.compare import Thresholds
from mindfoundry.debug.dump_folders import FORMATS
from mindfoundry.workflows.align import AlignThresholds

#: Why a dump folder cannot be a URL.
DUMPS_LOCAL = "the engines' hooks write dumps as local files, and the tools read them there (copy a dump here first)"


def cmd_dump(args: argparse.Namespace) -> int:
    from mindfoundry.workflows.replay import DumpChoice, replay_dump

    cfg = config_from_args(args)
    out = Path(args.out) if args.out else Path(cfg.run_dir) / "dump"
    choice = DumpChoice(
        steps=args.steps, mode=args.mode, modules=args.modules, directions=args.directions, format=args.format
    )
    steps, reached = replay_dump(cfg, choice, out, resume=args.resume == "auto", console=console)
    console.print(f"dumped steps {steps} (reached step {reached}) into {out}", highlight=False)
    return 0


def cmd_locate(args: argparse.Namespace) -> int:
    """The first non-finite tensor of each (step, rank) of a dump: the overflow locator on request."""
    from mindfoundry.debug.dump_folders import iter_dumps
    from mindfoundry.debug.locate import locate_overflow

    clean = True
    for dump in iter_dumps(Path(args.dump)):
        found = locate_overflow(dump)
        where = f"step {dump.meta.get('step')} rank {dump.meta.get('rank')}"
        if found is None:
            console.print(f"{where}: all {len(dump.records)} tensors finite", highlight=False)
        else:
            clean = False
            console.print(f"{where}: {found.direction} {found.module}: {found.message()}", highlight=False)
    return 0 if clean else 1


def cmd_compare(args: argparse.Namespace) -> int:
    from mindfoundry.debug.compare import compare_trees
    from mindfoundry.report.compare_report import summary_lines, write_csv, write_html

    comparisons = compare_trees(
        Path(args.dump_a), Path(args.dump_b), Thresholds(cosine_error=args.cosine, rel_error=args.rel_error)
    )
    out = (
        Path(args.out)
        if args.out
        else Path(args.dump_a).parent / f"compare-{Path(args.dump_a).name}-vs-{Path(args.dump_b).name}"
    )
    out.mkdir(parents=True, exist_ok=True)
    for cmp in comparisons:
        leaf = f"step{cmp.meta_a.get('step')}-rank{cmp.meta_a.get('rank')}"
        for line in summary_lines(cmp):
            console.print(line, highlight=False)
        console.print(f"csv: {write_csv(cmp, out / f'{leaf}.csv')}", highlight=False)
    console.print(f"html: {write_html(comparisons, out / 'compare.html')}", highlight=False)
    return 0 if all(c.passed() for c in comparisons) else 1


def cmd_align(args: argparse.Namespace) -> int:
    from mindfoundry.report.compare_report import summary_lines
    from mindfoundry.workflows.align import Side, align

    cfg = config_from_args(args)
    try:
        a, b = Side.parse(args.a), Side.parse(args.b)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    out = Path(args.out) if args.out else Path(cfg.run_dir) / "align" / f"{a.label}-vs-{b.label}"
    thresholds = AlignThresholds(loss_abs=args.loss_abs, loss_rel=args.loss_rel, grad_norm_rel=args.grad_norm_rel)
    result = align(cfg, None, a, b, out, steps=args.steps, mode=args.mode, thresholds=thresholds, log=console.print)
    for line in summary_lines(result.comparisons[0])[:-1]:
        console.print(line, highlight=False)
    for s in result.steps:
        console.print(
            f"step {s.step}: loss {s.loss_a:.6f} vs {s.loss_b:.6f} (abs {s.loss_abs_err:.2e}, rel "
            f"{s.loss_rel_err:.2e}) {'ok' if s.loss_ok else 'FAIL'}; grad norm {s.grad_norm_a:.6f} vs "
            f"{s.grad_norm_b:.6f} (rel {s.grad_norm_rel_err:.2e}) {'ok' if s.grad_norm_ok else 'FAIL'}",
            highlight=False,
        )
    low = result.lowest_cosine()
    if low is not None:
        console.print(f"lowest cosine: {low.cosine:.6g} ({low.name})", highlight=False)
    console.print(f"report: {result.files['html']}; summary: {out / 'align.json'}", highlight=False)
    verdict = "[green]ALIGN PASS[/]" if result.passed else "[red]ALIGN FAIL[/]"
    console.print(
        f"{verdict} {a.label} vs {b.label} (thresholds: loss abs < {thresholds.loss_abs} or rel < "
        f"{thresholds.loss_rel:.1%}; grad norm rel <= {thresholds.grad_norm_rel:.0%})"
    )
    return 0 if result.passed else 1


def add_debug_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "dump", help="replay a run's steps in a scratch folder and dump chosen steps (the run is not touched)"
    )
    add_config_arguments(p)
    p.add_argument("--steps", help="steps to dump, e.g. '1|50-60' (default: debug.dump.steps)")
    p.add_argument("--mode", choices=["statistics", "tensor"], help="statistics (default) or full tensors")
    p.add_argument(
        "--format",
        choices=list(FORMATS),
        help="mindfoundry (default: debug.dump.format) or msprobe: MindStudio Probe's layout, for `msprobe compare`",
    )
    p.add_argument(
        "--modules", nargs="+", metavar="PATTERN", help="module-name patterns, e.g. 'layers.1.*' (default: all)"
    )
    p.add_argument("--directions", nargs="+", choices=["forward", "backward", "params", "grads", "optimizer"])
    p.add_argument("--out", type=local_path(DUMPS_LOCAL), help="dump folder (default RUN_DIR/dump)")
    p.add_argument("--resume", choices=["auto", "none"], default="none",
                   help="auto: start from the run's newest valid checkpoint instead of the initial weights")
    p.set_defaults(func=cmd_dump)

    p = sub.add_parser("locate", help="name the first NaN/Inf tensor (in execution order) of each step of a dump")
    p.add_argument("dump", type=local_path(DUMPS_LOCAL), help="dump folder (a step{N}/rank{R} folder or a dump root)")
    p.set_defaults(func=cmd_locate)

    p = sub.add_parser("compare", help="compare two dumps: cosine, max abs/rel error, RMSE, verdicts, first divergence")
    p.add_argument("dump_a", type=local_path(DUMPS_LOCAL), help="dump folder (a step{N}/rank{R} folder or a dump root)")
    p.add_argument("dump_b", type=local_path(DUMPS_LOCAL), help="the reference dump (e.g. the PyTorch baseline)")
    p.add_argument("--out", type=local_path(DUMPS_LOCAL), help="report folder (default: next to DUMP_A)")
    p.add_argument("--cosine", type=float, default=Thresholds.cosine_error,
                   help=f"error when a tensor's cosine is below this ({Thresholds.cosine_error})")
    p.add_argument("--rel-error", type=float, default=Thresholds.rel_error,
                   help=f"error when RMSE / RMS(reference) is above this ({Thresholds.rel_error})")
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser(
        "align", help="same weights and batches through two engines or precisions; dump, compare, pass/fail"
    )
    add_config_arguments(p)
    p.add_argument("--a", default="mindspore", help="ENGINE[:PRECISION] under test (default mindspore)")
    p.add_argument(
        "--b",
        default="torch",
        help="reference ENGINE[:PRECISION] (default torch), e.g. 'mindspore:fp16' vs --a mindspore",
    )
    p.add_argument("--steps", type=int, default=1, help="optimizer steps to run and compare (default 1)")
    p.add_argument(
        "--mode", choices=["statistics", "tensor"], default="tensor", help="dump mode (tensor: full metrics; default)"
    )
    p.add_argument("--out", type=local_path(DUMPS_LOCAL), help="output folder (default RUN_DIR/align/A-vs-B)")
    p.add_argument(
        "--loss-abs", type=float, default=0.005, help="first-step loss passes when the abs error is below this ..."
    )
    p.add_argument("--loss-rel", type=float, default=0.005, help="... or the relative error below this (0.5%%)")
    p.add_argument(
        "--grad-norm-rel",
        type=float,
        default=AlignThresholds.grad_norm_rel,
        help=f"grad norm relative error allowed per step ({AlignThresholds.grad_norm_rel:.0%})".replace("%", "%%"),
    )
    p.set_defaults(func=cmd_align)
