"""Semi-auto (MindSpore cluster) checkpoints: per-rank slices + strategy file, merged back to the full format.

The slices are built the way each layout's strategy says (mindfoundry.backends.mindspore.strategies.parameter_layouts),
the merge must give back every tensor bit for bit, and MindSpore's own ``transform_checkpoints`` on the same rank files
and strategy file must give the same tensors (so the layout arithmetic is MindSpore's, not just our own round trip).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from mf_testing import launched, tiny_config
from mindfoundry.backends.mindspore.strategies import parameter_layouts, plan_strategies
from mindfoundry.checkpoint.convert import export_checkpoint
from mindfoundry.checkpoint.directory import Retention, save_checkpoint
from mindfoundry.checkpoint.rank_slices import STRATEGY_FILE, read_rank_slices, write_rank_slices, write_strategy
from mindfoundry.checkpoint.reader import load_checkpoint
from mindfoundry.checkpoint.store import CheckpointError
from mindfoundry.cli.main import main
from mindfoundry.model.spec import ModelSpec, init_weights
from mindfoundry.parallel.tensor_layout import TensorLayout, merge_slices, rank_slice

WORKER = Path(__file__).with_name("ms_transform_worker.py")

#: name -> (parallel section, model overrides, devices)
LAYOUTS = {
    "fsdp2_tp2": (
        {"dp_shard": 2, "tp": 2},
        {},
        4,
    ),  # parallel optimizer over dp_shard (level3), tied vocab-parallel head
    "pp2_tp2_dp2_zero1": ({"pp": 2, "tp": 2, "dp_replicate": 2, "optimizer_shard": True}, {"tie_embeddings": False}, 8),
    "moe_ep2_fsdp2": ({"dp_shard": 2, "ep": 2}, {"moe": {"num_experts": 4, "top_k": 2}}, 2),
}


def _state(name: str):
    parallel, model, devices = LAYOUTS[name]
    cfg = tiny_config(parallel=parallel, model={"n_layers": 2, **model}, train={"grad_accum": 2})
    spec = ModelSpec.from_config(cfg.model)
    layouts = parameter_layouts(plan_strategies(cfg, spec, launched(cfg, devices)), spec)
    rng = np.random.default_rng(7)
    weights = {n: (w + rng.normal(0, 0.05, w.shape)).astype(np.float32) for n, w in init_weights(spec, 1).items()}
    moments = {
        f"{k}.{n}": rng.normal(0, 1e-3, w.shape).astype(np.float32)
        for n, w in weights.items()
        for k in ("exp_avg", "exp_avg_sq")
    }
    return weights, moments, layouts, devices


def _write_cluster(folder: Path, arrays, layouts, devices: int, strategy=None) -> None:
    for rank in range(devices):
        write_rank_slices(folder, arrays, layouts, rank)
    write_strategy(folder, strategy or layouts)


def test_layouts_split_what_the_strategies_split() -> None:
    _, _, layouts, _ = _state("fsdp2_tp2")
    # grid (dp*cp, tp) = (2, 2); the parallel optimizer splits each tp slice's rows over the 2 dp_shard replicas
    assert layouts["layers.0.attn.q_proj.weight"] == TensorLayout((2, 2), (0, -1), 2, 0)  # column-parallel: rows by tp
    assert layouts["layers.0.attn.o_proj.weight"] == TensorLayout((2, 2), (-1, 0), 2, 0)  # row-parallel: columns by tp
    assert layouts["embed.weight"] == TensorLayout((2, 2), (0, -1), 2, 0)  # tied: the vocab-parallel head's split
    assert layouts["layers.0.attn_norm.weight"] == TensorLayout((2, 2), (-1,), 2, 0)  # whole, 4 replicas -> 2 pieces
    _, _, pp, _ = _state("pp2_tp2_dp2_zero1")
    assert pp["layers.0.mlp.down_proj.weight"] == TensorLayout((2, 2), (-1, 0), -1, 0)
    assert (
        pp["layers.1.mlp.down_proj.weight"].stage == 1
        and pp["lm_head.weight"].stage == 1
        and pp["embed.weight"].stage == 0
    )
    assert list(pp["lm_head.weight"].ranks()) == [4, 5, 6, 7]
    _, _, moe, _ = _state("moe_ep2_fsdp2")
    assert moe["layers.0.mlp.experts.gate_proj.weight"] == TensorLayout((2, 1, 1), (2, -1, -1), 0, 0)  # experts by ep
    assert moe["layers.0.mlp.router.weight"] == TensorLayout((2, 1), (-1, -1), 2, 0)


def test_slices_are_minimal_and_cover_the_tensor() -> None:
    lay = TensorLayout((2, 2), (0, -1), 2)  # rows by tp (grid index 0), then halves of each slice by the 2 replicas
    full = np.arange(8 * 3, dtype=np.float32).reshape(8, 3)
    parts = {r: rank_slice(full, lay, r) for r in range(4)}
    assert [p[:, 0].tolist() for p in parts.values()] == [[0, 3], [12, 15], [6, 9], [18, 21]]  # rank 1: tp 1, piece 0
    assert np.array_equal(merge_slices(parts, lay, full.shape, "w"), full)


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_rank_slices_merge_to_the_full_checkpoint(tmp_path: Path, name: str) -> None:
    weights, moments, layouts, devices = _state(name)
    folders = {"model": (weights, layouts), "optimizer": (moments, None)}
    for sub, (arrays, strategy) in folders.items():  # the optimizer folder: moments take their parameter's layout
        _write_cluster(tmp_path / sub, arrays, layouts, devices, strategy)
    sizes = [load_file(str(tmp_path / "model" / f"rank_{r}.safetensors")) for r in range(devices)]
    held = sum(a.size for s in sizes for a in s.values())
    total = sum(a.size for a in weights.values())
    assert held < devices * total  # the ranks hold slices, not copies
    for sub, (arrays, _) in folders.items():
        merged = read_rank_slices(tmp_path / sub)
        assert merged.keys() == arrays.keys()
        for n, a in arrays.items():
            assert np.array_equal(merged[n], a), n  # bit for bit


@pytest.mark.skipif(importlib.util.find_spec("mindspore") is None, reason="needs MindSpore")
def test_mindspore_transform_checkpoints_agrees(tmp_path: Path) -> None:
    """MindSpore's own merge of the same rank files (its .ckpt) and strategy file gives the same full tensors."""
    jobs = []
    for name in LAYOUTS:
        weights, _, layouts, devices = _state(name)
        _write_cluster(tmp_path / name / "slices", weights, layouts, devices)
        jobs.append((name, weights))
    for name, weights in jobs:
        out = tmp_path / name / "out"
        out.mkdir()
        subprocess.run(
            [sys.executable, str(WORKER), str(tmp_path / name / "slices"), str(out)],
            check=True,
            cwd=tmp_path,
            capture_output=True,
            timeout=300,
        )
        merged = load_file(str(out / "merged.safetensors"))
        assert merged.keys() == weights.keys()
        for n, a in weights.items():
            assert np.array_equal(merged[n], a), (name, n)


