"""Hardware metrics of a training process, for its step records: CPU utilisation always (psutil), and the
utilisation, temperature and power of its accelerator through the vendor's own tool when it is installed
(`nvidia-smi` for CUDA devices, `npu-smi` for Ascend NPUs). A machine without the tool or the device gets
none of those keys: absent quietly, never an error. Device *memory* comes from the engine
(:meth:`mindfoundry.backends.base.Backend.device_memory`), which knows its allocator.

The vendor tool is a subprocess of ~50 ms, so it is asked at most every `interval_s` seconds; the step
records in between repeat its last answer. Framework-free: no engine is imported here.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from typing import Callable

import psutil

#: nvidia-smi --query-gpu fields -> record keys.
NVIDIA_FIELDS = {"utilization.gpu": "device_util", "temperature.gpu": "device_temp_c", "power.draw": "device_power_w"}
#: npu-smi `info -t TYPE -i ID` key/value lines -> record keys (the first key containing the text wins).
NPU_QUERIES = {"usages": ("Aicore Usage Rate", "device_util"), "temp": ("Temperature", "device_temp_c"),
               "power": ("Power Dissipation", "device_power_w")}


def _number(text: str) -> float | None:
    try:
        return float(text.strip())
    except ValueError:  # "[N/A]", "[Not Supported]", "NA"
        return None


def parse_nvidia_smi(csv_line: str) -> dict[str, float]:
    """One line of `nvidia-smi --query-gpu=utilization.gpu,temperature.gpu,power.draw --format=csv,noheader,nounits`."""
    values = [_number(v) for v in csv_line.split(",")]
    return {key: v for key, v in zip(NVIDIA_FIELDS.values(), values) if v is not None}


def parse_npu_smi(text: str, label: str) -> float | None:
    """The value of the first `Label ... : value` line whose label contains `label` (npu-smi info -t ... output)."""
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and label.lower() in key.lower():
            return _number(value)
    return None


def _run(cmd: list[str]) -> str | None:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def nvidia_query(index: int) -> dict[str, float]:
    out = _run(
        ["nvidia-smi", f"--query-gpu={','.join(NVIDIA_FIELDS)}", "--format=csv,noheader,nounits", "-i", str(index)]
    )
    return parse_nvidia_smi(out.splitlines()[0]) if out and out.strip() else {}


def npu_query(index: int) -> dict[str, float]:
    found = {}
    for kind, (label, key) in NPU_QUERIES.items():
        out = _run(["npu-smi", "info", "-t", kind, "-i", str(index)])
        value = parse_npu_smi(out, label) if out else None
        if value is not None:
            found[key] = value
    return found


def device_query(device_kind: str) -> Callable[[int], dict[str, float]] | None:
    """The vendor query for a device kind ('cuda', 'npu'/'ascend'), or None (a CPU, or the tool is not installed)."""
    if device_kind in ("cuda", "gpu") and shutil.which("nvidia-smi"):
        return nvidia_query
    if device_kind in ("npu", "ascend") and shutil.which("npu-smi"):
        return npu_query
    return None


class HardwareSampler:
    """`sample()` -> the hardware keys of a step record: `cpu_util` (the machine's CPUs, %, since the previous
    sample), `process_cpu` (this process, % of one core) and, with an accelerator and its tool,
    `device_util` (%), `device_temp_c`, `device_power_w` of device `device_index`."""

    def __init__(self, device_kind: str, device_index: int = 0, interval_s: float = 10.0):
        self._query = device_query(device_kind)
        self.device_index, self.interval_s = device_index, interval_s
        self._process = psutil.Process()
        self._last: dict[str, float] = {}
        self._asked = -float("inf")
        psutil.cpu_percent(None)  # the first call starts the measuring window
        self._process.cpu_percent(None)

    def sample(self) -> dict[str, float]:
        out = {"cpu_util": psutil.cpu_percent(None), "process_cpu": self._process.cpu_percent(None)}
        if self._query is not None and time.monotonic() - self._asked >= self.interval_s:
            self._asked = time.monotonic()
            self._last = self._query(self.device_index)
        return out | self._last
