"""Config validation: every bad value fails early, on one line per problem, naming the key and the fix."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from mindfoundry.cli.main import main
from mindfoundry.config.load import ConfigError, load_config, validate

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "configs" / "demo.yaml"


def base() -> dict:
    return {"data": {"sources": [{"name": "c", "paths": ["corpus/"]}]}}


def with_(path: str, value) -> dict:
    tree = base()
    node = tree
    *parents, leaf = path.split(".")
    for p in parents:
        node = node.setdefault(p, {})
    node[leaf] = value
    return tree


IMAGES = {"data": {"sources": [{"name": "i", "paths": ["images/"], "modality": "image"}]}}
CAPTIONS = {"data": {"sources": [{"name": "i", "paths": ["images/"], "modality": "image_text"}]}}

BAD = [
    (with_("model.n_heads", 6), "model.n_heads=6 does not divide model.d_model=256"),
    (with_("model.n_kv_heads", 3), "model.n_kv_heads=3 does not divide model.n_heads=4"),
    (with_("model.n_layer", 3), "unknown key 'model.n_layer': did you mean 'model.n_layers'?"),
    (with_("model.d_model", -8), "model.d_model=-8: Input should be greater than or equal to 8"),
    (with_("train.seq_len", 4096), "train.seq_len=4096 exceeds model.max_seq_len=2048"),
    (with_("train.steps", "many"), "train.steps='many': Input should be a valid integer"),
    (with_("optim.lr", 0), "optim.lr=0: Input should be greater than 0"),
    (with_("optim.clip_norm", -1.0), "optim.clip_norm=-1.0: must be > 0, 'auto', or null"),
    (with_("optim.warmup_steps", 500), "optim.warmup_steps=500 exceeds train.steps=300"),
    (with_("backend", "jax"), "backend='jax': Input should be 'mindspore' or 'torch'"),
    (with_("model.vocab_size", 100), "model.vocab_size=100 is too small for a byte-level BPE tokenizer"),
    ({"data": {"sources": []}}, "data.sources=[]: List should have at least 1 item"),
    (
        {"data": {"sources": [{"name": "a", "paths": ["x"]}, {"name": "a", "builtin": "reviews"}]}},
        "data.sources[1].name='a' is used twice",
    ),
    ({"data": {"sources": [{"name": "a"}]}}, "data.sources[0] (a) needs exactly one of 'builtin' or 'paths'"),
    ({"data": {"sources": [{"name": "a", "builtin": "reviews", "modality": "image_text"}]}},
     "data.sources[0].modality='image_text': the built-in 'reviews' is text; give an image source its paths"),
    ({"data": {"sources": [{"name": "a", "paths": ["x"], "modality": "image", "max_documents": 5}]}},
     "data.sources[0]: max_documents and max_bytes cap text sources"),
    ({"model": {}}, "missing required key 'data'"),
    (
        with_("data.tokenizer.path", "/nonexistent/tokenizer.json"),
        "data.tokenizer.path='/nonexistent/tokenizer.json' does not exist",
    ),
    (with_("data.validation_fraction", 0.7), "data.validation_fraction=0.7: Input should be less than 0.5"),
    # a folder that can never be (issue #48: it passed validation and --dry-run, then a traceback at the first save)
    (with_("checkpoint.dir", f"{__file__}/ckpt"),
     f"checkpoint.dir='{__file__}/ckpt' cannot hold a folder: '{__file__}' is a file, not a folder"),
    (with_("checkpoint.dir", "/proc/self/ckpt"),
     "checkpoint.dir='/proc/self/ckpt' cannot be made: '/proc/self' is not writable"),
    (with_("run_dir", "s3://bucket/run"), "run_dir='s3://bucket/run' cannot be a URL: the run's lock, config, metrics "
                                          "and logs are local files"),
    (with_("data.cache_dir", "s3://bucket/cache"), "data.cache_dir='s3://bucket/cache' cannot be a URL: it is this "
                                                    "node's cache"),
    (
        with_("model.d_model", 260) | {"model": {"d_model": 260, "n_heads": 20}},
        "model.d_model/model.n_heads = 13 is odd",
    ),
    (with_("train.precision", "bf16"), "train.precision='bf16' is not available on the mindspore backend yet"),
    (with_("train.compile", True), "train.compile=true applies to the torch backend only"),
    (with_("device", "tpu"), "device='tpu': Input should be 'auto', 'cpu', 'gpu', 'cuda', 'ascend' or 'npu'"),
    (
        with_("parallel.dp", 8),
        "unknown key 'parallel.dp': parallel.dp was split into dp_replicate (replicas) and dp_shard (FSDP shards): set "
        "one of them",
    ),
    (with_("parallel.tp", 3), "parallel.tp=3 does not divide model.n_heads=4: use tp in {1, 2, 4}"),
    (with_("parallel.dp_shard", 0), "parallel.dp_shard=0: must be >= 1, or -1 for whatever is left of the world size"),
    # the image objectives (issue #50)
    (IMAGES | {"model": {"objective": "mae", "vision": {"patch_size": 5}}},
     "model.vision.patch_size=5 does not divide the image side 64 (data.images.size): choose a patch size dividing it "
     "(e.g. 2 or 4)"),
    (IMAGES | {"model": {"objective": "mae", "vision": {"image_size": 30, "patch_size": 4}}},
     "model.vision.patch_size=4 does not divide model.vision.image_size=30"),
    (IMAGES | {"model": {"objective": "mae", "vision": {}, "mae": {"mask_ratio": 1.0}}},
     "model.mae.mask_ratio=1.0: hide a share of the patches strictly between 0 and 1"),
    (IMAGES | {"model": {"objective": "mae"}}, "model.objective=mae trains a ViT: add model.vision"),
    ({"model": {"objective": "mae", "vision": {}}, **base()},
     "model.objective=mae trains on images, and data.sources has no image source: add one with modality: image or "
     "image_text"),
    (IMAGES | {"model": {"vision": {}}}, "model.vision is the encoder of the image objectives, and "
     "model.objective=clm trains text"),
    (IMAGES | {"model": {"objective": "mae", "vision": {}}, "parallel": {"tp": 2}},
     "parallel tp=2 with model.objective=mae: the image models run data parallel in this version"),
    (IMAGES | {"model": {"objective": "mae", "vision": {}}, "memory": {"recompute": "selective"}},
     "memory.recompute=selective names parts of the language model's blocks"),
    (IMAGES | {"model": {"objective": "mae", "vision": {}}, "train": {"precision": "fp16"}},
     "train.precision=fp16 with model.objective=mae on the mindspore engine: its ViT computes in float32"),
    (IMAGES | {"model": {"objective": "caption", "vision": {}}},
     "model.objective=caption learns images' captions, and data.sources has no source with captions"),
    (CAPTIONS | {"model": {"objective": "caption", "vision": {}}, "train": {"freeze": ["vision", "projector",
                                                                                      "decoder"]}},
     "train.freeze=['vision', 'projector', 'decoder'] freezes the whole captioner: nothing would train"),
    (CAPTIONS | {"model": {"objective": "caption", "max_seq_len": 256, "vision": {"patch_size": 4}}},
     "model.max_seq_len=256 is shorter than an image's 256 patch tokens plus train.seq_len=128 caption tokens: raise "
     "model.max_seq_len to 384"),
    (with_("train.freeze", ["decoder"]), "train.freeze names parts of a captioner, and model.objective=clm"),
]


@pytest.mark.parametrize("tree,message", BAD, ids=[m[:40] for _, m in BAD])
def test_bad_config_names_key_and_fix(tree: dict, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        validate(tree)
    assert message in str(info.value)


def test_all_problems_reported_at_once() -> None:
    tree = base() | {"model": {"n_heads": 6, "n_kv_heads": 4}, "train": {"seq_len": 9999}}
    text = str(pytest.raises(ConfigError, validate, tree).value)
    assert "model.n_heads=6" in text and "train.seq_len=9999" in text


def test_resolution_fills_defaults() -> None:
    cfg = validate(base() | {"model": {"d_model": 256, "n_heads": 4}, "optim": {"clip_norm": "auto"},
                             "train": {"micro_batch_size": 8, "grad_accum": 4}, "parallel": {"dp_shard": 2}})
    assert cfg.model.n_kv_heads == 4
    assert cfg.model.ffn_dim == 704  # 8/3*256 = 682.67 -> rounded up to a multiple of 64
    assert cfg.optim.clip_norm == pytest.approx(0.5 * (64 / 1024) ** 0.5)  # global batch 8*4*2 = 64
    assert cfg.run_dir == "runs/run" and cfg.data.output_dir == "runs/run/data"
    assert cfg.data.sources[0].category == "c"


def test_overrides_are_parsed_as_yaml() -> None:
    cfg = load_config(
        DEMO, ["train.steps=7", "optim.warmup_steps=2", "optim.clip_norm=null", "model.tie_embeddings=false"]
    )
    assert cfg.train.steps == 7 and cfg.optim.clip_norm is None and cfg.model.tie_embeddings is False


def test_shipped_configs_validate() -> None:
    for path in sorted((REPO / "configs").glob("*.yaml")):
        load_config(path)


def test_cli_prints_one_error_line_per_problem_without_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(with_("model.n_heads", 6)))
    proc = subprocess.run([sys.executable, "-m", "mindfoundry.cli", "config", "validate", str(bad)],
                          capture_output=True, text=True, env={"COLUMNS": "300", "PATH": ""})
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert (
        "model.n_heads=6 does not divide model.d_model=256: choose n_heads dividing d_model (e.g. 4 or 8)"
        in proc.stderr
    )


@pytest.mark.parametrize("content,message", [
    ("model: [1, 2\n", "is not valid YAML at line"),
    ("", "is empty"),
    ("- a\n- b\n", "must hold a mapping of sections"),
])
def test_unreadable_files(tmp_path: Path, content: str, message: str, capsys) -> None:
    f = tmp_path / "c.yaml"
    f.write_text(content)
    assert main(["config", "validate", str(f)]) == 2
    assert message in capsys.readouterr().err


def test_missing_config_file(capsys) -> None:
    assert main(["config", "validate", "/no/such.yaml"]) == 2
    assert "config file '/no/such.yaml' not found" in capsys.readouterr().err


def test_config_show_is_fully_resolved(capsys) -> None:
    assert main(["config", "show", str(DEMO)]) == 0
    shown = yaml.safe_load(capsys.readouterr().out)
    assert shown["model"]["ffn_dim"] == 704 and shown["model"]["n_kv_heads"] == 4
    assert validate(shown) == load_config(DEMO)


def test_override_into_a_list_item() -> None:
    cfg = load_config(DEMO, ["data.sources.1.max_bytes=1000"])
    assert cfg.data.sources[1].max_bytes == 1000
    with pytest.raises(ConfigError, match="'9' is not an index of a list of 4 items"):
        load_config(DEMO, ["data.sources.9.max_bytes=1000"])
