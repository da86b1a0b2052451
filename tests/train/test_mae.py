"""Masked image modelling (``model.objective: mae``) through the trainer and the CLI: both engines on the same
batches, a SIGKILLed run resumed, data-parallel layouts against one process."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from mindfoundry.cli.main import main
from mindfoundry.train.metrics import read_metrics


def _losses(run: Path) -> list[float]:
    by_step = {r["step"]: r["loss"] for r in read_metrics(run / "metrics.jsonl") if "loss" in r and "event" not in r}
    return [by_step[s] for s in sorted(by_step)]


def test_mae_trains_alike_on_both_engines_and_resumes_exactly_after_sigkill(tiny_mae, tmp_path) -> None:
    from test_recovery import last_step, wait_for_step

    runs = {}
    for engine in ("torch", "mindspore"):
        config = tiny_mae(engine, backend=engine)
        assert main(["train", str(config)]) == 0
        runs[engine] = _losses(tmp_path / engine)
    torch_losses, ms_losses = runs["torch"], runs["mindspore"]
    assert len(torch_losses) == 6 and torch_losses[-1] < torch_losses[0] - 0.1, torch_losses
    # measured 1.7e-7 at step 1, and no larger by step 6
    assert max(abs(a / b - 1) for a, b in zip(ms_losses, torch_losses)) <= 1e-6, (ms_losses, torch_losses)
    # `mindfoundry eval`: the whole validation split with training's validation masks (training's last evaluation
    # scored all of it too), and the digits probe of the encoder against a randomly initialised one
    assert main(["eval", str(tmp_path / "torch"), "--probe", "digits", "--json", str(tmp_path / "eval.json")]) == 0
    scores = json.loads((tmp_path / "eval.json").read_text())
    last_eval = [r for r in read_metrics(tmp_path / "torch" / "metrics.jsonl") if "val_loss" in r][-1]
    assert scores["validation"]["all"]["loss"] == last_eval["val_loss"]
    assert scores["validation"]["all"]["perplexity"] is None and last_eval["val_tokens"] % 12 == 0  # 12 of 16 hidden
    probe = scores["probe"]["digits"]
    assert (probe["train_images"], probe["test_images"]) == (100, 540)
    assert 0.3 < probe["random_encoder"] < 0.95 and 0.3 < probe["accuracy"] < 0.95, probe
    _exported_model_is_ours_in_transformers(tmp_path / "torch", tmp_path)
    for engine in ("torch", "mindspore"):  # killed after a checkpoint (every 2 steps), resumed: the same floats
        config, run = tiny_mae(f"{engine}-killed", backend=engine), tmp_path / f"{engine}-killed"
        proc = subprocess.Popen([sys.executable, "-m", "mindfoundry.cli", "train", str(config)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for_step(run, 3, proc)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert 3 <= last_step(run) < 6
        assert main(["train", str(config), "--resume", "auto"]) == 0
        assert _losses(run)[-6:] == runs[engine], engine


@pytest.mark.slow
def test_mae_data_parallel_launches_equal_one_process(tiny_mae, tmp_path) -> None:
    """FSDP over two torchrun ranks and data parallel over two msrun workers, each the same global batch of 16 images
    as one process (two micro-batches of 8 there, one per rank here)."""
    from mindfoundry.parallel.launch import free_port

    for engine, layout in (("torch", "parallel.dp_shard=2"), ("mindspore", "parallel.dp_replicate=2")):
        one, launched = tiny_mae(f"{engine}-one", backend=engine), tiny_mae(f"{engine}-dp", backend=engine)
        assert main(["train", str(one)]) == 0
        assert main(["launch", "train", str(launched), "--set", layout, "--set", "train.grad_accum=1",
                     "--master-port", str(free_port())]) == 0
        single, parallel = _losses(tmp_path / f"{engine}-one"), _losses(tmp_path / f"{engine}-dp")
        assert len(single) == len(parallel) == 6
        # measured: the same floats (each rank's micro-batch gradient summed over the ranks, in one process over the
        # micro-batches: the same two sums)
        assert parallel == single, (engine, parallel, single)


def _exported_model_is_ours_in_transformers(run: Path, tmp_path: Path) -> None:
    """`export --format hf`: ViTMAEForPreTraining given our validation masks as `noise` computes our engine's loss, the
    ViTModel in encoder/ our image features; `model.init_from` the folder starts a run from the same weights."""
    import numpy as np
    import torch
    from transformers import ViTMAEForPreTraining, ViTModel

    from mindfoundry.data.dataset.image_masking import mae_noise
    from mindfoundry.data.dataset.image_samples import open_image_samples
    from mindfoundry.data.dataset.masking import VALIDATION, masking_for
    from mindfoundry.data.dataset.prepared import load_prepared
    from mindfoundry.workflows.generate import load_trained

    out = tmp_path / "hf"
    assert main(["export", str(run), "--format", "hf", "--out", str(out)]) == 0
    model = load_trained(run)
    cfg = model.cfg
    data = load_prepared(Path(cfg.data.output_dir), cfg.model.vocab_size)
    images = open_image_samples(data.root, data.manifest, "validation").get_pixels(np.arange(8))
    masking = masking_for(cfg, data.tokenizer, VALIDATION)
    pixels, labels = masking.apply(images, np.arange(8))
    error, count, _ = model.backend.eval_batch(pixels, labels)
    hf = ViTMAEForPreTraining.from_pretrained(out).eval()
    noise = torch.from_numpy(mae_noise(cfg.seed, np.arange(8), masking.num_patches, VALIDATION))
    with torch.no_grad():
        theirs = float(hf(pixel_values=torch.from_numpy(pixels), noise=noise).loss)
        encoder = ViTModel.from_pretrained(out / "encoder", add_pooling_layer=False).eval()
        features = encoder(pixel_values=torch.from_numpy(pixels)).last_hidden_state[:, 1:].mean(dim=1).numpy()
    assert abs(error / count / theirs - 1) <= 1e-6, (error / count, theirs)  # measured 2.1e-8
    assert np.array_equal(features, model.backend.image_features(pixels))  # measured: the same floats
    from mindfoundry.checkpoint.hf_import import initial_weights
    from mindfoundry.model.spec import spec_for

    assert all(np.array_equal(a, model.backend.weights()[n])
               for n, a in initial_weights(out, spec_for(cfg.model)).items())
