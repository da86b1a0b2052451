"""The masked-LM objective (model.objective: mlm): masking as a pure function of (seed, stream, position) with
BERT's rates, the mask token, config errors, and -- end to end on the real engines -- cross-engine agreement,
bit-exact resume, held-out masked-token accuracy, the fill-mask samples and the refusals."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mf_testing import DEMO_TEST_SIZE, ArraySource, tiny_config
from mindfoundry.config.load import ConfigError, validate
from mindfoundry.data.dataset.loader import TrainLoader
from mindfoundry.data.dataset.masking import VALIDATION, MaskingRule
from mindfoundry.data.dataset.packing import IGNORE_INDEX
from mindfoundry.data.tokenizer import MASK, TokenizerError, mask_id, pad_id, train_tokenizer, with_mask_token
from mindfoundry.model.spec import PAD_ID, ModelSpec, visible_keys

V = 300
RULE = MaskingRule(V - 1, np.array([0, PAD_ID, V - 1]), np.arange(2, V - 1), 0.15, 0.8, 0.1, seed=7)


def rows(n: int, s: int = 64, seed: int = 0) -> np.ndarray:
    """Ordinary tokens with EOS here and there and a padded tail on every other row."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(2, V - 1, (n, s)).astype(np.int32)
    ids[:, ::17] = 0  # EOS
    ids[::2, -10:] = PAD_ID
    return ids


def test_masking_follows_bert_rates_and_is_a_pure_function_of_position() -> None:
    ids = rows(400)
    masked, labels = RULE.apply(ids, np.arange(400))
    chosen = labels != IGNORE_INDEX
    special = np.isin(ids, RULE.special)
    ordinary = (~special).sum(1)
    assert np.array_equal(
        chosen.sum(1), np.maximum(1, np.round(0.15 * ordinary))
    )  # exactly 15% of each row's ordinary tokens
    assert not (chosen & special).any()  # EOS and padding are never predicted
    assert np.array_equal(masked[~chosen], ids[~chosen]) and np.array_equal(labels[chosen], ids[chosen])
    n = int(chosen.sum())  # 3,600 positions
    shown_mask = masked[chosen] == RULE.mask_id
    kept = masked[chosen] == ids[chosen]
    replaced = ~shown_mask & ~kept
    # binomial shares: 3 standard deviations of n draws (0.8: 0.020; 0.1: 0.015); a random replacement equals its
    # token with probability 1/297 (counted as kept)
    assert abs(shown_mask.mean() - 0.8) < 3 * math.sqrt(0.8 * 0.2 / n)
    assert abs(replaced.mean() - 0.1 * 296 / 297) < 3 * math.sqrt(0.09 / n)
    assert np.isin(masked[chosen][replaced], RULE.ordinary).all()
    # purity: the same (seed, stream, position) gives the same mask in any batch; another one a different mask
    again, again_labels = RULE.apply(ids[[5, 3]], np.array([5, 3]))
    assert np.array_equal(again, masked[[5, 3]]) and np.array_equal(again_labels, labels[[5, 3]])
    for other in (
        RULE.for_stream(VALIDATION),
        MaskingRule(
            *[
                getattr(RULE, f)
                for f in ("mask_id", "special", "ordinary", "mask_rate", "mask_token_rate", "random_token_rate")
            ],
            seed=8,
        ),
    ):
        assert not np.array_equal(other.apply(ids[:4], np.arange(4))[1], labels[:4])
    moved, _ = RULE.apply(ids[:4], np.arange(1, 5))  # the same rows at other positions: other masks (dynamic masking)
    assert not np.array_equal(moved, masked[:4])


