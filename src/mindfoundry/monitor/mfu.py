"""Model FLOPs utilisation: the share of the hardware's peak that the model's own FLOPs use.

MFU = flops_per_token * tokens_per_s / peak (PaLM, appendix B). It counts only the model's FLOPs
(`model.spec.flops_per_token`), not recomputation or optimizer work, so it compares engines and
layouts fairly: a faster engine has a higher MFU on the same model and device.

Peaks are dense (no 2:4 sparsity) vendor figures in FLOP/s; the CPU peak is measured, because a
CPU's usable GEMM rate depends on its cores, vector units and BLAS build far more than on a model
name.
"""

from __future__ import annotations

import functools
import json
import math
import os
import platform
import re
import time
from pathlib import Path

import numpy as np

from mindfoundry import atomic

TERA = 1e12

# Dense peaks in TFLOP/s per device and dtype.
# NVIDIA figures: A100 datasheet (nvidia-a100-datasheet-us-nvidia-1758950-r4: BF16/FP16 312, TF32 156,
# FP32 19.5, identical for SXM and PCIe); H100 datasheet and Hopper whitepaper (SXM5: BF16/FP16 989.4,
# TF32 494.7, FP32 66.9; PCIe: the datasheet's 1,513 / 756 sparse figures halved, FP32 51); H200 has
# H100 SXM's compute (only its memory differs).
# Ascend: the original Ascend 910 is 256 TFLOPS FP16 (Huawei, Hot Chips 31, 2019). We found no Huawei
# datasheet with per-variant 910B figures; 313 (910B3 class) and 376 (910B2 class) TFLOPS FP16/BF16
# are the commonly quoted dense figures, and a public third-party GEMM benchmark measured 328 TFLOPS
# BF16 on a 910B, consistent with them. The Cube unit has no plain FP32 matmul, so no FP32 entry:
# pass an explicit peak for FP32 (HF32) runs on Ascend.
PEAK_TFLOPS: dict[str, dict[str, float]] = {
    "a100": {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5},
    "h100-sxm": {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9},
    "h100-pcie": {"bf16": 756.5, "fp16": 756.5, "tf32": 378.0, "fp32": 51.0},
    "h200": {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9},
    "ascend910": {"bf16": 256.0, "fp16": 256.0},
    "ascend910b2": {"bf16": 376.0, "fp16": 376.0},
    "ascend910b3": {"bf16": 313.0, "fp16": 313.0},
}

# Substrings of a normalised device name (lowercase, alphanumerics only), most specific first, so
# "NVIDIA H100 PCIe" and "Ascend910B2C" find their rows and a bare "910B" gets the lower 910B figure.
_NAME_PATTERNS: tuple[tuple[str, str], ...] = (
    ("h100pcie", "h100-pcie"),
    ("h100", "h100-sxm"),
    ("h200", "h200"),
    ("a100", "a100"),
    ("910b2", "ascend910b2"),
    ("910b", "ascend910b3"),
    ("910", "ascend910"),
)

_DTYPES = {"bf16": "bf16", "bfloat16": "bf16", "fp16": "fp16", "float16": "fp16", "half": "fp16",
           "tf32": "tf32", "fp32": "fp32", "float32": "fp32", "float": "fp32"}


class UnknownPeakError(ValueError):
    """No peak is known for this device and dtype; MFU needs an explicit peak."""


def _dtype(dtype: str) -> str:
    key = _DTYPES.get(dtype.lower())
    if key is None:
        raise UnknownPeakError(f"unknown dtype '{dtype}': use one of {sorted(set(_DTYPES.values()))}")
    return key


def device_key(device: str) -> str | None:
    """The table row for a device name as drivers report it ('NVIDIA A100-SXM4-80GB', 'Ascend910B2C',
    'h100'), or None when the device is not in the table."""
    name = re.sub(r"[^a-z0-9]", "", device.lower())
    return next((key for pattern, key in _NAME_PATTERNS if pattern in name), None)


