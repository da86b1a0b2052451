"""What a checkpoint needs from the run that wrote it: the run's config, its tokenizer and its data; and which
checkpoints a path names (a step folder, a run directory, a checkpoint.dir -- each local or a URL).

A checkpoint written since object storage support carries the run's resolved config and tokenizer itself
(``config.yaml``, ``tokenizer.json``); an older one lives at RUN/checkpoints/step_N with the config at
RUN/config.yaml and the tokenizer in the run's data folder. Either way the tokenizer taken is the one whose sha256 the
checkpoint's data manifest records (so a tokenizer retrained since is never paired with these weights). Used by
export, generation, evaluation and ``mindfoundry ckpt``.
"""

from __future__ import annotations

import json
from pathlib import Path

from mindfoundry.checkpoint.directory import CheckpointDir
from mindfoundry.checkpoint.store import MANIFEST_FILE, STEP_DIR, CheckpointError
from mindfoundry.config.load import read_yaml, validate
from mindfoundry.config.schema import RunConfig
from mindfoundry.config.storage_config import StorageConfig
from mindfoundry.data.dataset.prepared import local_copy
from mindfoundry.data.tokenizer import load_tokenizer, tokenizer_hash
from mindfoundry.storage.location import Location
from mindfoundry.storage.resolve import locate

CONFIG, TOKENIZER = "config.yaml", "tokenizer.json"


def _is_step(where: Location) -> bool:
    return bool(STEP_DIR.match(where.name)) or (where / MANIFEST_FILE).is_file()


def checkpoint_dir_of(path: str | Path | Location, storage: StorageConfig | None = None) -> CheckpointDir:
    """The checkpoints a run directory holds (its config's ``checkpoint.dir``, a folder or a URL; else
    RUN/checkpoints), or a checkpoint.dir given itself (a folder or a URL holding step_N folders)."""
    where = locate(path, storage)
    if (where / CONFIG).is_file():
        cfg = validate(read_yaml(where.local_path("the run directory", "a run directory is a folder of this machine "
                                                                       "(its lock and logs are local)") / CONFIG))
        if cfg.checkpoint.dir is not None:
            return CheckpointDir(locate(cfg.checkpoint.dir, cfg.storage), cache_dir=cfg.data.cache_dir)
        return CheckpointDir(where / "checkpoints")
    if not any(STEP_DIR.match(name) for name in where.children()):
        return CheckpointDir(where / "checkpoints")  # a run directory (a folder of step_N is a checkpoint.dir)
    return CheckpointDir(where)


def checkpoints_named(path: str | Path | Location,
                      storage: StorageConfig | None = None) -> tuple[CheckpointDir, list[Location]]:
    """A checkpoint (RUN/checkpoints/step_N, s3://.../step_N) or every committed checkpoint a run directory or a
    checkpoint.dir holds, with the directory they are in."""
    where = locate(path, storage)
    if _is_step(where):
        return CheckpointDir(where.parent), [where]
    directory = checkpoint_dir_of(where)
    found = directory.committed()
    if not found:
        raise CheckpointError(f"no committed checkpoints under '{directory}'")
    return directory, found


def checkpoint_of(path: str | Path | Location, storage: StorageConfig | None = None) -> Path:
    """A checkpoint as a local folder: a step folder as given (a URL's fetched into this node's cache, verified), or a
    run directory's (or checkpoint.dir's) newest valid checkpoint."""
    where = locate(path, storage)
    if _is_step(where):
        directory = CheckpointDir(where.parent)
        directory.verify(where)
        return directory.local_copy(where)
    found, skipped = checkpoint_dir_of(where).find_resumable()
    if found is None:
        notes = f" ({'; '.join(skipped)})" if skipped else ""
        raise CheckpointError(
            f"'{where}' is neither a checkpoint folder nor a run directory with a valid checkpoint{notes}: "
            "pass RUN_DIR, RUN_DIR/checkpoints/step_N or a checkpoint's URL"
        )
    return found


def run_config(ckpt_dir: Path) -> RunConfig:
    """The config of the run that wrote the (local) checkpoint folder ``ckpt_dir``: its own copy, else RUN/config.yaml
    of RUN/checkpoints/step_N."""
    for config in (Path(ckpt_dir) / CONFIG, Path(ckpt_dir).parent.parent / CONFIG):
        if config.is_file():
            return validate(read_yaml(config))
    raise CheckpointError(f"{Path(ckpt_dir) / CONFIG} not found, nor {Path(ckpt_dir).parent.parent / CONFIG}: the "
                          "checkpoint carries no run config and is not inside a MindFoundry run directory")


def _wanted_tokenizer(ckpt_dir: Path) -> str:
    manifest = json.loads((Path(ckpt_dir) / "data_manifest.json").read_text(encoding="utf-8"))
    return manifest["tokenizer"]["sha256"]


def run_tokenizer(ckpt_dir: Path, cfg: RunConfig) -> Location:
    """The run's tokenizer.json: the one the checkpoint's data manifest names (by sha256), from the checkpoint itself or
    the run's data folder (a folder or a URL)."""
    ckpt_dir = Path(ckpt_dir)
    want = _wanted_tokenizer(ckpt_dir)
    candidates = [locate(ckpt_dir / TOKENIZER), locate(ckpt_dir.parent.parent / "data" / TOKENIZER),
                  locate(cfg.data.output_dir, cfg.storage) / TOKENIZER]
    for path in candidates:
        if path.is_file() and tokenizer_hash(load_tokenizer(path)) == want:
            return path
    raise CheckpointError(
        f"the run's tokenizer (sha256 {want[:12]}...) is in none of {', '.join(map(str, candidates))}: "
        "use the run directory that trained this checkpoint, with its data folder in place"
    )


def run_data(ckpt_dir: Path, cfg: RunConfig) -> Path:
    """The run's prepared data folder on this machine (fetched when it lives at a URL): the one whose tokenizer is the
    checkpoint's."""
    want = _wanted_tokenizer(ckpt_dir)
    beside = Path(ckpt_dir).parent.parent / "data"
    for folder in (beside, None):
        folder = folder if folder is not None else local_copy(cfg)
        tokenizer = folder / TOKENIZER
        if tokenizer.is_file() and tokenizer_hash(load_tokenizer(tokenizer)) == want:
            return folder
    raise CheckpointError(f"the run's prepared data (tokenizer sha256 {want[:12]}...) is neither in {beside} nor at "
                          f"data.output_dir={cfg.data.output_dir}: prepare it again with the run's config")
