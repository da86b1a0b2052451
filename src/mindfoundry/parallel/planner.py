"""Per-device memory and per-step communication of a parallel layout, and a ranked plan of layouts.

Everything here is arithmetic on the model's shapes (:mod:`mindfoundry.model.spec`): pure functions,
no framework, so the estimates can be compared with measured peaks (see docs/parallelism.md).

Memory per device, bytes (the peak stage of the pipeline; ``e`` = bytes of the compute dtype, 2 for
bf16/fp16 and 4 for fp32; ``P`` = parameters this device holds before data-parallel sharding, i.e.
its pipeline stage's parameters divided by tp):

- weights    P * e / dp_shard
- gradients  P * e / dp_shard
- optimizer  P * k / shards, AdamW: k = 8 (fp32 m and v) for fp32 training, k = 12 (fp32 m, v and
  fp32 master weights) for bf16/fp16 (ZeRO paper accounting: 2 + 2 + 12 = 16 bytes per parameter);
  shards = dp_shard, or dp_replicate*dp_shard with optimizer_shard (ZeRO-1)
- fsdp buffers (dp_shard > 1) the largest unit (one layer or the embedding) gathered twice (the current
  one and the prefetched next) plus its unsharded gradient before the reduce-scatter: 3 * unit * e
- activations (below), and a fixed overhead (framework runtime, communication buffers, allocator
  slack: a few hundred MB on CPU, ~1 GiB on an accelerator).

This sum is the peak from the second micro-batch on, when the accumulated gradients and the next
micro-batch's activations are alive together.
"""

from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass, field
from typing import Literal

from mindfoundry.config.layout_rules import feasible_layouts
from mindfoundry.config.memory_config import MemoryConfig, Recompute
from mindfoundry.config.parallel_config import Batch, Layout
from mindfoundry.errors import MindFoundryError
from mindfoundry.model.spec import ModelSpec

Precision = Literal["bf16", "fp16", "fp32"]
GiB = 1024**3
#: Default fixed overhead on an accelerator: runtime/context, collective buffers, allocator fragmentation.
DEFAULT_FIXED_OVERHEAD = 1 * GiB


def dtype_bytes(precision: Precision) -> int:
    return 4 if precision == "fp32" else 2


def optimizer_bytes_per_param(precision: Precision) -> int:
    """AdamW state per parameter: fp32 m and v, plus fp32 master weights when the parameters are half precision."""
    return 8 if precision == "fp32" else 12


@dataclass(frozen=True)
class MemoryEstimate:
    """Estimated peak bytes on the most loaded device (``stage`` is its pipeline stage)."""

    weights: int
    gradients: int
    optimizer: int
    fsdp_buffers: int
    activations: int
    overhead: int
    stage: int = 0
    logits: int = 0  # the part of `activations` the output head and the loss keep (memory.loss_chunk shrinks it)

    @property
    def model_states(self) -> int:
        return self.weights + self.gradients + self.optimizer

    @property
    def total(self) -> int:
        return self.model_states + self.fsdp_buffers + self.activations + self.overhead

    def to_dict(self) -> dict:
        return asdict(self) | {"total": self.total}


@dataclass(frozen=True)
class CommEstimate:
    """Bytes each device sends per optimizer step, by kind (ring algorithms: see communication())."""

    dp_allreduce: int = 0
    fsdp: int = 0
    tp: int = 0
    pp: int = 0
    cp: int = 0
    ep: int = 0

    @property
    def total(self) -> int:
        return self.dp_allreduce + self.fsdp + self.tp + self.pp + self.cp + self.ep

    def to_dict(self) -> dict:
        return asdict(self) | {"total": self.total}


def layer_parameters(spec: ModelSpec) -> int:
    """Parameters of one transformer block (two norms, q/k/v/o, gate/up/down)."""
    d, hd = spec.d_model, spec.head_dim
    return 2 * d + 2 * d * spec.n_heads * hd + 2 * d * spec.n_kv_heads * hd + 3 * d * spec.ffn_dim


