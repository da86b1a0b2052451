"""`mindfoundry prepare`: raw text -> clean -> dedup -> split by document -> BPE tokenizer -> Megatron shards.

A staged pipeline (its stages: :mod:`.stage_clean`, :mod:`.stage_dedup`, :mod:`.stage_tokens`), each
stage a set of independent tasks over input shards (runs of a source's files, :mod:`.inputs`) or
hash partitions (:mod:`.keyruns`) whose outputs live on disk in a work area
(:mod:`~mindfoundry.data.execute.workdir`). The same stages run on a process pool of this machine
(``data.executor: local``) or on a Ray cluster (``ray``); every task writes to a folder of its own
and every decision that depends on order is made from (task, row) refs, so the output is
byte-identical for any executor and number of workers. A task's folder is its completion marker:
a `prepare` killed at any moment and started again skips what finished.

Memory does not grow with the corpus: a read task holds its input's documents, a partition task
its share of the keys, the dedup decision its pairs; this process (the driver) only hands out
tasks and adds up their small results into the manifest.
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import time
from collections.abc import Callable
from typing import Any, get_args

import mindfoundry
from mindfoundry.config.load import identity_view
from mindfoundry.config.schema import RunConfig
from mindfoundry.data.clean.curate import clean_profile
from mindfoundry.data.dataset.indexed import dtype_for_vocab
from mindfoundry.data.dataset.prepared import (
    SPLITS,
    TOKENIZER,
    DataError,
    PreparedData,
    file_changes,
    is_prepared,
    open_prepared,
    prepared_identity,
    prepared_location,
)
from mindfoundry.data.execute import create_executor
from mindfoundry.data.execute.progress import StagesProgress
from mindfoundry.data.execute.stage import R, Stage
from mindfoundry.data.execute.workdir import WorkDir, space_problem
from mindfoundry.data.ingest.inputs import plan_inputs
from mindfoundry.data.prepare.corpus import TOKENIZER as TOKENIZER_STAGE
from mindfoundry.data.prepare.corpus import Corpus
from mindfoundry.data.prepare.keyruns import MAX_PARTITIONS, partitions
from mindfoundry.data.prepare.manifest import SourceSummary, cleaning, source_line
from mindfoundry.data.prepare.output import claim_output, publish_output, taken_reason
from mindfoundry.data.prepare.results import (
    BoilerplateResult,
    CountedKind,
    DecideResult,
    ImageShardResult,
    MergeResult,
    ReadResult,
    TokenizerResult,
)
from mindfoundry.data.prepare.stage_clean import BoilerplateStage, CleanStage, ReadStage, TemplateStage
from mindfoundry.data.prepare.stage_dedup import BandStage, DecideStage, Dedup, ExactStage, PairStage
from mindfoundry.data.prepare.stage_images import (
    ImageCuration,
    ImageDedupStage,
    ImageReadStage,
    ImageShardStage,
    images_manifest,
)
from mindfoundry.data.prepare.stage_tokens import MergeStage, ShardStage, TokenizerStage
from mindfoundry.data.tokenizer import OBJECTIVE_TOKENS, load_tokenizer, tokenizer_hash
from mindfoundry.errors import MindFoundryError
from mindfoundry.storage.cache import cache_folder
from mindfoundry.storage.commit import is_committed
from mindfoundry.storage.location import Location
from mindfoundry.storage.resolve import locate

#: Keys of the data section that say how `prepare` runs, never what it writes.
EXECUTION_KEYS = {"output_dir", "mixture", "workers", "executor", "ray", "work_dir", "cache_dir", "task_bytes"}
#: Stages whose task time counts as dedup's time in the manifest.
DEDUP_STAGES = ("exact", "bands", "pairs", "decide")


def data_identity(cfg: RunConfig) -> str:
    """What determines the prepared data: the data section, the seed, the vocabulary size and, for the mlm
    objective, the mask token in the tokenizer.

    The mixture only changes the order in which training draws samples, not the shards, so it is
    left out: changing the weights must not force a re-prepare.
    """
    key = {"data": identity_view(_data_section(cfg), "data."), "seed": cfg.seed, "vocab_size": cfg.model.vocab_size}
    if cfg.model.objective == "mlm":  # a clm tokenizer has no mask token (and clm identities stay as they were)
        key["mask_token"] = True
    if cfg.model.objective == "caption":  # ... nor an image token
        key["image_token"] = True
    return _sha256_json(key)


def _data_section(cfg: RunConfig) -> dict[str, Any]:
    """The data config that shapes the shards (cleaning and dedup included; not where they go, not the
    mixture, not how they are made: the output is the same for any executor, workers or task size)."""
    return cfg.data.model_dump(mode="json", exclude=EXECUTION_KEYS)


def _sha256_json(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


def work_dir(cfg: RunConfig) -> Location:
    """Where this config's `prepare` keeps its stages: ``data.work_dir`` (a folder or a URL), else a hidden folder
    beside the output: next to a local output, in this node's cache for a URL output (on a Ray cluster, whose nodes
    share no disk, that cannot work: data.work_dir must be a URL there)."""
    if cfg.data.work_dir is not None:
        return locate(cfg.data.work_dir, cfg.storage)
    out = prepared_location(cfg)
    beside = out.parent.staging(cache_folder("work", str(out), cfg.data.cache_dir))
    if cfg.data.executor == "ray" and cfg.data.ray.address != "local" and not locate(beside).is_below(out.parent):
        raise DataError(f"data.output_dir is a URL ({out}) and data.executor is ray on a cluster: set "
                        "data.work_dir to a URL too (e.g. s3://BUCKET/work/NAME), where every node reaches the "
                        "stages' files; unset, the work area is a folder of this node only")
    return locate(beside / f".{out.name}.work")


def open_work(cfg: RunConfig) -> WorkDir:
    """The work area of this config's `prepare` (not yet claimed)."""
    return WorkDir(work_dir(cfg), cfg.data.cache_dir)


