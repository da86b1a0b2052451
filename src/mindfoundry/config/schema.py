"""The run configuration: one YAML file, one pydantic model per section.

Every field carries a description so `mindfoundry config show` and the docs can explain it.
Per-field limits live here; rules that relate several fields (divisibility, vocab vs. dtype,
batch vs. data) live in :mod:`mindfoundry.config.checks` so each error can name the full key
path and a concrete fix. The sections live in one module each where they are large (model, data,
data.clean, parallel); this module holds the training sections and the whole :class:`RunConfig`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from mindfoundry.config.data_config import DataConfig
from mindfoundry.config.memory_config import MemoryConfig
from mindfoundry.config.model_config import ModelConfig
from mindfoundry.config.parallel_config import ParallelConfig
from mindfoundry.config.section import Section, checked_path
from mindfoundry.config.selection import parse_selection
from mindfoundry.config.storage_config import StorageConfig

#: `device` values that name an Ascend NPU (MindSpore's bf16 kernels and FlashAttentionScore live there).
ASCEND_DEVICES = ("ascend", "npu")


class TrainConfig(Section):
    """Loop sizes. Global batch = micro_batch_size * grad_accum * parallel.dp sequences (dp = dp_replicate * dp_shard).
    """

    steps: int = Field(300, ge=1, description="Optimizer steps for the whole run.")
    micro_batch_size: int = Field(16, ge=1, le=2**20, description="Sequences per micro-batch per data-parallel rank.")
    grad_accum: int = Field(
        1,
        ge=1,
        le=2**20,
        description="Micro-batches accumulated per optimizer step (with parallel.pp > 1: the pipeline's "
        "micro-batches).",
    )
    seq_len: int = Field(128, ge=2, le=2**20, description="Tokens per training sequence (objective caption: caption "
                         "tokens after an image's patch tokens; a longer caption is cut).")
    freeze: list[Literal["vision", "projector", "decoder"]] = Field(
        default_factory=list, description="objective caption: the parts that do not train (their weights stay as "
        "initialised or loaded): vision (the ViT encoder), projector, decoder (the language model). [] = all train.")
    eval_every: int = Field(100, ge=0, description="Held-out evaluation period in steps (0 = only at the end).")
    eval_samples: int = Field(
        320, ge=1,
        description="Validation samples per training-time evaluation, evenly spaced over the split (capped by its "
        "size): the same samples whatever the layout, micro batch or accumulation (`mindfoundry eval` scores all).",
    )
    log_every: int = Field(1, ge=1, description="Console refresh period in steps (metrics.jsonl gets every step).")
    precision: Literal["fp32", "bf16", "fp16"] = Field(
        "fp32",
        description="Compute precision: fp32; bf16 autocast (torch backend, on devices with bf16); or fp16 mixed "
        "precision with dynamic loss scaling (both backends: matmuls in float16, fp32 master weights, norms and loss).",
    )
    loss_scale_init: float = Field(
        65536.0, ge=1, lt=float("inf"),
        description="fp16 only: initial dynamic loss scale (halved on every overflowing step, which is then skipped).",
    )
    loss_scale_growth_interval: int = Field(
        1000, ge=1, description="fp16 only: the loss scale doubles after this many overflow-free steps in a row."
    )
    compile: bool = Field(
        False, description="torch backend: torch.compile the model (costs ~40 s of compilation on CPU)."
    )
    flash_attention: Literal["auto", "on", "off"] = Field(
        "auto",
        description="mindspore backend: the attention core as Ascend's FlashAttentionScore (fp16/bf16; no (B,H,S,S) "
        "scores kept). auto = on with device: ascend/npu and train.precision fp16 or bf16, off elsewhere; on elsewhere "
        "is an error. The torch engine's scaled_dot_product_attention picks its own kernel.",
    )

    def uses_flash_attention(self, backend: str, device: str) -> bool:
        """Whether the MindSpore attention runs through FlashAttentionScore (the one place that resolves `auto`)."""
        if self.flash_attention == "off" or backend != "mindspore":
            return False
        return self.flash_attention == "on" or (device in ASCEND_DEVICES and self.precision in ("fp16", "bf16"))


class OptimConfig(Section):
    """AdamW with linear warmup and cosine decay."""

    lr: float = Field(
        3e-3, gt=0, le=10, description="Peak learning rate (not capped: `mindfoundry smoke` tells a diverging one)."
    )
    min_lr_ratio: float = Field(0.1, ge=0, le=1, description="Final LR as a fraction of the peak.")
    warmup_steps: int = Field(30, ge=0, description="Linear warmup steps.")
    weight_decay: float = Field(
        0.1,
        ge=0,
        lt=1,
        description="Decoupled (AdamW) weight decay on matrices; never applied to 1-D parameters (norm weights, "
                    "biases).",
    )
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
    """Step checkpoints (weights, optimizer, data position) under checkpoint.dir (RUN_DIR/checkpoints)."""

    dir: str | None = Field(
        None,
        description="Where checkpoints are committed: a folder, or a URL (s3://bucket/prefix: staged on this node, "
        "then uploaded in the background); null = RUN_DIR/checkpoints.",
    )
    every: int = Field(100, ge=0, description="Save period in steps (0 = only at the end).")
    keep_last: int = Field(
        3, ge=1, description="How many recent checkpoints to keep (at least 1: the newest is never deleted)."
    )
    keep_every: int = Field(
        0, ge=0, description="Also keep every checkpoint whose step is a multiple of this, permanently (0 = none)."
    )
    keep_best: bool = Field(True, description="Also keep the checkpoint with the lowest validation loss.")
    format: Literal["full", "sharded"] = Field(
        "full",
        description="full: rank 0 gathers the whole state and writes model.safetensors + optimizer.safetensors (both "
        "engines). sharded (torch engine): every rank writes only its shards (torch.distributed.checkpoint), resumable "
        "under "
        "any layout; `mindfoundry convert STEP_DIR out.safetensors` consolidates the weights (docs/checkpoints.md).",
    )
    stop_grace_s: float = Field(
        120.0, gt=0, le=86400,
        description="On a stop signal: seconds to wait for a checkpoint still committing in the background before "
        "the last-gasp one is written (past it, the run exits 75 and resumes from the newest committed checkpoint).",
    )

    @field_validator("dir")
    @classmethod
    def _dir(cls, v: str | None) -> str | None:
        return checked_path(v)


class AnomalyConfig(Section):
    """What a step with a non-finite or spiking loss/gradient does to the run."""

    policy: Literal["warn", "skip", "rollback"] = Field(
        "skip",
        description="On a loss or grad-norm spike: warn (apply the update), skip (drop the update) or rollback "
        "(reload the last checkpoint and skip the data window that caused the spike). NaN/Inf updates are always "
        "skipped.",
    )
    loss_spike: float = Field(1.0, gt=0, description="A loss above running mean + this many nats is a spike.")
    grad_spike: float = Field(5.0, gt=1, description="A grad norm above this many times its running mean is a spike.")
    window: int = Field(
        20, ge=2, description="Steps in the running means; no spike is called before the window is full."
    )
    max_consecutive: int = Field(5, ge=1, description="Stop with a diagnosis after this many anomalous steps in a row.")


class DumpConfig(Section):
    """Tensor dumps through module hooks on chosen steps (see docs/precision-debugging.md)."""

    steps: str = Field(
        "",
        description="Steps to dump, e.g. '1|50-100' (1-based optimizer steps, as in metrics.jsonl; step 1 dumps the "
                    "initial weights with directions 'params'); empty = no dumps.",
    )
    ranks: str = Field("", description="Data-parallel ranks to dump, same syntax; empty = all.")
    modules: list[str] = Field(
        default_factory=lambda: ["*"],
        min_length=1,
        description="Module-name patterns (* and ?), e.g. 'layers.1.*'; 'model' is the whole model (its output is the "
                    "logits).",
    )
    directions: list[Literal["forward", "backward", "params", "grads", "optimizer"]] = Field(
        default_factory=lambda: ["forward", "backward"],
        min_length=1,
        description="forward: module inputs/outputs; backward: gradients at module outputs/inputs; params: weights "
                    "before the step; "
        "grads: accumulated parameter gradients; optimizer: AdamW moments after the step.",
    )
    mode: Literal["statistics", "tensor"] = Field(
        "statistics",
        description="statistics: shape, dtype, min, max, mean, L2 norm, NaN/Inf counts; tensor: full arrays "
        "(.npy) too.",
    )
    format: Literal["mindfoundry", "msprobe"] = Field(
        "mindfoundry",
        description="mindfoundry: our index.jsonl/meta.json; msprobe: MindStudio Probe's dump.json/stack.json/"
        "construct.json (dump_tensor_data/*.pt for torch, *.npy for MindSpore), for `msprobe compare`.",
    )
    dir: str | None = Field(None, description="Dump folder (default RUN_DIR/dump).")

    @field_validator("steps", "ranks")
    @classmethod
    def _selection(cls, v: str, info) -> str:
        selection = parse_selection(v)  # raises ValueError with the offending part and an example
        if info.field_name == "steps" and 0 in selection:
            raise ValueError("step 0 is not a training step: dump steps count optimizer steps from 1, as metrics.jsonl "
                             "does; the initial weights are step 1's 'params' direction")
        return v


class InjectConfig(Section):
    """A non-finite value written into one module's output (forward) or input gradient (backward) at one step."""

    step: int = Field(ge=1, description="Optimizer step (1-based) that gets the fault.")
    module: str = Field(description="Module name, e.g. 'layers.1.mlp' (see `mindfoundry dump` output for the names).")
    direction: Literal["forward", "backward"] = "forward"
    value: Literal["inf", "nan"] = "inf"