def _layer_parameters_local(spec: ModelSpec, tp: int) -> int:
    """One block's parameters on one tp rank: matrices split by tp, norm weights replicated."""
    return 2 * spec.d_model + (layer_parameters(spec) - 2 * spec.d_model) // tp


def stage_parameters(spec: ModelSpec, layout: Layout, stage: int) -> int:
    """Parameters of pipeline stage `stage` on one tp rank (before any data-parallel sharding).

    The first stage holds the embedding, the last the final norm and the output head; with tied
    embeddings and pp > 1 both ends keep a copy of the shared matrix (as Megatron does).
    """
    pp, t = layout.pp, layout.tp
    vocab = spec.vocab_size * spec.d_model // t
    n = spec.n_layers // pp * _layer_parameters_local(spec, t)
    if stage == 0:
        n += vocab
    if stage == pp - 1:
        n += spec.d_model + (vocab if (not spec.tie_embeddings or pp > 1) else 0)
    return n


def activation_bytes_per_layer(spec: ModelSpec, layout: Layout, micro_batch: int, seq: int, precision: Precision, *,
                               flash_attention: bool = True, fused_norm: bool = True) -> int:
    """Bytes one transformer block keeps for its backward pass, for one micro-batch, on one device.

    Method and notation of Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
    Transformer Models" (arXiv:2205.05198), section 4: count the tensors autograd saves. Their GPT
    block (4h MLP, GeLU, LayerNorm, dropout) in fp16 without parallelism keeps
    s*b*h*(34 + 5*a*s/h) bytes; with tensor parallelism and sequence parallelism all of it is
    divided by t. Redone for this model's Llama block (RMSNorm, RoPE, SwiGLU, no dropout), per token,
    in elements of the compute dtype (e bytes each):

    - 4h outside the tensor-parallel region: each norm's input and the norm output that feeds the
      next linear layers (attention and MLP); +2h when the norm is not fused (the eager RMSNorm of
      both engines also keeps its normalized input). Split by t only with sequence parallelism.
    - 2h + 2h*cp + 4f inside it, split by t: the query (after RoPE) and the attention output; keys and
      values expanded to all query heads (the engines expand grouped kv heads before attention; with
      cp > 1 they are the all-gathered keys/values of the whole sequence); and the SwiGLU
      gate output, its SiLU, the up projection and their product.
    - the attention scores: a*s elements per token (the softmax output; heads split by t) without a
      flash kernel; with one, only the log-sum-exp, 4*a bytes per token.

    In bytes: s_loc*b*[e*(4h/t_sp + (2h + 2h*cp + 4f)/t) + (e*a*s/t or 4*a/t)], with s_loc = s/cp.
    Applied to the paper's GPT block this counting gives its 34 less the two 1-byte dropout masks
    (32), and 2 instead of 5 score bytes (no dropout); the SwiGLU MLP keeps 4 f-sized tensors where
    the GeLU MLP keeps 2.
    """
    e, t, c = dtype_bytes(precision), layout.tp, layout.cp
    h, f, a = spec.d_model, spec.ffn_dim, spec.n_heads
    t_sp = t if layout.sequence_parallel else 1
    s_loc = seq // c
    outside = (4 if fused_norm else 6) * h
    inside = 2 * h + 2 * h * c + 4 * f
    per_token = e * (outside / t_sp + inside / t)
    per_token += e * a * seq / t if not flash_attention else 4 * a / t
    return int(s_loc * micro_batch * per_token)


def micro_batches_in_flight(layout: Layout, num_micro_batches: int | None) -> float:
    """Micro-batches whose activations the first pipeline stage holds at once.

    No pipeline: 1 (micro-batches run one after another). 1F1B: min(pp, m). GPipe: m (all forwards
    first). Interleaved 1F1B with v chunks per rank: pp * (1 + (pp-1)/(pp*v)) (Korthikanti et al.
    2022, section 4.2.3). ``num_micro_batches`` (m, = train.grad_accum) None means m >= pp.
    """
    p, m = layout.pp, num_micro_batches
    if p == 1:
        return 1.0
    if layout.pp_schedule == "GPipe":
        return float(m if m is not None else p)
    inflight = float(min(p, m) if m is not None else p)
    if layout.pp_schedule == "Interleaved1F1B":
        inflight *= 1 + (p - 1) / (p * layout.pp_virtual_stages)
    return inflight


