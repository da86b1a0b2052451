"""Native checkpoint files: folder -> .ckpt/.pt -> folder round trips, and the files load in each engine."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mindfoundry.checkpoint.convert import export_checkpoint, import_checkpoint
from mindfoundry.checkpoint.directory import save_checkpoint
from mindfoundry.checkpoint.reader import load_checkpoint
from mindfoundry.checkpoint.store import CheckpointError
from mindfoundry.config.load import to_yaml
from mindfoundry.model.spec import ModelSpec, init_weights, parameter_shapes


@pytest.fixture
def run_ckpt(tmp_path: Path, tiny) -> tuple[Path, ModelSpec]:
    cfg, spec = tiny
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(to_yaml(cfg))
    weights = init_weights(spec, 1)
    rng = np.random.default_rng(0)
    optim = {
        f"{k}.{n}": rng.random(s).astype(np.float32)
        for n, s in parameter_shapes(spec).items()
        for k in ("exp_avg", "exp_avg_sq")
    }
    path = Path(save_checkpoint(run, 5, weights, optim, {"consumed_samples": 40, "consumed_tokens": 640}))
    return path, spec


@pytest.mark.parametrize("suffix,engine", [(".ckpt", "mindspore"), (".pt", "torch")])
def test_round_trip(run_ckpt, tmp_path: Path, suffix: str, engine: str) -> None:
    pytest.importorskip(engine)
    path, _ = run_ckpt
    native = Path(export_checkpoint(path, tmp_path / f"model{suffix}"))
    with pytest.raises(CheckpointError, match="is not a run directory"):
        import_checkpoint(native, tmp_path / "imported")
    (tmp_path / "imported").mkdir()
    (tmp_path / "imported" / "config.yaml").write_text((path.parent.parent / "config.yaml").read_text())
    back = load_checkpoint(import_checkpoint(native, tmp_path / "imported"))
    orig = load_checkpoint(path)
    assert back.state["step"] == 5 and back.state["consumed_samples"] == 40 and back.state["consumed_tokens"] == 640
    assert (
        all(np.array_equal(orig.weights[k], back.weights[k]) for k in orig.weights)
        and orig.weights.keys() == back.weights.keys()
    )
    assert (
        all(np.array_equal(orig.optimizer[k], back.optimizer[k]) for k in orig.optimizer)
        and orig.optimizer.keys() == back.optimizer.keys()
    )
    with pytest.raises(CheckpointError, match="already exists"):
        export_checkpoint(path, native)


def test_pt_loads_into_torch_model_and_adamw(run_ckpt, tmp_path: Path, tiny) -> None:
    torch = pytest.importorskip("torch")
    from mindfoundry.backends.torch.model import Transformer
    from mindfoundry.backends.torch.train_step import build_adamw

    path, spec = run_ckpt
    cfg, _ = tiny
    blob = torch.load(export_checkpoint(path, tmp_path / "m.pt"), weights_only=True)
    model = Transformer(spec)
    model.load_state_dict(blob["model"])
    opt = build_adamw(model, cfg.optim)
    opt.load_state_dict(blob["optimizer"])
    q = model.layers[0].attn.q_proj.weight
    assert torch.equal(
        opt.state[q]["exp_avg"],
        torch.from_numpy(load_checkpoint(path).optimizer["exp_avg.layers.0.attn.q_proj.weight"]),
    )
    assert opt.param_groups[1]["weight_decay"] == 0.0 and float(opt.state[q]["step"]) == 5.0


def test_ckpt_loads_into_mindspore_model(run_ckpt, tmp_path: Path, tiny) -> None:
    ms = pytest.importorskip("mindspore")
    from mindfoundry.backends.mindspore.model import Transformer

    path, spec = run_ckpt
    params = ms.load_checkpoint(str(export_checkpoint(path, tmp_path / "m.ckpt")))
    model = Transformer(spec)
    not_loaded, _ = ms.load_param_into_net(model, params)
    assert not not_loaded
    assert np.array_equal(model.embed.weight.asnumpy(), load_checkpoint(path).weights["embed.weight"])


def test_unknown_suffix(run_ckpt, tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="use .ckpt"):
        export_checkpoint(run_ckpt[0], tmp_path / "m.bin")


def test_convert_says_what_it_wrote_and_every_file_gets_the_umask_mode(run_ckpt, tmp_path: Path) -> None:
    """`convert` / `export` list their files on stdout; safetensors (0600), MindSpore's .ckpt (0400) and torch's .pt
    (0644) all come out 0666 less the umask, as a plain open() would make them (issue #19)."""
    path, _ = run_ckpt
    outputs = [("convert", "model.ckpt"), ("convert", "model.pt"), ("convert", "weights.safetensors")]
    for umask, mode in ((0o022, 0o644), (0o027, 0o640)):
        for verb, name in outputs:
            target = tmp_path / f"{umask:o}-{name}"
            proc = subprocess.run(
                [sys.executable, "-m", "mindfoundry.cli", verb, str(path), str(target)],
                capture_output=True,
                text=True,
                timeout=300,
                preexec_fn=lambda u=umask: os.umask(u),
                env=dict(os.environ, COLUMNS="300"),
            )
            assert proc.returncode == 0, proc.stderr
            assert f"wrote {target}" in proc.stdout and f"mode {mode:o}" in proc.stdout
            assert target.stat().st_mode & 0o777 == mode, (name, oct(target.stat().st_mode))
