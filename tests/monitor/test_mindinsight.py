"""`monitor.mindinsight`: MindSpore summary files from a real MindSpore run, read back through MindSpore's own
protobuf schema (mindspore.train.summary_pb2.Event) with the framing MindSpore Insight checks (length, masked
CRC32C)."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

pytest.importorskip("mindspore")

from mindfoundry.config.load import ConfigError, load_config  # noqa: E402
from mindfoundry.monitor.records import detail_records, read_records, step_records  # noqa: E402


def _crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def _masked(crc: int) -> int:
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def read_summary(path: Path) -> dict[str, list[tuple[int, float]]]:
    """tag -> [(step, value)] of a MindSpore summary file; every record's two CRCs are checked."""
    from mindspore.train.summary_pb2 import Event

    data, offset, out = path.read_bytes(), 0, {}
    while offset < len(data):
        header = data[offset:offset + 8]
        (length,), (header_crc,) = struct.unpack("<Q", header), struct.unpack("<I", data[offset + 8:offset + 12])
        assert header_crc == _masked(_crc32c(header)), f"{path}: bad length CRC at byte {offset}"
        body = data[offset + 12:offset + 12 + length]
        (body_crc,) = struct.unpack("<I", data[offset + 12 + length:offset + 16 + length])
        assert body_crc == _masked(_crc32c(body)), f"{path}: bad data CRC at byte {offset}"
        event = Event()
        event.ParseFromString(body)
        for value in event.summary.value:
            out.setdefault(value.tag, []).append((event.step, value.scalar_value))
        offset += 16 + length
    return out


def test_mindinsight_on_another_engine_is_a_config_error(tiny_run) -> None:
    with pytest.raises(ConfigError, match="monitor.mindinsight=true writes MindSpore summary files"):
        load_config(tiny_run(), ["backend=torch", "monitor.mindinsight=true"])


def assert_summary_matches_metrics(run: Path) -> None:
    """A real MindSpore run's summary file (monitor.mindinsight, detail_every 2, eval_every 2; trained by
    tests/monitor/test_hardware_and_profile.py, so that MindSpore trains once for both) holds metrics.jsonl's
    scalars."""
    import numpy as np

    (summary,) = (run / "mindinsight").glob("events.out.events.summary.*_MS")
    tags = read_summary(summary)
    records = read_records(run / "metrics.jsonl")
    steps = step_records(records)
    for key, tag in (
        ("loss", "train/loss"),
        ("lr", "train/lr"),
        ("grad_norm", "train/grad_norm"),
        ("cpu_util", "hw/cpu_util"),
    ):
        assert tags[tag] == [(r["step"], float(np.float32(r[key]))) for r in steps]  # float32, as summaries store them
    evals = [r for r in records if "val_loss" in r and "event" not in r]
    assert tags["val/loss"] == [(r["step"], float(np.float32(r["val_loss"]))) for r in evals]  # steps 0, 2, 4
    detail = detail_records(records)
    assert [s for s, _ in tags["layer_grad_norm/layers.1"]] == [r["step"] for r in detail] == [2, 4]
    assert tags["layer_grad_norm/layers.1"][0][1] == float(np.float32(detail[0]["layer_grad_norm"]["layers.1"]))
