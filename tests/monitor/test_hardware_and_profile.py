"""Hardware metrics and the profiler hook, through real training runs on this CPU machine: CPU utilisation in
metrics.jsonl and TensorBoard, no device keys where there is no device, and each engine's own profiler trace."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from mindfoundry.config.load import ConfigError, load_config
from mindfoundry.monitor.hardware import HardwareSampler, device_query, parse_npu_smi, parse_nvidia_smi
from mindfoundry.monitor.records import read_records, step_records


def test_vendor_tool_output_is_parsed_and_missing_values_are_skipped() -> None:
    # `nvidia-smi --query-gpu=utilization.gpu,temperature.gpu,power.draw --format=csv,noheader,nounits -i 0`
    assert parse_nvidia_smi("87, 64, 412.35") == {"device_util": 87.0, "device_temp_c": 64.0, "device_power_w": 412.35}
    assert parse_nvidia_smi("0, 31, [N/A]") == {"device_util": 0.0, "device_temp_c": 31.0}
    usages = "        Aicore Usage Rate(%)           : 73\n        HBM Usage Rate(%)              : 45\n"
    assert parse_npu_smi(usages, "Aicore Usage Rate") == 73.0
    assert parse_npu_smi("        Power Dissipation(W)           : NA\n", "Power Dissipation") is None


def test_a_cpu_machine_has_no_device_query_and_samples_cpu_only() -> None:
    assert device_query("cpu") is None
    sample = HardwareSampler("cpu").sample()
    assert set(sample) == {"cpu_util", "process_cpu"}
    assert 0.0 <= sample["cpu_util"] <= 100.0 and sample["process_cpu"] >= 0.0


@pytest.mark.parametrize("steps", ["1|5-6", "0-2", "3-x"])
def test_bad_profile_steps_are_named(tiny_run, steps: str) -> None:
    with pytest.raises(ConfigError, match="monitor.profile.steps"):
        load_config(tiny_run(), [f"monitor.profile.steps={steps}"])


def monitored_run(engine: str, corpus_dir: Path, tmp_path: Path, **monitor) -> str:
    """4 steps of a tiny run through the CLI with the profiler on steps 2-3 (and `monitor` settings); its stderr."""
    from mf_testing import tiny_run_tree

    tree = tiny_run_tree(corpus_dir, tmp_path / "run")
    tree.update(backend=engine, monitor={"progress": False, "detail_every": 0, "profile": {"steps": "2-3"}, **monitor})
    tree["train"].update(steps=4, eval_every=2)
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(tree))
    proc = subprocess.run([sys.executable, "-m", "mindfoundry.cli", "train", str(tmp_path / "run.yaml")],
                          capture_output=True, text=True, timeout=600, env=dict(os.environ, COLUMNS="200"))
    assert proc.returncode == 0, proc.stderr
    return proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["torch", "mindspore"])
def test_training_records_hardware_and_writes_the_engines_trace(engine: str, corpus_dir: Path, tmp_path: Path) -> None:
    """(The MindSpore run also writes MindSpore Insight summaries: tests/monitor/test_mindinsight.py reads them from
    this same kind of run, to train MindSpore once.)"""
    pytest.importorskip(engine)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    stderr = monitored_run(
        engine, corpus_dir, tmp_path, **({"mindinsight": True, "detail_every": 2} if engine == "mindspore" else {})
    )
    records = read_records(tmp_path / "run" / "metrics.jsonl")
    steps = step_records(records)
    assert len(steps) == 4
    for r in steps:  # CPU utilisation on every step; no device keys on a machine without one
        assert 0.0 <= r["cpu_util"] <= 100.0 and r["process_cpu"] >= 0.0
        assert not [k for k in r if k.startswith("device_")]
    profile = [r for r in records if r.get("event") == "profile"]
    folder = tmp_path / "run" / "profile" / "steps_2-3" / "rank0"
    assert [(r["step"], r["path"]) for r in profile] == [(3, str(folder))]
    assert f"profiler trace of steps 2-3: {folder}" in stderr
    if engine == "torch":
        (trace,) = folder.glob("rank0.*.pt.trace.json")
        names = {e.get("name", "") for e in json.loads(trace.read_text())["traceEvents"]}
        assert any(n.startswith("aten::") for n in names) and "Optimizer.step#AdamW.step" in names
    else:
        (trace,) = folder.glob("*_ascend_ms/ASCEND_PROFILER_OUTPUT/trace_view.json")
        assert len(json.loads(trace.read_text())) > 0
        (ops,) = folder.glob("*_ascend_ms/FRAMEWORK/cpu_op_type_info_0.csv")
        assert "MatMul" in ops.read_text()
    acc = EventAccumulator(str(tmp_path / "run" / "tb"))
    acc.Reload()
    assert [e.step for e in acc.Scalars("hw/cpu_util")] == [1, 2, 3, 4]
    if engine == "mindspore":
        from test_mindinsight import assert_summary_matches_metrics

        assert_summary_matches_metrics(tmp_path / "run")
