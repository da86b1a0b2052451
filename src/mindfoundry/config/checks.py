"""Rules that relate several config fields.

Each rule returns a message naming the full key path(s), the values and a fix, so the user never
has to guess which number to change.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from mindfoundry.config.parallel_config import split_settings
from mindfoundry.config.schema import ASCEND_DEVICES, RunConfig
from mindfoundry.config.section import url_protocol

#: 256 byte symbols plus the EOS and PAD special tokens.
MIN_BYTE_BPE_VOCAB = 258


def _divisors_near(n: int, around: int) -> str:
    divs = [d for d in range(1, n + 1) if n % d == 0]
    best = sorted(divs, key=lambda d: abs(d - around))[:2]
    return " or ".join(str(d) for d in sorted(best))


def _model_problems(cfg: RunConfig) -> list[str]:
    m = cfg.model
    out = []
    if m.d_model % m.n_heads:
        out.append(
            f"model.n_heads={m.n_heads} does not divide model.d_model={m.d_model}: "
            f"choose n_heads dividing d_model (e.g. {_divisors_near(m.d_model, m.n_heads)})"
        )
    elif (m.d_model // m.n_heads) % 2:
        out.append(
            f"model.d_model/model.n_heads = {m.d_model // m.n_heads} is odd: RoPE needs an even head dimension; "
            "change n_heads or d_model"
        )
    if m.n_kv_heads is not None and m.n_heads % m.n_kv_heads:
        out.append(
            f"model.n_kv_heads={m.n_kv_heads} does not divide model.n_heads={m.n_heads}: "
            f"choose n_kv_heads dividing n_heads (e.g. {_divisors_near(m.n_heads, m.n_kv_heads)})"
        )
    if cfg.train.seq_len > m.max_seq_len:
        out.append(
            f"train.seq_len={cfg.train.seq_len} exceeds model.max_seq_len={m.max_seq_len}: "
            "lower train.seq_len or raise model.max_seq_len"
        )
    if cfg.data.tokenizer.path is None and m.vocab_size < MIN_BYTE_BPE_VOCAB:
        out.append(
            f"model.vocab_size={m.vocab_size} is too small for a byte-level BPE tokenizer: "
            f"use at least {MIN_BYTE_BPE_VOCAB} (256 bytes + 2 special tokens)"
        )
    if m.objective == "mlm" and cfg.data.tokenizer.path is None and m.vocab_size < MIN_BYTE_BPE_VOCAB + 1:
        out.append(
            f"model.vocab_size={m.vocab_size} leaves no room for the mask token of model.objective=mlm: use at least "
            f"{MIN_BYTE_BPE_VOCAB + 1} (256 bytes + 3 special tokens)"
        )
    if m.moe.num_experts and m.moe.every > m.n_layers:
        out.append(
            f"model.moe.every={m.moe.every} exceeds model.n_layers={m.n_layers}: no block would be a mixture of "
            f"experts; use every <= {m.n_layers} (1 = every block) or num_experts: 0 for a dense model"
        )
    return out


def _data_problems(cfg: RunConfig) -> list[str]:
    out = []
    seen: set[str] = set()
    for i, src in enumerate(cfg.data.sources):
        key = f"data.sources[{i}]"
        if src.name in seen:
            out.append(f"{key}.name={src.name!r} is used twice: give every source a unique name")
        seen.add(src.name)
        if (src.builtin is None) == (not src.paths):
            out.append(f"{key} ({src.name}) needs exactly one of 'builtin' or 'paths': set one and remove the other")
        if src.builtin is not None and src.modality != "text":
            out.append(f"{key}.modality={src.modality!r}: the built-in {src.builtin!r} is text; give an image source "
                       "its paths (WebDataset tars, .jsonl/.parquet records, image folders)")
        if src.modality != "text" and (src.max_documents is not None or src.max_bytes is not None):
            out.append(f"{key}: max_documents and max_bytes cap text sources; an image source reads all its files "
                       "(narrow its paths instead)")
    tok = cfg.data.tokenizer.path
    if tok is not None and url_protocol(tok) is None and not Path(tok).is_file():  # (a URL's object: when it is read)
        out.append(
            f"data.tokenizer.path={tok!r} does not exist: point it at a tokenizer.json or set it to null to train one"
        )
    return out + _clean_problems(cfg) + _dedup_problems(cfg)


# (section, lower-bound field, upper-bound field) pairs that must not cross.
_CLEAN_BOUNDS = (
    ("length", "min_chars", "max_chars"),
    ("script", "min_cjk_ratio", "max_cjk_ratio"),
    ("script", "min_latin_ratio", "max_latin_ratio"),
    ("quality", "min_mean_word_length", "max_mean_word_length"),
)


def _clean_problems(cfg: RunConfig) -> list[str]:
    """Bounds that exclude every document, in data.clean and in each source's overrides."""
    sections = [("data.clean", cfg.data.clean)]
    sections += [(f"data.sources[{i}].clean", src.clean) for i, src in enumerate(cfg.data.sources)]
    out = []
    for prefix, clean in sections:
        for name, low_field, high_field in _CLEAN_BOUNDS:
            section = getattr(clean, name)
            if section is None:
                continue
            low, high = getattr(section, low_field), getattr(section, high_field)
            if low is not None and high is not None and low > high:
                out.append(f"{prefix}.{name}.{low_field}={low} exceeds {high_field}={high}: no document can pass; "
                           f"lower {low_field} or raise {high_field}")
        script = clean.script
        if script is not None and (script.min_cjk_ratio or 0) + (script.min_latin_ratio or 0) > 1:
            out.append(
                f"{prefix}.script.min_cjk_ratio={script.min_cjk_ratio} plus min_latin_ratio={script.min_latin_ratio} "
                "exceeds 1: no document can have both shares; lower one of them"
            )
    corpus_wide = cfg.data.clean.boilerplate
    for i, src in enumerate(cfg.data.sources):
        own = src.clean.boilerplate
        for key in (
            "min_documents",
            "min_line_chars",
            "edge_lines",
            "min_source_share",
        ):  # what the pre-pass counts with
            if own is not None and getattr(own, key) != getattr(corpus_wide, key):
                out.append(
                    f"data.sources[{i}].clean.boilerplate.{key}={getattr(own, key)} differs from "
                    f"data.clean.boilerplate.{key}={getattr(corpus_wide, key)}: lines are counted over the whole "
                    f"corpus in one pre-pass, so set {key} in data.clean.boilerplate only"
                )
    return out


