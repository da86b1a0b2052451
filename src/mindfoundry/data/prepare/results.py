"""What each task of the staged `prepare` reports: one dataclass per stage, the fields that the later stages, the
driver (:mod:`.pipeline`) and the manifest (:mod:`.manifest`) read by name.

A result travels from a worker to the driver and is kept as its task folder's result.json, so that a resumed
`prepare` reads back a finished task's result instead of running it again; nested values (a block's counters, a
shard's description, the dedup report) are the JSON mappings the manifest writes as they are.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from mindfoundry.data.execute.stage import TaskResult

#: The key runs a read task counts: boilerplate lines ("line") and template spans ("span").
CountedKind = Literal["line", "span"]


@dataclass(frozen=True)
class ReadResult(TaskResult):
    """A read task: what it read (counters, files with their sha256, notes), what the blocks before boilerplate did,
    the documents it stored, its drop-log lines, and the key runs it counted (None: it counted none of that kind)."""

    kept: int
    stats: dict[str, int]
    files: list[dict[str, Any]]
    notes: list[str]
    blocks: dict[str, dict[str, Any]]
    lines: int
    line_documents: int | None = None
    line_entries: int | None = None
    span_documents: int | None = None
    span_entries: int | None = None
    span_sites: dict[str, int] | None = None  # sampled documents per site number (str: the result is JSON)

    def counted(self, kind: CountedKind) -> tuple[int, int] | None:
        """(documents, key-run entries) of the keys of ``kind`` this task counted, or None."""
        documents, entries = (
            (self.line_documents, self.line_entries) if kind == "line" else (self.span_documents, self.span_entries)
        )
        return None if documents is None or entries is None else (documents, entries)


@dataclass(frozen=True)
class BoilerplateResult(TaskResult):
    """A key range's frequent keys: boilerplate body lines, header/footer lines and template spans."""

    body: int
    edges: int
    spans: int


@dataclass(frozen=True)
class TemplateResult(TaskResult):
    """The template shingles of a read task's sampled documents."""

    shingles: int


@dataclass(frozen=True)
class CleanResult(TaskResult):
    """A clean task: the documents it kept and their characters, what its blocks did, its drop-log lines (the read
    task's and its own) and the time spent signing for dedup."""

    kept: int
    chars: int
    blocks: dict[str, dict[str, Any]]
    lines: int
    sign_seconds: float


@dataclass(frozen=True)
class ExactResult(TaskResult):
    """An exact-dedup key range: keys seen, copies dropped, the clusters (their JSON form) and drops per source
    (keyed by the source's index as a string, JSON's only key type)."""

    entries: int
    dropped: int
    clusters: dict[str, Any]
    by_source: dict[str, int]


@dataclass(frozen=True)
class BandResult(TaskResult):
    """An LSH band-key range: keys seen and the candidate pairs they made."""

    entries: int
    pairs: int


@dataclass(frozen=True)
class PairResult(TaskResult):
    """A read task's candidate pairs, and how many of them verification kept."""

    candidates: int
    verified: int


@dataclass(frozen=True)
class DecideResult(TaskResult):
    """The near-duplicate decisions' report: the manifest's ``dedup`` section (without its times)."""

    report: dict[str, Any]


@dataclass(frozen=True)
class TokenizerResult(TaskResult):
    """Where the tokenizer came from (``info``: loaded from a path or trained, and how), its size, and the time."""

    info: dict[str, Any]
    vocab_size: int
    seconds: float


@dataclass(frozen=True)
class ShardResult(TaskResult):
    """A read task's token shards: per split the counts (documents, tokens, bytes, chars) and the shard's
    description, its drop-log lines, and the characters dedup removed by kind."""

    splits: dict[str, dict[str, int]]
    shards: dict[str, dict[str, Any]]
    lines: int
    dedup_chars: dict[str, int]


@dataclass(frozen=True)
class MergeResult(TaskResult):
    """A merge task: one (source, split) shard's description for the manifest, or (the last task) the drop log's
    file name."""

    shard: dict[str, Any] | None = None
    file: str | None = None


@dataclass(frozen=True)
class ImageReadResult(TaskResult):
    """An image read task: the samples it read and kept, the reasons of those it did not keep, and the bytes it stored
    for the WebDataset tars."""

    read: int
    kept: int
    reasons: dict[str, int]
    stored_bytes: int


@dataclass(frozen=True)
class ImageDedupResult(TaskResult):
    """Image dedup over the whole corpus: the images kept, the exact and near copies removed (and by source), the
    clusters of the split and the images held out."""

    kept: int
    exact: int
    near: int
    clusters: int
    validation: int
    removed_by_source: dict[str, int]


@dataclass(frozen=True)
class ImageShardResult(TaskResult):
    """One image source's shards of one split: where they are (relative to the data folder) and their sha256."""

    source: str
    split: str
    images: int
    shards: dict[str, Any]
