"""`mindfoundry convert`: engine-neutral checkpoint folders <-> each engine's native checkpoint file.

MindFoundry checkpoints are already engine-neutral (safetensors under shared names), so a run
continues on either engine without conversion. This converter serves the tools around the
engines: `.ckpt` files for MindSpore tooling (MindFormers, `load_checkpoint`) and `.pt` files for
PyTorch tooling, and the way back from them into a checkpoint folder that `--resume` accepts.

`out.safetensors` exports the weights alone, under the shared parameter names, in one file that
either engine's ``load_weights`` takes; from a sharded checkpoint (``checkpoint.format: sharded``)
this consolidates every rank's shards in this process. Every export reads sharded checkpoints too.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from mindfoundry.checkpoint.directory import Retention, save_checkpoint
from mindfoundry.checkpoint.reader import load_checkpoint
from mindfoundry.checkpoint.run_files import run_config
from mindfoundry.checkpoint.store import CheckpointError, publish_mode, write_safetensors
from mindfoundry.errors import MindFoundryError
from mindfoundry.storage.commit import staged_file
from mindfoundry.storage.location import Location
from mindfoundry.storage.resolve import locate

NATIVE = {".ckpt": "mindspore", ".pt": "torch"}
WEIGHTS_ONLY = ".safetensors"


def _engine_module(suffix: str):
    engine = NATIVE.get(suffix)
    if engine is None:
        raise CheckpointError(f"unknown checkpoint file type '{suffix}': use .ckpt (MindSpore) or .pt (PyTorch), "
                              f"or {WEIGHTS_ONLY} to export the weights alone")
    try:
        return importlib.import_module(f"mindfoundry.backends.{engine}.native")
    except ModuleNotFoundError as exc:
        raise CheckpointError(
            f"converting {suffix} files needs {exc.name}: pip install 'mindfoundry[{engine}]'"
        ) from None


def export_checkpoint(ckpt_dir: Path, out: str | Path | Location) -> Location:
    """Write checkpoint folder `ckpt_dir` (full or sharded) as the file `out`, a path or a URL (.ckpt, .pt, or
    .safetensors = the weights alone, byte for byte the full format's model.safetensors); refuses to overwrite."""
    out = locate(out)
    if out.exists():
        raise CheckpointError(f"{out} already exists: choose another output path")
    module = None if out.name.endswith(WEIGHTS_ONLY) else _engine_module(Path(out.name).suffix)
    ckpt = load_checkpoint(ckpt_dir)
    with staged_file(out) as tmp:
        if module is None:
            write_safetensors(tmp, ckpt.weights)
        else:
            module.export_native(ckpt.weights, ckpt.optimizer, ckpt.state, tmp, run_config(Path(ckpt_dir)))
            publish_mode(tmp)
    return out


def import_checkpoint(native: Path, run_dir: Path, retention: Retention = Retention()) -> Path:
    """Turn a native .ckpt/.pt into RUN_DIR/checkpoints/step_N (step taken from the file)."""
    if not native.is_file():
        raise CheckpointError(f"{native} not found")
    if not (run_dir / "config.yaml").is_file():
        raise CheckpointError(f"'{run_dir}' is not a run directory: create it with `mindfoundry prepare CONFIG` "
                              "(the config the run will continue with), then import into it")
    engine = _engine_module(native.suffix)
    try:
        weights, optimizer, counters = engine.import_native(native)
    except MindFoundryError:
        raise
    except Exception as exc:  # each engine's loader has its own zoo of errors for a file it cannot parse
        first = (
            str(exc).strip().split(". ")[0].splitlines()[0][:200] if str(exc).strip() else "unreadable"
        )  # the loader's first sentence
        raise CheckpointError(
            f"{native} is not a {native.suffix} file that `mindfoundry convert` wrote "
            f"({type(exc).__name__}: {first}): convert a checkpoint folder with `mindfoundry convert STEP_DIR FILE`"
        ) from None
    if "step" not in counters:
        raise CheckpointError(f"{native} carries no 'step' counter: it was not written by `mindfoundry convert`")
    step = counters.pop("step")
    return save_checkpoint(run_dir, step, weights, optimizer, {**counters, "imported_from": str(native)}, retention)
