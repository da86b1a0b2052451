"""PyTorch-only options: bf16 autocast and torch.compile keep the fp32 eager numbers (within their precision)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from mindfoundry.backends.base import BackendUnavailable, create_backend  # noqa: E402
from mindfoundry.backends.torch.backend import select_device  # noqa: E402
from mindfoundry.model.spec import ModelSpec, init_weights  # noqa: E402
from mindfoundry.parallel.layout import launch_layout  # noqa: E402
from mindfoundry.train.schedule import step_scalars  # noqa: E402


def run_steps(cfg, steps: int = 3) -> list[float]:
    spec = ModelSpec.from_config(cfg.model)
    backend = create_backend(cfg, spec, launch_layout(cfg))
    backend.load_weights(init_weights(spec, 0))
    tokens = np.random.default_rng(0).integers(0, spec.vocab_size, (steps, 1, 4, 17)).astype(np.int32)
    return [backend.train_step(tokens[t, ..., :-1], tokens[t, ..., 1:], step_scalars(t + 1, 10, cfg.optim, 64)).loss
            for t in range(steps)]


def test_bf16_autocast_tracks_fp32(make_config) -> None:
    fp32 = run_steps(make_config(backend="torch", train={"precision": "fp32"}))
    bf16 = run_steps(make_config(backend="torch", train={"precision": "bf16"}))
    assert fp32 != bf16  # autocast really changed the arithmetic
    assert np.allclose(bf16, fp32, rtol=2e-2)


@pytest.mark.slow
def test_compiled_step_matches_eager(make_config) -> None:
    eager = run_steps(make_config(backend="torch"))
    compiled = run_steps(make_config(backend="torch", train={"compile": True}))
    assert np.allclose(compiled, eager, rtol=1e-5)


def test_device_selection_on_a_cpu_machine() -> None:
    if torch.cuda.is_available():
        pytest.skip("this test describes a machine without CUDA")
    assert select_device("auto").type == "cpu"
    with pytest.raises(BackendUnavailable, match="no CUDA device"):
        select_device("cuda")