def test_sharded_checkpoint_folder_loads_as_full_arrays(tmp_path: Path, capsys) -> None:
    """A committed step folder whose tensors are rank slices verifies and loads full, with no engine's reader."""
    weights, moments, layouts, devices = _state("pp2_tp2_dp2_zero1")

    def writer(folders):
        for folder, arrays in zip(folders, (weights, moments)):
            _write_cluster(folder, arrays, layouts, devices)

    path = Path(save_checkpoint(tmp_path, 3, None, None, {"adam_step": 3}, Retention(), writer=writer))
    ckpt = load_checkpoint(path)  # rank slices merged without an engine
    assert all(np.array_equal(ckpt.weights[n], a) for n, a in weights.items())
    assert all(np.array_equal(ckpt.optimizer[n], a) for n, a in moments.items())
    # the weights alone, one file: byte for byte the model.safetensors of a full-format checkpoint of the same state
    full = Path(save_checkpoint(tmp_path / "full", 3, weights, moments, {"adam_step": 3}))
    out = Path(export_checkpoint(path, tmp_path / "weights.safetensors"))
    assert out.read_bytes() == (full / "model.safetensors").read_bytes()
    assert main(["ckpt", "inspect", str(path)]) == 0
    text = capsys.readouterr().out
    assert "model/ (sharded, 8 shard files, rank_slices)" in text and f"{len(weights)} tensors" in text


def test_damaged_or_incomplete_slices_are_named(tmp_path: Path) -> None:
    weights, _, layouts, devices = _state("fsdp2_tp2")
    folder = tmp_path / "model"
    _write_cluster(folder, weights, layouts, devices)
    (folder / "rank_3.safetensors").rename(tmp_path / "rank_3.safetensors")
    with pytest.raises(CheckpointError, match=r"no slice from rank\(s\) \[3\].*copy every rank's file"):
        read_rank_slices(folder)
    (tmp_path / "rank_3.safetensors").rename(folder / "rank_3.safetensors")
    good = (folder / "rank_1.safetensors").read_bytes()
    (folder / "rank_1.safetensors").write_bytes(good[:100])  # truncated
    with pytest.raises(CheckpointError, match=r"rank_1.safetensors: unreadable slice file"):
        read_rank_slices(folder)
    (folder / "rank_1.safetensors").write_bytes(good)

    # a replica that differs (files of two steps mixed): the norm weight's rank 0 and rank 2 hold the same piece
    other = {n: a + 1 for n, a in weights.items()}
    write_rank_slices(folder, other, layouts, 2)
    with pytest.raises(CheckpointError, match=r"ranks 0 and 2 hold different copies of the same slice"):
        read_rank_slices(folder)
    write_rank_slices(folder, weights, layouts, 2)
    assert np.array_equal(read_rank_slices(folder)["norm.weight"], weights["norm.weight"])

    strategy = json.loads((folder / STRATEGY_FILE).read_text())
    strategy["parallel_layout_item"]["norm.weight"]["param_split_shape"] = [16, 48]
    (folder / STRATEGY_FILE).write_text(json.dumps(strategy))
    with pytest.raises(CheckpointError, match=r"'norm.weight' is split unevenly .*mindspore.transform_checkpoints"):
        read_rank_slices(folder)
    (folder / STRATEGY_FILE).write_text("{not json")
    with pytest.raises(CheckpointError, match=r"strategy.json: not JSON"):
        read_rank_slices(folder)
    del strategy["parallel_layout_item"]["norm.weight"]
    (folder / STRATEGY_FILE).write_text(json.dumps(strategy))
    with pytest.raises(CheckpointError, match=r"'norm.weight' is in the rank files but not in strategy.json"):
        read_rank_slices(folder)