class OverflowConfig(Section):
    """A step whose loss or gradient is not finite (an fp16 loss-scale overflow aside, which only backs off the scale).
    """

    enable: bool = Field(
        True,
        description="Re-run the step with hooks and report the first non-finite module (logged as an 'overflow' "
        "event).",
    )
    error_stop: bool = Field(
        False,
        description="Stop training at the first such step, naming the module (the last checkpoint is the one to resume "
                    "or debug from); false = record it and continue, the anomaly policy deciding the update.",
    )


class DebugConfig(Section):
    """Drills for the failure paths (used by tests and by users rehearsing a run's recovery), and precision debugging.
    """

    dump: DumpConfig = Field(default_factory=DumpConfig)
    overflow: OverflowConfig = Field(default_factory=OverflowConfig)
    inject_inf: InjectConfig | None = Field(
        None, description="Drill for the overflow locator: a non-finite value in one module at one step."
    )

    inject_nan_at: list[int] = Field(
        default_factory=list, description="Steps whose loss and gradients are made NaN (once each)."
    )
    inject_spike_at: list[int] = Field(
        default_factory=list, description="Steps whose loss and gradients are scaled by spike_factor (once each)."
    )
    spike_factor: float = Field(100.0, gt=1, description="Scale of an injected spike.")
    unshifted_labels: bool = Field(
        False, description="Train on labels equal to the inputs (the classic off-by-one bug), to see `smoke` catch it."
    )


