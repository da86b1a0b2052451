"""Parallel layouts: the rules a layout must satisfy for a model, a sequence length, a batch and a
world size, and every layout that satisfies them.

The processes form a grid ``pp x dp_replicate x dp_shard x cp x tp`` (outermost first, torchtitan's
device-mesh order: tp ranks are neighbours, on the fastest links); its product is the world size.
Expert parallelism does not add a dimension: the experts are spread over ``ep`` of the
``dp_shard x cp`` ranks.

What each degree splits, and so what it must divide:

==================  ===========================================================================
dp_replicate        the batch (whole model copies; gradients all-reduced)
dp_shard            the batch, and parameters/gradients/optimizer state (FSDP, ZeRO-3)
tp                  attention heads (q and kv), the MLP hidden size, and the vocabulary (the
                    embedding and the output head are vocab-parallel)
sequence_parallel   with tp > 1, the sequence inside norms and the residual stream: seq_len / (cp*tp)
pp                  the layers, into pp * pp_virtual_stages equal contiguous chunks; the pipeline's
                    micro-batches are train.grad_accum micro-batches (1F1B needs >= pp of them)
cp                  the sequence, into 2*cp chunks; rank i holds chunks i and 2*cp-1-i so that each
                    rank does the same amount of causal-attention work (load balancing)
ep                  the experts (divides num_experts and dp_shard*cp)
==================  ===========================================================================

Every violated rule is one message naming the keys, the numbers and a value that would work.
This module is the one home of these rules: config validation applies them (:func:`config_problems`), the
launch checks them once more with the launcher's process count
(:func:`mindfoundry.parallel.layout.launch_layout`), and the engines only refuse what they cannot run. The
resolved :class:`~mindfoundry.config.parallel_config.Layout` they check carries the grid's arithmetic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from itertools import product

from mindfoundry.config.model_config import ModelConfig
from mindfoundry.config.parallel_config import DEGREES, Batch, BatchShape, Layout, ParallelConfig, Schedule
from mindfoundry.config.schema import RunConfig

#: Pipeline schedules that keep at most pp micro-batches in flight and so need at least pp of them.
ONE_F_ONE_B = ("1F1B", "Interleaved1F1B")


@dataclass(frozen=True)
class ModelSizes:
    """The sizes of a model that the rules divide (``ModelSpec.sizes()`` gives a resolved model's)."""

    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    ffn_dim: int
    num_experts: int  # 0: a dense model


def _dims(model: ModelSizes | ModelConfig) -> ModelSizes:
    """A ModelConfig's sizes, resolving what it leaves open (n_kv_heads, ffn_dim)."""
    if isinstance(model, ModelSizes):
        return model
    return ModelSizes(model.vocab_size, model.d_model, model.n_layers, model.n_heads, model.n_kv_heads or model.n_heads,
                      model.resolved_ffn_dim(), model.moe.num_experts)


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _set(values: list[int], limit: int = 8) -> str:
    shown = [str(v) for v in values[:limit]]
    return "{" + ", ".join(shown) + (", ..." if len(values) > limit else "") + "}"


def _round_up(n: int, k: int) -> int:
    return -(-n // k) * k


def _tp_rules(lay: Layout, d: ModelSizes, seq_len: int) -> list[str]:
    t = lay.tp
    if t == 1:
        return []
    out = []
    good = _set(divisors(math.gcd(d.n_heads, d.n_kv_heads, d.ffn_dim)))
    if d.n_heads % t:
        also = f" (and n_kv_heads={d.n_kv_heads})" if d.n_kv_heads != d.n_heads and d.n_kv_heads % t else ""
        out.append(f"parallel.tp={t} does not divide model.n_heads={d.n_heads}{also}: use tp in {good}")
    elif d.n_kv_heads % t:
        out.append(
            f"parallel.tp={t} does not divide model.n_kv_heads={d.n_kv_heads} (each rank needs whole key/value heads): "
            f"use tp in {good}"
        )
    if d.ffn_dim % t:
        out.append(f"parallel.tp={t} does not divide model.ffn_dim={d.ffn_dim} (the MLP is split column/row-wise): "
                   f"use tp in {good} or set model.ffn_dim to a multiple of {t} (e.g. {_round_up(d.ffn_dim, t)})")
    if d.vocab_size % t:
        out.append(
            f"parallel.tp={t} does not divide model.vocab_size={d.vocab_size} (the embedding and output head are split "
            f"along the vocabulary): raise model.vocab_size to {_round_up(d.vocab_size, t)} (unused rows are harmless) "
            f"or use tp in {_set(divisors(math.gcd(d.vocab_size, d.n_heads, d.n_kv_heads, d.ffn_dim)))}"
        )
    if lay.sequence_parallel and seq_len % (lay.cp * t):
        over = f"cp*tp = {lay.cp}*{t} = {lay.cp * t}" if lay.cp > 1 else f"tp={t}"
        out.append(
            f"parallel.sequence_parallel=true splits train.seq_len={seq_len} over {over} ranks, which does not divide "
            f"it: use seq_len={_round_up(seq_len, lay.cp * t)} (a multiple of {lay.cp * t}) "
            "or set parallel.sequence_parallel: false"
        )
    return out


def _cp_rules(lay: Layout, seq_len: int) -> list[str]:
    c = lay.cp
    if c == 1 or seq_len % (2 * c) == 0:
        return []
    good = [k for k in range(1, seq_len // 2 + 1) if k == 1 or seq_len % (2 * k) == 0]
    return [
        f"parallel.cp={c} needs train.seq_len={seq_len} divisible by 2*cp = {2 * c} (each sequence is cut into 2*cp "
        "chunks, rank i holding chunks i and 2*cp-1-i so that causal attention work is balanced): use cp in "
        f"{_set(good)} or seq_len={_round_up(seq_len, 2 * c)}"
    ]


def _pp_rules(lay: Layout, d: ModelSizes, grad_accum: int) -> list[str]:
    p, v, sched, L = lay.pp, lay.pp_virtual_stages, lay.pp_schedule, d.n_layers
    out = []
    if p == 1:
        if v > 1:
            out.append(
                f"parallel.pp_virtual_stages={v} needs parallel.pp > 1 (there is no pipeline): set pp_virtual_stages: 1"
            )
        return out
    fits_v = [k for k in range(1, L + 1) if L % (k * v) == 0]
    if p > L:
        out.append(
            f"parallel.pp={p} exceeds model.n_layers={L}: every stage needs at least one layer; use pp in "
            f"{_set(fits_v)}"
        )
    elif L % (p * v):
        text = (f"parallel.pp * pp_virtual_stages = {p}*{v} = {p * v} does not divide model.n_layers={L} "
                f"(the layers are cut into that many equal chunks): use pp in {_set(fits_v)}")
        if v > 1:
            text += f" or pp_virtual_stages in {_set([k for k in range(1, L + 1) if L % (k * p) == 0])}"
        out.append(text)
    if v > 1 and sched != "Interleaved1F1B":
        out.append(
            f"parallel.pp_virtual_stages={v} needs parallel.pp_schedule: Interleaved1F1B ({sched} runs one chunk per "
            "rank): set pp_schedule: Interleaved1F1B or pp_virtual_stages: 1"
        )
    if sched == "Interleaved1F1B" and v == 1:
        out.append(
            "parallel.pp_schedule=Interleaved1F1B needs parallel.pp_virtual_stages >= 2 (with one chunk per rank it is "
            "plain 1F1B): set pp_virtual_stages: 2 or pp_schedule: 1F1B"
        )
    if sched in ONE_F_ONE_B and grad_accum < p:
        out.append(
            f"train.grad_accum={grad_accum} is below parallel.pp={p}: the {sched} schedule needs at least pp "
            "micro-batches per step (train.grad_accum is the pipeline's number of micro-batches): raise "
            f"train.grad_accum to {p} or more (the idle bubble is (pp-1)/(grad_accum+pp-1) of each step, e.g. {4 * p} "
            f"gives {(p - 1) / (5 * p - 1):.0%})"
        )
    elif sched == "Interleaved1F1B" and grad_accum % p:
        out.append(
            f"train.grad_accum={grad_accum} is not a multiple of parallel.pp={p}: Interleaved1F1B runs micro-batches "
            f"in rounds of pp; use grad_accum={_round_up(grad_accum, p)}"
        )
    return out


def _ep_rules(lay: Layout, num_experts: int) -> list[str]:
    e = lay.ep
    if e == 1:
        return []
    if not num_experts:
        return [f"parallel.ep={e} spreads experts, but the model is dense (model.moe.num_experts=0): "
                "set model.moe.num_experts (a multiple of ep) or parallel.ep: 1"]
    out = []
    spread = lay.dp_shard * lay.cp if lay.dp_shard > 0 else None
    good = divisors(math.gcd(num_experts, spread or e))
    if num_experts % e:
        out.append(f"parallel.ep={e} does not divide model.moe.num_experts={num_experts}: use ep in {_set(good)}")
    if spread is not None and spread % e:
        out.append(
            f"parallel.ep={e} does not divide parallel.dp_shard*cp = {lay.dp_shard}*{lay.cp} = {spread} "
            f"(experts are spread over the FSDP and context-parallel ranks): use ep in {_set(good)} or raise dp_shard"
        )
    return out


def _model_rules(lay: Layout, d: ModelSizes, train: BatchShape) -> list[str]:
    """Every rule that does not involve the world size."""
    return (_tp_rules(lay, d, train.seq_len) + _cp_rules(lay, train.seq_len)
            + _pp_rules(lay, d, train.grad_accum) + _ep_rules(lay, d.num_experts))


def _factorizations(n: int, parts: int) -> list[tuple[int, ...]]:
    """Ordered tuples of `parts` positive integers whose product is n."""
    if parts == 1:
        return [(n,)]
    return [(d, *rest) for d in divisors(n) for rest in _factorizations(n // d, parts - 1)]


def _suggest(lay: Layout, d: ModelSizes, train: BatchShape, world: int) -> str:
    """The valid layout for `world` processes closest to `lay`: fewest doublings/halvings, model-parallel degrees kept
    first."""

    def distance(c: Layout) -> tuple[float, float]:
        moved = {n: abs(math.log2(getattr(c, n) / max(getattr(lay, n), 1))) for n in DEGREES}
        return sum(moved.values()), moved["tp"] + moved["pp"] + moved["cp"]

    candidates = [c for c in _grid(lay, world) if not _model_rules(c, d, train)] or [
        c for c in _grid(replace(lay, ep=1), world) if not _model_rules(c, d, train)]
    if not candidates:
        return f"no layout of this model has {world} processes; change the number of processes"
    best = min(candidates, key=distance)
    return ", ".join(f"{n}={getattr(best, n)}" for n in (*DEGREES, "ep")
                     if getattr(best, n) != 1 or getattr(best, n) != getattr(lay, n))


def _grid(lay: Layout, world: int) -> list[Layout]:
    """`lay` with every split of `world` into dp_replicate x dp_shard x cp x tp x pp (other options kept)."""
    return [replace(lay, **dict(zip(DEGREES, split))) for split in _factorizations(world, len(DEGREES))]


def layout_problems(parallel: ParallelConfig | Layout, model: ModelSizes | ModelConfig, train: BatchShape,
                    world_size: int | None = None) -> list[str]:
    """Every violated layout rule, one message each (empty: the layout works).

    ``world_size`` is the number of processes the launcher started; without it the config's
    parallel.world_size (if set) is checked instead, and without either the product is not checked.
    The expert rules read the model's expert count (0: dense).
    """
    return checked_layout(parallel, model, train, world_size)[1]


def checked_layout(parallel: ParallelConfig | Layout, model: ModelSizes | ModelConfig, train: BatchShape,
                   world_size: int | None) -> tuple[Layout, list[str]]:
    """The layout the rules were checked on (dp_shard 0 where it is not known yet) and every violated rule."""
    d = _dims(model)
    configured = parallel.world_size if isinstance(parallel, ParallelConfig) else None
    world = world_size if world_size is not None else configured
    source = "the launcher started {} processes" if world_size is not None else "parallel.world_size={}"
    count = f"the {world} processes the launcher started" if world_size is not None else f"parallel.world_size={world}"
    out = []
    if world_size is not None and configured is not None and configured != world_size:
        out.append(f"parallel.world_size={configured} but the launcher started {world_size} processes: "
                   f"launch {configured} processes or set parallel.world_size: {world_size}")
    if isinstance(parallel, Layout):
        lay = parallel
    else:
        fixed = parallel.model_copy(update={"dp_shard": 1}).layout()
        rest = fixed.world_size
        known = parallel.dp_shard != -1 or (world is not None and world % rest == 0)
        lay = parallel.layout(world) if known else fixed
        if not known and world is not None:
            out.append(
                f"parallel.dp_shard=-1 takes what is left of the world size, but dp_replicate*cp*tp*pp = {rest} does "
                f"not divide {count}: e.g. {_suggest(lay, d, train, world)}"
            )
        if not known:  # dp_shard unknown until launch: leave out the rules that involve it
            lay = replace(lay, dp_shard=0)
    if world is not None and lay.dp_shard > 0 and lay.world_size != world:
        out.append(f"product dp_replicate*dp_shard*cp*tp*pp = {lay.world_size} but {source.format(world)}: "
                   f"e.g. {_suggest(lay, d, train, world)}")
    return lay, out + _model_rules(lay, d, train)


def config_problems(cfg: RunConfig) -> list[str]:
    """The layout rules a config must pass before any launch: divisibility by the model's heads, layers,
    vocabulary and the sequence, pipeline micro-batches, and parallel.world_size when it is set."""
    return layout_problems(cfg.parallel, cfg.model, cfg.train)


def feasible_layouts(
    model: ModelSizes | ModelConfig,
    train: BatchShape,
    world_size: int,
    *,
    global_batch: int | None = None,
    sequence_parallel: bool = True,
    pp_schedule: Schedule = "1F1B",
    pp_virtual_stages: int = 1,
    optimizer_shard_variants: bool = True,
) -> list[Layout]:
    """Every layout of `world_size` processes that passes :func:`layout_problems`, in grid order.

    With ``global_batch`` (sequences per optimizer step), the batch must split evenly:
    grad_accum = global_batch / (dp * train.micro_batch_size) must be a whole number, and it is what
    the pipeline rules see; without it, train.grad_accum is used as is. For a mixture-of-experts model
    every ep dividing both its expert count and dp_shard*cp is tried. ``optimizer_shard_variants`` adds a ZeRO-1
    variant (optimizer_shard=true) of each layout with dp_replicate > 1.
    """
    d = _dims(model)
    base = Layout(sequence_parallel=sequence_parallel, pp_schedule=pp_schedule, pp_virtual_stages=pp_virtual_stages)
    out = []
    for lay in _grid(base, world_size):
        shape: BatchShape = train
        if global_batch is not None:
            accum = lay.grad_accum_for(global_batch, train.micro_batch_size)
            if accum is None:
                continue
            shape = Batch(train.seq_len, train.micro_batch_size, accum)
        eps = divisors(math.gcd(d.num_experts, lay.dp_shard * lay.cp)) if d.num_experts else [1]
        shards = (False, True) if optimizer_shard_variants and lay.dp_replicate > 1 else (False,)
        for ep, shard in product(eps, shards):
            cand = replace(lay, ep=ep, optimizer_shard=shard)
            if not _model_rules(cand, d, shape):
                out.append(cand)
    return out