def selective_savings_per_layer(spec: ModelSpec, layout: Layout, micro_batch: int, seq: int, precision: Precision, *,
                                flash_attention: bool = True) -> int:
    """Bytes of one block's activations that selective recompute does not keep (memory.recompute: selective).

    It recomputes the attention core and the SwiGLU activation from their kept inputs (the RoPE'd query
    and keys, the values, the gate and up projections), and keeps their outputs (the o_proj and
    down_proj inputs). So per token it drops: the attention scores (a*s elements, heads split by t;
    with a flash kernel only its 4*a-byte log-sum-exp); keys and values expanded to every query head
    beyond the kv heads themselves, 2*(h - kv_dim)*cp; and the SiLU output, f, split by t.
    """
    e, t, c = dtype_bytes(precision), layout.tp, layout.cp
    h, f, a = spec.d_model, spec.ffn_dim, spec.n_heads
    kv_dim = spec.n_kv_heads * spec.head_dim
    per_token = e * (2 * (h - kv_dim) * c + f) / t
    per_token += e * a * seq / t if not flash_attention else 4 * a / t
    return int(seq // c * micro_batch * per_token)


def estimate(spec: ModelSpec, layout: Layout, micro_batch: int, seq: int, precision: Precision,
             recompute: Recompute = "none", *,
             recomputed_layers: int | None = None, loss_chunk: int = 0, offload: bool = False,
             num_micro_batches: int | None = None, fixed_overhead_bytes: int = DEFAULT_FIXED_OVERHEAD,
             flash_attention: bool = True, fused_norm: bool = True, vocab_parallel_loss: bool = True) -> MemoryEstimate:
    """Peak memory per device of `layout` during training steps (the more loaded of the first and the last pipeline
    stage).

    `vocab_parallel_loss=False` models an engine that gathers the full-vocabulary logits on every
    tensor-parallel rank before the loss (as this project's torch engine does today) instead of
    computing the loss on vocab shards.

    Activations (see activation_bytes_per_layer for one block): the first stage keeps
    micro_batches_in_flight() micro-batches of its n_layers/pp blocks; the last stage keeps one
    micro-batch plus the logits, s_loc*b*(V/t)*(e + 8) bytes (the logits, the fp32 log-probabilities
    the loss saves and their fp32 gradient); with ``loss_chunk`` c only one chunk's, b*c*(V/t)*(e + 8).

    The `memory` section's modes, for the first ``recomputed_layers`` blocks (None = all; a stage
    counts those of its own blocks): full recompute keeps only a block's input, s_loc*b*h*e/t_sp
    bytes, and one block's full activations exist at a time while it is recomputed (after the loss's
    backward has freed the logits term: the larger of the two counts); selective keeps
    a block's activations less :func:`selective_savings_per_layer`. With ``offload`` the kept
    activations live in host memory, and the device holds two blocks' worth (the one computing and
    the one in transfer) besides the working set and the logits.
    """
    e = dtype_bytes(precision)
    t_sp = layout.tp if layout.sequence_parallel else 1
    s_loc = seq // layout.cp
    per_layer = activation_bytes_per_layer(spec, layout, micro_batch, seq, precision,
                                           flash_attention=flash_attention, fused_norm=fused_norm)
    recomputed_kept = {
        "none": per_layer,
        "selective": per_layer - selective_savings_per_layer(spec, layout, micro_batch, seq, precision,
                                                             flash_attention=flash_attention),
        "full": s_loc * micro_batch * spec.d_model * e // t_sp,
    }[recompute]
    working = per_layer if recompute == "full" else 0
    layers = spec.n_layers // layout.pp
    vocab = spec.vocab_size // (layout.tp if vocab_parallel_loss else 1)
    logits = micro_batch * (min(loss_chunk, s_loc) if loss_chunk else s_loc) * vocab * (e + 8)
    unit = max(_layer_parameters_local(spec, layout.tp), spec.vocab_size * spec.d_model // layout.tp)
    buffers = 3 * unit * e if layout.dp_shard > 1 else 0
    best: MemoryEstimate | None = None
    for stage in sorted({0, layout.pp - 1}):
        params = stage_parameters(spec, layout, stage)
        first = stage * layers
        chosen = layers if recomputed_layers is None else min(max(recomputed_layers - first, 0), layers)
        kept = chosen * recomputed_kept + (layers - chosen) * per_layer
        if offload:  # held on the device: the block computing and the one in transfer
            kept = min(kept, 2 * (per_layer if chosen < layers else recomputed_kept))
        inflight = micro_batches_in_flight(layout, num_micro_batches) if stage == 0 else 1.0
        last = stage == layout.pp - 1
        # the logits term peaks in the loss's backward, before any block is recomputed; a recomputed block's
        # working set exists later, once the logits and their gradients are freed
        acts = int(inflight * kept) + max(working if chosen else 0, logits if last else 0)
        est = MemoryEstimate(
            weights=params * e // layout.dp_shard,
            gradients=params * e // layout.dp_shard,
            optimizer=params * optimizer_bytes_per_param(precision) // layout.optimizer_shards,
            fsdp_buffers=buffers, activations=acts, overhead=fixed_overhead_bytes, stage=stage,
            logits=logits if last else 0,
        )
        if best is None or est.total > best.total:
            best = est
    assert best is not None
    return best


def communication(spec: ModelSpec, layout: Layout, micro_batch: int, seq: int, num_micro_batches: int,
                  precision: Precision,
                  recompute: Recompute = "none") -> CommEstimate:
    """Bytes each device sends per optimizer step (ring collectives: an all-reduce of N bytes over n
    ranks sends 2(n-1)/n*N, an all-gather or reduce-scatter of a full N-byte tensor (n-1)/n*N).

    m = num_micro_batches (= train.grad_accum), P = the stage's parameters on one tp rank, A =
    s_loc*b*h*e (one micro-batch's hidden states on one cp rank), L_s = n_layers/pp.

    - DP replicas: one all-reduce of the gradients per step, 2(r-1)/r * P*e / dp_shard (with FSDP the
      replicas exchange only their shard); with optimizer_shard (ZeRO-1) a reduce-scatter of the
      gradients plus an all-gather of the updated weights, (r-1)/r * 2P*e.
    - FSDP: per micro-batch, the weights all-gathered for the forward and again for the backward, and
      the gradients reduce-scattered: 3(n-1)/n * P*e * m (FSDP2 defaults).
    - TP: per block and micro-batch, 2 all-reduces forward and 2 backward (or the same volume as
      all-gather + reduce-scatter pairs with sequence parallelism), 8(t-1)/t * A, plus the
      vocab-parallel embedding and head, 4(t-1)/t * A; full recompute repeats the forward's half
      (selective recomputes no projection, so no TP collective).
    - PP: per micro-batch and chunk, the activation sent forward and its gradient sent back, 2*A/t_sp
      per chunk boundary (pp_virtual_stages chunks per rank).
    - CP: per block and micro-batch, K and V all-gathered forward and their gradients
      reduce-scattered backward: 2 * (c-1)/c * 2*s*b*kv_dim*e/t (kv_dim = n_kv_heads*head_dim); full and
      selective recompute both run the attention core again, repeating the forward's gathers.
    - EP (a mixture-of-experts model only): per block and micro-batch, tokens dispatched and combined forward
      and backward: 4 all-to-alls of (ep-1)/ep * A*top_k.
    """
    e = dtype_bytes(precision)
    m, t, c, p = num_micro_batches, layout.tp, layout.cp, layout.pp
    stage_params = max(stage_parameters(spec, layout, s) for s in {0, p - 1})
    hidden = seq // c * micro_batch * spec.d_model * e
    layers = spec.n_layers // p
    tp_repeat = 1.5 if recompute == "full" else 1.0
    cp_repeat = 1.5 if recompute != "none" else 1.0

    def ring(n: int) -> float:
        return (n - 1) / n

    dp = fsdp = tp = pp = cp = ep = 0.0
    r, n = layout.dp_replicate, layout.dp_shard
    if r > 1:
        if layout.optimizer_shard and n == 1:
            dp = ring(r) * 2 * stage_params * e
        else:
            dp = 2 * ring(r) * stage_params * e / n
    if n > 1:
        fsdp = 3 * ring(n) * stage_params * e * m
    if t > 1:
        tp = (8 * layers * tp_repeat + 4) * ring(t) * hidden * m
    if p > 1:
        t_sp = t if layout.sequence_parallel else 1
        pp = 2 * hidden / t_sp * layout.pp_virtual_stages * m
    if c > 1:
        kv = 2 * seq * micro_batch * spec.n_kv_heads * spec.head_dim * e / t
        cp = (1 + cp_repeat) * ring(c) * kv * layers * m
    if layout.ep > 1 and spec.num_experts:
        ep = 4 * ring(layout.ep) * hidden * spec.moe_top_k * layers * m
    return CommEstimate(*(int(x) for x in (dp, fsdp, tp, pp, cp, ep)))


def pipeline_bubble(layout: Layout, num_micro_batches: int) -> float:
    """Idle share of a step: (pp-1)/(v*m + pp-1) for 1F1B/GPipe (v = 1) and Interleaved1F1B (v chunks)."""
    p = layout.pp
    if p == 1:
        return 0.0
    v = layout.pp_virtual_stages if layout.pp_schedule == "Interleaved1F1B" else 1
    return (p - 1) / (v * num_micro_batches + p - 1)


#: `fits` of a plan row: without recompute, with selective, with full recompute (the modes the engines run), or not.
Fit = Literal["yes", "selective", "recompute", "no"]
_MODE_OF_FIT: dict[str, Recompute] = {"yes": "none", "selective": "selective", "recompute": "full", "no": "full"}


@dataclass(frozen=True)
class PlanRow:
    """One candidate layout with its estimates for each memory.recompute mode."""

    layout: Layout
    micro_batch: int
    grad_accum: int
    memory: MemoryEstimate  # without recompute
    memory_selective: MemoryEstimate  # with selective recompute
    memory_recompute: MemoryEstimate  # with full recompute
    comm: CommEstimate  # without recompute
    comm_selective: CommEstimate
    comm_recompute: CommEstimate
    device_memory: int
    bubble: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def fits(self) -> Fit:
        for fit, est in (("yes", self.memory), ("selective", self.memory_selective),
                         ("recompute", self.memory_recompute)):
            if est.total <= self.device_memory:
                return fit
        return "no"

    @property
    def recompute(self) -> Recompute:
        """The memory.recompute mode this row needs (the least recompute that fits; full when nothing fits)."""
        return _MODE_OF_FIT[self.fits]

    @property
    def chosen_memory(self) -> MemoryEstimate:
        return {"none": self.memory, "selective": self.memory_selective, "full": self.memory_recompute}[self.recompute]

    @property
    def chosen_comm(self) -> CommEstimate:
        return {"none": self.comm, "selective": self.comm_selective, "full": self.comm_recompute}[self.recompute]

    def sort_key(self) -> tuple:
        """Fits (without, then with selective, then with full recompute), then least communication, then least memory.
        """
        return ({"yes": 0, "selective": 1, "recompute": 2, "no": 3}[self.fits], self.chosen_comm.total,
                self.chosen_memory.total)

    def to_dict(self) -> dict:
        return {
            "layout": self.layout.config(), "describe": self.layout.describe(), "micro_batch": self.micro_batch,
            "grad_accum": self.grad_accum, "fits": self.fits, "recompute": self.recompute,
            "device_memory": self.device_memory,
            "memory": self.memory.to_dict(), "memory_selective": self.memory_selective.to_dict(),
            "memory_recompute": self.memory_recompute.to_dict(), "comm": self.comm.to_dict(),
            "comm_selective": self.comm_selective.to_dict(), "comm_recompute": self.comm_recompute.to_dict(),
            "bubble": round(self.bubble, 4),
        }


def plan(spec: ModelSpec, devices: int, device_memory: int, seq: int, global_batch: int, precision: Precision = "bf16",
         *,
         micro_batch: int = 1, fixed_overhead_bytes: int = DEFAULT_FIXED_OVERHEAD, flash_attention: bool = True,
         fused_norm: bool = True) -> list[PlanRow]:
    """Every feasible layout of `devices` processes for this model and batch, best first (PlanRow.sort_key)."""
    if global_batch % micro_batch:
        raise ValueError(f"global batch {global_batch} is not a multiple of the micro-batch {micro_batch}")
    layouts = feasible_layouts(spec.sizes(), Batch(seq, micro_batch, 1), devices, global_batch=global_batch)
    rows = []
    modes: tuple[Recompute, ...] = ("none", "selective", "full")
    for lay in layouts:
        m = lay.grad_accum_for(global_batch, micro_batch)
        assert m is not None  # feasible_layouts kept only the layouts that split the batch
        mem = [estimate(spec, lay, micro_batch, seq, precision, rc, num_micro_batches=m,
                        fixed_overhead_bytes=fixed_overhead_bytes,
                        flash_attention=flash_attention, fused_norm=fused_norm) for rc in modes]
        comm = [communication(spec, lay, micro_batch, seq, m, precision, rc) for rc in modes]
        rows.append(PlanRow(lay, micro_batch, m, *mem, *comm, device_memory, pipeline_bubble(lay, m)))
    return sorted(rows, key=PlanRow.sort_key)


#: Fixed overhead of a CPU process (Python, the framework's runtime, allocator slack).
CPU_FIXED_OVERHEAD = 512 * 1024**2


class MemoryFitError(MindFoundryError, MemoryError):
    """A run that cannot fit the memory it would run in."""


def host_memory() -> int:
    """This machine's physical memory in bytes."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def memory_options(memory: MemoryConfig, n_layers: int) -> dict:
    """:func:`estimate`'s keyword arguments for a run's `memory` section (a list of recomputed blocks counts as
    that many leading blocks: the same bytes in one stage)."""
    return {"recompute": memory.recompute, "recomputed_layers": len(memory.recomputed_layers(n_layers)) or None,
            "loss_chunk": memory.loss_chunk, "offload": memory.offload_activations}


def check_host_fit(spec: ModelSpec, layout: Layout, micro_batch: int, seq: int, precision: Precision, processes: int,
                   available: int | None = None, memory: MemoryConfig | None = None) -> MemoryEstimate:
    """Refuse a CPU run whose estimated peak (all ``processes`` on this machine) exceeds its memory, before
    anything is allocated: a model of 2**40 parameters would otherwise end in a MemoryError traceback
    (or the OOM killer) after minutes of work. ``memory`` is the run's `memory` section (recompute shrinks the need)."""
    options = memory_options(memory, spec.n_layers) if memory is not None else {}
    est = estimate(spec, layout, micro_batch, seq, precision, **options, fixed_overhead_bytes=CPU_FIXED_OVERHEAD)
    available = host_memory() if available is None else available
    need = est.total * processes
    if need > available:
        raise MemoryFitError(
            f"this run needs about {format_bytes(need)} ({processes} process(es) x {format_bytes(est.total)}: weights "
            f"{format_bytes(est.weights)}, gradients {format_bytes(est.gradients)}, AdamW "
            f"{format_bytes(est.optimizer)}, activations {format_bytes(est.activations)}) and this machine has "
            f"{format_bytes(available)}: use a smaller model (model.d_model, model.n_layers) or micro-batch, "
            "memory.recompute: full, or see `mindfoundry plan` for a layout over more devices")
    return est


_UNITS = {"": 1, "b": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4,
          "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4,
          "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4}


def parse_bytes(text: str) -> int:
    """'32GiB' -> 34359738368; KiB/MiB/GiB/TiB and bare K/M/G/T are powers of 1024, KB/MB/GB/TB of 1000."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", text)
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _UNITS:
        raise ValueError(f"{text!r} is not a memory size: write e.g. 32GiB, 64GB or 512MiB")
    return int(float(match.group(1)) * _UNITS[unit])


def format_bytes(n: float) -> str:
    return f"{n / GiB:.1f} GiB" if n >= GiB / 10 or n == 0 else f"{n / 1024**2:.0f} MiB"