def test_loader_masks_by_global_position_across_ranks_and_resumes() -> None:
    """Two dp ranks' slices are one process's batch; a loader started at position 16 (a resume) gives what the
    uninterrupted one gave there."""
    ids = rows(48)
    source = ArraySource(ids, np.full_like(ids, IGNORE_INDEX))
    one = TrainLoader(source, micro_batch_size=4, grad_accum=2, prefetch=0, masking=RULE)
    ranks = [
        TrainLoader(source, micro_batch_size=2, grad_accum=2, dp_rank=r, dp_size=2, prefetch=0, masking=RULE)
        for r in (0, 1)
    ]
    with one.iterate(0) as batches:
        seen = [next(batches) for _ in range(3)]
    for b in seen:
        split = [r.batch(b.position) for r in ranks]
        assert np.array_equal(np.concatenate([s.input_ids.reshape(-1, 64) for s in split]), b.input_ids.reshape(-1, 64))
        assert np.array_equal(np.concatenate([s.labels.reshape(-1, 64) for s in split]), b.labels.reshape(-1, 64))
    with TrainLoader(source, micro_batch_size=4, grad_accum=2, prefetch=2, masking=RULE).iterate(16) as resumed:
        b = next(resumed)
    assert (
        b.position == 16 and np.array_equal(b.input_ids, seen[2].input_ids) and np.array_equal(b.labels, seen[2].labels)
    )


def test_attention_sees_every_key_but_padding() -> None:
    spec = ModelSpec.from_config(tiny_config(model={"objective": "mlm"}).model)
    ids = np.array([[5, 6, PAD_ID, PAD_ID]])
    assert visible_keys(spec, ids)[0].astype(int).tolist() == [[1, 1, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 0, 1]]
    causal = ModelSpec.from_config(tiny_config().model)
    assert visible_keys(causal, ids)[0].astype(int).tolist() == [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]]


@pytest.mark.parametrize(
    "section,message",
    [
        ({"model": {"objective": "bert"}}, "model.objective"),
        (
            {"model": {"objective": "mlm", "mlm": {"mask_rate": 0.0}}},
            "mask_rate=0.0: predict a share of the tokens strictly between 0 and 1",
        ),
        ({"model": {"objective": "mlm", "mlm": {"mask_rate": 1.0}}}, "mask_rate=1.0"),
        (
            {"model": {"objective": "mlm", "mlm": {"mask_token_rate": 0.95, "random_token_rate": 0.1}}},
            "mask_token_rate + random_token_rate = 1.05 exceeds 1",
        ),
        ({"model": {"objective": "mlm", "vocab_size": 258}}, "model.vocab_size=258 leaves no room for the mask token"),
        (
            {"model": {"objective": "mlm", "n_layers": 4}, "parallel": {"pp": 2}},
            "parallel.pp=2 with model.objective=mlm",
        ),
        ({"model": {"objective": "mlm"}, "parallel": {"cp": 2}}, "parallel.cp=2 with model.objective=mlm"),
    ],
)
def test_config_errors_name_the_key_and_the_fix(section: dict, message: str) -> None:
    tree = {"data": {"sources": [{"name": "c", "paths": ["x"]}]}, "model": {"vocab_size": 300}, **section}
    tree["model"] = {"vocab_size": 300, **section.get("model", {})}
    with pytest.raises(ConfigError, match=None) as err:
        validate(tree)
    assert message in str(err.value)


def test_mask_token_takes_the_last_id_or_is_refused_without_room() -> None:
    texts = ["hello world, a small corpus of words"] * 40
    tok = train_tokenizer(texts, 300, mask_token=True)
    assert (pad_id(tok), mask_id(tok)) == (PAD_ID, tok.get_vocab_size() - 1)
    assert tok.encode(f"a {MASK} b").ids.count(mask_id(tok)) == 0  # the literal text is not the special token
    full = train_tokenizer(texts, 300)
    n = full.get_vocab_size()
    with pytest.raises(TokenizerError, match=f"all of model.vocab_size={n}: no room for the mask token"):
        with_mask_token(full, n)
    assert mask_id(with_mask_token(full, n + 1)) == n and full.get_vocab_size() == n + 1


