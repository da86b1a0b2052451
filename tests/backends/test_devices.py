"""A device the engine cannot reach is one line (exit 2) before anything is prepared or written, on both engines:
MindSpore accepted `device: cuda` and failed in C++ at the first tensor (exit 70) after preparing the data."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from mindfoundry.cli.main import main


@pytest.mark.parametrize("backend, device, says", [
    ("mindspore", "cuda", "device='cuda': this MindSpore install cannot reach a GPU device"),
    ("mindspore", "ascend", "device='ascend': this MindSpore install cannot reach a Ascend device"),
    ("torch", "gpu", "device='gpu' but torch sees no CUDA device: use device: cpu"),
    ("torch", "npu", "device='npu' needs torch_npu: install torch_npu for your CANN version"),
])
def test_an_unreachable_device_is_one_line_before_any_work(tiny_run, capsys, backend, device, says) -> None:
    pytest.importorskip(backend)
    if device in ("cuda", "gpu") and shutil.which("nvidia-smi") or device in ("ascend", "npu") and Path(
            "/usr/local/Ascend").exists():
        pytest.skip(f"this machine may have a {device}")
    config = tiny_run(f"{backend}-{device}", backend=backend, device=device)
    run_dir = Path(yaml.safe_load(config.read_text())["run_dir"])
    for extra in (["--dry-run"], []):
        assert main(["train", str(config), *extra]) == 2
        errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and errors[0].startswith(f"error: {says}"), errors
        assert not run_dir.exists()  # nothing prepared, nothing claimed
