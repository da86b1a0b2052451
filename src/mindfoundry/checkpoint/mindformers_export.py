"""`mindfoundry export CHECKPOINT --format mindformers --out DIR`: the same pretraining continued by MindFormers.

MindFormers is MindSpore's own engine for Ascend clusters; its ``LlamaForCausalLM`` is our model (RMSNorm,
rotate-half RoPE, grouped-query attention, SwiGLU; MindFormers converts Hugging Face Llama weights by
renaming alone), so the hand-off is names and a run config, no arithmetic:

- ``DIR/weights/model.safetensors``: every tensor as it is, under MindFormers' Llama names
  (``layers.3.attn.q_proj.weight`` -> ``model.layers.3.attention.wq.weight``; a tied head is the embedding,
  ``tie_word_embeddings: true``);
- ``DIR/run_mindformers.yaml``: a MindFormers run config for ``msrun ... run_mindformer.py --config``: the model
  (``LlamaConfig``), ``parallel_config`` from our ``parallel`` section, ``recompute_config`` from ``memory``,
  the data as MindFormers' Megatron-dataset loader (``BlendedMegatronDatasetDataLoader``, ``GPTDataset``) over
  this run's ``.bin/.idx`` train shards, blended as our loader draws them, AdamW, the warmup + cosine schedule,
  clipping, loss scaling and checkpoint settings;
- ``DIR/tokenizer.json``: the run's tokenizer (the shards' ids).

What MindFormers' Llama lacks is refused by name: mixture-of-experts blocks (ours are Mixtral-style) and the
masked-LM objective (its Llama is causal). Framework-free: safetensors, json and yaml only;
tests/checkpoint/test_mindformers_export.py opens the files with MindFormers itself.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import numpy as np
import yaml
from safetensors.numpy import save_file

from mindfoundry.checkpoint.handoff import load_hand_off, renamed
from mindfoundry.checkpoint.hf_export import check_weights
from mindfoundry.checkpoint.run_files import run_data
from mindfoundry.checkpoint.store import CheckpointError, publish_mode
from mindfoundry.config.schema import RunConfig
from mindfoundry.data.dataset.mixture import build_mixture
from mindfoundry.data.dataset.prepared import load_prepared
from mindfoundry.model.spec import CaptionSpec, ModelSpec
from mindfoundry.storage.commit import staged_folder
from mindfoundry.storage.local_path import Local
from mindfoundry.storage.location import Location
from mindfoundry.storage.resolve import locate

WEIGHTS_DIR, RUN_YAML = "weights", "run_mindformers.yaml"

#: Our parameter names -> MindFormers' Llama ones: the top-level ones, and a block's (the layer index is kept).
_TOP = {"embed.weight": "model.tok_embeddings.embedding_weight", "norm.weight": "model.norm_out.weight",
        "lm_head.weight": "lm_head.weight"}
_BLOCK = {f"{ours}.weight": f"{theirs}.weight" for ours, theirs in (
    ("attn_norm", "attention_norm"), ("mlp_norm", "ffn_norm"), ("attn.q_proj", "attention.wq"),
    ("attn.k_proj", "attention.wk"), ("attn.v_proj", "attention.wv"), ("attn.o_proj", "attention.wo"),
    ("mlp.gate_proj", "feed_forward.w1"), ("mlp.down_proj", "feed_forward.w2"), ("mlp.up_proj", "feed_forward.w3"))}
_DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


def mindformers_name(name: str) -> str:
    """MindFormers' Llama name of one of our parameter names."""
    return renamed(name, _TOP, _BLOCK)


def model_config(spec: ModelSpec, cfg: RunConfig, *, eos: int, pad: int) -> dict[str, Any]:
    """``model.model_config`` of the run YAML: a ``LlamaConfig`` with exactly this model's sizes. Parameters stay
    float32 (our master weights); the matmuls run in the run's precision, norms and softmax in float32."""
    compute = _DTYPES[cfg.train.precision]
    return {
        "type": "LlamaConfig",
        "batch_size": cfg.train.micro_batch_size,
        "seq_length": cfg.train.seq_len,
        "hidden_size": spec.d_model,
        "num_layers": spec.n_layers,
        "num_heads": spec.n_heads,
        "n_kv_heads": spec.n_kv_heads,
        "intermediate_size": spec.ffn_dim,
        "vocab_size": spec.vocab_size,
        "rms_norm_eps": spec.norm_eps,
        "theta": spec.rope_theta,
        "max_position_embedding": spec.max_seq_len,
        "tie_word_embeddings": spec.tie_embeddings,
        "bos_token_id": eos,
        "eos_token_id": eos,
        "pad_token_id": pad,
        "ignore_token_id": -100,
        "compute_dtype": compute,
        "layernorm_compute_type": "float32",
        "softmax_compute_type": "float32",
        "rotary_dtype": "float32",
        "param_init_type": "float32",
        "use_past": False,
        "use_flash_attention": True,
        "qkv_concat": False,
        "use_rope_slice": True,  # rotate-half as slices (our RoPE), not a swap matmul
    }


