"""Framework-free description of the decoder-only model: shapes, parameter names, size, FLOPs.

Both backends build their modules from :class:`ModelSpec` and must produce exactly the parameter
names and shapes listed by :func:`parameter_shapes`; a contract test holds them to it. Weight
matrices use the ``[out_features, in_features]`` layout of torch.nn.Linear / mindspore.nn.Dense,
so one safetensors file loads into either backend (and maps 1:1 onto Hugging Face Llama names).

Parameter naming scheme::

    embed.weight                         [vocab, d_model]
    layers.{i}.attn_norm.weight          [d_model]
    layers.{i}.attn.q_proj.weight        [n_heads*head_dim, d_model]
    layers.{i}.attn.k_proj.weight        [n_kv_heads*head_dim, d_model]
    layers.{i}.attn.v_proj.weight        [n_kv_heads*head_dim, d_model]
    layers.{i}.attn.o_proj.weight        [d_model, n_heads*head_dim]
    layers.{i}.mlp_norm.weight           [d_model]
    layers.{i}.mlp.gate_proj.weight      [ffn_dim, d_model]
    layers.{i}.mlp.up_proj.weight        [ffn_dim, d_model]
    layers.{i}.mlp.down_proj.weight      [d_model, ffn_dim]
    norm.weight                          [d_model]
    lm_head.weight                       [vocab, d_model]   (absent when tie_embeddings)

A mixture-of-experts block (``model.moe.num_experts`` = E > 0; blocks every-1, 2*every-1, ...)
replaces the three ``mlp.*_proj`` matrices by a router and E stacked SwiGLU experts::

    layers.{i}.mlp.router.weight               [E, d_model]
    layers.{i}.mlp.experts.gate_proj.weight    [E, ffn_dim, d_model]
    layers.{i}.mlp.experts.up_proj.weight      [E, ffn_dim, d_model]
    layers.{i}.mlp.experts.down_proj.weight    [E, d_model, ffn_dim]

Expert e's matrices are slice ``[e]`` of the stacked weights, each in the [out, in] layout of the
dense MLP (Hugging Face Mixtral's ``block_sparse_moe.experts.{e}.w1/w3/w2`` are these slices, its
``block_sparse_moe.gate`` is the router), and expert parallelism shards them along dim 0.

The MoE arithmetic, the same in both engines (and in tests/backends/numpy_reference.py), per token x
(the normed block input) of a block with E experts and k = top_k:

- router: p = softmax(x @ router.weight^T) over all E experts (float32); the k largest p are kept
  and renormalized to sum to 1 (Mixtral's order: softmax, then top-k; the same as a softmax over
  the k top logits); output = sum_j w_j * SwiGLU_{e_j}(x), summed in top-k order. By default no
  capacity limit and no token dropping: every token reaches its k experts, so expert parallelism is exact.
- capacity (``model.moe.capacity_factor`` = c, optional): per sequence of S positions, expert e takes at
  most C = min(S, ceil(c * k * S / E)) of the (position, slot) pairs routed to it, in priority order
  "every position's first choice (positions in order), then every second choice, ..."; a pair beyond
  C is dropped: its term w_j * SwiGLU_{e_j}(x) is left out (the other slots keep their w_j; the block
  input still passes through the residual). Per sequence, so it does not depend on how sequences
  are grouped into micro-batches or ranks. Routing statistics (f_e below) count routed, not kept, pairs.
- load-balancing loss (Switch / Mixtral): aux = E * sum_e f_e * P_e over the N token positions of
  one micro-batch of one data-parallel rank (its train.micro_batch_size sequences, padding
  positions included), with f_e = (tokens that route to e) / N (no gradient; sums to k) and
  P_e = mean router probability of e; it is k at perfect balance. A model's aux is the mean over
  its MoE blocks. Being per micro-batch, it depends on how rows are grouped into micro-batches (the
  LM loss does not): dp ranks with grad_accum A train exactly what one process trains with the same
  micro_batch_size and grad_accum dp*A (the loader gives each rank a contiguous block of rows). The training
  objective adds ``aux_loss_weight * aux`` per token position: each micro-batch contributes
  ``(nll_sum + aux_loss_weight * N * aux) / (valid target tokens of the global batch)``, so with
  packed (unpadded) data the step loss is exactly LM loss + aux_loss_weight * aux. Evaluation
  loss is the LM loss alone.

Two objectives share every block, parameter and name (``model.objective``):

- ``clm`` (causal LM, a decoder): position q attends keys k <= q; labels are the next tokens.
- ``mlm`` (masked LM, a bidirectional encoder): position q attends every key k that is not padding
  (``ids[k] != PAD_ID``), and itself (so a padding row still has one key and no NaN); labels are the
  original tokens at the masked positions (:mod:`mindfoundry.data.dataset.masking`). The masked-token
  head is the output head (tied to the embedding like the LM head), so weights move between the
  objectives and engines unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import asdict, dataclass, replace
from typing import Literal

import numpy as np

from mindfoundry.config.layout_rules import ModelSizes
from mindfoundry.config.model_config import ModelConfig
from mindfoundry.model.vision_spec import (
    VisionSpec,
    blocks_flops,
    encoder_parameter_shapes,
    init_vision_weights,
    mae_flops_per_image,
    vision_module_classes,
    vision_parameter_shapes,
)

#: Output projections that add into the residual stream; their init std is scaled by 1/sqrt(2L).
RESIDUAL_PROJECTIONS = ("attn.o_proj.weight", "mlp.down_proj.weight", "mlp.experts.down_proj.weight")
#: The tokenizer's padding token id (data/tokenizer.py trains PAD at this id): bidirectional
#: attention hides keys holding it.
PAD_ID = 1
#: The router's init std is init_std times this: near-uniform routing (balanced load) at the start.
ROUTER_INIT_SCALE = 0.1


@dataclass(frozen=True)
class ModelSpec:
    """Resolved model hyper-parameters (no optional fields left)."""

    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    ffn_dim: int
    max_seq_len: int
    rope_theta: float
    norm_eps: float
    tie_embeddings: bool
    init_std: float
    num_experts: int = 0  # model.moe.num_experts; 0 = dense
    moe_top_k: int = 2
    moe_every: int = 1
    moe_aux_loss_weight: float = 0.01
    objective: Literal["clm", "mlm"] = "clm"  # model.objective
    moe_capacity_factor: float | None = None  # model.moe.capacity_factor; None = no capacity limit

    @classmethod
    def from_config(cls, m: ModelConfig) -> "ModelSpec":
        if m.n_kv_heads is None or m.ffn_dim is None:
            raise ValueError(
                "ModelSpec needs a resolved config (n_kv_heads and ffn_dim filled): use config.load_config"
            )
        return cls(
            vocab_size=m.vocab_size, d_model=m.d_model, n_layers=m.n_layers, n_heads=m.n_heads,
            n_kv_heads=m.n_kv_heads, ffn_dim=m.ffn_dim, max_seq_len=m.max_seq_len,
            rope_theta=m.rope_theta, norm_eps=m.norm_eps, tie_embeddings=m.tie_embeddings,
            init_std=m.init_std, num_experts=m.moe.num_experts, moe_top_k=m.moe.top_k, moe_every=m.moe.every,
            moe_aux_loss_weight=m.moe.aux_loss_weight, objective=m.objective, moe_capacity_factor=m.moe.capacity_factor,
        )

    def sizes(self) -> ModelSizes:
        """The sizes the parallel layout rules divide."""
        return ModelSizes(self.vocab_size, self.d_model, self.n_layers, self.n_heads, self.n_kv_heads, self.ffn_dim,
                          self.num_experts)

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def causal(self) -> bool:
        """Whether attention is causal (clm) or bidirectional over the non-padding keys (mlm)."""
        return self.objective == "clm"

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class CaptionSpec:
    """The captioner (``objective: caption``, LLaVA's first stage): the ViT encoder ``vision`` (its ``vision.*``
    parameters, shared with the MAE), a two-layer projector and the causal language model ``text`` under its own names,
    so an MAE checkpoint starts the encoder and a text checkpoint the decoder::

        vision.*                              the ViT encoder (vision_spec.encoder_parameter_shapes)
        projector.linear_1.weight             [D, C]  (+ .bias [D])    C = the ViT's width, D = the decoder's
        projector.linear_2.weight             [D, D]  (+ .bias [D])
        embed.weight, layers.*, norm.weight   the decoder (parameter_shapes)

    An image enters as its L patch tokens: the encoder's last block's outputs before its final norm (LLaVA's
    ``vision_feature_layer: -1`` on a ViT, whose hidden states are taken before the norm), the cls token left out
    (``vision_feature_select_strategy: default``), each through linear_1, exact GELU, linear_2. They are the first L
    positions of the decoder's sequence (the ``<|image|>`` placeholders' places), the caption's tokens follow, all
    causal, RoPE positions counted from the first image token; the position before each caption token predicts it
    (the last image token the first caption token), so only caption tokens carry a loss: the arithmetic of
    ``LlavaForConditionalGeneration``, which `export --format hf` writes.
    """

    vision: VisionSpec
    text: ModelSpec

    @classmethod
    def from_config(cls, m: ModelConfig, text: ModelSpec) -> CaptionSpec:
        return cls(VisionSpec.from_config(m), text)

    @property
    def n_layers(self) -> int:
        """The decoder's blocks (what memory.recompute counts)."""
        return self.text.n_layers

    @property
    def image_tokens(self) -> int:
        return self.vision.num_patches

    def to_dict(self) -> dict:
        return {"vision": asdict(self.vision), "text": self.text.to_dict()}


