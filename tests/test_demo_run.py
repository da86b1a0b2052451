"""`mindfoundry run configs/demo.yaml` end to end with a test-sized override (the main job)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mf_testing import DEMO_TEST_SIZE
from mindfoundry.train.metrics import read_metrics

pytest.importorskip("snownlp")

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow



#: Each engine runs the demo with a memory mode, which the report names beside the measured peak.
MEMORY = {"mindspore": (["memory.recompute=full"], "full recompute (all blocks)"),
          "torch": (["memory.recompute=selective", "memory.recompute_layers=1", "memory.loss_chunk=16"],
                    "selective recompute (block 0 of 2), loss in chunks of 16 positions")}


@pytest.mark.parametrize("backend", ["mindspore", "torch"])
def test_demo_end_to_end(tmp_path: Path, backend: str) -> None:
    pytest.importorskip(backend)
    run_dir = tmp_path / "demo"
    cmd = [
        sys.executable,
        "-m",
        "mindfoundry.cli",
        "run",
        str(REPO / "configs" / "demo.yaml"),
        "--set",
        f"run_dir={run_dir}",
        "--set",
        f"backend={backend}",
    ]
    sets, described = MEMORY[backend]
    for item in DEMO_TEST_SIZE + sets:
        cmd += ["--set", item]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=dict(os.environ, COLUMNS="200"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    initial, final = summary["initial"], summary["final"]
    assert summary["backend"] == backend
    assert initial["val_loss"] == pytest.approx(math.log(1024), abs=0.15)  # untrained: ~uniform
    assert final["val_perplexity"] < 0.5 * initial["val_perplexity"]
    assert 0 < final["val_bits_per_byte"] < initial["val_bits_per_byte"]
    assert [s["prompt"] for s in summary["samples"]] == ["ROMEO:\n", "中国人民", "def read_"]
    manifest = json.loads((run_dir / "data" / "manifest.json").read_text())
    assert {s["category"] for s in manifest["sources"]} == {"news", "reviews", "literature", "code"}
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir() if p.name.startswith("step_")) == [
        "step_00000020",
        "step_00000040",
    ]
    assert "held-out evaluation" in proc.stdout
    report = (run_dir / "report.html").read_text()
    assert 'id="loss"' in report and "data:image/png;base64," in report
    peak = max(r["peak_rss_mb"] for r in read_metrics(run_dir / "metrics.jsonl") if "loss" in r)
    assert f'<td>memory mode (memory section)</td><td class="num">{described}</td>' in report
    assert f'<td>peak host memory (MiB)</td><td class="num">{peak:,.0f}</td>' in report
