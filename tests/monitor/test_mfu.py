"""MFU arithmetic against hand computation, the peak table's lookups, and the measured CPU peak."""

from __future__ import annotations

import json

import pytest

from mindfoundry.monitor import mfu as mfu_module
from mindfoundry.monitor.mfu import UnknownPeakError, device_key, measured_cpu_peak, mfu, observed_peak, peak_flops


def test_mfu_by_hand():
    # A 1.1B model at seq 2048 (d=2048, 22 layers): 6*N + 12*L*d*T = 6.6e9 + 1,107,296,256
    # = 7,707,296,256 FLOPs/token; at 12,000 tokens/s that is 92,487,555,072,000 FLOP/s, and on one
    # A100 (312e12 bf16) an MFU of 0.2964344713846...
    flops_per_token = 6 * 1.1e9 + 12 * 22 * 2048 * 2048
    assert flops_per_token == 7_707_296_256.0
    assert mfu(flops_per_token, 12_000, peak_flops("a100", "bf16")) == pytest.approx(0.2964344713846, rel=1e-12)
    assert mfu(1e9, 1e3, 4e12) == 0.25  # exactly: 1e12 FLOP/s achieved of 4e12
    assert mfu(1e9, 1e3, 2 * 1e12) == 0.5  # two devices: pass the summed peak


def test_mfu_rejects_a_non_positive_peak():
    with pytest.raises(ValueError, match="positive"):
        mfu(1e9, 1e3, 0.0)


@pytest.mark.parametrize(("device", "dtype", "tflops"), [
    ("NVIDIA A100-SXM4-80GB", "bf16", 312.0),
    ("a100", "tf32", 156.0),
    ("A100", "float32", 19.5),
    ("NVIDIA H100 80GB HBM3", "bfloat16", 989.4),
    ("NVIDIA H100 PCIe", "fp16", 756.5),
    ("NVIDIA H200", "bf16", 989.4),
    ("h100", "fp32", 66.9),
    ("Ascend910B2C", "bf16", 376.0),
    ("Ascend910B3", "fp16", 313.0),
    ("ascend910b", "bf16", 313.0),
])
def test_peak_table(device, dtype, tflops):
    assert peak_flops(device, dtype) == tflops * 1e12


def test_unknown_device_or_dtype_is_a_clear_error():
    assert device_key("GeForce RTX 4090") is None
    with pytest.raises(
        UnknownPeakError, match="no peak FLOP/s known for device 'GeForce RTX 4090'.*pass the peak explicitly"
    ):
        peak_flops("GeForce RTX 4090", "bf16")
    with pytest.raises(UnknownPeakError, match="no fp32 peak for ascend910b3"):
        peak_flops("Ascend910B3", "fp32")
    with pytest.raises(UnknownPeakError, match="unknown dtype 'int8'"):
        peak_flops("a100", "int8")
    with pytest.raises(UnknownPeakError, match="no bf16 peak for the CPU"):
        peak_flops("cpu", "bf16")


def test_cpu_peak_is_measured_once_per_process(monkeypatch, tmp_path):
    monkeypatch.setenv("MF_CACHE_DIR", str(tmp_path))
    measured_cpu_peak.cache_clear()
    calls = []
    real = mfu_module.time.perf_counter
    monkeypatch.setattr(mfu_module.time, "perf_counter", lambda: calls.append(1) or real())
    first = peak_flops("cpu")
    second = peak_flops("CPU", "float32")
    assert first == second and 1e8 < first < 1e14  # a plausible GEMM rate for any CPU
    assert len(calls) == 2 * 7  # one timed pair per repeat, on the first call only
    measured_cpu_peak.cache_clear()


def test_cpu_peak_is_the_fastest_window_and_never_falls_below_what_the_machine_did_before(monkeypatch, tmp_path):
    """Issue #36: a peak timed while another process ran read low and MFU showed 60-87% for a tiny model. The peak is
    the fastest window (load only slows a window), and the highest ever measured on the machine (cached), so a later
    measurement under load cannot lower it."""
    monkeypatch.setenv("MF_CACHE_DIR", str(tmp_path))
    measured_cpu_peak.cache_clear()
    ticks = iter([0.0, 0.5, 1.0, 1.1, 2.0, 2.3])  # durations 0.5, 0.1, 0.3 -> the fastest is 0.1
    monkeypatch.setattr(mfu_module.time, "perf_counter", lambda: next(ticks))
    assert measured_cpu_peak(64, 3) == pytest.approx(2 * 64**3 / 0.1)
    measured_cpu_peak.cache_clear()
    ticks = iter([0.0, 1.0, 2.0, 3.0, 4.0, 5.0])  # a busy machine: every window 1.0 s, ten times slower
    assert measured_cpu_peak(64, 3) == pytest.approx(2 * 64**3 / 0.1)  # the machine's known peak stands
    assert json.loads(mfu_module.peak_cache().read_text()) == {
        mfu_module._machine_key(): pytest.approx(2 * 64**3 / 0.1)
    }
    measured_cpu_peak.cache_clear()


def test_mfu_never_reads_above_one_and_a_faster_step_raises_the_peak():
    assert mfu(1e6, 3e3, 1e9) == 1.0  # 300% of the peak reads 100%
    assert observed_peak(1e9, 1e6, 3e3) == 3e9 and observed_peak(1e10, 1e6, 3e3) == 1e10
    assert mfu(1e6, 3e3, observed_peak(1e9, 1e6, 3e3)) == 1.0
