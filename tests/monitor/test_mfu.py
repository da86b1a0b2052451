"""MFU arithmetic against hand computation, the peak table's lookups, and the measured CPU peak."""

from __future__ import annotations

import pytest

from mindfoundry.monitor import mfu as mfu_module
from mindfoundry.monitor.mfu import UnknownPeakError, device_key, measured_cpu_peak, mfu, peak_flops


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
    with pytest.raises(UnknownPeakError, match="no peak FLOP/s known for device 'GeForce RTX 4090'.*pass the peak explicitly"):
        peak_flops("GeForce RTX 4090", "bf16")
    with pytest.raises(UnknownPeakError, match="no fp32 peak for ascend910b3"):
        peak_flops("Ascend910B3", "fp32")
    with pytest.raises(UnknownPeakError, match="unknown dtype 'int8'"):
        peak_flops("a100", "int8")
    with pytest.raises(UnknownPeakError, match="no bf16 peak for the CPU"):
        peak_flops("cpu", "bf16")


def test_cpu_peak_is_measured_once_per_process(monkeypatch):
    measured_cpu_peak.cache_clear()
    calls = []
    real = mfu_module.time.perf_counter
    monkeypatch.setattr(mfu_module.time, "perf_counter", lambda: calls.append(1) or real())
    first = peak_flops("cpu")
    second = peak_flops("CPU", "float32")
    assert first == second and 1e8 < first < 1e14  # a plausible GEMM rate for any CPU
    assert len(calls) == 2 * 5  # one timed pair per repeat, on the first call only
    measured_cpu_peak.cache_clear()


def test_cpu_peak_is_flops_over_median_time(monkeypatch):
    """2*n^3 FLOPs over the median of the timed repeats (warm-up not timed)."""
    measured_cpu_peak.cache_clear()
    ticks = iter([0.0, 0.5, 1.0, 1.1, 2.0, 2.3])  # durations 0.5, 0.1, 0.3 -> median 0.3
    monkeypatch.setattr(mfu_module.time, "perf_counter", lambda: next(ticks))
    assert measured_cpu_peak(64, 3) == pytest.approx(2 * 64**3 / 0.3)
    measured_cpu_peak.cache_clear()
