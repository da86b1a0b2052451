"""`mindfoundry data validate|inspect|drops|mindrecord CONFIG`: look at, check and export prepared data.

All of them work on the folder `mindfoundry prepare CONFIG` wrote (``data.output_dir``). Problems
with the data are user errors: one clear line each and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console

from mindfoundry.cli.args import add_config_arguments, config_from_args, local_path
from mindfoundry.data.clean.droplog import DropSummary
from mindfoundry.data.dataset.prepared import local_copy
from mindfoundry.data.document import origin_name
from mindfoundry.storage.resolve import locate

EXIT_INVALID_DATA = 2
# Rich assumes 80 columns when stdout is not a terminal, which would crop the tables in a pipe or log.
_PIPE_WIDTH = 160



def stdout() -> Console:
    """The console for tables: a wide one when stdout is a pipe or a log."""
    console = Console()
    return console if console.is_terminal else Console(width=_PIPE_WIDTH)


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def cmd_validate(args: argparse.Namespace) -> int:
    from mindfoundry.data.dataset.validate import render_validation, validate_prepared

    cfg = config_from_args(args)
    report = validate_prepared(local_copy(cfg), vocab_size=cfg.model.vocab_size, seq_len=cfg.train.seq_len)
    stdout().print(render_validation(report))
    err = Console(stderr=True, soft_wrap=True)
    for shard in report.shards:
        for warning in shard.warnings:
            err.print(f"[yellow]warning:[/] {shard.path}: {warning}", highlight=False)
    if not report.ok:
        for message in report.messages():
            err.print(f"[red]error:[/] {message}", highlight=False)
        return EXIT_INVALID_DATA
    err.print(f"[green]{cfg.data.output_dir}: all {len(report.shards)} shards pass[/]")
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    from mindfoundry.data.dataset.inspect import inspect_prepared, mixture_shares, render_inspect
    from mindfoundry.data.dataset.prepared import load_prepared

    cfg = config_from_args(args)
    data = local_copy(cfg)
    report = inspect_prepared(data, per_category=args.samples, max_chars=args.chars, seed=cfg.seed)
    report.planned = cfg.train.steps * cfg.parallel.layout(cfg.parallel.world_size or 1).global_batch(cfg.train)
    report.shares = mixture_shares(
        load_prepared(data, cfg.model.vocab_size),
        cfg.data.mixture,
        seq_len=cfg.train.seq_len,
        seed=cfg.seed,
        shuffle=cfg.data.shuffle,
        planned=report.planned,
    )
    render_inspect(report, stdout())
    return 0


def print_drops(out: Console, summary: DropSummary, title: str, chars: int) -> None:
    """A drop-log summary: a table of block / reason / action counts in documents and characters (largest first), then
    examples of each."""
    from rich.table import Table

    out.print(title, soft_wrap=True, highlight=False)
    table = Table()
    for column in ("block", "reason", "action", "documents", "characters"):
        table.add_column(column, justify="right" if column in ("documents", "characters") else "left")
    for key, chars in summary.chars.most_common():
        table.add_row(*key, f"{summary.counts[key]:,}", f"{chars:,}")
    out.print(table)
    out.print("by source: " + ", ".join(f"{name} {n:,} ({summary.chars_by_source[name]:,} characters)"
                                        for name, n in summary.by_source.most_common()), soft_wrap=True)
    for (block, reason, action), lines in summary.examples.items():
        out.print(f"\n[bold]{block} / {reason} ({action})[/]")
        for line in lines:
            if line["action"] == "edit":
                measured = f" {line['value']} characters removed"
            else:
                measured = "" if line["value"] is None else f" value {line['value']} (threshold {line['threshold']})"
            kept = f" -> kept {origin_name(line['kept'])}" if "kept" in line else ""
            out.print(f"  {origin_name(line)}{measured}{kept}", highlight=False, soft_wrap=True)
            out.print(f"    {line['excerpt'][:chars]!r}", highlight=False, markup=False, soft_wrap=True)


def cmd_drops(args: argparse.Namespace) -> int:
    from mindfoundry.data.clean.droplog import DROPS_FILE, read_drops, summarise

    cfg = config_from_args(args)
    path = local_copy(cfg) / DROPS_FILE
    summary = summarise(
        read_drops(path), block=args.block, reason=args.reason, source=args.source, examples=args.examples
    )
    out = stdout()
    wanted = ", ".join(
        f"{k}={v}" for k, v in (("block", args.block), ("reason", args.reason), ("source", args.source)) if v
    )
    if not summary.total:
        out.print(f"{path}: no line matches{' ' + wanted if wanted else ''}")
        return 0
    print_drops(
        out,
        summary,
        f"{path}: {summary.total} documents dropped or edited{' (' + wanted + ')' if wanted else ''}",
        args.chars,
    )
    return 0


def cmd_mindrecord(args: argparse.Namespace) -> int:
    from mindfoundry.backends.base import BackendUnavailable

    try:
        from mindfoundry.backends.mindspore.mindrecord import export_mindrecord
    except ModuleNotFoundError as exc:
        raise BackendUnavailable(
            f"MindRecord export needs {exc.name!r}: pip install 'mindfoundry[mindspore]'"
        ) from None
    cfg = config_from_args(args)
    out = locate(args.out if args.out else Path(cfg.run_dir) / "mindrecord", cfg.storage)
    export_mindrecord(local_copy(cfg), out, shards=args.shards)
    Console(stderr=True).print(
        f"wrote {out} ({args.shards} file(s) per split; read with mindspore.dataset.MindDataset)"
    )
    return 0


def cmd_demo_images(args: argparse.Namespace) -> int:
    """Write the image demo corpus (Noto emoji with their CLDR names) from Debian packages fetched into the cache."""
    from mindfoundry.data.images.demo_corpus import write_corpus, write_digits
    from mindfoundry.storage.cache import cache_root

    out = Path(args.out)
    count = write_corpus(cache_root() / "debian", out, limit=args.limit)
    print(f"{out / 'emoji' / '00000.tar'}: {count} emoji with their English CLDR names (Chinese in each .json); "
          "prepare it with configs/demo-images.yaml")
    digits = write_digits(out)
    print(f"{out / 'digits' / '00000.tar'}: {digits} handwritten digits (the linear probe's fitted ones; "
          "configs/demo-mae.yaml and demo-caption.yaml add them)")
    return 0


def add_data_commands(subparsers: argparse._SubParsersAction) -> None:
    """Register `data validate|inspect|drops|mindrecord` on the main parser's subcommands."""
    data = subparsers.add_parser("data", help="validate, inspect or export prepared data (after `prepare`)")
    sub = data.add_subparsers(dest="data_command", required=True)


    p = sub.add_parser("validate", help="check every shard; exit 2 naming shard and problem if any fails")
    add_config_arguments(p)
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("inspect", help="decoded samples per category, token counts, length histogram, removals")
    add_config_arguments(p)
    p.add_argument("--samples", type=_positive_int, default=3, metavar="N", help="documents shown per category")
    p.add_argument("--chars", type=_positive_int, default=160, metavar="N", help="characters shown per document")
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser(
        "drops", help="what cleaning and dedup dropped or edited, and why, with examples (drops.jsonl.gz)"
    )
    add_config_arguments(p)
    p.add_argument("--block", default=None, help="only this block (e.g. repetition, boilerplate, dedup)")
    p.add_argument("--reason", default=None, help="only this reason (e.g. duplicate_15gram_chars, near)")
    p.add_argument("--source", default=None, help="only this source")
    p.add_argument("--examples", type=_positive_int, default=3, metavar="N", help="examples shown per block and reason")
    p.add_argument("--chars", type=_positive_int, default=160, metavar="N", help="characters shown per example")
    p.set_defaults(func=cmd_drops)

    p = sub.add_parser("mindrecord", help="export the prepared documents to MindRecord files (MindDataset)")
    add_config_arguments(p)
    p.add_argument(
        "--out", default=None, metavar="DIR", help="output folder or URL (must not exist); default RUN_DIR/mindrecord"
    )
    p.add_argument("--shards", type=_positive_int, default=1, metavar="N", help="MindRecord files per split")
    p.set_defaults(func=cmd_mindrecord)

    p = sub.add_parser("demo-images", help="write the image demo corpus: Noto Color Emoji with their Unicode CLDR "
                       "names, from Debian packages (apt-get download, once, into the cache)")
    p.add_argument("--out", type=local_path("the corpus is written with tarfile on a disk"),
                   default="corpora/demo-images", metavar="DIR",
                   help="where the corpus goes (default corpora/demo-images; kept if it is there)")
    p.add_argument("--limit", type=_positive_int, default=None, metavar="N", help="at most N emoji")
    p.set_defaults(func=cmd_demo_images)
