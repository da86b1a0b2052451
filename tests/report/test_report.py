"""The HTML report from synthetic run directories: every section, embedded images, compare mode, errors."""

from __future__ import annotations

import base64
import json
import math
import re
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

from mindfoundry.cli.main import main  # noqa: E402
from mindfoundry.monitor.records import MetricsError  # noqa: E402
from mindfoundry.report.render import SECTIONS, write_report  # noqa: E402

IMG = re.compile(r'<img alt="([^"]*)" src="data:image/png;base64,([A-Za-z0-9+/=]+)">')
MODULES = ("embed", "layers.0", "layers.1", "norm")


def write_run(
    root: Path, name: str, backend: str, *, steps: int = 80, detail_every: int | None = 10, slow: float = 1.0
) -> Path:
    """A run directory as training leaves it: metrics.jsonl, config.yaml, data manifest, a checkpoint."""
    run = root / name
    (run / "data").mkdir(parents=True)
    records = [
        {
            "event": "start",
            "step": 0,
            "backend": backend,
            "parameters": 5_048_576,
            "flops_per_token": 31_850_496,
            "time": 1000.0,
        },
        {
            "step": 0,
            "val_loss": 9.0,
            "val_perplexity": math.exp(9.0),
            "val_bits_per_byte": 3.9,
            "val_tokens": 5000,
            "time": 1001.0,
        },
    ]
    for s in range(1, steps + 1):
        loss = 3.0 + 6.0 * math.exp(-s / 30) + 0.05 * math.sin(s)
        records.append(
            {
                "step": s,
                "loss": None if s == 33 else loss,
                "lr": 3e-3 * min(1.0, s / 8),
                "grad_norm": None if s == 33 else 0.6 + 2 * math.exp(-s / 20),
                "applied": s != 33,
                "tokens": 2048,
                "valid_tokens": 2040,
                "tokens_per_s": 5000.0 / slow,
                "step_time_s": 0.41 * slow,
                "data_time_s": 0.001,
                "model_tflops_per_s": 0.16,
                "mfu": 0.012 / slow,
                "rss_mb": 900.0 + s,
                "consumed_samples": 16 * s,
                "time": 1001.0 + s,
                "cpu_util": 90.0 + s % 7,
                "process_cpu": 180.0,
                "device_mem_allocated_mb": 2000.0 + s,
                "device_mem_reserved_mb": 4096.0,
                "device_mem_peak_mb": 3000.0,
                "device_util": 97.0,
                "device_temp_c": 61.0,
            }
        )
        if s == 33:
            records.append(
                {
                    "step": s,
                    "event": "anomaly",
                    "kind": "nonfinite",
                    "reason": "loss=nan grad_norm=nan",
                    "action": "skipped",
                }
            )
        if detail_every and s % detail_every == 0:
            records.append(
                {
                    "step": s,
                    **{
                        key: {m: scale * (1 + i) / s for i, m in enumerate(MODULES)}
                        for key, scale in (
                            ("layer_grad_norm", 5.0),
                            ("layer_weight_norm", 100.0),
                            ("layer_update_ratio", 0.1),
                        )
                    },
                }
            )
        if s % 20 == 0:
            records.append(
                {
                    "step": s,
                    "val_loss": 3.5 + 10 / s,
                    "val_perplexity": math.exp(3.5 + 10 / s),
                    "val_bits_per_byte": 1.5,
                    "val_tokens": 5000,
                }
            )
            records.append(
                {"step": s, "event": "checkpoint", "path": str(run / f"checkpoints/step_{s:08d}"), "seconds": 0.2}
            )
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    (run / "config.yaml").write_text(
        f"name: {name}\nbackend: {backend}\ndevice: cpu\noptim:\n  lr: 0.003\n  warmup_steps: 8\n  clip_norm: 1.0\n"
        f"data:\n  output_dir: {run / 'data'}\n  mixture:\n    weights: {{news: 3, code: 1}}\n",
        encoding="utf-8",
    )
    sources = [
        {
            "name": n,
            "category": c,
            "kept": 10,
            "splits": {"train": {"tokens": t}, "validation": {"tokens": t // 50}},
            "chars": {
                "read": 2 * t,
                "removed_by_rules": t // 10,
                "removed_by_dedup": t // 20,
                "added_by_edits": 0,
                "kept": 2 * t - t // 10 - t // 20,
            },
        }
        for n, c, t in (("daily", "news", 600_000), ("stdlib", "code", 300_000), ("plays", "literature", 100_000))
    ]
    (run / "data" / "manifest.json").write_text(
        json.dumps({"identity": "ab" * 32, "created": "2026-01-01T00:00:00Z", "sources": sources})
    )
    ckpt = run / "checkpoints" / f"step_{steps:08d}"
    ckpt.mkdir(parents=True)
    (ckpt / "trainer_state.json").write_text(
        json.dumps(
            {
                "step": steps,
                "backend": backend,
                "data_manifest_sha256": "cd" * 32,
                "versions": {"mindfoundry": "0.1.0", "python": "3.11.7", backend: "9.9.9"},
            }
        )
    )
    (run / "checkpoints" / "latest").write_text(ckpt.name)
    return run


def images(text: str) -> dict[str, bytes]:
    return {alt: base64.b64decode(data) for alt, data in IMG.findall(text)}


def section(text: str, sid: str) -> str:
    return text.split(f'<section id="{sid}">', 1)[1].split("</section>", 1)[0]


def test_single_run_report_has_every_section_with_embedded_plots(tmp_path):
    run = write_run(tmp_path, "run-a", "mindspore")
    out = write_report(run)
    assert out == run / "report.html"
    text = out.read_text(encoding="utf-8")
    for sid, title in SECTIONS:
        assert f'<section id="{sid}"><h2>{title}</h2>' in text
        assert f'href="#{sid}"' in text
    pngs = images(text)
    assert all(png.startswith(b"\x89PNG\r\n\x1a\n") for png in pngs.values())
    for sid in ("loss", "lr", "grad-norm", "layers", "throughput", "memory", "hardware", "events", "data"):
        assert IMG.search(section(text, sid)), f"no embedded image in section {sid}"
    assert "per-layer heat maps of run-a (mindspore)" in pngs
    assert "<script" not in text and not re.search(r'(src|href)="https?:', text)  # self-contained


def test_report_lists_health_findings_anomalies_data_and_environment(tmp_path):
    text = write_report(write_run(tmp_path, "run-a", "mindspore")).read_text(encoding="utf-8")
    events = section(text, "events")
    assert "health: nonfinite" in events and "non-finite loss or grad norm at step 33" in events
    assert "anomaly: nonfinite" in events and "update skipped" in events
    data = section(text, "data")
    assert "<td>daily</td><td>news</td><td class=\"num\">600,000</td>" in data
    # characters first: read, removed by the rules and by dedup, and the share kept
    assert (
        '<td class="num">1,200,000</td><td class="num">60,000</td><td class="num">30,000</td><td class="num">92.5%</td>'
        in data
    )
    environment = section(text, "environment")
    assert "version: mindspore" in environment and "9.9.9" in environment
    overview = section(text, "overview")
    assert "9.0000 → 3.6250" in overview  # held-out loss, first and last evaluation
    assert "warmup_steps: 8" in section(text, "config")


def test_compare_overlays_two_runs_naming_both(tmp_path):
    a = write_run(tmp_path, "run-a", "mindspore")
    b = write_run(tmp_path, "run-b", "torch", detail_every=None, slow=2.0)
    out = write_report(a, b, tmp_path / "cmp.html")
    text = out.read_text(encoding="utf-8")
    assert "<h1>run-a (mindspore) vs run-b (torch)</h1>" in text
    assert "<th>run-a (mindspore)</th><th>run-b (torch)</th>" in section(text, "overview")
    assert "<td>backend</td><td>mindspore</td><td>torch</td>" in section(text, "config")  # the keys that differ
    layers = section(text, "layers")
    assert "per-layer heat maps of run-a (mindspore)" in layers
    assert "run-b (torch): no per-layer records" in layers
    assert "run-a (mindspore): train tokens" not in text  # bar labels live in the image
    assert len(images(text)) >= 8


def test_same_named_runs_are_told_apart(tmp_path):
    a = write_run(tmp_path / "before", "demo", "mindspore")
    b = write_run(tmp_path / "after", "demo", "mindspore")
    text = write_report(a, b).read_text(encoding="utf-8")
    assert "<h1>before/demo (mindspore) vs after/demo (mindspore)</h1>" in text
    assert (a / "report-vs-demo.html").is_file()


def test_run_without_per_layer_or_memory_records_says_so(tmp_path):
    run = write_run(tmp_path, "bare", "torch", detail_every=None)
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    hardware = {
        "rss_mb",
        "cpu_util",
        "process_cpu",
        "device_mem_allocated_mb",
        "device_mem_reserved_mb",
        "device_mem_peak_mb",
        "device_util",
        "device_temp_c",
    }
    (run / "metrics.jsonl").write_text(
        "".join(json.dumps({k: v for k, v in r.items() if k not in hardware}) + "\n" for r in lines)
    )
    text = write_report(run).read_text(encoding="utf-8")
    assert "no per-layer records (set monitor.detail_every" in section(text, "layers")
    assert "No memory records (rss_mb) in this run." in section(text, "memory")
    assert "No hardware records in this run" in section(text, "hardware") and not IMG.search(section(text, "hardware"))


def test_missing_or_empty_metrics_is_a_clear_user_error(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(MetricsError, match="no metrics file at .*has the run started training"):
        write_report(empty)
    (empty / "metrics.jsonl").write_text(json.dumps({"event": "start", "step": 0}) + "\n")
    with pytest.raises(MetricsError, match="has no training step yet"):
        write_report(empty)
    assert main(["report", str(tmp_path / "nowhere")]) == 2
    assert "run directory" in capsys.readouterr().err and not (tmp_path / "nowhere").exists()


def test_torn_last_line_is_ignored_but_a_torn_middle_line_is_an_error(tmp_path):
    run = write_run(tmp_path, "torn", "mindspore")
    metrics = run / "metrics.jsonl"
    metrics.write_text(metrics.read_text() + '{"step": 81, "lo')
    assert write_report(run).is_file()
    lines = metrics.read_text().splitlines()
    metrics.write_text("\n".join(lines[:5] + ['{"step": 4, "lo'] + lines[5:]) + "\n")
    with pytest.raises(MetricsError, match=r"metrics.jsonl:6: not a JSON record"):
        write_report(run)


def test_cli_writes_the_file(tmp_path, capsys):
    run = write_run(tmp_path, "cli", "mindspore", steps=30)
    assert main(["report", str(run), "-o", str(tmp_path / "r.html")]) == 0
    assert (tmp_path / "r.html").read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    assert "wrote" in capsys.readouterr().err