def _blend(cfg: RunConfig, data_dir: Path) -> list[Any]:
    """MindFormers' ``data_path``: [weight, shard prefix, ...] over the train shards, weighted as our loader draws them
    (the mixture's target shares, else each source by its tokens)."""
    prepared = load_prepared(data_dir, cfg.model.vocab_size)
    entries = prepared.manifest["splits"]["train"]["shards"]
    if cfg.data.mixture is not None:
        shares = build_mixture(prepared, cfg.data.mixture, seq_len=cfg.train.seq_len, seed=cfg.seed).target()["sources"]
        weights = [shares[Path(e["path"]).name] for e in entries]
    else:
        weights = [e["num_tokens"] for e in entries]
    total = sum(weights)
    return [
        x
        for w, e in zip(weights, entries)
        if w > 0
        for x in (round(w / total, 6), str((data_dir / e["path"]).resolve()))
    ]


def run_yaml(
    cfg: RunConfig, spec: ModelSpec, weights_dir: Path, data_path: list[Any], *, eos: int, pad: int
) -> dict[str, Any]:
    """The MindFormers run config continuing `cfg`'s pretraining (see the module docstring)."""
    t, o, p, mem = cfg.train, cfg.optim, cfg.parallel, cfg.memory
    layout = p.layout()
    steps = t.steps
    dataset = {
        "data_loader": {
            "type": "BlendedMegatronDatasetDataLoader", "datasets_type": "GPTDataset",
            "sizes": [layout.global_batch(t) * steps, 0, 0], "shuffle": cfg.data.shuffle,
            "config": {"seed": cfg.seed, "seq_length": t.seq_len, "split": "1, 0, 0", "data_path": data_path,
                       "num_dataset_builder_threads": 1, "eod": eos, "pad": pad, "eod_mask_loss": False,
                       "create_attention_mask": True},
        },
        "input_columns": ["input_ids", "labels", "loss_mask", "position_ids", "attention_mask"],
        "construct_args_key": ["input_ids", "labels", "loss_mask", "position_ids", "attention_mask"],
        "num_parallel_workers": 8, "python_multiprocessing": False, "drop_remainder": True, "numa_enable": False,
        "prefetch_size": 1, "seed": cfg.seed,
    }
    scale: Any = 1.0
    if t.precision == "fp16":
        scale = {"type": "DynamicLossScaleUpdateCell", "loss_scale_value": t.loss_scale_init, "scale_factor": 2,
                 "scale_window": t.loss_scale_growth_interval}
    recompute: Any = False
    if mem.recompute == "full":
        recompute = True if mem.recompute_layers == "all" else len(mem.recomputed_layers(spec.n_layers))
    return {
        "seed": cfg.seed,
        "output_dir": "./output",
        "run_mode": "train",
        "load_checkpoint": str(weights_dir.resolve()),
        "load_ckpt_format": "safetensors",
        "auto_trans_ckpt": True,
        "only_save_strategy": False,
        "resume_training": False,
        "trainer": {"type": "CausalLanguageModelingTrainer", "model_name": "llama"},
        "runner_config": {
            "epochs": 1,
            "batch_size": t.micro_batch_size,
            "sink_mode": True,
            "sink_size": 1,
            "gradient_accumulation_steps": t.grad_accum if p.pp == 1 else 1,
        },
        "optimizer": {"type": "AdamW", "betas": [o.beta1, o.beta2], "eps": o.eps, "weight_decay": o.weight_decay},
        "lr_schedule": {
            "type": "CosineWithWarmUpLR",
            "learning_rate": o.lr,
            "lr_end": o.lr * o.min_lr_ratio,
            "warmup_steps": o.warmup_steps,
            "total_steps": steps,
        },
        "train_dataset": dataset,
        "train_dataset_task": {"type": "CausalLanguageModelDataset", "dataset_config": dataset},
        "use_parallel": layout.world_size > 1,
        "parallel": {
            "parallel_mode": 1,
            "gradients_mean": False,
            "enable_alltoall": p.ep > 1,
            "full_batch": True,
            "search_mode": "sharding_propagation",
            "enable_parallel_optimizer": layout.shards_optimizer,
            "strategy_ckpt_save_file": "./ckpt_strategy.ckpt",
            "parallel_optimizer_config": {"gradient_accumulation_shard": False, "parallel_optimizer_threshold": 64},
        },
        "parallel_config": {
            "data_parallel": layout.dp,
            "model_parallel": p.tp,
            "pipeline_stage": p.pp,
            "context_parallel": p.cp,
            "expert_parallel": p.ep,
            "use_seq_parallel": p.tp > 1 and p.sequence_parallel,
            "micro_batch_num": t.grad_accum if p.pp > 1 else 1,
            "vocab_emb_dp": p.tp == 1,
            "optimizer_shard": layout.shards_optimizer,
            "gradient_aggregation_group": p.grad_fusion_groups or 4,
        },
        "micro_batch_interleave_num": 1,
        "recompute_config": {
            "recompute": recompute,
            "select_recompute": mem.recompute == "selective",
            "parallel_optimizer_comm_recompute": False,
            "mp_comm_recompute": True,
            "recompute_slice_activation": True,
        },
        "callbacks": [
            {"type": "MFLossMonitor"},
            {
                "type": "CheckpointMonitor",
                "prefix": cfg.name,
                "save_checkpoint_steps": cfg.checkpoint.every or steps,
                "keep_checkpoint_max": cfg.checkpoint.keep_last,
                "integrated_save": False,
                "async_save": False,
            },
        ],
        "context": {
            "mode": 0,
            "device_target": "Ascend",
            "max_call_depth": 10000,
            "save_graphs": False,
            "device_id": 0,
        },
        "model": {"model_config": model_config(spec, cfg, eos=eos, pad=pad), "arch": {"type": "LlamaForCausalLM"}},
        "runner_wrapper": {
            "type": "MFTrainOneStepCell",
            "scale_sense": scale,
            "use_clip_grad": o.clip_norm is not None,
            "max_grad_norm": float(o.clip_norm or 1.0),
        },
    }


