"""Recompute, chunked loss and offload change memory, never numbers: every option against the plain step, both engines.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from mf_testing import padded_markov_samples, tiny_config
from mindfoundry.backends.base import BackendUnavailable, create_backend
from mindfoundry.debug.dump import DumpWriter
from mindfoundry.debug.probe import Probe
from mindfoundry.model.spec import ModelSpec, init_weights
from mindfoundry.parallel.layout import launch_layout
from mindfoundry.train.schedule import step_scalars

pytest.importorskip("mindspore")

#: (memory section, bit-identical to the plain step, also on MindSpore). Chunks of 5 over 16 positions end in a short
#: chunk of 1. MindSpore compiles a graph per option (~8 s): it runs the three that cover its code paths (its full
#: recompute alone is bit-exact in tests/train/test_resume_and_rundir.py::test_resume_is_bit_exact).
OPTIONS = [
    ({"recompute": "full"}, True, False),
    ({"recompute": "selective"}, True, False),
    ({"recompute": "full", "recompute_layers": [1]}, True, False),
    ({"recompute": "selective", "recompute_layers": 1}, True, True),
    ({"loss_chunk": 16}, False, False),  # one chunk (torch: still the chunked loss's own gradients)
    ({"loss_chunk": 5}, False, True),
    ({"recompute": "full", "loss_chunk": 3}, False, True),
]


def _steps(engine: str, memory: dict, *, steps: int = 3, backend_hook=None) -> tuple[list, dict]:
    """Three steps of 2 micro-batches of 4 padded sequences; (losses, grad norms, per-parameter grad norms), weights."""
    cfg = tiny_config(backend=engine, memory=memory, train={"micro_batch_size": 4, "seq_len": 16, "grad_accum": 2})
    spec = ModelSpec.from_config(cfg.model)
    backend = create_backend(cfg, spec, launch_layout(cfg))
    backend.load_weights(init_weights(spec, 0))
    if backend_hook is not None:
        backend_hook(backend)
    ids, labels = padded_markov_samples(8 * steps, spec.vocab_size, 16)
    out = []
    for t in range(steps):
        rows = slice(8 * t, 8 * t + 8)
        i, lab = ids[rows].reshape(2, 4, 16), labels[rows].reshape(2, 4, 16)
        o = backend.train_step(i, lab, step_scalars(t + 1, 10, cfg.optim, int((lab >= 0).sum())))
        out.append((o.loss, o.grad_norm, o.grad_sq))
    return out, backend.weights()


CASES = [(engine, memory, exact) for memory, exact, on_mindspore in OPTIONS
         for engine in (("torch", "mindspore") if on_mindspore else ("torch",))]


@pytest.fixture(scope="module")
def plain() -> dict:
    """The plain run of each engine, computed once."""
    return {}


@pytest.mark.parametrize("engine,memory,exact", CASES, ids=[f"{e}-{json.dumps(m)}" for e, m, _ in CASES])
def test_memory_options_keep_the_numbers(plain, engine, memory, exact) -> None:
    if engine not in plain:
        plain[engine] = _steps(engine, {})
    ref, ref_weights = plain[engine]
    got, weights = _steps(engine, memory)
    for (loss, norm, sq), (loss0, norm0, sq0) in zip(got, ref):
        if exact:
            assert (loss, norm) == (loss0, norm0)
            np.testing.assert_array_equal(sq, sq0)
        # the head over other row blocks (torch: gradients computed by hand) rounds differently; measured rel <= 1.1e-7
        else:
            assert loss == pytest.approx(loss0, rel=2e-7)
            assert norm == pytest.approx(norm0, rel=2e-7)
            np.testing.assert_allclose(
                np.sqrt(sq), np.sqrt(sq0), rtol=1e-6
            )  # per-parameter gradient norms: measured <= 6.8e-7
    for name, w in ref_weights.items():
        if exact:
            np.testing.assert_array_equal(weights[name], w, err_msg=name)
        else:  # AdamW's first steps (m/sqrt(v) ~ sign(g) for gradients near eps) amplify those roundings: measured
            np.testing.assert_allclose(
                weights[name], w, atol=4e-5, err_msg=name
            )  # <= 2.7e-5 (torch), 5.0e-6 (MindSpore)


def test_offload_saves_activations_in_host_memory_with_the_same_numbers() -> None:
    """On a CPU the engine refuses offload (nothing to move); the step's wiring runs here with torch's save_on_cpu
    unpinned, and every saved tensor goes through it."""
    packed = []

    def offloaded(backend) -> None:
        class Counting(torch.autograd.graph.save_on_cpu):
            def __init__(self):
                super().__init__(pin_memory=False)
                pack = self.pack_hook

                def counting(t):
                    packed.append(t.numel())
                    return pack(t)
                self.pack_hook = counting
        backend.step_fn.saved_tensors = Counting

    ref, _ = _steps("torch", {}, steps=2)
    got, _ = _steps("torch", {"recompute": "selective"}, steps=2, backend_hook=offloaded)
    assert [(a[0], a[1]) for a in got] == [(b[0], b[1]) for b in ref]
    assert len(packed) > 20  # 2 steps x 2 micro-batches x every saved activation


def test_cpu_offload_is_refused_with_the_alternative() -> None:
    from mindfoundry.backends.torch.memory import saved_tensors

    cfg = tiny_config(backend="torch", device="auto") if not torch.cuda.is_available() else None
    if cfg is None:
        pytest.skip("this machine has an accelerator")
    with pytest.raises(
        BackendUnavailable, match="on device cpu the activations already are in host memory; use memory.recompute"
    ):
        saved_tensors(cfg.memory.model_copy(update={"offload_activations": True}), torch.device("cpu"))


@pytest.mark.parametrize("engine", ["torch", "mindspore"])
def test_a_debug_step_dumps_the_same_with_recompute(engine, tmp_path) -> None:
    """Hooks fire once per module call: the debug step runs the blocks without recompute and dumps what the plain run
    dumps."""
    dumps = {}
    for label, memory in (("plain", {}), ("recompute", {"recompute": "full", "loss_chunk": 5})):
        cfg = tiny_config(backend=engine, memory=memory, train={"micro_batch_size": 2, "seq_len": 16, "grad_accum": 1})
        spec = ModelSpec.from_config(cfg.model)
        backend = create_backend(cfg, spec, launch_layout(cfg))
        backend.load_weights(init_weights(spec, 0))
        ids = np.random.default_rng(1).integers(0, spec.vocab_size, (1, 2, 17)).astype(np.int32)
        writer = DumpWriter(tmp_path / label, 1, 0, "statistics", {"backend": engine})
        out = backend.train_step(ids[..., :-1], ids[..., 1:], step_scalars(1, 10, cfg.optim, 32), Probe(writer))
        writer.close()
        dumps[label] = (out.loss, sorted((tmp_path / label).rglob("index.jsonl"))[0].read_text())
    assert dumps["recompute"] == dumps["plain"]
