"""The prepared output of `prepare`: claimed by one writer at a time (and shared by the runs that train on it),
assembled from the work area's files and committed -- never over another run's committed output without
``--overwrite``."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

from mindfoundry.config.schema import RunConfig
from mindfoundry.data.clean.droplog import DROPS_FILE
from mindfoundry.data.dataset.prepared import IMAGES, MANIFEST, SPLITS, TOKENIZER, DataError, is_prepared
from mindfoundry.data.execute.workdir import RESULT, WorkDir, link_or_copy
from mindfoundry.data.prepare.corpus import IMAGE_SHARDS, MERGE, Corpus
from mindfoundry.data.prepare.corpus import TOKENIZER as TOKENIZER_STAGE
from mindfoundry.data.prepare.stage_tokens import MergeStage
from mindfoundry.storage.cache import cache_folder
from mindfoundry.storage.claim import ClaimHeldError, alive
from mindfoundry.storage.commit import COMMIT, is_committed, publish
from mindfoundry.storage.location import Claim, Location


def output_lock(out: Location) -> Location:
    """The lock beside a prepared output: a `prepare` writing it holds it alone, a run training on it shares it."""
    return out.with_name(f".{out.name}.lock")


def claim_output(out: Location, *, shared: bool) -> Claim:
    """Hold ``out``: alone to write it (``prepare``), shared to read it (a training run, so that no `prepare
    --overwrite` replaces the data under it); refused in one line naming the process that holds it otherwise."""
    try:
        return output_lock(out).claim(shared=shared)
    except ClaimHeldError as holder:
        raise DataError(f"data.output_dir {out} is held by {holder}: one prepare writes it at a time, and none while "
                        "a run trains on it; wait for it to end, or give this config another data.output_dir "
                        "(nothing was written)") from None


def taken_reason(out: Location) -> str:
    """Why the committed folder ``out`` is not this config's to reuse or replace (without --overwrite)."""
    if not is_prepared(out):
        return (f"data.output_dir {out} holds files that are not prepared data (e.g. '{out.children()[0]}'): choose "
                "another data.output_dir, or pass --overwrite to move them aside")
    try:
        by = json.loads((out / MANIFEST).read_bytes()).get("prepared_by") or {}
    except (OSError, ValueError, AttributeError):
        by = {}
    who = f" (by the run in {by['run_dir']})" if isinstance(by, dict) and by.get("run_dir") else ""
    return (f"'{out}' holds data prepared from a different data config{who}: pass --overwrite to rebuild it (the old "
            "folder is moved aside) or set data.output_dir")


def publish_output(work: WorkDir, corpus: Corpus, manifest: dict[str, Any], out: Location, cfg: RunConfig,
                   overwrite: bool) -> None:
    """The output folder, assembled aside from the work area's files (hard links) and committed (renamed into place
    on a disk, uploaded and then marked committed on a store). A committed folder found at ``out`` now (another
    prepare committed it since this one began) is refused without ``overwrite``, and moved aside with it."""
    staging = out.parent.staging(cache_folder("publish", str(out), cfg.data.cache_dir))
    _remove_stale_assemblies(staging, out.name)
    local_tmp = staging / f".{out.name}.tmp-{os.getpid()}"
    shutil.rmtree(local_tmp, ignore_errors=True)
    try:
        for split in SPLITS:
            (local_tmp / split).mkdir(parents=True)
        merge = MergeStage(work, corpus)
        for task in range(merge.tasks() - 1):  # (source, split) in order: task-N/SPLIT/SOURCE.bin|idx
            for shard in sorted(work.task(MERGE, task).glob("*/*")):
                link_or_copy(shard, local_tmp / shard.parent.name / shard.name)
        for task in range(len(corpus.image_sources) * len(SPLITS)):  # images/SPLIT/...: each source's shards
            for file in sorted(p for p in work.task(IMAGE_SHARDS, task).rglob("*") if p.is_file()):
                if file.name != RESULT:
                    target = local_tmp / IMAGES / file.relative_to(work.task(IMAGE_SHARDS, task))
                    target.parent.mkdir(parents=True, exist_ok=True)
                    link_or_copy(file, target)
        link_or_copy(work.task(MERGE, merge.tasks() - 1) / DROPS_FILE, local_tmp / DROPS_FILE)
        link_or_copy(work.task(TOKENIZER_STAGE, 0) / TOKENIZER, local_tmp / TOKENIZER)
        (local_tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        if is_committed(out):
            if not overwrite:
                raise DataError(taken_reason(out))
            out.move_folder(out.with_name(f"{out.name}.old-{time.strftime('%Y%m%d-%H%M%S')}"), COMMIT)
        publish(local_tmp, out)  # (over the objects without a marker that a killed upload of the output left)
    finally:
        shutil.rmtree(local_tmp, ignore_errors=True)


def _remove_stale_assemblies(staging: Path, name: str) -> None:
    """Folders ``.NAME.tmp-PID`` that a killed `prepare` left (its process is gone): nothing reads them."""
    for path in staging.glob(f".{name}.tmp-*"):
        pid = path.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True)
