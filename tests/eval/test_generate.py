"""Cached generation: the key/value cache changes the cost, not the result, on both engines."""

from __future__ import annotations

import numpy as np
import pytest

from mindfoundry.backends.base import create_backend
from mindfoundry.eval.sampling import GenerationError, fit_prompt, generate, sample_next
from mindfoundry.model.spec import ModelSpec, init_weights
from mindfoundry.parallel.layout import launch_layout

ENGINES = ["mindspore", "torch"]


def random_backend(engine: str, make_config, **model):
    """A tiny model with random weights (norms too), GQA, untied head: every cached path is exercised."""
    pytest.importorskip(engine)
    cfg = make_config(backend=engine, model={"n_kv_heads": 2, "tie_embeddings": False, "max_seq_len": 48, **model})
    spec = ModelSpec.from_config(cfg.model)
    rng = np.random.default_rng(5)
    weights = {n: (w + rng.normal(0, 0.05, w.shape)).astype(np.float32) for n, w in init_weights(spec, 1).items()}
    backend = create_backend(cfg, spec, launch_layout(cfg))
    backend.load_weights(weights)
    return backend, spec


def greedy_without_cache(backend, prompt: list[int], steps: int, eos: int) -> list[int]:
    """The reference: every token re-runs the whole sequence. The sequence is right-padded to one length, so that
    MindSpore compiles one forward instead of one per length; in a causal model the padding after position t
    changes nothing at t."""
    tokens, out = list(prompt), []
    width = len(prompt) + steps
    for _ in range(steps):
        padded = np.asarray([tokens + [eos] * (width - len(tokens))], np.int32)
        nxt = int(np.argmax(backend.logits(padded)[0, len(tokens) - 1]))
        if nxt == eos:
            break
        tokens.append(nxt)
        out.append(nxt)
    return out


@pytest.mark.parametrize("engine", ENGINES)
def test_cached_decoding_equals_the_full_forward(engine: str, make_config) -> None:
    backend, spec = random_backend(engine, make_config)
    ids = np.random.default_rng(1).integers(2, spec.vocab_size, 20)
    full = backend.logits(ids[None].astype(np.int32))[0]
    cache = backend.new_cache(spec.max_seq_len)
    prefill = backend.decode(ids[:12], 0, cache)
    steps = np.stack([backend.decode(ids[i:i + 1], i, cache)[0] for i in range(12, 20)])
    assert np.abs(prefill - full[:12]).max() < 2e-6  # measured 0 (torch), 8.6e-7 (mindspore); logits ~1.5
    assert np.abs(steps - full[12:]).max() < 2e-6  # measured 7.2e-7 (torch), 6.6e-7 (mindspore)

    prompt = ids[:6].tolist()
    cached = generate(
        backend, prompt, max_seq_len=spec.max_seq_len, max_new_tokens=30, temperature=0, top_k=0, eos_id=0, seed=0
    )
    assert cached == greedy_without_cache(backend, prompt, 30, eos=0) and len(cached) == 30  # token for token


def test_sampling_rules_and_prompt_fitting() -> None:
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05]))
    rng = np.random.default_rng(0)
    assert sample_next(logits, 0, 0, rng) == 0
    assert {sample_next(logits, 1.0, 0, rng, top_p=0.5) for _ in range(50)} == {0}  # nucleus of one token
    assert {sample_next(logits, 1.0, 0, rng, top_p=0.8) for _ in range(200)} == {0, 1}
    assert {sample_next(logits, 1.0, 2, rng) for _ in range(200)} == {0, 1}
    assert fit_prompt(list(range(10)), 4, 8) == [6, 7, 8, 9]  # the last max_seq_len - max_new_tokens tokens
    with pytest.raises(GenerationError, match="max_new_tokens=8 must be between 1 and model.max_seq_len-1 = 7"):
        fit_prompt([1], 8, 8)


def test_generate_command_refuses_bad_input(tiny_prepared, capsys) -> None:
    """An empty prompt and impossible settings: one line, exit 2. A long prompt is cut from the left, and says so."""
    from mf_testing import random_checkpoint
    from mindfoundry.cli.main import main

    tiny, data = tiny_prepared
    _, _, cfg = random_checkpoint(tiny, data)
    run = cfg.run_dir
    base = ["generate", str(run), "--backend", "torch"]
    assert main([*base, "--prompt", ""]) == 2
    assert "--prompt is empty: give the text to continue" in capsys.readouterr().err
    assert main([*base, "--prompt", "x", "--top-p", "0", "--max-new-tokens", "8"]) == 2
    assert (
        "use temperature >= 0 (0 = greedy), top_k >= 0 (0 = all tokens) and 0 < top_p <= 1" in capsys.readouterr().err
    )
    assert main([*base, "--prompt", "x", "--max-new-tokens", "64"]) == 2  # model.max_seq_len is 64
    assert "max_new_tokens=64 must be between 1 and model.max_seq_len-1 = 63" in capsys.readouterr().err
    long = "import json\n" * 40
    assert main([*base, "--prompt", long, "--max-new-tokens", "8", "--temperature", "0"]) == 0
    err = capsys.readouterr().err
    assert f"the prompt has {len(data.tokenizer.encode(long).ids)} tokens; generating from its last 56" in err.replace(
        "\n", " "
    )
