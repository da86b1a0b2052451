"""`mindfoundry export --format hf`: the folder opens in Hugging Face transformers, which computes our logits."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

transformers = pytest.importorskip("transformers", reason="transformers is installed by `make test` (the dev extra)")
torch = pytest.importorskip("torch")

from mf_testing import random_checkpoint  # noqa: E402
from mindfoundry.backends.base import create_backend  # noqa: E402
from mindfoundry.checkpoint.directory import Retention, save_checkpoint  # noqa: E402
from mindfoundry.checkpoint.hf_export import export_hf, hf_name  # noqa: E402
from mindfoundry.checkpoint.store import CheckpointError  # noqa: E402
from mindfoundry.cli.main import main  # noqa: E402
from mindfoundry.config.load import to_yaml  # noqa: E402
from mindfoundry.data.tokenizer import eos_id, pad_id  # noqa: E402
from mindfoundry.errors import OutputExistsError  # noqa: E402
from mindfoundry.eval.sampling import generate  # noqa: E402
from mindfoundry.model.spec import ModelSpec, parameter_shapes  # noqa: E402
from mindfoundry.parallel.layout import launch_layout  # noqa: E402

os.environ["HF_HUB_OFFLINE"] = "1"  # local folders only, never the hub


@pytest.mark.parametrize("model", [{}, {"n_kv_heads": 1, "tie_embeddings": False}], ids=["tied-mha", "untied-gqa"])
def test_transformers_opens_the_export_and_agrees_with_both_engines(
    tiny_prepared, tmp_path: Path, model: dict, capsys
) -> None:
    cfg, data = tiny_prepared
    ckpt, weights, cfg = random_checkpoint(cfg, data, **model)
    out = Path(export_hf(ckpt, tmp_path / "hf"))
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "generation_config.json", "model.safetensors",
                                                      "tokenizer.json", "tokenizer_config.json"]
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, local_files_only=True)
    assert type(hf).__name__ == "LlamaForCausalLM"
    hf.eval()
    spec = ModelSpec.from_config(cfg.model)
    assert len(dict(hf.named_parameters())) == len(parameter_shapes(spec))  # a tied head is one parameter in both
    ids = np.random.default_rng(0).integers(2, spec.vocab_size, (2, cfg.train.seq_len)).astype(np.int32)
    with torch.no_grad():
        theirs = hf(torch.from_numpy(ids.astype(np.int64))).logits.numpy()
    for engine in ("torch", "mindspore"):
        pytest.importorskip(engine)
        backend = create_backend(cfg.model_copy(update={"backend": engine}), spec, launch_layout(cfg))
        backend.load_weights(weights)
        ours = backend.logits(ids)
        assert np.abs(ours - theirs).max() < 2e-6, (
            engine
        )  # measured 4.8e-7 / 3.6e-7 (torch), 8.2e-7 / 7.2e-7 (mindspore); logits ~1.7

    tok = transformers.AutoTokenizer.from_pretrained(out, local_files_only=True)
    text = "def greet(name):\n    return f'你好, {name}!'\n"
    assert tok(text, add_special_tokens=False)["input_ids"] == data.tokenizer.encode(text).ids
    assert tok.decode(data.tokenizer.encode(text).ids) == text
    assert (tok.eos_token_id, tok.pad_token_id) == (eos_id(data.tokenizer), pad_id(data.tokenizer))

    prompt = data.tokenizer.encode("import json\n").ids
    backend = create_backend(cfg.model_copy(update={"backend": "torch"}), spec, launch_layout(cfg))
    backend.load_weights(weights)
    ours = generate(backend, prompt, max_seq_len=cfg.model.max_seq_len, max_new_tokens=12, temperature=0, top_k=0,
                    eos_id=eos_id(data.tokenizer), seed=0)
    with torch.no_grad():
        full = hf.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False)[0, len(prompt):].tolist()
    theirs = full[: full.index(eos_id(data.tokenizer))] if eos_id(data.tokenizer) in full else full
    assert ours == theirs and len(ours) > 0  # greedy decoding, token for token
    for engine in ("torch", "mindspore"):  # and through the command line, on either engine
        assert main(["generate", str(ckpt), "--prompt", "import json\n", "--temperature", "0", "--max-new-tokens", "12",
                     "--json", "--backend", engine]) == 0
        printed = json.loads(capsys.readouterr().out)
        assert printed["token_ids"] == theirs and printed["completion"] == data.tokenizer.decode(theirs), engine


def test_names_and_config(tiny_prepared, tmp_path: Path) -> None:
    cfg, data = tiny_prepared
    ckpt, _, cfg = random_checkpoint(cfg, data)
    assert [hf_name(n) for n in ("embed.weight", "layers.1.attn_norm.weight", "layers.1.attn.k_proj.weight",
                                 "layers.1.mlp_norm.weight", "layers.1.mlp.down_proj.weight", "norm.weight")] == [
        "model.embed_tokens.weight", "model.layers.1.input_layernorm.weight", "model.layers.1.self_attn.k_proj.weight",
        "model.layers.1.post_attention_layernorm.weight", "model.layers.1.mlp.down_proj.weight", "model.norm.weight"]
    assert main(["export", str(ckpt), "--out", str(tmp_path / "hf")]) == 0
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert {
        k: config[k]
        for k in (
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "intermediate_size",
            "vocab_size",
            "rope_theta",
            "rms_norm_eps",
            "tie_word_embeddings",
        )
    } == {
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "intermediate_size": cfg.model.ffn_dim,
        "vocab_size": 512,
        "rope_theta": 10000.0,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": True,
    }
    mask = os.umask(0)
    os.umask(mask)  # every file as a plain open() makes it (safetensors alone writes 0600)
    assert {f.name: f.stat().st_mode & 0o777 for f in (tmp_path / "hf").iterdir()} == {
        name: 0o666 & ~mask for name in ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                                          "tokenizer_config.json")}


def test_export_refuses_what_it_cannot_write(tiny_prepared, tmp_path: Path, capsys) -> None:
    cfg, data = tiny_prepared
    ckpt, _, _ = random_checkpoint(cfg, data)
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "keep.txt").write_text("mine")
    with pytest.raises(OutputExistsError, match="not an empty folder"):
        export_hf(ckpt, taken)
    assert [p.name for p in taken.iterdir()] == ["keep.txt"]  # nothing written, nothing lost
    assert main(["export", str(ckpt), "--format", "safetensors", "--out", str(tmp_path / "w.bin")]) == 2
    assert "give --out a name ending in .safetensors" in capsys.readouterr().err
    assert main(["export", str(ckpt), "--format", "safetensors", "--out", str(tmp_path / "w.safetensors")]) == 0
    assert (tmp_path / "w.safetensors").read_bytes() == (ckpt / "model.safetensors").read_bytes()
    (ckpt.parent.parent / "data" / "tokenizer.json").write_text(
        (ckpt.parent.parent / "data" / "tokenizer.json").read_text().replace('"<|pad|>"', '"<|pad2|>"')
    )
    with pytest.raises(CheckpointError, match="the run's tokenizer .* is in none of"):
        export_hf(ckpt, tmp_path / "other")
    assert not (tmp_path / "other").exists()


def test_init_from_an_export_round_trips_byte_for_byte(tiny_prepared, tmp_path: Path) -> None:
    """export -> model.init_from -> a new run's initial weights -> export again: the same bytes."""
    from mindfoundry.checkpoint.hf_import import initial_weights
    from mindfoundry.train.trainer import Trainer

    cfg, data = tiny_prepared
    ckpt, weights, cfg = random_checkpoint(cfg, data, n_kv_heads=1, tie_embeddings=False)
    first = Path(export_hf(ckpt, tmp_path / "first"))
    spec = ModelSpec.from_config(cfg.model)
    imported = initial_weights(first, spec)
    assert imported.keys() == weights.keys() and all(np.array_equal(imported[n], weights[n]) for n in weights)
    assert all(np.array_equal(initial_weights(ckpt, spec)[n], weights[n]) for n in weights)  # a checkpoint folder too

    new_run = cfg.model_copy(update={"run_dir": str(tmp_path / "continued"), "backend": "torch",
                                     "model": cfg.model.model_copy(update={"init_from": str(first)})})
    trainer = Trainer(new_run, data, tmp_path / "continued", launch_layout(new_run))
    trainer.restore_or_init(resume=False)
    started = trainer.backend.weights()
    assert all(np.array_equal(started[n], weights[n]) for n in weights)
    (tmp_path / "continued").mkdir()
    (tmp_path / "continued" / "config.yaml").write_text(to_yaml(new_run))
    again = Path(save_checkpoint(
        tmp_path / "continued",
        1,
        started,
        {f"{k}.{n}": np.zeros_like(w) for n, w in started.items() for k in ("exp_avg", "exp_avg_sq")},
        {"adam_step": 0, "consumed_samples": 0, "consumed_tokens": 0},
        extra_files={"data_manifest.json": data.manifest_bytes},
    ))
    second = Path(export_hf(again, tmp_path / "second"))
    assert (second / "model.safetensors").read_bytes() == (first / "model.safetensors").read_bytes()
    assert (second / "config.json").read_bytes() == (first / "config.json").read_bytes()


