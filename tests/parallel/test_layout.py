"""Layout rules: every bad layout is rejected with the numbers and a layout that would work."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from mindfoundry.cli.main import main
from mindfoundry.config.layout_rules import _factorizations, feasible_layouts, layout_problems
from mindfoundry.config.load import ConfigError, validate
from mindfoundry.config.model_config import ModelConfig
from mindfoundry.config.parallel_config import Batch, Layout, ParallelConfig
from mindfoundry.parallel.layout import LayoutError, launch_layout, launched_world_size

MODEL = ModelConfig(vocab_size=8192, d_model=256, n_layers=4, n_heads=8, n_kv_heads=4)  # ffn_dim derived: 704
BATCH = Batch(seq_len=128, micro_batch_size=2, grad_accum=8)


def with_experts(model: ModelConfig, num_experts: int) -> ModelConfig:
    return model.model_copy(update={"moe": model.moe.model_copy(update={"num_experts": num_experts})})


def problems(
    world_size: int | None = None, model: ModelConfig = MODEL, batch: Batch = BATCH, num_experts: int = 0, **parallel
) -> list[str]:
    return layout_problems(ParallelConfig(**parallel), with_experts(model, num_experts), batch, world_size=world_size)


def test_a_valid_layout_has_no_problems() -> None:
    assert problems(world_size=16, dp_shard=2, tp=4, pp=2) == []
    assert problems(world_size=1) == []


def test_tp_must_divide_query_and_kv_heads() -> None:
    assert problems(tp=3)[0] == "parallel.tp=3 does not divide model.n_heads=8 (and n_kv_heads=4): use tp in {1, 2, 4}"
    assert problems(tp=8) == [
        "parallel.tp=8 does not divide model.n_kv_heads=4 (each rank needs whole key/value heads): use tp in {1, 2, 4}"
    ]


def test_tp_must_divide_ffn_and_vocab() -> None:
    model = ModelConfig(vocab_size=301, d_model=256, n_layers=4, n_heads=8, ffn_dim=702)
    text = "\n".join(problems(tp=4, model=model))
    assert "parallel.tp=4 does not divide model.ffn_dim=702 (the MLP is split column/row-wise): use tp in {1, 2} " \
           "or set model.ffn_dim to a multiple of 4 (e.g. 704)" in text
    assert (
        "parallel.tp=4 does not divide model.vocab_size=301 (the embedding and output head are split along the "
        "vocabulary): raise model.vocab_size to 304" in text
    )


def test_sequence_parallel_needs_seq_len_divisible_by_tp() -> None:
    batch = Batch(seq_len=30, grad_accum=1)
    assert problems(tp=4, batch=batch) == [
        "parallel.sequence_parallel=true splits train.seq_len=30 over tp=4 ranks, which does not divide it: "
        "use seq_len=32 (a multiple of 4) or set parallel.sequence_parallel: false"]
    assert problems(tp=4, sequence_parallel=False, batch=batch) == []


def test_cp_needs_two_chunks_per_rank() -> None:
    assert problems(cp=3, batch=Batch(seq_len=100))[0].startswith(
        "parallel.cp=3 needs train.seq_len=100 divisible by 2*cp = 6 (each sequence is cut into 2*cp chunks")
    assert "use cp in {1, 2, 5, 10, 25, 50} or seq_len=102" in problems(cp=3, batch=Batch(seq_len=100))[0]
    assert problems(cp=2, batch=Batch(seq_len=102))  # cp divides 102, but 4 chunks of 25.5 tokens do not exist
    assert problems(cp=2, batch=Batch(seq_len=100)) == []


def test_pp_cannot_exceed_layers() -> None:
    assert problems(pp=6) == [
        "parallel.pp=6 exceeds model.n_layers=4: every stage needs at least one layer; use pp in {1, 2, 4}"
    ]


def test_pp_times_virtual_stages_must_divide_layers() -> None:
    model = MODEL.model_copy(update={"n_layers": 12})
    assert problems(pp=4, pp_virtual_stages=2, pp_schedule="Interleaved1F1B", model=model) == [
        "parallel.pp * pp_virtual_stages = 4*2 = 8 does not divide model.n_layers=12 (the layers are cut into that "
        "many equal chunks): use pp in {1, 2, 3, 6} or pp_virtual_stages in {1, 3}"
    ]
    assert problems(pp=3, model=MODEL.model_copy(update={"n_layers": 4}))[0].startswith(
        "parallel.pp * pp_virtual_stages = 3*1 = 3 does not divide model.n_layers=4")


def test_pipeline_needs_enough_micro_batches() -> None:
    few = Batch(seq_len=128, grad_accum=2)
    assert problems(pp=4, batch=few)[0].startswith(
        "train.grad_accum=2 is below parallel.pp=4: the 1F1B schedule needs at least pp micro-batches per step "
        "(train.grad_accum is the pipeline's number of micro-batches): raise train.grad_accum to 4 or more")
    assert problems(pp=4, pp_schedule="GPipe", batch=few) == []
    model = MODEL.model_copy(update={"n_layers": 8})
    assert problems(pp=2, pp_virtual_stages=2, pp_schedule="Interleaved1F1B", model=model, batch=Batch(128, 1, 5)) == [
        "train.grad_accum=5 is not a multiple of parallel.pp=2: Interleaved1F1B runs micro-batches in rounds of pp; "
        "use grad_accum=6"
    ]


def test_schedule_and_virtual_stages_go_together() -> None:
    model = MODEL.model_copy(update={"n_layers": 8})
    assert problems(pp=2, pp_virtual_stages=2, model=model) == [
        "parallel.pp_virtual_stages=2 needs parallel.pp_schedule: Interleaved1F1B (1F1B runs one chunk per rank): "
        "set pp_schedule: Interleaved1F1B or pp_virtual_stages: 1"]
    assert problems(pp=2, pp_schedule="Interleaved1F1B", model=model)[0].startswith(
        "parallel.pp_schedule=Interleaved1F1B needs parallel.pp_virtual_stages >= 2")
    assert problems(pp_virtual_stages=2) == [
        "parallel.pp_virtual_stages=2 needs parallel.pp > 1 (there is no pipeline): set pp_virtual_stages: 1"
    ]


def test_world_size_mismatch_suggests_a_layout_for_the_launched_processes() -> None:
    assert problems(world_size=4, dp_shard=4, tp=2) == [
        "product dp_replicate*dp_shard*cp*tp*pp = 8 but the launcher started 4 processes: e.g. dp_shard=2, tp=2"]
    text = layout_problems(ParallelConfig(dp_shard=4, tp=2, world_size=4), MODEL, BATCH)
    assert text == ["product dp_replicate*dp_shard*cp*tp*pp = 8 but parallel.world_size=4: e.g. dp_shard=2, tp=2"]
    both = layout_problems(ParallelConfig(dp_shard=8, world_size=8), MODEL, BATCH, world_size=4)
    assert (
        both[0]
        == "parallel.world_size=8 but the launcher started 4 processes: launch 8 processes or set parallel.world_size: "
           "4"
    )
    assert both[1] == "product dp_replicate*dp_shard*cp*tp*pp = 8 but the launcher started 4 processes: e.g. dp_shard=4"


def test_suggestion_changes_a_model_parallel_degree_when_it_must() -> None:
    # tp=4 cannot stay with 2 processes: the closest layout halves tp
    assert problems(world_size=2, tp=4)[0].endswith("e.g. tp=2")
    assert problems(world_size=1, tp=2, pp=2)[0].endswith("e.g. tp=1, pp=1")


def test_dp_shard_minus_one_takes_the_rest() -> None:
    assert ParallelConfig(dp_shard=-1, tp=2).layout(world_size=8) == Layout(dp_shard=4, tp=2)
    assert problems(world_size=8, dp_shard=-1, tp=2) == []
    assert problems(world_size=6, dp_shard=-1, tp=4) == [
        "parallel.dp_shard=-1 takes what is left of the world size, but dp_replicate*cp*tp*pp = 4 does not divide "
        "the 6 processes the launcher started: e.g. dp_shard=3, tp=2"]
    assert problems(dp_shard=-1, tp=2) == []  # unknown until launch
    with pytest.raises(ValueError, match="set parallel.world_size"):
        ParallelConfig(dp_shard=-1).layout()


def test_ep_must_divide_experts_and_the_fsdp_cp_ranks() -> None:
    assert problems(world_size=4, dp_shard=4, ep=4, num_experts=6) == [
        "parallel.ep=4 does not divide model.moe.num_experts=6: use ep in {1, 2}"]
    assert problems(world_size=2, dp_shard=2, ep=4, num_experts=8) == [
        "parallel.ep=4 does not divide parallel.dp_shard*cp = 2*1 = 2 (experts are spread over the FSDP and "
        "context-parallel ranks): use ep in {1, 2} or raise dp_shard"
    ]
    assert problems(world_size=8, dp_shard=2, cp=2, tp=2, ep=4, num_experts=8) == []
    assert problems(world_size=2, dp_shard=2, ep=2) == [  # the one home of this rule (the engines no longer repeat it)
        "parallel.ep=2 spreads experts, but the model is dense (model.moe.num_experts=0): set model.moe.num_experts "
        "(a multiple of ep) or parallel.ep: 1"]


def test_every_problem_is_reported_at_once() -> None:
    found = problems(world_size=3, tp=3, pp=6, cp=3, batch=Batch(seq_len=100, grad_accum=1))
    joined = "\n".join(found)
    for part in ("product dp_replicate", "parallel.tp=3 does not divide model.n_heads", "parallel.pp=6 exceeds",
                 "parallel.cp=3 needs", "train.grad_accum=1 is below parallel.pp=6"):
        assert part in joined


def test_feasible_layouts_are_exactly_the_valid_ones() -> None:
    found = feasible_layouts(MODEL, BATCH, 8, optimizer_shard_variants=False)
    brute = [Layout(**dict(zip(("dp_replicate", "dp_shard", "cp", "tp", "pp"), split)))
             for split in _factorizations(8, 5)]
    assert set(found) == {lay for lay in brute if not layout_problems(lay, MODEL, BATCH, world_size=8)}
    assert all(lay.world_size == 8 for lay in found)
    assert Layout(tp=8) not in found and Layout(dp_shard=2, tp=4) in found and Layout(pp=8) not in found


def test_feasible_layouts_split_the_global_batch() -> None:
    found = feasible_layouts(MODEL, Batch(seq_len=128, micro_batch_size=2), 8, global_batch=8)
    assert found and all(8 % (lay.dp * 2) == 0 for lay in found)
    assert Layout(dp_replicate=8) not in found  # 8 ranks x micro-batch 2 > 8 sequences
    assert Layout(dp_replicate=2, tp=4, optimizer_shard=True) in found  # ZeRO-1 variant
    with_pp = [lay for lay in found if lay.pp > 1]
    assert all(8 // (lay.dp * 2) >= lay.pp for lay in with_pp)  # grad_accum >= pp for 1F1B
    moe = feasible_layouts(with_experts(MODEL, 4), BATCH, 4, optimizer_shard_variants=False)
    assert Layout(dp_shard=4, ep=4) in moe and Layout(dp_shard=4, ep=2) in moe and Layout(tp=4, ep=2) not in moe


def test_layout_describe_and_config() -> None:
    lay = Layout(dp_replicate=2, tp=4, optimizer_shard=True)
    assert lay.describe() == "dp_replicate=2, tp=4, optimizer_shard=true"
    assert lay.config()["world_size"] == 8 and lay.dp == 2 and lay.optimizer_shards == 2
    assert Layout().describe() == "single process"
    assert ParallelConfig(**{k: v for k, v in lay.config().items()}).layout() == lay
    assert lay.global_batch(Batch(seq_len=16, micro_batch_size=3, grad_accum=5)) == 3 * 5 * 2


def test_launch_checks_the_launchers_world_size() -> None:
    assert launched_world_size({"WORLD_SIZE": "4"}) == 4
    assert launched_world_size({"MS_WORKER_NUM": "2"}) == 2
    assert launched_world_size({}) is None
    assert launch_layout(validate(tree(dp_shard=-1, tp=2)), env={"WORLD_SIZE": "8"}) == Layout(
        dp_shard=4, tp=2
    )
    with pytest.raises(
        LayoutError, match="product dp_replicate\\*dp_shard\\*cp\\*tp\\*pp = 2 but the launcher started 4 processes"
    ):
        launch_layout(validate(tree(tp=2)), env={"WORLD_SIZE": "4"})
    assert launch_layout(validate(tree()), env={}) == Layout()


# --- through the config ---------------------------------------------------------------------------

def tree(**parallel) -> dict:
    return {"data": {"sources": [{"name": "c", "paths": ["x"]}]},
            "model": {"d_model": 256, "n_heads": 8, "n_kv_heads": 4, "n_layers": 4}, "parallel": parallel}


def test_config_validation_applies_the_layout_rules() -> None:
    with pytest.raises(ConfigError) as info:
        validate(tree(tp=3))
    assert "parallel.tp=3 does not divide model.n_heads=8 (and n_kv_heads=4): use tp in {1, 2, 4}" in str(info.value)
    with pytest.raises(ConfigError, match="unknown key 'parallel.dp': parallel.dp was split into dp_replicate"):
        validate(tree(dp=8))


def test_resolution_fills_world_size_and_dp_shard() -> None:
    cfg = validate(tree(tp=2, dp_shard=-1, world_size=8))
    layout = cfg.parallel.layout()
    assert (cfg.parallel.dp_shard, cfg.parallel.world_size, layout.dp, layout.world_size) == (4, 8, 4, 8)
    cfg = validate(tree(dp_replicate=2, pp=2) | {"train": {"grad_accum": 2}})
    assert cfg.parallel.world_size == 4 and cfg.parallel.layout().dp == 2
    assert validate(tree(dp_shard=-1, tp=2)).parallel.world_size is None  # known at launch


def test_auto_clip_norm_needs_a_known_batch() -> None:
    with pytest.raises(ConfigError, match="optim.clip_norm='auto' depends on the global batch"):
        validate(tree(dp_shard=-1) | {"optim": {"clip_norm": "auto"}})


def test_config_validate_cli_rejects_a_bad_layout(tmp_path: Path, capsys) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(tree(tp=3)))
    assert main(["config", "validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert "parallel.tp=3 does not divide model.n_heads=8 (and n_kv_heads=4): use tp in {1, 2, 4}" in err
    assert "Traceback" not in err


def test_launching_an_open_dp_shard_without_a_process_count_names_the_flag(capsys) -> None:
    """dp_shard=-1 and no world_size: `launch` cannot tell how many processes to start; nothing is started."""
    demo = Path(__file__).resolve().parents[2] / "configs" / "demo.yaml"
    assert main(["launch", "train", str(demo), "--set", "parallel.dp_shard=-1", "--set", "optim.clip_norm=1.0"]) == 2
    assert capsys.readouterr().err.strip() == (
        "config error: parallel.dp_shard=-1 takes what is left of the world size, so the config does not say how many "
        "processes to start: pass --nproc-per-node (processes on each node) or set parallel.world_size")
