"""`mindfoundry ckpt list|best|verify|inspect`: look at a run's checkpoints without loading an engine;
`mindfoundry convert`: a checkpoint to and from the engines' native files."""

from __future__ import annotations

import argparse
import math

from rich.console import Console
from rich.table import Table
from safetensors import safe_open

from mindfoundry.checkpoint.reader import shard_format
from mindfoundry.checkpoint.run_files import checkpoint_dir_of, checkpoint_of, checkpoints_named
from mindfoundry.checkpoint.store import (
    BEST_FILE,
    LATEST_FILE,
    MODEL_DIR,
    MODEL_FILE,
    OPTIMIZER_DIR,
    OPTIMIZER_FILE,
    CheckpointError,
    checkpoint_bytes,
    checkpoint_eval,
    read_state,
)
from mindfoundry.cli.args import add_storage_arguments, console, storage_from_args
from mindfoundry.storage.location import Location
from mindfoundry.storage.resolve import locate

out = Console()


def _size_mb(path: Location) -> float:
    """A checkpoint's size (sharded: its shard folders too) as its manifest lists it."""
    size = checkpoint_bytes(path)
    return float("nan") if size is None else size / 1e6


def cmd_list(args: argparse.Namespace) -> int:
    directory, found = checkpoints_named(args.run_dir, storage_from_args(args))
    latest, best = directory.pointer(LATEST_FILE), directory.pointer(BEST_FILE)
    table = Table(title=f"checkpoints in {directory} (val loss: measured at that step; blank where no evaluation ran)")
    for col in ("checkpoint", "MB", "consumed samples", "val loss", "status"):
        table.add_column(col)
    problems = []
    for path in found:
        try:
            directory.verify(path)
            status = "ok"
        except CheckpointError as exc:
            status = "INVALID"
            problems.append(str(exc))
        state = directory.state(path)
        val = checkpoint_eval(state)
        name = path.name + "".join(
            f"  ({tag})" for tag, pointed in (("latest", latest), ("best", best)) if path.name == pointed
        )
        table.add_row(name, f"{_size_mb(path):.1f}", str(state.get("consumed_samples", "?")),
                      "" if val is None else f"{val:.4f}", status)
    out.print(table)
    for problem in problems:
        out.print(f"[red]INVALID[/] {problem}", highlight=False, soft_wrap=True)
    return 0


def cmd_best(args: argparse.Namespace) -> int:
    """The checkpoint `checkpoints/best` points at, verified, with its validation loss; its path alone on stdout.
    Without the pointer (a run stopped between writing `latest` and `best`), the committed checkpoint it would name."""
    directory = checkpoint_dir_of(args.run_dir, storage_from_args(args))
    name = directory.pointer(BEST_FILE)
    if name is None:
        found = directory.committed()
        if not found:
            raise CheckpointError(f"no committed checkpoints under '{directory}'")
        name = directory.best_of(found)
        if name is None:
            raise CheckpointError(
                f"no checkpoint of {args.run_dir} was evaluated at its own step, so none is best: evaluate where you "
                "checkpoint (train.eval_every a multiple of checkpoint.every; the last step always is)"
            )
        console.print(f"no {BEST_FILE} pointer in {directory} (the run stopped before writing it): the best of its "
                      "committed checkpoints by their own evaluations", highlight=False)
    path = directory.root / name
    directory.verify(path)
    print(path)
    console.print(
        f"best: {name}, validation loss {checkpoint_eval(directory.state(path)):.4f} (sha256 verified)", highlight=False
    )
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    bad = 0
    directory, found = checkpoints_named(args.path, storage_from_args(args))
    for path in found:
        try:
            manifest = directory.verify(path)
            out.print(f"[green]ok[/]  {path}  ({len(manifest['files'])} files, sha256 verified)", highlight=False)
        except CheckpointError as exc:
            bad += 1
            out.print(f"[red]INVALID[/]  {exc}", highlight=False, soft_wrap=True)
    return 2 if bad else 0


def cmd_inspect(args: argparse.Namespace) -> int:
    path = checkpoint_of(args.path, storage_from_args(args))
    state = read_state(path)
    out.print(
        f"[bold]{path}[/]  step {state.get('step')}  (AdamW updates applied: "
        f"{state.get('adam_step', state.get('step'))})"
    )
    for key in (
        "consumed_samples",
        "consumed_tokens",
        "val_loss",
        "val_step",
        "backend",
        "versions",
        "loss_scale",
        "skipped_windows",
        "anomaly",
    ):
        if key in state:
            out.print(f"  {key}: {state[key]}", highlight=False)
    form = shard_format(path)
    if form is not None:
        if form == "rank_slices":  # MindSpore semi-auto: the slices' headers and the strategy file
            from mindfoundry.checkpoint.rank_slices import stored_shapes
        else:  # the shards' headers, through torch
            from mindfoundry.backends.torch.sharded_checkpoint import stored_shapes

        for name in (MODEL_DIR, OPTIMIZER_DIR):
            shapes = stored_shapes(path / name)
            first = next(iter(shapes))
            out.print(
                f"  {name}/ (sharded, {sum(1 for _ in (path / name).glob('*.safetensors'))} shard files, {form}): "
                f"{len(shapes)} tensors, "
                f"{sum(math.prod(s) for s in shapes.values()):,} values; e.g. {first} {list(shapes[first])}",
                highlight=False,
            )
        return 0
    for name in (MODEL_FILE, OPTIMIZER_FILE):
        with safe_open(str(path / name), framework="numpy") as f:
            keys = list(f.keys())
            total = sum(math.prod(f.get_slice(k).get_shape()) for k in keys)
            out.print(
                f"  {name}: {len(keys)} tensors, {total:,} values; e.g. {keys[0]} {f.get_slice(keys[0]).get_shape()}",
                highlight=False,
            )
    return 0