def test_prepare_refuses_a_loaded_tokenizer_without_room_for_the_mask_token(corpus_dir: Path, tmp_path: Path) -> None:
    """data.tokenizer.path with a tokenizer as large as model.vocab_size: `prepare` for mlm stops before writing shards.
    """
    from mf_testing import tiny_run_tree
    from mindfoundry.data.prepare.pipeline import prepare_data

    full = train_tokenizer((corpus_dir / "code.jsonl").read_text().splitlines(), 300)
    full.save(str(tmp_path / "tok.json"))
    tree = tiny_run_tree(corpus_dir, tmp_path / "run", model__objective="mlm", model__vocab_size=full.get_vocab_size())
    tree["data"]["tokenizer"] = {"path": str(tmp_path / "tok.json")}
    with pytest.raises(
        TokenizerError, match=f"all of model.vocab_size={full.get_vocab_size()}: no room for the mask token"
    ):
        prepare_data(validate(tree), log=lambda _: None)
    assert not (tmp_path / "run" / "data").exists()


# -- end to end ---------------------------------------------------------------------------------------------------

REPO = Path(__file__).resolve().parents[2]


def run_demo_mlm(tmp_path: Path, name: str, *args: str, command: str = "run") -> subprocess.CompletedProcess:
    """`mindfoundry run configs/demo-mlm.yaml` (or `train`) at test size, every run on one prepared data folder."""
    cmd = [sys.executable, "-m", "mindfoundry.cli", command, str(REPO / "configs" / "demo-mlm.yaml"), *args,
           "--set", f"run_dir={tmp_path / name}", "--set", f"data.output_dir={tmp_path / 'data'}"]
    for item in DEMO_TEST_SIZE:
        cmd += ["--set", item]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=dict(os.environ, COLUMNS="200"))


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mindfoundry.cli", *args], capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, COLUMNS="200"))