def prepare_data(cfg: RunConfig, *, overwrite: bool = False, log: Callable[[str], None] = print) -> PreparedData:
    """Prepare cfg.data.output_dir (a folder or a URL), or reuse it when it already holds data for this exact config.

    An interrupted `prepare` of the same config (and the same source files) resumes: its finished
    tasks are kept. ``overwrite`` rebuilds from scratch (an existing output is moved aside).
    """
    out = prepared_location(cfg)
    identity = data_identity(cfg)
    if is_committed(out) and not overwrite:
        if not is_prepared(out) or prepared_identity(out) != identity:
            raise DataError(taken_reason(out))
        data = open_prepared(cfg, log)
        try:
            drift = source_drift(cfg, data.manifest)
            note = (f"; warning: its sources changed since it was prepared ({'; '.join(drift)}): training uses the "
                    "data as prepared; `prepare --overwrite` rebuilds it (a run resumed on rebuilt data is refused, "
                    "naming what changed)" if drift else "")
        except MindFoundryError as exc:  # the raw corpus is not on this node (only the prepared data is)
            note = f"; its sources cannot be listed here to check them for changes ({exc})"
        log(f"reusing prepared data in {out}{note}")
        return data
    out.check_writable()  # before hours of work: the output must be writable
    claim = claim_output(out, shared=False)
    try:
        text, images = plan_inputs(cfg.data, cfg.storage)
        corpus = Corpus(cfg.data, tuple(text), cfg.storage, tuple(images))
        work = open_work(cfg)
        plan = _sha256_json([task.to_json() for task in (*corpus.inputs, *corpus.images)])
        work.claim(identity, plan, fresh=overwrite, log=log)
        try:
            staged = _StagedRun(cfg, corpus, work, log)
            manifest = {"identity": identity, "prepared_by": {"run_dir": str(cfg.run_dir), "name": cfg.name},
                        **staged.run()}
            publish_output(work, corpus, manifest, out, cfg, overwrite)
        except OSError as exc:
            problem = space_problem(exc, work.scratch)
            if problem is None:
                raise
            raise problem from None
        finally:
            work.release()
        work.remove()
    finally:
        claim.release()
    t, v = manifest["splits"]["train"], manifest["splits"]["validation"]
    images = manifest.get("images", {}).get("splits")
    held = f"; images: train {images['train']['images']}, validation {images['validation']['images']}" if images else ""
    log(
        f"prepared {out}: train {t['documents']} docs / {t['tokens']:,} tokens, validation {v['documents']} docs / "
        f"{v['tokens']:,} tokens{held}"
    )
    return open_prepared(cfg)


