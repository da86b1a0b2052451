"""lm-evaluation-harness: the exported folder through lm-eval's own Hugging Face model, and our engines through
our LM subclass, score the example task identically."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import yaml

pytest.importorskip("lm_eval", reason="lm-eval is installed by `make test` (the eval extra)")
pytest.importorskip("transformers")
pytest.importorskip("torch")

from mf_testing import random_checkpoint  # noqa: E402
from mindfoundry.checkpoint.hf_export import export_hf  # noqa: E402
from mindfoundry.eval.lm_harness import MindFoundryLM, run_lm_eval  # noqa: E402
from mindfoundry.workflows.generate import load_trained  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
os.environ.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")


def example_task(tmp_path: Path) -> Path:
    """The shipped example task with its data file given by absolute path (lm-eval resolves it from the cwd)."""
    spec = yaml.safe_load((REPO / "examples" / "lm_eval" / "mindfoundry_mc.yaml").read_text())
    spec["dataset_kwargs"]["data_files"]["test"] = str(REPO / "examples" / "lm_eval" / "mc.jsonl")
    path = tmp_path / "tasks" / "mindfoundry_mc.yaml"
    path.parent.mkdir()
    path.write_text(yaml.safe_dump(spec))
    return path


def test_hf_route_our_engines_and_the_eval_command_agree(tiny_prepared, tmp_path: Path) -> None:
    """One checkpoint (grouped-query attention) through lm-eval's hf model on the export, through our LM on both
    engines, and through `mindfoundry eval --lm-eval`: the same accuracies and per-choice log-likelihoods."""
    import json

    from mindfoundry.cli.main import main

    cfg, data = tiny_prepared
    ckpt, _, _ = random_checkpoint(cfg, data, n_kv_heads=1)
    task = example_task(tmp_path)
    hf = run_lm_eval("hf", [task], model_args=f"pretrained={export_hf(ckpt, tmp_path / 'hf')},dtype=float32,device=cpu",
                     log_samples=True)
    a = hf["results"]["mindfoundry_mc"]
    lla = np.array([[r[0] for r in s["filtered_resps"]] for s in hf["samples"]["mindfoundry_mc"]], np.float64)
    for engine in ("torch", "mindspore"):
        pytest.importorskip(engine)
        model = load_trained(ckpt, engine)
        ours = run_lm_eval(
            MindFoundryLM(model.backend, model.tokenizer, model.cfg.model.max_seq_len), [task], log_samples=True
        )
        b = ours["results"]["mindfoundry_mc"]
        assert (a["acc,none"], a["acc_norm,none"]) == (b["acc,none"], b["acc_norm,none"]), engine
        llb = np.array([[r[0] for r in s["filtered_resps"]] for s in ours["samples"]["mindfoundry_mc"]], np.float64)
        assert lla.shape == (6, 4) and np.abs(lla - llb).max() < 1e-5, (
            engine
        )  # measured 2.2e-6 (torch), 1.8e-6 (mindspore); sums up to 45

    assert (
        main(["eval", str(ckpt), "--backend", "torch", "--lm-eval", str(task), "--json", str(tmp_path / "r.json")]) == 0
    )
    metrics = json.loads((tmp_path / "r.json").read_text())["lm_eval"]["mindfoundry_mc"]
    assert (metrics["acc,none"], metrics["acc_norm,none"]) == (a["acc,none"], a["acc_norm,none"]) and 0 <= metrics[
        "acc,none"
    ] <= 1
    assert main(["eval", str(ckpt), "--lm-eval", str(tmp_path / "missing.yaml")]) == 2