class HealthConfig(Section):
    """Health rules over the step records; each fires at most once per run. A threshold set to null
    disables its rule."""

    enabled: bool = Field(True, description="Check the health rules during training and record each finding once.")
    grad_window: int = Field(
        50, ge=5, description="Steps after warmup whose median grad norm the grad-norm rules judge."
    )
    grad_norm_low: float | None = Field(
        0.5,
        gt=0,
        description="Median grad norm after warmup below this: 'LR too low?' (updates too small to make progress).",
    )
    grad_norm_high: float | None = Field(
        5.0,
        gt=0,
        description="Median grad norm after warmup above this: 'clip harder / lower LR?' (every update is clipped).",
    )
    oscillation_window: int = Field(
        50, ge=10, description="Steps after warmup over which the loss's swing around its trend is measured."
    )
    oscillation_smooth: int = Field(
        5,
        ge=1,
        description="Steps averaged before measuring the swing, so the per-batch noise of small batches is not called "
                    "oscillation.",
    )
    loss_oscillation: float | None = Field(
        0.2,
        gt=0,
        description="Std (nats) of the smoothed loss around its quadratic trend above this: the loss oscillates.",
    )
    spike_window: int = Field(
        20, ge=2, description="Steps in the running mean (and std) that a loss spike is measured against."
    )
    loss_spike: float | None = Field(1.0, gt=0, description="A loss this many nats above the running mean is a spike.")
    spike_sigmas: float = Field(
        4.0,
        ge=0,
        description="A spike must also exceed this many running stds, so a noisy small-batch loss does not count. 0 = "
                    "off.",
    )
    nonfinite: bool = Field(True, description="Report the first NaN/Inf loss or grad norm.")
    throughput_window: int = Field(50, ge=5, description="Steps in the running median of tokens/s.")
    throughput_recent: int = Field(
        5,
        ge=1,
        description="Steps whose median tokens/s is compared with the running median (one slow step is not a stall).",
    )
    throughput_drop: float | None = Field(
        0.3, gt=0, lt=1, description="Fractional drop of recent tokens/s below the running median that reports a stall."
    )


class EvalConfig(Section):
    """Zero-shot tasks scored at every held-out evaluation of training (see docs/evaluation.md)."""

    tasks: list[str] = Field(
        default_factory=list,
        description="Multiple-choice task files (.jsonl: question, choices, answer[, "
        "subject]) scored with the validation split; acc and acc_norm per task go to metrics.jsonl "
        "(task_acc, task_acc_norm), TensorBoard and the report.",
    )