@pytest.mark.slow
def test_demo_mlm_runs_resumes_bit_exact_and_agrees_across_engines(tmp_path: Path) -> None:
    pytest.importorskip("mindspore")
    pytest.importorskip("torch")
    pytest.importorskip("snownlp")
    from safetensors.numpy import load_file

    from mindfoundry.backends.base import create_backend
    from mindfoundry.config.load import load_config
    from mindfoundry.data.dataset.prepared import load_prepared
    from mindfoundry.model.spec import init_weights
    from mindfoundry.parallel.layout import launch_layout
    from mindfoundry.train.metrics import read_metrics
    from mindfoundry.train.schedule import step_scalars
    from mindfoundry.workflows.align import first_batches

    straight = run_demo_mlm(tmp_path, "straight")
    assert straight.returncode == 0, straight.stderr[-3000:]
    first = run_demo_mlm(tmp_path, "split", "--stop-at-step", "20", command="train")
    assert first.returncode == 0, first.stderr[-3000:]
    # the second half recomputes every block: the memory section may change between resumes, it changes no number
    second = run_demo_mlm(tmp_path, "split", "--resume", "auto", "--set", "memory.recompute=full", command="train")
    assert second.returncode == 0 and "resumed from" in second.stderr, second.stderr[-3000:]

    # resume: the same losses, weights and moments as the uninterrupted run, bit for bit
    records = {run: read_metrics(tmp_path / run / "metrics.jsonl") for run in ("straight", "split")}
    losses = {run: {r["step"]: r["loss"] for r in recs if "loss" in r} for run, recs in records.items()}
    assert losses["straight"] == losses["split"] and sorted(losses["split"]) == list(range(1, 41))
    ckpts = [tmp_path / run / "checkpoints" / "step_00000040" for run in ("straight", "split")]
    state = {part: [load_file(str(c / f"{part}.safetensors")) for c in ckpts] for part in ("model", "optimizer")}
    for a, b in state.values():
        assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)

    # held-out masked tokens: the loss starts near a uniform guess over the vocabulary and falls; the same masks at
    # every evaluation (the same scored tokens); accuracy is a share of them (untrained ~10%: with tied embeddings an
    # untrained model predicts its input token, right for the 10% kept; 40 steps then learn frequent tokens first)
    summary = json.loads((tmp_path / "straight" / "summary.json").read_text())
    initial, final = summary["initial"], summary["final"]
    assert initial["val_loss"] == pytest.approx(math.log(1024), abs=0.15)  # measured 6.83 vs ln 1024 = 6.93
    assert final["val_loss"] < initial["val_loss"] - 0.5  # measured 6.83 -> 5.96
    assert initial["val_tokens"] == final["val_tokens"]
    for r in (initial, final):
        hits = r["val_accuracy"] * r["val_tokens"]
        assert 0 <= r["val_accuracy"] <= 1 and hits == pytest.approx(round(hits), abs=1e-9)
    # fill-mask samples in place of generations, in the summary and the report
    samples = summary["samples"]
    assert len(samples) == 3 and all(MASK in s["prompt"] and MASK not in s["completion"] for s in samples)
    assert samples[0]["prompt"].startswith("ROME") and samples[0]["correct"].endswith("/5")  # 15% of 33 tokens
    report = (tmp_path / "straight" / "report.html").read_text()
    assert "yonder" in report and f'{initial["val_accuracy"]:.3f} → {final["val_accuracy"]:.3f}' in report

    # both engines: the same masked batch and initial weights give the same first-step loss
    cfg = load_config(tmp_path / "straight" / "config.yaml")
    data = load_prepared(cfg.data.output_dir, cfg.model.vocab_size)
    assert mask_id(data.tokenizer) == cfg.model.vocab_size - 1
    ((ids, labels, _),) = first_batches(cfg, data, 1)
    assert (ids == mask_id(data.tokenizer)).any() and (labels != IGNORE_INDEX).mean() < 0.2
    spec = ModelSpec.from_config(cfg.model)
    scalars = step_scalars(1, cfg.train.steps, cfg.optim, int((labels != IGNORE_INDEX).sum()))
    out = {}
    for engine in ("mindspore", "torch"):
        backend = create_backend(cfg.model_copy(update={"backend": engine}), spec, launch_layout(cfg))
        backend.load_weights(init_weights(spec, cfg.seed))
        out[engine] = backend.train_step(ids, labels, scalars).loss
    assert out["mindspore"] == pytest.approx(losses["straight"][1], rel=1e-6)  # the run's first step is this step
    assert abs(out["mindspore"] / out["torch"] - 1) < 1e-5  # measured 3e-7

    # eval, generation and the exports of the trained model
    ev = cli("eval", str(tmp_path / "straight"), "--json", str(tmp_path / "eval.json"))
    assert ev.returncode == 0, ev.stderr
    val = json.loads((tmp_path / "eval.json").read_text())["validation"]
    assert {"all", "news", "reviews", "literature", "code"} <= set(val) and 0 < val["all"]["accuracy"] < 1
    gen = cli("generate", str(tmp_path / "straight"), "--prompt", "def ")
    assert gen.returncode == 2 and "generation needs a causal LM" in gen.stderr and "model.objective=mlm" in gen.stderr
    hf = cli("export", str(tmp_path / "straight"), "--format", "hf", "--out", str(tmp_path / "hf"))
    assert hf.returncode == 2 and "export --format hf" in hf.stderr and not (tmp_path / "hf").exists()
    merged = cli(
        "export", str(tmp_path / "straight"), "--format", "safetensors", "--out", str(tmp_path / "mlm.safetensors")
    )
    assert merged.returncode == 0, merged.stderr  # the weights themselves export: the same names as a clm model
    weights = load_file(str(tmp_path / "mlm.safetensors"))
    trained = state["model"][0]
    assert weights.keys() == trained.keys() and all(np.array_equal(weights[k], trained[k]) for k in trained)
