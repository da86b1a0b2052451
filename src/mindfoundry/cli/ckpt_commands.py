"""`mindfoundry ckpt list|best|verify|inspect`: look at a run's checkpoints without loading an engine;
`mindfoundry convert`: a checkpoint to and from the engines' native files."""

from __future__ import annotations

import argparse
import json
import math
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table
from safetensors import safe_open

from mindfoundry.checkpoint.reader import shard_format
from mindfoundry.checkpoint.run_files import checkpoint_dir_of, checkpoint_of, checkpoints_named
from mindfoundry.checkpoint.store import (
    BEST_FILE,
    LATEST_FILE,
    MANIFEST_FILE,
    MODEL_DIR,
    MODEL_FILE,
    OPTIMIZER_DIR,
    OPTIMIZER_FILE,
    CheckpointError,
    checkpoint_eval,
    read_state,
    written_files,
)
from mindfoundry.cli.args import console
from mindfoundry.errors import OutputExistsError
from mindfoundry.storage.commit import publish
from mindfoundry.storage.location import Location, locate

out = Console()


def _size_mb(path: Location) -> float:
    """A checkpoint's size (sharded: its shard folders too): its files on a local disk, its manifest's sum on a store.
    """
    if isinstance(path, Path):
        return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 1e6
    try:
        manifest = json.loads((path / MANIFEST_FILE).read_bytes())
        return sum(int(meta["bytes"]) for meta in manifest["files"].values()) / 1e6
    except (OSError, ValueError, KeyError, TypeError):
        return float("nan")


def cmd_list(args: argparse.Namespace) -> int:
    directory, found = checkpoints_named(args.run_dir)
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
    """The checkpoint `checkpoints/best` points at, verified, with its validation loss; its path alone on stdout."""
    directory = checkpoint_dir_of(args.run_dir)
    name = directory.pointer(BEST_FILE)
    if name is None:
        if not directory.committed():
            raise CheckpointError(f"no committed checkpoints under '{directory}'")
        raise CheckpointError(
            f"no checkpoint of {args.run_dir} was evaluated at its own step, so none is best: evaluate where you "
            "checkpoint (train.eval_every a multiple of checkpoint.every; the last step always is)"
        )
    path = directory.root / name
    directory.verify(path)
    print(path)
    console.print(
        f"best: {name}, validation loss {checkpoint_eval(directory.state(path)):.4f} (sha256 verified)", highlight=False
    )
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    bad = 0
    directory, found = checkpoints_named(args.path)
    for path in found:
        try:
            manifest = directory.verify(path)
            out.print(f"[green]ok[/]  {path}  ({len(manifest['files'])} files, sha256 verified)", highlight=False)
        except CheckpointError as exc:
            bad += 1
            out.print(f"[red]INVALID[/]  {exc}", highlight=False, soft_wrap=True)
    return 2 if bad else 0


def cmd_inspect(args: argparse.Namespace) -> int:
    path = checkpoint_of(args.path)
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

    src, dst = Path(args.source), Path(args.dest)
    written = export_checkpoint(src, dst) if src.is_dir() else import_checkpoint(src, dst)
    print_written(written)
    return 0


def print_written(path: Path) -> None:
    """On stdout, what a conversion or export wrote: each file with its size and mode."""
    files = written_files(path)
    out.print(f"wrote {path}" + ("" if path.is_file() else f" ({len(files)} files)"), highlight=False)
    for f in files:
        out.print(f"  {f}  {f.stat().st_size:,} bytes  mode {f.stat().st_mode & 0o777:o}", highlight=False)


def cmd_export(args: argparse.Namespace) -> int:
    from mindfoundry.checkpoint.convert import WEIGHTS_ONLY, export_checkpoint
    from mindfoundry.checkpoint.hf_export import export_hf
    from mindfoundry.checkpoint.mindformers_export import export_mindformers

    out = locate(args.out)
    if args.format == "safetensors" and not out.name.endswith(WEIGHTS_ONLY):
        raise CheckpointError(f"--format safetensors writes one file: give --out a name ending in {WEIGHTS_ONLY}")
    writers = {"hf": export_hf, "mindformers": export_mindformers, "safetensors": export_checkpoint}
    if isinstance(out, Path):
        print_written(writers[args.format](checkpoint_of(args.checkpoint), out))
        return 0
    if args.format == "mindformers":
        raise CheckpointError("--format mindformers writes a run YAML whose paths MindFormers reads from a local disk: "
                              "export to a folder of the machine that runs MindFormers, not to a URL")
    if out.exists():
        raise OutputExistsError(f"{out} already holds objects: choose another --out (nothing was written)")
    with tempfile.TemporaryDirectory() as tmp:
        local = writers[args.format](checkpoint_of(args.checkpoint), Path(tmp) / out.name)
        if local.is_dir():
            publish(local, out)  # the objects, then commit.json
        else:
            out.upload(local)
        out_count = len(written_files(local))
    console.print(f"wrote {out} ({out_count} object{'s' if out_count > 1 else ''})", highlight=False)
    return 0


def add_ckpt_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "convert", help="checkpoint folder (full or sharded) <-> MindSpore .ckpt / PyTorch .pt; -> weights .safetensors"
    )
    p.add_argument("source", help="RUN/checkpoints/step_N folder (export) or a .ckpt/.pt file (import)")
    p.add_argument(
        "dest", help="output .ckpt/.pt file or .safetensors (weights alone) (export), or a run directory to import into"
    )
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
    p.add_argument("--out", required=True, help="output folder (hf; must not exist or be empty) or .safetensors file; "
                   "a URL (s3://...) for hf and safetensors: uploaded, then commit.json")
    p.set_defaults(func=cmd_export)

    ckpt = sub.add_parser("ckpt", help="list, verify or inspect checkpoints").add_subparsers(
        dest="ckpt_command", required=True
    )
    p = ckpt.add_parser("list", help="a run's checkpoints with size, data position, val loss and status")
    p.add_argument("run_dir", help="RUN_DIR (its checkpoint.dir), or a checkpoint.dir folder or URL")
    p.set_defaults(func=cmd_list)
    p = ckpt.add_parser(
        "best", help="print the path of the checkpoint with the lowest validation loss (checkpoints/best)"
    )
    p.add_argument("run_dir", help="RUN_DIR (its checkpoint.dir), or a checkpoint.dir folder or URL")
    p.set_defaults(func=cmd_best)
    p = ckpt.add_parser(
        "verify", help="check sizes and sha256 of a checkpoint (or of all of a run's); exit 2 if any is invalid"
    )
    p.add_argument("path", help="RUN_DIR, a checkpoint.dir (folder or URL), or one CKPT/step_N (folder or URL)")
    p.set_defaults(func=cmd_verify)
    p = ckpt.add_parser("inspect", help="trainer state and tensor summary of one checkpoint")
    p.add_argument("path", help="CKPT/step_N (folder or URL), or RUN_DIR for its newest valid checkpoint")
    p.set_defaults(func=cmd_inspect)