def source_drift(cfg: RunConfig, manifest: dict[str, Any]) -> list[str]:
    """How each file source differs now from what the prepared data was made of (files added, removed, changed in
    size or version), listed again: [] when nothing changed."""
    listed: dict[int, dict[str, tuple[int, Any]]] = {}
    for task in (task for tasks in plan_inputs(cfg.data, cfg.storage) for task in tasks):
        listed.setdefault(task.source, {}).update({path: (size, version) for path, size, version in task.files})
    entries = {e.get("name"): e for e in [*manifest.get("sources", []), *manifest.get("images", {}).get("sources", [])]}
    out = []
    for index, src in enumerate(cfg.data.sources):
        entry = entries.get(src.name)
        if src.builtin is not None or entry is None:
            continue
        before = {f["path"]: (f.get("bytes"), f.get("version")) for f in entry.get("files", [])}
        now = listed.get(index, {})
        capped = src.max_documents is not None or src.max_bytes is not None  # read only its first files
        added = set() if capped else now.keys() - before.keys()
        changed = {p for p in before.keys() & now.keys()
                   if before[p][0] != now[p][0] or before[p][1] not in (None, now[p][1])}
        what = file_changes(*({os.path.basename(path) for path in group}
                              for group in (added, before.keys() - now.keys(), changed)))
        if what:
            out.append(f"{entry.get('name')}: {what}")
    return out