def mindformers_weights(spec: ModelSpec, weights: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The checkpoint's weights under MindFormers' names; the names and shapes must be exactly this model's."""
    check_weights(spec, weights, "the checkpoint's weights")
    return {mindformers_name(n): np.ascontiguousarray(w, dtype=np.float32) for n, w in weights.items()}


def export_mindformers(ckpt_dir: str | Path, out: str | Path | Location) -> Path:
    """Write checkpoint `ckpt_dir` as a MindFormers hand-off folder `out` (a local folder: its run YAML names the
    weights by their path); refuses a non-empty `out` and what MindFormers' Llama cannot hold."""
    ckpt_dir = Path(ckpt_dir)
    out = locate(out).local_path("--out of --format mindformers", "the run YAML names its weights by a path that "
                                 "MindFormers reads from a local disk: export to a folder of the machine that runs "
                                 "MindFormers")
    with staged_folder(Local(out)) as tmp:
        model = load_hand_off(ckpt_dir, "mindformers", "MindFormers' LlamaForCausalLM")
        cfg, spec = model.cfg, model.spec
        if isinstance(spec, CaptionSpec):
            raise CheckpointError("MindFormers 1.9 has no image-text model to hold a captioner: export it with "
                                  "--format hf (LlavaForConditionalGeneration) or --format safetensors")
        weights = mindformers_weights(spec, model.weights)
        if spec.tie_embeddings:
            weights.pop("lm_head.weight", None)
        (tmp / WEIGHTS_DIR).mkdir()
        save_file(weights, str(tmp / WEIGHTS_DIR / "model.safetensors"), metadata={"format": "ms"})
        config = run_yaml(
            cfg, spec, out / WEIGHTS_DIR, _blend(cfg, run_data(ckpt_dir, cfg)), eos=model.eos, pad=model.pad
        )
        header = (
            f"# MindFormers run config written by `mindfoundry export --format mindformers` from {ckpt_dir.resolve()}\n"
            "# Continue on Ascend: msrun --worker_num=N ... run_mindformer.py --config THIS_FILE "
            "(docs/checkpoints.md)\n"
        )
        (tmp / RUN_YAML).write_text(
            header + yaml.safe_dump(config, sort_keys=False, allow_unicode=True), encoding="utf-8"
        )
        model.tokenizer_path.download(tmp / "tokenizer.json")
        publish_mode(tmp)
    return out
