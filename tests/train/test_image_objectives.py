"""The image objectives through the trainer and the CLI: masked image modelling (``model.objective: mae``) and
captioning (``caption``) -- both engines on the same batches, a SIGKILLed run resumed, data-parallel layouts against
one process, the evaluations, and the exports transformers opens."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mindfoundry.cli.main import main
from mindfoundry.train.metrics import read_metrics


def _losses(run: Path) -> list[float]:
    by_step = {r["step"]: r["loss"] for r in read_metrics(run / "metrics.jsonl") if "loss" in r and "event" not in r}
    return [by_step[s] for s in sorted(by_step)]


def _engines_agree(config_for, tmp_path: Path) -> dict[str, list[float]]:
    """Both engines' uninterrupted 6 steps (their losses by engine), each then SIGKILLed at a random step and resumed
    to the same floats; the engines within 1e-6 of each other at every step."""
    from test_recovery import last_step, wait_for_step

    rng = random.Random(str(tmp_path))

    runs = {}
    for engine in ("torch", "mindspore"):
        assert main(["train", str(config_for(engine, backend=engine))]) == 0
        runs[engine] = _losses(tmp_path / engine)
    torch_losses, ms_losses = runs["torch"], runs["mindspore"]
    assert len(torch_losses) == 6 and torch_losses[-1] < torch_losses[0] - 0.1, torch_losses
    # measured: mae 1.7e-7 at step 1 and no larger by step 6; caption the same floats
    assert max(abs(a / b - 1) for a, b in zip(ms_losses, torch_losses)) <= 1e-6, (ms_losses, torch_losses)
    for engine in ("torch", "mindspore"):
        config, run = config_for(f"{engine}-killed", backend=engine), tmp_path / f"{engine}-killed"
        proc = subprocess.Popen([sys.executable, "-m", "mindfoundry.cli", "train", str(config)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for_step(run, rng.randint(2, 4), proc)  # a random step of the six (checkpoints every 2)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert 2 <= last_step(run) < 6
        assert main(["train", str(config), "--resume", "auto"]) == 0
        assert _losses(run)[-6:] == runs[engine], engine
    return runs


def test_mae_trains_alike_on_both_engines_and_resumes_exactly_after_sigkill(tiny_mae, tmp_path) -> None:
    _engines_agree(tiny_mae, tmp_path)
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


def test_captioner_trains_alike_on_both_engines_resumes_and_is_llava_in_transformers(tiny_caption, tmp_path) -> None:
    _engines_agree(tiny_caption, tmp_path)
    run = tmp_path / "torch"
    assert main(["eval", str(run), "--json", str(tmp_path / "eval.json")]) == 0
    scores = json.loads((tmp_path / "eval.json").read_text())["validation"]
    last_eval = [r for r in read_metrics(run / "metrics.jsonl") if "val_loss" in r][-1]
    assert scores["all"]["loss"] == last_eval["val_loss"]  # every caption token of the split, the true images
    assert scores["shuffled_images"]["tokens"] == scores["all"]["tokens"]  # the same captions, other images
    assert scores["shuffled_images"]["loss"] != scores["all"]["loss"]
    _exported_captioner_is_llava_in_transformers(run, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("objective", ["mae", "caption"])
def test_image_objectives_data_parallel_launches_equal_one_process(objective, tiny_mae, tiny_caption,
                                                                   tmp_path) -> None:
    """FSDP over two torchrun ranks and data parallel over two msrun workers, each the same global batch of 16 images
    as one process (two micro-batches of 8 there, one per rank here)."""
    from mindfoundry.parallel.launch import free_port

    config_for = tiny_mae if objective == "mae" else tiny_caption
    for engine, layout in (("torch", "parallel.dp_shard=2"), ("mindspore", "parallel.dp_replicate=2")):
        one, launched = config_for(f"{engine}-one", backend=engine), config_for(f"{engine}-dp", backend=engine)
        assert main(["train", str(one)]) == 0
        assert main(["launch", "train", str(launched), "--set", layout, "--set", "train.grad_accum=1",
                     "--master-port", str(free_port())]) == 0
        single, parallel = _losses(tmp_path / f"{engine}-one"), _losses(tmp_path / f"{engine}-dp")
        assert len(single) == len(parallel) == 6
        # measured: the same floats, or (torch FSDP's reductions) 6e-8 apart
        assert max(abs(a / b - 1) for a, b in zip(parallel, single)) <= 1e-6, (engine, parallel, single)


def test_a_captioner_starts_its_encoder_from_an_mae_run_and_trains_what_is_not_frozen(tiny_mae, tiny_caption,
                                                                                       tmp_path) -> None:
    """LLaVA's first stage: the encoder from an mae run's checkpoint (model.vision.init_from), encoder and decoder
    frozen, the projector alone trains (torch; the MindSpore engine gives the same floats, both leaving frozen
    parameters out of AdamW)."""
    from safetensors.numpy import load_file

    from mindfoundry.config.load import load_config
    from mindfoundry.model.spec import init_weights, spec_for

    def newest(run: str) -> Path:
        return sorted((tmp_path / run / "checkpoints").glob("step_*"))[-1]

    assert main(["train", str(tiny_mae("mae", train__steps=2))]) == 0
    mae = load_file(str(newest("mae") / "model.safetensors"))
    config = tiny_caption("frozen", train__freeze=["vision", "decoder"], train__steps=2,
                          model__vision={"patch_size": 4, "d_model": 32, "n_layers": 2, "n_heads": 2,
                                         "init_from": str(newest("mae"))})
    assert main(["train", str(config)]) == 0
    cfg = load_config(config)
    start = init_weights(spec_for(cfg.model), cfg.seed)
    trained = load_file(str(newest("frozen") / "model.safetensors"))
    assert all(np.array_equal(trained[n], mae[n]) for n in trained if n.startswith("vision."))  # the mae's encoder
    changed = {n for n, w in trained.items() if not n.startswith("vision.") and not np.array_equal(w, start[n])}
    assert changed == {n for n in start if n.startswith("projector.")}


def _exported_model_is_ours_in_transformers(run: Path, tmp_path: Path) -> None:
    """`export --format hf`: ViTMAEForPreTraining given our validation masks as `noise` computes our engine's loss, the
    ViTModel in encoder/ our image features; `model.init_from` the folder starts a run from the same weights."""
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


def _exported_captioner_is_llava_in_transformers(run: Path, tmp_path: Path) -> None:
    """`export --format hf`: LlavaForConditionalGeneration's greedy caption of validation images equals ours token for
    token (16 tokens, EOS not stopping either); `generate --image` captions an image file as the engine does."""
    import torch
    from PIL import Image
    from transformers import LlavaForConditionalGeneration

    from mindfoundry.data.dataset.prepared import load_prepared
    from mindfoundry.data.tokenizer import eos_id, image_id
    from mindfoundry.eval.captioning import greedy_caption
    from mindfoundry.eval.heldout import held_out
    from mindfoundry.workflows.generate import load_trained

    out = tmp_path / "llava"
    assert main(["export", str(run), "--format", "hf", "--out", str(out)]) == 0
    model = load_trained(run)
    cfg, tokenizer = model.cfg, model.tokenizer
    samples = held_out(cfg, load_prepared(Path(cfg.data.output_dir), cfg.model.vocab_size)).samples
    hf = LlavaForConditionalGeneration.from_pretrained(out).eval()
    prefix = torch.full((1, 16), image_id(tokenizer))  # the image's 16 patch tokens
    for i in (0, 7, 21):
        pixels, _ = samples.get_batch(np.array([i]))
        ours = greedy_caption(model.backend, pixels[0], 16, None)
        with torch.no_grad():
            theirs = hf.generate(input_ids=prefix, pixel_values=torch.from_numpy(pixels), max_new_tokens=16,
                                 eos_token_id=None, do_sample=False)[0, 16:].tolist()
        assert ours == theirs, (i, ours, theirs)
    image = tmp_path / "digit.png"
    Image.fromarray(samples.images.get_pixels(samples.rows[[7]])[0]).save(image)  # a validation image, lossless
    capture = subprocess.run([sys.executable, "-m", "mindfoundry.cli", "generate", str(run), "--image", str(image),
                              "--json"], capture_output=True, text=True, check=True)
    pixels, _ = samples.get_batch(np.array([7]))
    expected = tokenizer.decode(greedy_caption(model.backend, pixels[0], 16, eos_id(tokenizer)))
    assert json.loads(capture.stdout.splitlines()[-1])["caption"] == expected


def test_align_compares_the_captioners_vision_projector_and_decoder_across_engines(tiny_caption, tmp_path) -> None:
    """`mindfoundry align` on a captioner: both engines' dumps hold every module of the encoder, the projector and the
    decoder under the same names, the step passes and no module introduces more than float32 noise."""
    out = tmp_path / "align"
    assert main(["align", str(tiny_caption("aligned")), "--out", str(out)]) == 0
    result = json.loads((out / "align.json").read_text())
    assert result["passed"] and result["a"]["backend"] == "mindspore" and result["b"]["backend"] == "torch"
    step = result["steps"][0]
    assert step["loss_rel_err"] <= 1e-6 and step["grad_norm_rel_err"] <= 1e-6  # measured: the same floats
    compared = (out / "compare_step1.csv").read_text()
    for name in ("vision.layers.1.attn.q_proj", "projector.linear_2", "layers.1.mlp.down_proj", "vision.patch_embed"):
        assert f"{name}.forward" in compared, name
    assert max(m["introduced"] for m in result["top_modules"]) < 1e-5  # measured 3e-7


@pytest.mark.parametrize("objective", ["mae", "caption"])
def test_run_ends_with_the_objectives_deliverables_in_summary_and_report(objective, tiny_mae, tiny_caption,
                                                                          tmp_path) -> None:
    """`mindfoundry run`: an encoder's digits probe (mae), a captioner's validation captions and its loss with
    shuffled images (caption), in summary.json and the HTML report."""
    config = (tiny_mae if objective == "mae" else tiny_caption)("ran", train__steps=2)
    assert main(["run", str(config)]) == 0
    summary = json.loads((tmp_path / "ran" / "summary.json").read_text())
    report = (tmp_path / "ran" / "report.html").read_text()
    assert "samples" not in summary and summary["final"]["val_loss"] > 0
    if objective == "mae":
        probe = summary["probe"]["digits"]
        assert (probe["train_images"], probe["test_images"]) == (100, 540) and "Linear probe of" in report
    else:
        assert len(summary["captions"]) == 6 and all(c["caption"].startswith("the handwritten digit ")
                                                    for c in summary["captions"])
        assert summary["shuffled_images"]["tokens"] == summary["final"]["val_tokens"] and "Captions by" in report
