"""What a checkpoint folder needs from the run that wrote it: the run's config and its tokenizer.

A checkpoint lives at RUN/checkpoints/step_N; the run's resolved config is RUN/config.yaml, and
the tokenizer is the one whose sha256 the checkpoint's data manifest records (so a tokenizer
retrained since is never paired with these weights). Used by export, generation and evaluation.
"""

from __future__ import annotations

import json
from pathlib import Path

from mindfoundry.checkpoint.store import MANIFEST_FILE, CheckpointError, find_resumable
from mindfoundry.config.load import read_yaml
from mindfoundry.config.schema import RunConfig
from mindfoundry.data.prepare.tokenizer import load_tokenizer, tokenizer_hash
from mindfoundry.parallel.layout import validate_run_config


def checkpoint_of(path: str | Path) -> Path:
    """A checkpoint folder as given, or a run directory's newest valid checkpoint."""
    path = Path(path)
    if (path / MANIFEST_FILE).is_file():
        return path
    found, skipped = find_resumable(path)
    if found is None:
        notes = f" ({'; '.join(skipped)})" if skipped else ""
        raise CheckpointError(
            f"'{path}' is neither a checkpoint folder nor a run directory with a valid checkpoint{notes}: "
            "pass RUN_DIR or RUN_DIR/checkpoints/step_N"
        )
    return found


def run_config(ckpt_dir: Path) -> RunConfig:
    """The config of the run that wrote `ckpt_dir` (RUN/checkpoints/step_N)."""
    config = Path(ckpt_dir).parent.parent / "config.yaml"
    if not config.is_file():
        raise CheckpointError(f"{config} not found: the checkpoint is not inside a MindFoundry run directory")
    return validate_run_config(read_yaml(config))


def run_tokenizer(ckpt_dir: Path, cfg: RunConfig) -> Path:
    """The run's tokenizer.json: the one the checkpoint's data manifest names (by sha256), from the run's data folder.
    """
    ckpt_dir = Path(ckpt_dir)
    manifest = json.loads((ckpt_dir / "data_manifest.json").read_text(encoding="utf-8"))
    want = manifest["tokenizer"]["sha256"]
    candidates = [ckpt_dir.parent.parent / "data" / "tokenizer.json", Path(cfg.data.output_dir) / "tokenizer.json"]
    for path in candidates:
        if path.is_file() and tokenizer_hash(load_tokenizer(path)) == want:
            return path
    raise CheckpointError(
        f"the run's tokenizer (sha256 {want[:12]}...) is in none of {', '.join(map(str, candidates))}: "
        "use the run directory that trained this checkpoint, with its data folder in place"
    )