def _gemm_rate(size: int, repeats: int) -> float:
    """FP32 GEMM FLOP/s of this process's numpy BLAS: the fastest of ``repeats`` timed size x size matmuls after a
    warm-up. The fastest, not the median: another process busy on the same cores only ever slows a window, so the
    fastest is the closest to what the cores can do (a median taken under load under-read the peak 2-3x, and MFU
    read 60-87% for a tiny model)."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((size, size), dtype=np.float32)
    b = rng.standard_normal((size, size), dtype=np.float32)
    a @ b
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t0)
    return 2.0 * size**3 / best


def _machine_key() -> str:
    """This machine's CPU model, the cores this process may use and numpy's version: what the GEMM rate depends on."""
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            model = next((line.split(":", 1)[1].strip() for line in fh if line.startswith("model name")), model)
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{model}|{cores} cores|numpy {np.__version__}"


def peak_cache() -> Path:
    """Where measured CPU peaks are kept per machine ($MF_CACHE_DIR, else $XDG_CACHE_HOME/mindfoundry, else ~/.cache).
    """
    root = (
        os.environ.get("MF_CACHE_DIR")
        or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "mindfoundry"
    )
    return Path(root) / "cpu_peak.json"


def remember_cpu_peak(flops: float) -> float:
    """Record ``flops`` as this machine's CPU peak when it is the highest seen; return the highest. A peak only ever
    rises (a measurement under load cannot lower it); an unwritable cache is skipped."""
    path, key = peak_cache(), _machine_key()
    try:
        known = json.loads(path.read_text(encoding="utf-8"))
        known = known if isinstance(known, dict) else {}
    except (OSError, ValueError):
        known = {}
    previous = known.get(key)
    previous = float(previous) if isinstance(previous, (int, float)) else 0.0  # a damaged entry counts as none
    best = max(flops, previous)
    if best > previous:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic.write_text(path, json.dumps({**known, key: best}, indent=1) + "\n")
        except OSError:
            pass
    return best


@functools.cache
def measured_cpu_peak(size: int = 1024, repeats: int = 7) -> float:
    """This machine's FP32 GEMM peak: the fastest window measured now or ever before on it (:func:`remember_cpu_peak`;
    measured once per process, a fraction of a second)."""
    return remember_cpu_peak(_gemm_rate(size, repeats))


def peak_flops(device: str, dtype: str = "fp32") -> float:
    """Dense peak FLOP/s of one device for a compute dtype; 'cpu' is measured (fp32 GEMM).

    On a CPU, fp16 (mixed precision) is held against the measured fp32 GEMM rate: x86 cores without
    AVX512-FP16 convert float16 to float32 and multiply on the same FP32 units (a float16 1024^2
    matmul in MindSpore ran at ~0.8x the float32 rate on the EPYC CI machine), so the fp32 rate is
    the ceiling. bf16 has no CPU peak: AVX512-BF16/AMX cores have a bf16 rate we do not measure.
    """
    kind = _dtype(dtype)
    if device.lower() == "cpu":
        if kind == "fp16":
            return measured_cpu_peak()
        if kind != "fp32":
            raise UnknownPeakError(f"no {kind} peak for the CPU: only the fp32 GEMM rate is measured")
        return measured_cpu_peak()
    key = device_key(device)
    if key is None:
        raise UnknownPeakError(f"no peak FLOP/s known for device '{device}' (known: cpu, {', '.join(PEAK_TFLOPS)}); "
                               "pass the peak explicitly")
    if kind not in PEAK_TFLOPS[key]:
        raise UnknownPeakError(
            f"no {kind} peak for {key} (known: {', '.join(PEAK_TFLOPS[key])}); pass the peak explicitly"
        )
    return PEAK_TFLOPS[key][kind] * TERA


def mfu(flops_per_token: float, tokens_per_s: float, peak: float) -> float:
    """Model FLOPs utilisation in [0, 1] for a realistic run. `tokens_per_s` and `peak` must cover
    the same devices: for N data-parallel devices pass the global tokens/s and N x the per-device peak.
    Never above 1: a rate above the peak means the peak was under-read (:func:`observed_peak` raises it)."""
    if peak <= 0:
        raise ValueError(f"peak FLOP/s must be positive, got {peak}")
    return min(flops_per_token * tokens_per_s / peak, 1.0)


def observed_peak(peak: float, flops_per_token: float, tokens_per_s: float) -> float:
    """The peak, raised to the model FLOP rate a run reached when that is higher: the cores did that much, so the
    peak is at least that (a CPU peak measured while something else ran)."""
    return max(peak, flops_per_token * tokens_per_s)


def devices_peak(peak_tflops: float | None, device: str, dtype: str, devices: int) -> float:
    """Peak FLOP/s of `devices` processes, one device each: monitor.peak_tflops, else the table, else measured (a
    CPU); UnknownPeakError when none applies."""
    return (peak_tflops * 1e12 if peak_tflops else peak_flops(device, dtype)) * devices


class MfuMeter:
    """A run's MFU from step to step. A step faster than the peak shows the peak was under-read (a CPU peak timed
    while something else ran): the peak rises to what the step did, and MFU never reads above 100%."""

    def __init__(self, peak: float | None) -> None:
        self.peak = peak  # FLOP/s of all the run's devices; None: MFU is not reported

    def __call__(self, flops_per_token: float, tokens_per_s: float) -> float | None:
        if not self.peak:
            return None
        self.peak = observed_peak(self.peak, flops_per_token, tokens_per_s)
        return mfu(flops_per_token, tokens_per_s, self.peak)
