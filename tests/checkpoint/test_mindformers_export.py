"""`mindfoundry export --format mindformers`: MindFormers itself reads the run YAML, builds its Llama from it, loads
our weights into it by name and computes our logits, and its Megatron reader opens our shards."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from mf_testing import random_checkpoint
from mindfoundry.checkpoint.mindformers_export import mindformers_name
from mindfoundry.cli.main import main
from mindfoundry.model.spec import ModelSpec

WORKER = Path(__file__).with_name("mindformers_worker.py")


def test_mindformers_runs_the_export(tiny_prepared, tmp_path: Path) -> None:
    pytest.importorskip("mindspore")
    if importlib.util.find_spec("mindformers") is None:  # not imported here: importing it writes logs under ./output
        pytest.skip("MindFormers is not installed: `make install` adds 1.9.0 without its pins (Makefile)")
    from mindfoundry.backends.base import create_backend
    from mindfoundry.parallel.layout import launch_layout

    cfg, data = tiny_prepared
    ckpt, weights, cfg = random_checkpoint(cfg, data, n_kv_heads=1)  # grouped-query attention, tied head
    assert main(["export", str(ckpt), "--format", "mindformers", "--out", str(tmp_path / "mf")]) == 0
    spec = ModelSpec.from_config(cfg.model)
    ids = np.random.default_rng(0).integers(2, spec.vocab_size, (2, cfg.train.seq_len)).astype(np.int32)
    np.save(tmp_path / "ids.npy", ids)
    (tmp_path / "scratch").mkdir()
    proc = subprocess.run(
        [sys.executable, str(WORKER), str(tmp_path / "mf"), str(tmp_path / "ids.npy"), str(tmp_path / "mf.json")],
        cwd=tmp_path / "scratch",
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads((tmp_path / "mf.json").read_text())
    assert got["version"] == "1.9.0" and got["tied"]
    assert got["unresolved_types"] == [] and got["unknown_model_keys"] == []  # every class and key is MindFormers'
    assert got["not_loaded"] == [] and got["unused"] == []  # every weight found its parameter by name, none left over
    backend = create_backend(cfg.model_copy(update={"backend": "mindspore"}), spec, launch_layout(cfg))
    backend.load_weights(weights)
    theirs = np.load(tmp_path / "mf.npy")
    assert theirs.shape == (2, cfg.train.seq_len, spec.vocab_size)
    assert np.abs(theirs - backend.logits(ids)).max() < 1e-5  # measured 2.7e-7 (logits ~1)

    # the layout, schedule and data of the run, in MindFormers' words
    want = {"data_parallel": 1, "model_parallel": 1, "pipeline_stage": 1, "context_parallel": 1, "expert_parallel": 1,
            "use_seq_parallel": False, "micro_batch_num": 1, "vocab_emb_dp": True, "optimizer_shard": False,
            "gradient_aggregation_group": 4}
    assert {k: got["parallel_config"][k] for k in want} == want  # MindFormerConfig adds its defaults for the rest
    assert {k: got["lr_schedule"][k] for k in ("learning_rate", "warmup_steps", "total_steps")} == {
        "learning_rate": cfg.optim.lr, "warmup_steps": cfg.optim.warmup_steps, "total_steps": cfg.train.steps}
    ours = {str((Path(cfg.data.output_dir) / e["path"]).resolve()): (e, shard)
            for e, shard in zip(data.manifest["splits"]["train"]["shards"], data.shards["train"])}
    assert set(got["shards"]) == set(ours) and sum(s["weight"] for s in got["shards"].values()) == pytest.approx(
        1, abs=1e-5
    )
    for prefix, seen in got["shards"].items():  # MindFormers' reader sees our documents
        entry, shard = ours[prefix]
        assert seen["documents"] == len(shard) == entry["num_documents"]
        assert seen["first"] == shard[0].tolist() and seen["last"] == shard[len(shard) - 1].tolist()
        assert seen["weight"] == pytest.approx(
            entry["num_tokens"] / data.manifest["splits"]["train"]["tokens"], abs=1e-6
        )


def test_names_layout_and_refusals(tiny_prepared, tmp_path: Path, capsys) -> None:
    cfg, data = tiny_prepared
    assert [
        mindformers_name(n)
        for n in (
            "embed.weight",
            "layers.1.attn_norm.weight",
            "layers.1.attn.k_proj.weight",
            "layers.1.mlp.gate_proj.weight",
            "layers.1.mlp.up_proj.weight",
            "layers.1.mlp.down_proj.weight",
            "layers.1.mlp_norm.weight",
            "norm.weight",
        )
    ] == [
        "model.tok_embeddings.embedding_weight",
        "model.layers.1.attention_norm.weight",
        "model.layers.1.attention.wk.weight",
        "model.layers.1.feed_forward.w1.weight",
        "model.layers.1.feed_forward.w3.weight",
        "model.layers.1.feed_forward.w2.weight",
        "model.layers.1.ffn_norm.weight",
        "model.norm_out.weight",
    ]
    ckpt, _, cfg = random_checkpoint(cfg, data)
    layout = cfg.model_dump(mode="json")
    layout["parallel"] = {
        "dp_replicate": 2,
        "tp": 2,
        "pp": 2,
        "optimizer_shard": True,
        "grad_fusion_groups": 4,
        "sequence_parallel": True,
    }
    layout["memory"] = {"recompute": "selective"}
    (Path(cfg.run_dir) / "config.yaml").write_text(yaml.safe_dump(layout))
    assert main(["export", str(ckpt), "--format", "mindformers", "--out", str(tmp_path / "mf")]) == 0
    run = yaml.safe_load((tmp_path / "mf" / "run_mindformers.yaml").read_text())
    assert run["parallel_config"] == {
        "data_parallel": 2,
        "model_parallel": 2,
        "pipeline_stage": 2,
        "context_parallel": 1,
        "expert_parallel": 1,
        "use_seq_parallel": True,
        "micro_batch_num": cfg.train.grad_accum,
        "vocab_emb_dp": False,
        "optimizer_shard": True,
        "gradient_aggregation_group": 4,
    }
    assert run["parallel"]["enable_parallel_optimizer"] and run["recompute_config"]["select_recompute"]
    assert sorted(p.relative_to(tmp_path / "mf").as_posix() for p in (tmp_path / "mf").rglob("*") if p.is_file()) == [
        "run_mindformers.yaml", "tokenizer.json", "weights/model.safetensors"]

    capsys.readouterr()
    assert (
        main(["export", str(ckpt), "--format", "mindformers", "--out", str(tmp_path / "mf")]) == 2
    )  # never overwrites
    assert "already exists and is not an empty folder" in capsys.readouterr().err
    for model, named in (({"moe": {"num_experts": 2, "top_k": 1}}, "mixture-of-experts blocks"),
                         ({"objective": "mlm"}, "model.objective=mlm")):
        refused, _, _ = random_checkpoint(cfg, data, **model)
        assert main(["export", str(refused), "--format", "mindformers", "--out", str(tmp_path / "no")]) == 2
        assert named in capsys.readouterr().err and not (tmp_path / "no").exists()