def lsh_candidate_probability(similarity: float, bands: int, rows: int) -> float:
    """Probability that MinHash-LSH with ``bands`` x ``rows`` proposes a pair of this Jaccard similarity."""
    return 1.0 - (1.0 - similarity**rows) ** bands


def _dedup_problems(cfg: RunConfig) -> list[str]:
    """LSH bands x rows must fit the signature and find pairs at the configured threshold."""
    d = cfg.data.dedup
    if not (d.enabled and d.near):
        return []
    if d.bands * d.rows > d.num_perm:
        return [
            f"data.dedup.bands*rows = {d.bands}*{d.rows} = {d.bands * d.rows} exceeds "
            f"data.dedup.num_perm={d.num_perm}: lower bands or rows, or raise num_perm to {d.bands * d.rows}"
        ]
    found = lsh_candidate_probability(d.threshold, d.bands, d.rows)
    if found < 0.5:
        rows = max(
            (r for r in range(1, d.num_perm + 1) if lsh_candidate_probability(d.threshold, d.num_perm // r, r) >= 0.9),
            default=1,
        )
        return [
            f"data.dedup.bands={d.bands} x rows={d.rows} finds a pair at data.dedup.threshold={d.threshold} with "
            "probability "
            f"{found:.2f}: most near-duplicates would be missed; use bands={d.num_perm // rows}, rows={rows}"
        ]
    return []


def _train_problems(cfg: RunConfig) -> list[str]:
    out = []
    if cfg.backend == "mindspore" and cfg.train.precision == "bf16" and cfg.device not in ASCEND_DEVICES:
        out.append(
            "train.precision='bf16' is not available on the mindspore backend yet (MindSpore has no bf16 kernels on "
            "CPU): use train.precision: fp16 (mixed precision with dynamic loss scaling) or fp32, or backend: torch "
            f"for bf16 (device: {cfg.device}; MindSpore's bf16 runs with device: ascend)"
        )
    if cfg.train.flash_attention == "on":
        where = (
            []
            if cfg.backend == "mindspore"
            else [f"the mindspore backend (the {cfg.backend} engine's attention picks its own kernel)"]
        )
        where += (
            [] if cfg.device in ASCEND_DEVICES else [f"device: ascend (FlashAttentionScore has no {cfg.device} kernel)"]
        )
        where += (
            []
            if cfg.train.precision in ("fp16", "bf16")
            else ["train.precision fp16 or bf16 (it computes in half precision)"]
        )
        if where:
            out.append(
                f"train.flash_attention=on needs {' and '.join(where)}: set train.flash_attention: auto (or off)"
            )
    if cfg.backend == "mindspore" and cfg.train.compile:
        out.append(
            "train.compile=true applies to the torch backend only: MindSpore always compiles (GRAPH_MODE); remove it"
        )
    if cfg.backend != "mindspore" and cfg.monitor.mindinsight:
        out.append(
            "monitor.mindinsight=true writes MindSpore summary files (mindspore.SummaryRecord), which the "
            f"{cfg.backend} engine does not load: use backend: mindspore, or set monitor.mindinsight: false "
            "(TensorBoard has the same scalars)"
        )
    if cfg.backend == "mindspore":
        split = split_settings(cfg.parallel)
        if cfg.checkpoint.format == "sharded" and not split:
            out.append(
                "checkpoint.format='sharded' with backend mindspore is the form of semi-auto parallel layouts (each "
                "rank writes the slices it holds); this layout keeps whole replicas: use checkpoint.format: full"
            )
        elif (
            split and cfg.checkpoint.format == "full" and cfg.device != "cpu"
        ):  # on CPU the engine refuses the layout itself
            out.append(
                f"parallel {', '.join(split)}: the MindSpore engine runs this layout in semi-auto parallel mode, whose "
                "ranks hold slices of the weights and optimizer state: set checkpoint.format: sharded (rank slices + "
                "MindSpore's strategy file; they merge into full arrays without MindSpore)"
            )
    if cfg.model.objective == "mlm" and cfg.eval.tasks:
        out.append(
            "eval.tasks score multiple-choice answers by their causal log-likelihood, which model.objective=mlm (a "
            "bidirectional encoder) does not give: remove eval.tasks, or train with model.objective: clm"
        )
    for i, task in enumerate(cfg.eval.tasks):
        if url_protocol(task) is None and not Path(task).is_file():
            out.append(
                f"eval.tasks[{i}]={task!r} does not exist: give a multiple-choice .jsonl file (docs/evaluation.md) "
                "or remove it"
            )
    init = cfg.model.init_from
    if init is not None and url_protocol(init) is None and not Path(init).is_dir():
        out.append(f"model.init_from={init!r} is not a folder: point it at a Hugging Face Llama folder or a "
                   "RUN/checkpoints/step_N folder, or set it to null for random initial weights")
    if cfg.optim.warmup_steps > cfg.train.steps:
        out.append(
            f"optim.warmup_steps={cfg.optim.warmup_steps} exceeds train.steps={cfg.train.steps}: "
            "the LR would never reach its peak; lower warmup_steps"
        )
    return out


def _mixture_problems(cfg: RunConfig) -> list[str]:
    """The mixture must weigh exactly the categories of data.sources: a category left out or weighted 0
    would silently vanish from training, and a misspelt one would silently get nothing."""
    mix = cfg.data.mixture
    if mix is None:
        return []
    sources: dict[str, list[str]] = {}
    for src in cfg.data.sources:
        if src.modality == "text":  # the mixture draws the text samples; images are the image trainers'
            sources.setdefault(src.resolved_category(), []).append(src.name)
    out = []
    for name, weight in mix.weights.items():
        key = f"data.mixture.weights.{name}"
        if name not in sources:
            out.append(
                f"{key}: no source has category {name!r} (categories: {', '.join(sources)}): fix the name or remove it"
            )
        elif not 0 < weight < math.inf:
            out.append(f"{key}={weight}: weights must be > 0; to train without category {name!r}, "
                       f"remove its sources ({', '.join(sources[name])}) from data.sources")
    for name, names in sources.items():
        if name not in mix.weights:
            out.append(
                f"data.mixture.weights has no weight for category {name!r} (sources: {', '.join(names)}): add one, "
                "or remove those sources"
            )
    largest = max(len(sources), *(len(n) for n in sources.values()))
    if mix.block_size < largest:
        out.append(
            f"data.mixture.block_size={mix.block_size} is below the {largest} categories or sources of one category "
            f"it must fit: raise it (e.g. 1000)"
        )
    return out


def _image_model_problems(cfg: RunConfig) -> list[str]:
    """The image objectives: a ViT to train, image data its size fits, and only what this version runs them with."""
    m, out = cfg.model, []
    if cfg.train.freeze and m.objective != "caption":
        out.append(f"train.freeze names parts of a captioner, and model.objective={m.objective}: remove train.freeze")
    if not m.is_image:
        if m.vision is not None:
            out.append(f"model.vision is the encoder of the image objectives, and model.objective={m.objective} "
                       "trains text: remove model.vision, or set model.objective: mae or caption")
        return out
    if m.vision is None:
        return [f"model.objective={m.objective} trains a ViT: add model.vision (e.g. {{patch_size: 8, d_model: 192, "
                "n_layers: 4, n_heads: 3}})"]
    side = cfg.data.images.size
    if m.vision.image_size is not None and m.vision.image_size != side:
        out.append(f"model.vision.image_size={m.vision.image_size} differs from data.images.size={side}, the side of "
                   "the prepared pixel shards: set one to the other (or model.vision.image_size: null to follow it)")
    elif side % m.vision.patch_size:
        near = _divisors_near(side, m.vision.patch_size)
        out.append(f"model.vision.patch_size={m.vision.patch_size} does not divide the image side {side} "
                   f"(data.images.size): choose a patch size dividing it (e.g. {near})")
    if not any(src.modality != "text" for src in cfg.data.sources):
        out.append(f"model.objective={m.objective} trains on images, and data.sources has no image source: add one "
                   "with modality: image or image_text")
    elif m.objective == "caption" and not any(src.modality == "image_text" for src in cfg.data.sources):
        out.append("model.objective=caption learns images' captions, and data.sources has no source with captions: "
                   "add one with modality: image_text (images with their captions)")
    if m.objective == "caption":
        out += _caption_problems(cfg)
    elif m.vision is not None and m.vision.init_from is not None:
        out.append("model.vision.init_from starts a captioner's encoder; an mae run starts from model.init_from: "
                   "move it there")
    if cfg.data.mixture is not None:
        out.append(f"data.mixture weighs text categories; model.objective={m.objective} reads every prepared image: "
                   "remove data.mixture")
    if cfg.eval.tasks:
        out.append(f"eval.tasks score text answers; model.objective={m.objective} trains an image model: remove "
                   "eval.tasks")
    if cfg.backend == "mindspore" and cfg.train.precision != "fp32":
        out.append(f"train.precision={cfg.train.precision} with model.objective={m.objective} on the mindspore engine: "
                   "its ViT computes in float32 in this version; use train.precision: fp32, or backend: torch (bf16 "
                   "and fp16 autocast)")
    split = [f"{key}={value}" for key, value in (("tp", cfg.parallel.tp), ("pp", cfg.parallel.pp),
                                                  ("cp", cfg.parallel.cp), ("ep", cfg.parallel.ep)) if value > 1]
    if split:
        out.append(f"parallel {', '.join(split)} with model.objective={m.objective}: the image models run data "
                   "parallel in this version (parallel.dp_replicate, and dp_shard on torch): set them to 1")
    return out


def _caption_problems(cfg: RunConfig) -> list[str]:
    """A captioner's decoder must hold the image tokens and the caption, and something must train."""
    m, out = cfg.model, []
    patches = (cfg.data.images.size // m.vision.patch_size) ** 2 if m.vision else 0
    if patches + cfg.train.seq_len > m.max_seq_len:
        out.append(f"model.max_seq_len={m.max_seq_len} is shorter than an image's {patches} patch tokens plus "
                   f"train.seq_len={cfg.train.seq_len} caption tokens: raise model.max_seq_len to "
                   f"{patches + cfg.train.seq_len} (or use larger patches, or shorter captions)")
    if m.moe.num_experts:
        out.append("model.moe.num_experts with model.objective=caption: the captioner's decoder is dense in this "
                   "version (LLaVA's layout); set model.moe.num_experts: 0")
    if set(cfg.train.freeze) >= {"vision", "projector", "decoder"}:
        out.append(f"train.freeze={list(cfg.train.freeze)} freezes the whole captioner: nothing would train; leave "
                   "at least one part out (LLaVA's first stage freezes vision and decoder, training the projector)")
    return out


def _parallel_problems(cfg: RunConfig) -> list[str]:
    """The parallel rules that need neither the model's divisibility nor a launcher (those are
    :mod:`mindfoundry.config.layout_rules`'s, which :func:`mindfoundry.config.load.validate` applies after these)."""
    out = []
    p = cfg.parallel
    if cfg.model.objective == "mlm":
        for key, value, why in (
            ("pp", p.pp, "the later pipeline stages never see the token ids the padding mask comes from"),
            ("cp", p.cp, "its attention is written for the causal mask"),
        ):
            if value > 1:
                out.append(f"parallel.{key}={value} with model.objective=mlm: {why}; use parallel.{key}: 1 with mlm "
                           "(dp, dp_shard, tp and ep all train it)")
    if p.grad_fusion_groups is not None and cfg.backend != "mindspore":
        out.append(
            f"parallel.grad_fusion_groups={p.grad_fusion_groups} (MindFormers' gradient_aggregation_group) sets "
            f"MindSpore's gradient all-reduce fusion; the {cfg.backend} engine's FSDP2 reduces each block's gradients "
            "as one group: remove it, or use backend: mindspore"
        )
    if cfg.optim.clip_norm == "auto" and p.dp_shard == -1 and p.world_size is None:
        out.append(
            "optim.clip_norm='auto' depends on the global batch, which parallel.dp_shard=-1 leaves unknown until "
            "launch: set parallel.world_size (the number of processes) or a number for optim.clip_norm"
        )
    return out


def _memory_problems(cfg: RunConfig) -> list[str]:
    """Recompute on blocks the model has, chunks no longer than a sequence, offload only where it moves something."""
    mem = cfg.memory
    out = []
    m = cfg.model
    blocks = m.n_layers
    if m.objective == "mae" and m.vision is not None:
        blocks = m.vision.n_layers + m.mae.decoder_layers  # the encoder's, then the decoder's
        if mem.recompute == "selective":
            out.append(f"memory.recompute=selective names parts of the language model's blocks; model.objective="
                       f"{m.objective} recomputes a ViT's blocks whole: use memory.recompute: full")
        if mem.loss_chunk:
            out.append(f"memory.loss_chunk={mem.loss_chunk} cuts a language model's output head; model.objective="
                       f"{m.objective} has none: set memory.loss_chunk: 0")
    if m.objective == "caption" and mem.loss_chunk:
        out.append(f"memory.loss_chunk={mem.loss_chunk} with model.objective=caption: the captioner's loss covers "
                   "its caption slots whole in this version; set memory.loss_chunk: 0")
    try:
        mem.recomputed_layers(blocks)
    except ValueError as err:
        out.append(str(err))
    if mem.recompute == "none" and mem.recompute_layers != "all":
        out.append(f"memory.recompute_layers={mem.recompute_layers} has no effect with memory.recompute: none: "
                   "set memory.recompute: full or selective, or remove recompute_layers")
    if mem.loss_chunk > cfg.train.seq_len:
        out.append(
            f"memory.loss_chunk={mem.loss_chunk} exceeds train.seq_len={cfg.train.seq_len}: a chunk holds at most one "
            f"sequence's positions; use loss_chunk <= {cfg.train.seq_len} (e.g. {max(1, cfg.train.seq_len // 4)}), "
            "or 0 for the whole-vocabulary loss in one piece"
        )
    if mem.offload_activations and cfg.device == "cpu":
        out.append(
            "memory.offload_activations=true with device: cpu: offloading moves activations from an accelerator to "
            "host memory, and on a CPU they already are there; use memory.recompute: full (or selective) to save "
            "memory on CPU, or device: cuda/npu"
        )
    elif mem.offload_activations and cfg.backend == "mindspore":
        out.append(
            "memory.offload_activations=true on the mindspore backend: MindSpore's Cell.offload needs lazy-inline "
            "blocks on Ascend, which this engine does not build yet; use memory.recompute: full (or selective), or "
            "backend: torch on a CUDA/NPU device"
        )
    return out


#: The keys that name a folder MindFoundry writes, and, for those that cannot be a URL, why.
FOLDER_KEYS: dict[str, str | None] = {
    "run_dir": "the run's lock, config, metrics and logs are local files: keep run_dir on a local disk and put "
    "checkpoint.dir and data.output_dir at URLs",
    "checkpoint.dir": None,
    "data.output_dir": None,
    "data.work_dir": None,
    "data.cache_dir": "it is this node's cache of what it fetches from URLs",
    "debug.dump.dir": "the engines' hooks write dumps as local files (copy the folder to storage afterwards)",
    "monitor.profile.dir": "the engines' profilers write their traces as local files",
}


def _value(cfg: RunConfig, dotted: str) -> object:
    node: object = cfg
    for part in dotted.split("."):
        node = getattr(node, part)
    return node


def _path_problems(cfg: RunConfig) -> list[str]:
    """Folders that cannot be: a URL where only a local folder works, a local path under an existing file (or a
    device, a pipe) that can never hold a folder."""
    out = []
    for key, local_only in FOLDER_KEYS.items():
        value = _value(cfg, key)
        if not isinstance(value, str):
            continue
        if url_protocol(value) is not None:
            if local_only:
                out.append(f"{key}={value!r} cannot be a URL: {local_only}")
            continue
        path = Path(value.removeprefix("file://"))
        blocker = next((p for p in (path, *path.parents) if p.exists()), None)
        if blocker is not None and not blocker.is_dir():
            out.append(f"{key}={value!r} cannot hold a folder: '{blocker}' is a file, not a folder; choose a folder "
                       "path")
        elif blocker is not None and blocker != path and not os.access(blocker, os.W_OK):
            out.append(f"{key}={value!r} cannot be made: '{blocker}' is not writable (a read-only disk, /proc, "
                       "another user's folder); choose a folder on a writable disk")
    return out


def cross_field_problems(cfg: RunConfig) -> list[str]:
    """All violated multi-field rules, in section order."""
    return (
        _path_problems(cfg)
        + _model_problems(cfg)
        + _image_model_problems(cfg)
        + _data_problems(cfg)
        + _mixture_problems(cfg)
        + _train_problems(cfg)
        + _parallel_problems(cfg)
        + _memory_problems(cfg)
    )