def projector_shapes(spec: CaptionSpec) -> dict[str, tuple[int, ...]]:
    c, d = spec.vision.d_model, spec.text.d_model
    return {"projector.linear_1.weight": (d, c), "projector.linear_1.bias": (d,),
            "projector.linear_2.weight": (d, d), "projector.linear_2.bias": (d,)}


def caption_parameter_shapes(spec: CaptionSpec, text_shapes: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """The encoder's, the projector's and the decoder's (``text_shapes``) parameters, in that order."""
    return encoder_parameter_shapes(spec.vision) | projector_shapes(spec) | text_shapes


def init_caption_weights(spec: CaptionSpec, seed: int, text_weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The encoder as the MAE starts it, the projector Xavier-uniform with zero biases (its own stream), the decoder's
    ``text_weights``."""
    encoder = {n: w for n, w in init_vision_weights(spec.vision, seed).items() if n.startswith("vision.")}
    rng = np.random.Generator(np.random.PCG64([seed, 1 << 20]))  # apart from every decoder parameter's stream
    projector = {}
    for name, shape in projector_shapes(spec).items():
        if name.endswith(".bias"):
            projector[name] = np.zeros(shape, np.float32)
        else:
            bound = np.sqrt(6.0 / (shape[0] + shape[1]))
            projector[name] = rng.uniform(-bound, bound, shape).astype(np.float32)
    return encoder | projector | text_weights


def caption_flops_per_token(spec: CaptionSpec, seq_len: int, text_flops_per_token: int) -> int:
    """Training FLOPs per token of the decoder's L + seq_len sequence: the decoder's own, plus the encoder over every
    patch and the projector, spread over the sequence's tokens (three forwards each)."""
    v, length = spec.vision, spec.image_tokens + seq_len
    c, d = v.d_model, spec.text.d_model
    image = (2 * v.num_patches * c * v.patch_dim + blocks_flops(v.num_patches + 1, c, v.ffn_dim, v.n_layers)
             + 2 * v.num_patches * (c * d + d * d))
    return text_flops_per_token + 3 * image // length


#: Any model a run trains: the language model, the ViT masked autoencoder, or the captioner.
AnySpec = ModelSpec | VisionSpec | CaptionSpec


def spec_for(m: ModelConfig) -> AnySpec:
    """The spec of the configured objective (the one place that picks the model family)."""
    if m.objective == "caption":  # its decoder is a causal language model
        return CaptionSpec.from_config(m, replace(ModelSpec.from_config(m), objective="clm"))
    return VisionSpec.from_config(m) if m.is_image else ModelSpec.from_config(m)


def visible_keys(spec: ModelSpec, ids: np.ndarray) -> np.ndarray:
    """bool [B, S, S]: whether query q of each row attends key k (the definition both engines implement)."""
    b, s = ids.shape
    if spec.causal:
        return np.broadcast_to(np.tril(np.ones((s, s), bool)), (b, s, s))
    return (ids != PAD_ID)[:, None, :] | np.eye(s, dtype=bool)[None]


def moe_capacity(spec: ModelSpec, seq_len: int) -> int | None:
    """(position, slot) pairs each expert takes per sequence of `seq_len` positions; None without a capacity limit.
    Never more than seq_len: the top_k experts of a position are distinct, so no expert gets more pairs than that."""
    if spec.moe_capacity_factor is None:
        return None
    return min(seq_len, math.ceil(spec.moe_capacity_factor * spec.moe_top_k * seq_len / spec.num_experts))


def is_moe_layer(spec: ModelSpec, i: int) -> bool:
    """Whether block i has a mixture-of-experts FFN: blocks every-1, 2*every-1, ... when num_experts > 0."""
    return spec.num_experts > 0 and i % spec.moe_every == spec.moe_every - 1


def chunk_bounds(seq: int, chunk: int) -> list[tuple[int, int]]:
    """[start, end) position ranges of ``chunk`` positions covering ``seq`` (the last may be shorter):
    the pieces both engines compute the output head and the loss in under ``memory.loss_chunk``."""
    if chunk < 1:
        raise ValueError(f"chunk of {chunk} positions: give at least 1")
    return [(a, min(a + chunk, seq)) for a in range(0, seq, chunk)]


def parameter_shapes(spec: AnySpec) -> dict[str, tuple[int, ...]]:
    """Every parameter name and shape, in a fixed canonical order."""
    if isinstance(spec, VisionSpec):
        return vision_parameter_shapes(spec)
    if isinstance(spec, CaptionSpec):
        return caption_parameter_shapes(spec, parameter_shapes(spec.text))
    d, hd, f = spec.d_model, spec.head_dim, spec.ffn_dim
    shapes: dict[str, tuple[int, ...]] = {"embed.weight": (spec.vocab_size, d)}
    for i in range(spec.n_layers):
        p = f"layers.{i}."
        shapes[p + "attn_norm.weight"] = (d,)
        shapes[p + "attn.q_proj.weight"] = (spec.n_heads * hd, d)
        shapes[p + "attn.k_proj.weight"] = (spec.n_kv_heads * hd, d)
        shapes[p + "attn.v_proj.weight"] = (spec.n_kv_heads * hd, d)
        shapes[p + "attn.o_proj.weight"] = (d, spec.n_heads * hd)
        shapes[p + "mlp_norm.weight"] = (d,)
        if is_moe_layer(spec, i):
            e = spec.num_experts
            shapes[p + "mlp.router.weight"] = (e, d)
            shapes[p + "mlp.experts.gate_proj.weight"] = (e, f, d)
            shapes[p + "mlp.experts.up_proj.weight"] = (e, f, d)
            shapes[p + "mlp.experts.down_proj.weight"] = (e, d, f)
            continue
        shapes[p + "mlp.gate_proj.weight"] = (f, d)
        shapes[p + "mlp.up_proj.weight"] = (f, d)
        shapes[p + "mlp.down_proj.weight"] = (d, f)
    shapes["norm.weight"] = (d,)
    if not spec.tie_embeddings:
        shapes["lm_head.weight"] = (spec.vocab_size, d)
    return shapes


def module_boundaries(spec: ModelSpec) -> list[str]:
    """Module paths whose outputs both engines expose, in execution order (embedding, blocks, final norm).

    Used to compare activations across engines and, later, as dump points.
    """
    return ["embed", *(f"layers.{i}" for i in range(spec.n_layers)), "norm"]


def module_names(spec: AnySpec) -> list[str]:
    """Every module that runs a forward, in definition order; 'model' is the whole model.

    Both engines' hookable modules carry exactly these names (a contract test holds them to it), so
    dump selections and fault injections are checked before a run starts, without an engine.
    In a MoE block, ``mlp.router`` outputs the router logits [tokens, E] and ``mlp.experts`` (with
    its ``gate_proj``/``up_proj``/``down_proj``) the expert computations; their shapes are
    engine-specific (torch runs each expert on its routed tokens; MindSpore on per-expert buffers of
    capacity rows with a capacity limit, else every expert on every token), the ``mlp`` output
    [B, S, d_model] is the same in both. An image model's are :func:`module_classes`' keys.
    """
    if not isinstance(spec, ModelSpec):
        return list(module_classes(spec))
    attn = ["attn_norm", "attn", "attn.q_proj", "attn.k_proj", "attn.v_proj", "attn.o_proj", "mlp_norm", "mlp"]
    dense = ["mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]
    moe = ["mlp.router", "mlp.experts", "mlp.experts.gate_proj", "mlp.experts.up_proj", "mlp.experts.down_proj"]
    names = ["model", "embed"]
    for i in range(spec.n_layers):
        block = attn + (moe if is_moe_layer(spec, i) else dense)
        names += [f"layers.{i}", *(f"layers.{i}.{m}" for m in block)]
    return names + ["norm"] + ([] if spec.tie_embeddings else ["lm_head"])


def module_classes(spec: AnySpec) -> dict[str, str]:
    """Each :func:`module_names` entry's class name, the same in both engines (a contract test holds them to it).

    MindStudio Probe names a module's dump entry ``Module|Cell.<name>.<Class>.forward.<call>``, so
    writing its format needs the class without an engine; sharing class names also lets msprobe's
    cell mapping (Cell -> Module) pair a MindSpore dump with a PyTorch one without a mapping file. An image model's
    come from :func:`mindfoundry.model.vision_spec.vision_module_classes` (a captioner's decoder is the language
    model's, its encoder and projector follow).
    """
    if isinstance(spec, VisionSpec):
        return {"model": "MAE", **vision_module_classes(spec)}
    if isinstance(spec, CaptionSpec):
        text = module_classes(spec.text)
        return {**text, "model": "Captioner", **vision_module_classes(spec.vision, decoder=False),
                "projector": "Projector", "projector.linear_1": "Linear", "projector.linear_2": "Linear"}
    out = {}
    for name in module_names(spec):
        last = name.rsplit(".", 1)[-1]
        layer = int(name.split(".")[1]) if name.startswith("layers.") else None
        if name == "model":
            out[name] = "Transformer"
        elif name == "embed":
            out[name] = "Embedding"
        elif last.isdigit():
            out[name] = "Block"
        elif last.endswith("norm"):
            out[name] = "RMSNorm"
        elif last == "attn":
            out[name] = "Attention"
        elif last == "mlp":
            out[name] = "MoE" if is_moe_layer(spec, layer) else "MLP"
        elif last == "experts":
            out[name] = "Experts"
        else:  # *_proj, router, lm_head
            out[name] = "GroupedLinear" if ".experts." in name else "Linear"
    return out


def frozen_names(spec: AnySpec, freeze: Collection[str]) -> set[str]:
    """The parameters ``train.freeze`` keeps as they are: a captioner's ``vision`` (``vision.*``), ``projector``
    (``projector.*``) and ``decoder`` (every other) parts, by name; the engines leave them out of AdamW."""
    def part(name: str) -> str:
        return "vision" if name.startswith("vision.") else "projector" if name.startswith("projector.") else "decoder"

    return {name for name in parameter_shapes(spec) if part(name) in freeze}


def decays(name: str, shape: tuple[int, ...]) -> bool:
    """Weight decay applies to matrices only, never to norm weights or biases (1-D), nor to the ViT's cls and mask
    tokens (MAE's rule: they are embeddings, not projections)."""
    return len(shape) >= 2 and not name.endswith("_token")


def num_parameters(spec: AnySpec) -> int:
    """All parameters (every expert counted)."""
    return sum(int(np.prod(s)) for s in parameter_shapes(spec).values())


def num_active_parameters(spec: ModelSpec) -> int:
    """Parameters one token passes through: top_k of each MoE block's experts (the total for a dense model)."""
    return sum(_active(s, spec) for s in parameter_shapes(spec).values())


def _active(shape: tuple[int, ...], spec: ModelSpec) -> int:
    """Elements of one parameter a token uses: stacked expert weights [E, ...] count top_k experts."""
    if len(shape) == 3:
        return spec.moe_top_k * int(np.prod(shape[1:]))
    return int(np.prod(shape))


def sample_tokens(spec: AnySpec, seq_len: int) -> int:
    """The tokens one training sample gives the model (what tokens/s and MFU count): its seq_len tokens, an image's
    patches (mae), or an image's patch tokens and its caption's seq_len (caption)."""
    if isinstance(spec, VisionSpec):
        return spec.num_patches
    if isinstance(spec, CaptionSpec):
        return spec.image_tokens + seq_len
    return seq_len


def flops_per_token(spec: AnySpec, seq_len: int) -> int:
    """Training FLOPs per token: 6*N_matmul + 12*L*d_attn*seq_len (PaLM appendix B).

    N_matmul counts the weights that take part in matrix multiplies: every projection plus the
    output head (the embedding lookup itself is a gather and costs nothing; with tied embeddings
    the shared matrix is counted once, as the head). The attention term covers QK^T and AV
    without the causal halving, as is conventional for MFU. In MoE blocks the router counts in full
    and the experts top_k times one expert (the active parameters; dispatch costs no FLOPs).

    A ViT's token is a patch: its image's training FLOPs (three forwards) over its patches.
    """
    if isinstance(spec, VisionSpec):
        return 3 * mae_flops_per_image(spec) // spec.num_patches
    if isinstance(spec, CaptionSpec):
        return caption_flops_per_token(spec, seq_len, flops_per_token(spec.text, spec.image_tokens + seq_len))
    shapes = parameter_shapes(spec)
    n_matmul = sum(_active(s, spec) for n, s in shapes.items() if len(s) >= 2 and n != "embed.weight")
    n_matmul += spec.vocab_size * spec.d_model if spec.tie_embeddings else 0
    attn = 12 * spec.n_layers * spec.n_heads * spec.head_dim * seq_len
    return 6 * n_matmul + attn


def init_weights(spec: AnySpec, seed: int) -> dict[str, np.ndarray]:
    """The initial weights, generated framework-free so both backends start from the same numbers.

    normal(0, init_std) for matrices (and stacked expert weights), init_std/sqrt(2*n_layers) for
    residual projections (GPT-2, expert down_proj included), init_std*ROUTER_INIT_SCALE for routers,
    ones for RMSNorm weights. Each parameter gets its own stream derived from (seed, name index),
    so adding a parameter later does not change the others. A ViT starts as MAE does (:func:`init_vision_weights`).
    """
    if isinstance(spec, VisionSpec):
        return init_vision_weights(spec, seed)
    if isinstance(spec, CaptionSpec):
        return init_caption_weights(spec, seed, init_weights(spec.text, seed))
    out: dict[str, np.ndarray] = {}
    resid_std = spec.init_std / np.sqrt(2 * spec.n_layers)
    for idx, (name, shape) in enumerate(parameter_shapes(spec).items()):
        if len(shape) == 1:
            out[name] = np.ones(shape, dtype=np.float32)
            continue
        std = resid_std if name.endswith(RESIDUAL_PROJECTIONS) else spec.init_std
        if name.endswith("mlp.router.weight"):
            std = spec.init_std * ROUTER_INIT_SCALE
        rng = np.random.Generator(np.random.PCG64([seed, idx]))
        out[name] = (rng.standard_normal(shape, dtype=np.float32) * np.float32(std)).astype(np.float32)
    return out


def rope_tables(spec: ModelSpec, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin tables [seq_len, head_dim] for rotate-half RoPE (the Hugging Face Llama convention)."""
    hd = spec.head_dim
    inv_freq = 1.0 / (spec.rope_theta ** (np.arange(0, hd, 2, dtype=np.float64) / hd))
    angles = np.outer(np.arange(seq_len, dtype=np.float64), inv_freq)  # (S, hd/2)
    emb = np.concatenate([angles, angles], axis=-1)  # (S, hd)
    return np.cos(emb).astype(np.float32), np.sin(emb).astype(np.float32)