@pytest.mark.parametrize(
    "edit, message",
    [
        ({"attention_bias": True}, "attention_bias=True is not representable"),
        (
            {"rope_parameters": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}},
            "rope_type='linear' \\(RoPE scaling\\)",
        ),
        ({"hidden_size": 64}, "hidden_size=64 but this run has model.d_model=32: set model.d_model to match"),
        ({"num_key_value_heads": 1}, "num_key_value_heads=1 but this run has model.n_kv_heads=2"),
    ],
)
def test_init_from_refuses_what_the_model_cannot_represent(
    tiny_prepared, tmp_path: Path, edit: dict, message: str
) -> None:
    from mindfoundry.checkpoint.hf_import import initial_weights

    cfg, data = tiny_prepared
    ckpt, _, cfg = random_checkpoint(cfg, data)
    folder = Path(export_hf(ckpt, tmp_path / "hf"))
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | edit))
    with pytest.raises(CheckpointError, match=message):
        initial_weights(folder, ModelSpec.from_config(cfg.model))


def test_init_from_must_be_a_folder(make_config) -> None:
    from mindfoundry.config.load import ConfigError

    with pytest.raises(ConfigError, match="model.init_from='/no/such' is not a folder"):
        make_config(model={"init_from": "/no/such"})


def test_a_sharded_checkpoint_exports_the_same_bytes(tiny_prepared, tmp_path: Path) -> None:
    """checkpoint.format: sharded (torch.distributed.checkpoint shards) exports exactly what the full format does."""
    cfg, data = tiny_prepared
    full, weights, cfg = random_checkpoint(cfg, data)
    backend = create_backend(
        cfg.model_copy(update={"backend": "torch"}), ModelSpec.from_config(cfg.model), launch_layout(cfg)
    )
    backend.load_weights(weights)
    sharded = Path(save_checkpoint(
        Path(cfg.run_dir),
        2,
        None,
        None,
        {"adam_step": 0, "consumed_samples": 0, "consumed_tokens": 0},
        Retention(keep_last=2),
        extra_files={"data_manifest.json": data.manifest_bytes},
        writer=backend.save_sharded,
    ))
    assert (sharded / "model").is_dir()
    a, b = Path(export_hf(full, tmp_path / "from-full")), Path(export_hf(sharded, tmp_path / "from-sharded"))
    assert {p.name: p.read_bytes() for p in a.iterdir()} == {p.name: p.read_bytes() for p in b.iterdir()}


def test_init_from_is_not_part_of_the_run_identity(make_config, tmp_path: Path) -> None:
    from mindfoundry.train.run_identity import run_identity

    plain = make_config()
    assert run_identity(make_config(model={"init_from": str(tmp_path)})) == run_identity(plain)
    assert run_identity(make_config(model={"d_model": 128})) != run_identity(plain)