def cmd_convert(args: argparse.Namespace) -> int:
    from mindfoundry.checkpoint.convert import export_checkpoint, import_checkpoint

    storage = storage_from_args(args)
    src, dst = locate(args.source, storage), locate(args.dest, storage)
    if src.is_dir():
        written = export_checkpoint(checkpoint_of(src), dst)
    else:
        native = src.local_path("convert SOURCE", "a .ckpt/.pt file is read from a local disk: copy it here first")
        written = import_checkpoint(native, dst.local_path("convert DEST", "a checkpoint is imported into a run "
                                                          "directory, which is a local folder"))
    print_written(written)
    return 0


def print_written(written: Location) -> None:
    """On stdout, what a conversion or export wrote: each file with its size (and its mode, on a disk)."""
    files = written.files() if written.is_dir() else [written]
    out.print(f"wrote {written}" + ("" if written.is_file() else f" ({len(files)} files)"), highlight=False)
    for f in files:
        mode = f.permissions()
        out.print(f"  {f}  {f.size_and_version()[0]:,} bytes" + ("" if mode is None else f"  mode {mode:o}"),
                  highlight=False)


def cmd_export(args: argparse.Namespace) -> int:
    from mindfoundry.checkpoint.convert import WEIGHTS_ONLY, export_checkpoint
    from mindfoundry.checkpoint.hf_export import export_hf
    from mindfoundry.checkpoint.mindformers_export import export_mindformers

    storage = storage_from_args(args)
    dest = locate(args.out, storage)
    if args.format == "safetensors" and not dest.name.endswith(WEIGHTS_ONLY):
        raise CheckpointError(f"--format safetensors writes one file: give --out a name ending in {WEIGHTS_ONLY}")
    writers = {"hf": export_hf, "mindformers": export_mindformers, "safetensors": export_checkpoint}
    print_written(locate(writers[args.format](checkpoint_of(args.checkpoint, storage), dest)))
    return 0


def add_ckpt_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "convert", help="checkpoint folder (full or sharded) <-> MindSpore .ckpt / PyTorch .pt; -> weights .safetensors"
    )
    p.add_argument("source", help="RUN/checkpoints/step_N folder or URL (export), or a local .ckpt/.pt file (import)")
    p.add_argument(
        "dest", help="output .ckpt/.pt file or .safetensors (weights alone), a path or a URL (export), or a run "
        "directory to import into"
    )
    add_storage_arguments(p)
    p.set_defaults(func=cmd_convert)
    p = sub.add_parser(
        "export", help="a checkpoint as a Hugging Face Llama folder (transformers opens it) or merged weights"
    )
    p.add_argument(
        "checkpoint", help="CKPT/step_N folder or URL (full or sharded), or RUN_DIR / a checkpoint.dir for its newest "
        "valid one"
    )
    p.add_argument(
        "--format",
        choices=["hf", "mindformers", "safetensors"],
        default="hf",
        help="hf: config.json + model.safetensors (Llama names) + tokenizer; mindformers: weights under MindFormers' "
        "Llama names + a MindFormers run YAML over this run's shards + tokenizer; safetensors: one file, our names",
    )
    p.add_argument("--out", required=True, help="output folder (hf, mindformers; must not exist or be empty) or "
                   ".safetensors file; a URL (s3://...) for hf and safetensors: uploaded, then commit.json "
                   "(mindformers: a local folder, its run YAML names the weights by path)")
    add_storage_arguments(p)
    p.set_defaults(func=cmd_export)

    ckpt = sub.add_parser("ckpt", help="list, verify or inspect checkpoints").add_subparsers(
        dest="ckpt_command", required=True
    )
    p = ckpt.add_parser("list", help="a run's checkpoints with size, data position, val loss and status")
    p.add_argument("run_dir", help="RUN_DIR (its checkpoint.dir), or a checkpoint.dir folder or URL")
    add_storage_arguments(p)
    p.set_defaults(func=cmd_list)
    p = ckpt.add_parser(
        "best", help="print the path of the checkpoint with the lowest validation loss (checkpoints/best)"
    )
    p.add_argument("run_dir", help="RUN_DIR (its checkpoint.dir), or a checkpoint.dir folder or URL")
    add_storage_arguments(p)
    p.set_defaults(func=cmd_best)
    p = ckpt.add_parser(
        "verify", help="check sizes and sha256 of a checkpoint (or of all of a run's); exit 2 if any is invalid"
    )
    p.add_argument("path", help="RUN_DIR, a checkpoint.dir (folder or URL), or one CKPT/step_N (folder or URL)")
    add_storage_arguments(p)
    p.set_defaults(func=cmd_verify)
    p = ckpt.add_parser("inspect", help="trainer state and tensor summary of one checkpoint")
    p.add_argument("path", help="CKPT/step_N (folder or URL), or RUN_DIR for its newest valid checkpoint")
    add_storage_arguments(p)
    p.set_defaults(func=cmd_inspect)