class _StagedRun:
    """The driver of one `prepare`: the stages in order on the configured executor, then the manifest."""

    def __init__(self, cfg: RunConfig, corpus: Corpus, work: WorkDir, log: Callable[[str], None]) -> None:
        self.cfg, self.corpus, self.work, self.log = cfg, corpus, work, log
        self.stages: dict[str, Stage] = {}
        self.timings: dict[str, Any] = {}
        self.decided: DecideResult | None = None  # the decide stage's, once dedup ran
        self.sign_seconds = 0.0  # the clean stage's time signing documents for dedup

    def run(self) -> dict[str, Any]:
        """Every stage, then the manifest (without its identity)."""
        start, cpu = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
        with create_executor(self.cfg.data) as executor, StagesProgress(self.log) as progress:
            self.log(f"prepare: {len(self.corpus.inputs)} read tasks over {len(self.cfg.data.sources)} sources, "
                     f"{executor.describe()}")
            self.executor, self.progress = executor, progress
            summaries, kept = self._clean() if self.corpus.inputs else ({}, [])
            dedup = self._dedup(summaries, kept) if self.corpus.inputs else Dedup(self.work, 0, decided=False)
            images = self._images()
            tokenizer, merged = self._tokens(summaries, dedup, images)
            image_shards = [] if images is None else self._run(ImageShardStage(
                self.work, self.corpus, self.work.task(TOKENIZER_STAGE, 0) / TOKENIZER, self.cfg.model.vocab_size))
        driver = resource.getrusage(resource.RUSAGE_SELF)
        return self._manifest(summaries, merged, tokenizer, dedup, images, image_shards, {
            "executor": executor.describe(), "stages": self.timings, "total_s": round(time.perf_counter() - start, 2),
            "driver_cpu_s": round(driver.ru_utime + driver.ru_stime - cpu.ru_utime - cpu.ru_stime, 2),
            "driver_peak_rss_mib": round(driver.ru_maxrss / 1024, 1)})

    def _clean(self) -> tuple[dict[int, SourceSummary], list[int]]:
        """The read, boilerplate and clean stages: per source what was read and what every block did; the documents
        each read task kept."""
        work, corpus = self.work, self.corpus
        read = self._run(ReadStage(work, corpus))
        summaries = self._summaries(read)
        counted: dict[str, tuple[list[int], dict[str | int, int]]] = {}
        entries = 0
        for kind in get_args(CountedKind):
            tasks, documents = [], {}
            for t, result in enumerate(read):
                if (counts := result.counted(kind)) is not None:
                    tasks.append(t)
                    entries += counts[1]
                    # lines are counted per source, template spans per site (templates.site_documents)
                    per = {int(site): n for site, n in (result.span_sites or {}).items()} if kind == "span" else {
                        corpus.inputs[t].source: counts[0]}
                    for key, n in per.items():
                        documents[key] = documents.get(key, 0) + n
            if tasks:
                counted[kind] = (tasks, documents)
        keys = partitions(entries) if counted else 0
        if counted:
            self._log_boilerplate(self._run(BoilerplateStage(work, corpus, keys, counted)))
        if "span" in counted:
            self._run(TemplateStage(work, corpus, keys))
        clean = self._run(CleanStage(work, corpus, keys))
        for t, result in enumerate(clean):
            summaries[corpus.inputs[t].source].add_blocks(result)
        self.sign_seconds = sum(result.sign_seconds for result in clean)
        return summaries, [result.kept for result in clean]

    def _images(self) -> ImageCuration | None:
        """The image read and dedup stages (before the tokenizer, which learns from the training captions too); None
        without image sources."""
        if not self.corpus.images:
            return None
        read = self._run(ImageReadStage(self.work, self.corpus))
        decided = self._run(ImageDedupStage(self.work, self.corpus, self.cfg.seed))[0]
        self.log(f"images: read {sum(r.read for r in read)}, kept {decided.kept} after checks and dedup (removed "
                 f"{decided.exact} exact and {decided.near} near copies); {decided.clusters} clusters, "
                 f"{decided.validation} images held out")
        return ImageCuration(read, decided)

    def _tokens(self, summaries: dict[int, SourceSummary], dedup: Dedup,
                images: ImageCuration | None) -> tuple[TokenizerResult, list[MergeResult]]:
        """The tokenizer, shards and merge stages; the tokenizer's result and the merged shards."""
        work, corpus = self.work, self.corpus
        options = {
            "seed": self.cfg.seed,
            "vocab_size": self.cfg.model.vocab_size,
            "extra_token": OBJECTIVE_TOKENS.get(self.cfg.model.objective),
        }
        tokenizer = self._run(TokenizerStage(work, corpus, dedup, **options))[0]
        self._log_tokenizer(tokenizer)
        for t, result in enumerate(self._run(ShardStage(work, corpus, dedup, **options))):
            summaries[corpus.inputs[t].source].add_shards(result)
        return tokenizer, self._run(MergeStage(work, corpus))

    def _run(self, stage: Stage[R]) -> list[R]:
        """All tasks of ``stage``: those an earlier `prepare` finished are read back, the others run."""
        self.stages[stage.name] = stage
        self.work.clear_attempts(stage.name)
        total = stage.tasks()
        results: list[R | None] = [None] * total
        todo = []
        for task in range(total):
            if self.work.done(stage.name, task):
                results[task] = stage.result(task)
            else:
                todo.append(task)
        progress = self.progress.stage(stage.name, total, total - len(todo))
        for task, result in self.executor.run(stage, todo):
            results[task] = result
            assert result.timing is not None  # run_task measured it
            progress.advance(result.documents, result.timing.seconds)
        progress.close()
        done = [r for r in results if r is not None]
        timing = [r.timing for r in done if r.timing is not None]
        self.timings[stage.name] = dict(progress.summary(), cpu_s=round(sum(t.cpu_s for t in timing), 2),
                                        peak_rss_mib=max((t.peak_rss_mib for t in timing), default=None),
                                        processes=len({(t.host, t.pid) for t in timing}),
                                        nodes=len({t.node or t.host for t in timing}))
        return done

    def _summaries(self, read: list[ReadResult]) -> dict[int, SourceSummary]:
        """Per text source (by its index in data.sources), what its read tasks read (a source that read nothing is
        an error here, before more work)."""
        data = self.cfg.data
        summaries = {i: SourceSummary(data.sources[i], clean_profile(data, data.sources[i]))
                     for i in self.corpus.text_sources}
        for t, result in enumerate(read):
            summaries[self.corpus.inputs[t].source].add_read(result)
        for summary in summaries.values():
            summary.check_read()
        return summaries

    def _dedup(self, summaries: dict[int, SourceSummary], kept: list[int]) -> Dedup:
        """The dedup stages that the settings ask for; where their decisions are. A source that cleaning and dedup
        emptied is an error here, before the tokenizer."""
        settings, work, corpus = self.cfg.data.dedup, self.work, self.corpus
        dedup = self._deduplicate(sum(kept)) if settings.enabled else Dedup(work, 0, decided=False)
        for source, summary in summaries.items():
            if self.decided is not None:  # the decide stage ran
                summary.dedup = self.decided.report["removed_by_source"].get(summary.src.name, {})
            summary.check_kept(sum(kept[t] for t in corpus.tasks_of(source)) - sum(summary.dedup.values()))
        return dedup

    def _deduplicate(self, cleaned: int) -> Dedup:
        settings, work, corpus = self.cfg.data.dedup, self.work, self.corpus
        exact = partitions(cleaned) if settings.exact else 0
        if exact:
            self._run(ExactStage(work, corpus, exact))
        if settings.near:
            ranges = partitions(cleaned, max(1, MAX_PARTITIONS // settings.bands))
            self._run(BandStage(work, corpus, ranges, exact))
            self._run(PairStage(work, corpus, settings.bands * ranges))
        self.decided = self._run(DecideStage(work, corpus, exact, cleaned, pairs=settings.near))[0]
        report = self.decided.report
        seconds = sum(self.timings[name]["task_seconds"] for name in DEDUP_STAGES if name in self.timings)
        seconds += self.sign_seconds
        report.update(seconds=round(seconds, 3), documents_per_second=round(cleaned / seconds) if seconds else None)
        self.log(
            f"dedup: {report['documents']} documents, removed {report['exact']['removed']} exact and "
            f"{report['near']['removed']} near duplicates ({report['near']['clusters']} clusters) in {seconds:.1f}s"
        )
        return Dedup(work, exact, decided=True)

    def _log_boilerplate(self, found: list[BoilerplateResult]) -> None:
        body, edges, spans = (sum(r.body for r in found), sum(r.edges for r in found), sum(r.spans for r in found))
        if body or edges:
            settings = self.cfg.data.clean.boilerplate
            self.log(f"boilerplate: {body} lines occur in >= {settings.min_documents} documents, "
                     f"{edges} header/footer lines open or close >= {settings.min_source_share:.0%} of their source's")
        if spans:
            templates = self.cfg.data.dedup.templates
            self.log(f"dedup templates: {spans} spans of {templates.ngram} units recur in >= "
                     f"{templates.min_share:.0%} of their source's sampled documents (left out of near-duplicate "
                     "similarity)")

    def _log_tokenizer(self, result: TokenizerResult) -> None:
        if result.info["source"] == "loaded":
            extra = OBJECTIVE_TOKENS.get(self.cfg.model.objective)
            self.log(f"loaded tokenizer {result.info['path']} ({result.vocab_size} tokens"
                     f"{f', {extra} added' if extra else ''})")
        else:
            self.log(f"trained byte-level BPE: {result.vocab_size} tokens in {result.seconds:.1f}s")

    def _manifest(self, summaries: dict[int, SourceSummary], merged: list[MergeResult], tokenizer: TokenizerResult,
                  dedup: Dedup, images: ImageCuration | None, image_shards: list[ImageShardResult],
                  timings: dict[str, Any]) -> dict[str, Any]:
        cfg = self.cfg
        totals = {split: {"documents": 0, "tokens": 0, "bytes": 0, "chars": 0, "shards": []} for split in SPLITS}
        for summary in summaries.values():
            for split in SPLITS:
                for key in ("documents", "tokens", "bytes", "chars"):
                    totals[split][key] += summary.splits[split][key]
        for result in merged[:-1]:  # (source, split) in order; the last task is the drop log
            assert result.shard is not None  # a shard task's
            totals[result.shard["path"].split("/", 1)[0]]["shards"].append(result.shard)
        entries = [summary.entry() for summary in summaries.values()]
        for entry in entries:
            self.log(source_line(entry))
        for summary in summaries.values():
            if (warning := summary.rule_warning()) is not None:
                self.log(warning)
        image_section = images_manifest(self.corpus, images, image_shards) if images is not None else None
        _check_splits(totals, image_section, cfg)
        tok = load_tokenizer(self.work.task(TOKENIZER_STAGE, 0) / TOKENIZER)
        data_section = _data_section(cfg)
        dedup_report = self.decided.report if self.decided is not None else {"enabled": False}
        return {
            "format": "mindfoundry.data/1",
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "mindfoundry": mindfoundry.__version__,
            "seed": cfg.seed,
            "validation_fraction": cfg.data.validation_fraction,
            "dtype": str(dtype_for_vocab(cfg.model.vocab_size)),
            "vocab_size": cfg.model.vocab_size,
            "tokenizer": dict(
                tokenizer.info, file=TOKENIZER, sha256=tokenizer_hash(tok), vocab_size=tok.get_vocab_size()
            ),
            "data_config": data_section,
            "data_config_sha256": _sha256_json(data_section),
            "sources": entries,
            "splits": totals,
            "cleaning": cleaning(list(summaries.values())),
            "dedup": dedup_report,
            "notes": [note for summary in summaries.values() for note in summary.notes],
            **({"images": image_section} if image_section is not None else {}),
            "timings": timings,
        }


def _check_splits(totals: dict[str, Any], images: dict[str, Any] | None, cfg: RunConfig) -> None:
    """Refuse a split that holds nothing: no training document or image, no validation one."""
    held = {split: totals[split]["documents"] + (images["splits"][split]["images"] if images else 0)
            for split in SPLITS}
    if held["train"] == 0:
        raise DataError("the corpus is empty after reading: no training documents; check data.sources")
    if cfg.data.validation_fraction > 0 and held["validation"] == 0:
        raise DataError(
            f"no document fell into the validation split (data.validation_fraction={cfg.data.validation_fraction}): "
            "raise the fraction or add documents"
        )


def wait_for_prepared(cfg: RunConfig, *, timeout_s: float = 24 * 3600, poll_s: float = 2.0) -> PreparedData:
    """Wait for another process (rank 0 of a launch) to finish preparing cfg.data.output_dir, then load it.

    Preparation ends with one atomic rename (a folder) or its commit marker (a URL), so the manifest appears only when
    everything is in place; this process never writes.
    """
    out = prepared_location(cfg)
    deadline = time.monotonic() + timeout_s
    while not is_prepared(out):
        if time.monotonic() > deadline:
            raise DataError(f"'{out}' was not prepared within {timeout_s:.0f} s by rank 0: check rank 0's log")
        time.sleep(poll_s)
    if prepared_identity(out) != data_identity(cfg):
        raise DataError(f"'{out}' holds data prepared from a different data config than this rank's: "
                        "all ranks must run the same config")
    return open_prepared(cfg)