class ProfileConfig(Section):
    """The engine's own profiler over a few steps: torch.profiler or mindspore.profiler (see docs/monitoring.md)."""

    steps: str = Field(
        "",
        description="One range of optimizer steps to profile, e.g. '10-12' (1-based, as in metrics.jsonl); "
        "empty = off. Keep it short: a trace grows with every step.",
    )
    dir: str | None = Field(
        None, description="Trace folder (default RUN_DIR/profile); each rank writes into steps_A-B/rankR."
    )

    @field_validator("steps")
    @classmethod
    def _one_range(cls, v: str) -> str:
        selection = parse_selection(v)  # raises ValueError with the offending part and an example
        if len(selection.ranges) > 1:
            raise ValueError(
                f"'{v}' names {len(selection.ranges)} ranges: the profiler runs once, over one range like '10-12'"
            )
        if 0 in selection:
            raise ValueError("step 0 is not a training step: profile steps count optimizer steps from 1, e.g. '10-12'")
        return v


class MonitorConfig(Section):
    """What the run shows and records."""

    progress: bool = Field(True, description="Live progress line on the console.")
    detail_every: int = Field(
        50, ge=0, description="Per-layer gradient norm, weight norm and update/weight ratio every N steps (0 = off)."
    )
    tensorboard: bool = Field(
        True, description="Write TensorBoard event files to RUN_DIR/tb (view with `tensorboard --logdir RUN_DIR/tb`)."
    )
    mindinsight: bool = Field(
        False,
        description="MindSpore engine: also write MindSpore summary files (mindspore.SummaryRecord) to "
        "RUN_DIR/mindinsight for MindSpore Insight (`mindinsight start --summary-base-dir RUN_DIR`).",
    )
    peak_tflops: float | None = Field(
        None,
        gt=0,
        description="Per-device dense peak TFLOP/s for MFU; null = from the device name (table in monitor/mfu.py; "
                    "measured on CPU).",
    )
    hardware_every_s: float = Field(
        10.0,
        gt=0,
        le=86400,
        description="Ask the accelerator's vendor tool (nvidia-smi, npu-smi) for "
        "utilisation, temperature and power at most every N seconds (CPU utilisation: every step).",
    )
    health: HealthConfig = Field(default_factory=HealthConfig)
    profile: ProfileConfig = Field(default_factory=ProfileConfig)


class GenerateConfig(Section):
    """Sample generations at the end of `mindfoundry run`."""

    prompts: list[str] = Field(default_factory=lambda: ["The ", "人民", "def "], description="Prompts to continue.")
    max_new_tokens: int = Field(48, ge=1)
    temperature: float = Field(0.8, ge=0, description="0 = greedy.")
    top_k: int = Field(40, ge=0, description="0 = no top-k filter.")


class RunConfig(Section):
    """A whole run."""

    name: str = Field(
        "run",
        min_length=1,
        max_length=100,
        pattern=r"^[A-Za-z0-9._-]+$",
        description="Run name; default run_dir is runs/NAME.",
    )
    run_dir: str | None = Field(None, description="Where everything of this run is written. null = runs/NAME.")
    seed: int = Field(
        1234,
        ge=0,
        lt=2**32,
        description="Seed for the split, init, data order and sampling (below 2**32, what every RNG in use accepts).",
    )
    backend: Literal["mindspore", "torch"] = Field("mindspore", description="Training engine.")
    device: Literal["auto", "cpu", "gpu", "cuda", "ascend", "npu"] = Field(
        "cpu",
        description="Device: cpu, gpu/cuda, ascend/npu, or auto (the first accelerator the backend finds, else CPU).",
    )
    model: ModelConfig = Field(default_factory=ModelConfig)
    data: DataConfig
    train: TrainConfig = Field(default_factory=TrainConfig)
    optim: OptimConfig = Field(default_factory=OptimConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    anomaly: AnomalyConfig = Field(default_factory=AnomalyConfig)
    debug: DebugConfig = Field(default_factory=DebugConfig)
    monitor: MonitorConfig = Field(default_factory=MonitorConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    parallel: ParallelConfig = Field(default_factory=ParallelConfig)
    memory: MemoryConfig = Field(default_factory=MemoryConfig)
    generate: GenerateConfig = Field(default_factory=GenerateConfig)
    storage: StorageConfig = Field(
        default_factory=StorageConfig, description="How URLs (s3://...) in this config are reached (optional)."
    )

    @field_validator("run_dir")
    @classmethod
    def _run_dir(cls, v: str | None) -> str | None:
        return checked_path(v)
