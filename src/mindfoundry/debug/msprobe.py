"""MindStudio Probe's dump format (msprobe, module level L0), written from our probes and read back.

Layout, as msprobe's own PrecisionDebugger writes it::

    DUMP/step{N}/rank{R}/dump.json         {"task", "level": "L0", "framework", "dump_data_dir", "data": {ENTRY: ...}}
    DUMP/step{N}/rank{R}/stack.json        call stacks, grouped: {"0": [[ENTRY, ...], [frame, ...]], ...}
    DUMP/step{N}/rank{R}/construct.json    ENTRY -> the entry of the module that called it (null at the top)
    DUMP/step{N}/rank{R}/dump_tensor_data/ tensor mode: one file per tensor, ENTRY.input.0.pt (PyTorch) / .npy
    (MindSpore)

An entry is ``Module.<name>.<Class>.forward.<call>`` (PyTorch; ``Cell.`` for MindSpore) holding
``input_args``/``input_kwargs``/``output``/``parameters``; ``...backward.<call>`` holds ``input``
(the gradient arriving at the module's output) and ``output`` (the gradient it sends to its
input); ``...parameters_grad.0`` the parameters' gradients. Each tensor is described by type,
dtype, shape and the statistics ``Max``/``Min``/``Mean``/``Norm``. Our names map one to one:

    layers.0.attn.forward.0.input.0          Module.layers.0.attn.Attention.forward.0  input_args[0]
    layers.0.attn.backward.0.grad_output.0   Module.layers.0.attn.Attention.backward.0 input[0]
    param.layers.0.attn.q_proj.weight        Module.layers.0.attn.q_proj.Linear.forward.0 parameters.weight
    grad.layers.0.attn.q_proj.weight         Module.layers.0.attn.q_proj.Linear.parameters_grad.0 weight[0]

msprobe's L0 hooks submodules only, and has no place for optimizer moments: the whole model's
output, the loss and AdamW's moments are written only in our own format. Our step numbers
(optimizer steps from 1) name the step folders; a PrecisionDebugger counts its ``step()`` calls
from 0, so its step0 is our step 1. Our own facts (step, backend, loss) ride in dump.json under
``"mindfoundry"``, a key msprobe ignores. dump.json is written last and atomically: a step folder
without it was interrupted.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import numpy as np

from mindfoundry import atomic
from mindfoundry.debug.dump import Dump, DumpError, claim_leaf
from mindfoundry.debug.stats import tensor_stats
from mindfoundry.debug.torch_files import write_pt

DUMP_JSON = "dump.json"
STACK_JSON = "stack.json"
CONSTRUCT_JSON = "construct.json"
TENSOR_DATA = "dump_tensor_data"
META_KEY = "mindfoundry"
ROOT = "model"  # our name for the whole model, which msprobe's L0 does not dump
_MS_DTYPES = {"float16": "Float16", "float32": "Float32", "float64": "Float64", "bfloat16": "BFloat16", "int8": "Int8",
              "int16": "Int16", "int32": "Int32", "int64": "Int64", "uint8": "UInt8", "bool": "Bool"}
_ENTRY = re.compile(
    r"^(Module|Cell)\.(?P<path>.+)\.(?P<cls>[^.]+)\.(?P<dir>forward|backward|parameters_grad)\.(?P<call>\d+)$"
)


def representable(module: str, kind: str) -> bool:
    """Whether msprobe's L0 layout has a place for a tensor: not the whole model's output, the loss or AdamW's moments.
    """
    return module not in (ROOT, "loss") and kind not in ("loss", "exp_avg", "exp_avg_sq")


@dataclass(frozen=True)
class Flavor:
    """How msprobe writes one framework's dumps."""

    framework: str              # dump.json "framework"
    prefix: str                 # entry prefix
    tensor_type: str
    suffix: str                 # tensor file suffix
    save: Callable[[Path, np.ndarray], None]

    def dtype(self, ours: str) -> str:
        return f"torch.{ours}" if self.framework == "pytorch" else _MS_DTYPES.get(ours, ours.capitalize())


FLAVORS = {
    "torch": Flavor("pytorch", "Module", "torch.Tensor", ".pt", write_pt),
    "mindspore": Flavor("mindspore", "Cell", "mindspore.Tensor", ".npy", lambda p, a: np.save(p, a)),
}


def msprobe_stats(a: np.ndarray) -> dict[str, Any]:
    """Max/Min/Mean/Norm as msprobe records them: over every element (a NaN makes them NaN); integer tensors have no
    Mean/Norm."""
    if a.size == 0:
        return {"Max": None, "Min": None, "Mean": None, "Norm": None}
    s = tensor_stats(a)
    if s["nan"] or s["inf"]:
        f = np.asarray(a, dtype=np.float64)
        s = {
            "max": float(f.max()),
            "min": float(f.min()),
            "mean": float(f.mean()),
            "norm": float(np.sqrt(np.sum(f * f))),
        }
    integral = a.dtype.kind in "iub"
    return {
        "Max": s["max"],
        "Min": s["min"],
        "Mean": None if integral else s["mean"],
        "Norm": None if integral else s["norm"],
    }


class MsprobeWriter:
    """Streams one step's tensors of one rank into msprobe's layout: tensor files as they come, the
    three JSON files (statistics only, small) at :meth:`close`. Same interface as DumpWriter."""

    def __init__(self, root: Path, step: int, rank: int, mode: str, meta: dict[str, Any], backend: str,
                 classes: Mapping[str, str], micro_batches: int = 1):
        if backend not in FLAVORS:
            raise ValueError(f"no msprobe flavor for backend '{backend}': choose one of {', '.join(FLAVORS)}")
        self.dir = claim_leaf(root, step, rank, mode, DUMP_JSON, TENSOR_DATA)
        self.flavor, self.classes, self.mode = FLAVORS[backend], dict(classes), mode
        # msprobe repeats the parameters in every forward call's entry and records the running gradient
        # sum after each backward (parameters_grad.0 ... .{A-1}); we hold the step's sum, the last of them
        self.micro_batches = micro_batches
        self.meta = {"step": step, "rank": rank, "mode": mode, **meta}
        self.data: dict[str, dict[str, Any]] = {}
        self.count = self.skipped = 0

    def _entry(self, module: str, direction: str, call: int) -> str:
        return f"{self.flavor.prefix}.{module}.{self.classes[module]}.{direction}.{call}"

    def _places(self, name: str, module: str, kind: str) -> list[tuple[str, str, str | None]]:
        """(entry, slot, parameter name) where one of our tensors goes; none for what msprobe has no place for."""
        if not representable(module, kind):
            return []
        if kind == "param":
            return [
                (self._entry(module, "forward", call), "parameters", name.rsplit(".", 1)[1])
                for call in range(self.micro_batches)
            ]
        if kind == "grad":
            return [
                (
                    self._entry(module, "parameters_grad", self.micro_batches - 1),
                    "parameters_grad",
                    name.rsplit(".", 1)[1],
                )
            ]
        direction, call = name[len(module) + 1:].split(".")[:2]
        slot = {"forward_input": "input_args", "forward_output": "output",
                "backward_grad_output": "input", "backward_grad_input": "output"}[kind]
        return [(self._entry(module, direction, int(call)), slot, None)]

    def record(self, name: str, module: str, kind: str, array: np.ndarray, dtype: str | None = None) -> dict[str, Any]:
        places = self._places(name, module, kind)
        if not places:
            self.skipped += 1
            return {}
        a = np.asarray(array)
        f = self.flavor
        stats: dict[str, Any] = {
            "type": f.tensor_type,
            "dtype": f.dtype(dtype or str(a.dtype)),
            "shape": list(a.shape),
            **msprobe_stats(a),
        }
        # activations and weights of a training step carry autograd, gradients do not. msprobe's own MindSpore
        # dumps leave the field out, and its compare then calls every MindSpore-vs-PyTorch row "Required_Grad
        # inconsistent"; the value is as true of a MindSpore step, so both flavors write it
        stats["requires_grad"] = kind in ("forward_input", "forward_output", "param") and a.dtype.kind == "f"
        for entry, slot, param in places:
            info = dict(stats)
            body = self.data.setdefault(entry, _empty(entry))
            if self.mode == "tensor":
                if slot == "parameters_grad":
                    data_name = f"{entry}.{param}"
                elif slot == "parameters":
                    data_name = f"{entry}.parameters.{param}"
                else:
                    data_name = f"{entry}.{'output' if slot == 'output' else 'input'}.{len(body[slot])}"
                f.save(self.dir / TENSOR_DATA / (data_name + f.suffix), a)
                info["data_name"] = data_name + f.suffix
            if slot == "parameters":
                body["parameters"][param] = info
            elif slot == "parameters_grad":
                body[param] = [info]
            else:
                body[slot].append(info)
        self.count += 1
        return stats

    def close(self, **extra: Any) -> Path:
        """Write construct.json, stack.json, then dump.json (its presence marks a complete dump)."""
        parents = {e: self._parent(e) for e in self.data if ".parameters_grad." not in e}
        _write_json(self.dir / CONSTRUCT_JSON, parents)
        _write_json(
            self.dir / STACK_JSON,
            {
                "0": [
                    list(self.data),
                    [
                        f"recorded by MindFoundry's {self.meta.get('backend', '')} "
                        "module hooks (no Python stack is kept)"
                    ],
                ]
            },
        )
        meta = {**self.meta, **extra, "tensors": self.count, "not_in_msprobe_format": self.skipped}
        _write_json(self.dir / DUMP_JSON, {
            "task": self.mode, "level": "L0", "framework": self.flavor.framework,
            "dump_data_dir": str(self.dir / TENSOR_DATA) if self.mode == "tensor" else None,
            "data": self.data, META_KEY: meta})
        return self.dir

    def _parent(self, entry: str) -> str | None:
        m = _ENTRY.match(entry)
        path = m["path"]
        while "." in path:
            path = path.rsplit(".", 1)[0]
            if path in self.classes:
                candidate = self._entry(path, m["dir"], int(m["call"]))
                if candidate in self.data:
                    return candidate
        return None


def _empty(entry: str) -> dict[str, Any]:
    """An entry's fields before any tensor is recorded, as msprobe lays them out."""
    if ".parameters_grad." in entry:
        return {}
    if ".backward." in entry:
        return {"input": [], "output": []}
    return {"input_args": [], "input_kwargs": {}, "output": [], "parameters": {}}


def _write_json(path: Path, value: Any) -> None:
    atomic.write_text(path, json.dumps(value, indent=1) + "\n")


# -- reading ---------------------------------------------------------------------------------
def _our_dtype(name: str) -> str:
    return str(name).removeprefix("torch.").lower()


def _flatten(items: Any, prefix: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """(index, tensor info) of a list of arguments/outputs; tuples nest (``1.0``), non-tensors are skipped."""
    for i, item in enumerate(items or []):
        index = f"{prefix}{i}"
        if isinstance(item, list):
            yield from _flatten(item, index + ".")
        elif isinstance(item, dict) and str(item.get("type", "")).endswith("Tensor"):
            yield index, item


def _tensors(entry: str, body: dict[str, Any]) -> Iterator[tuple[str, str, str, dict[str, Any]]]:
    """(our name, module, kind, info) of every tensor one dump.json entry holds, inputs before outputs."""
    m = _ENTRY.match(entry)
    if m is None:  # an API-level (L1) entry, e.g. Functional.linear.0.forward: its own name is the module
        for slot in ("input_args", "input", "output"):
            for i, info in _flatten(body.get(slot), ""):
                yield f"{entry}.{'output' if slot == 'output' else 'input'}.{i}", entry, f"api_{slot}", info
        return
    path, direction, call = m["path"], m["dir"], m["call"]
    if direction == "parameters_grad":
        for param, infos in body.items():
            info = infos[-1] if isinstance(infos, list) and infos else infos
            if isinstance(info, dict):
                yield f"grad.{path}.{param}", path, "grad", info
        return
    base = f"{path}.{direction}.{call}"
    if direction == "forward":
        for i, info in _flatten(body.get("input_args"), ""):
            yield f"{base}.input.{i}", path, "forward_input", info
        for key, info in (body.get("input_kwargs") or {}).items():
            if isinstance(info, dict) and str(info.get("type", "")).endswith("Tensor"):
                yield f"{base}.input.{key}", path, "forward_input", info
        for i, info in _flatten(body.get("output"), ""):
            yield f"{base}.output.{i}", path, "forward_output", info
        if call == "0":
            for param, info in (body.get("parameters") or {}).items():
                if isinstance(info, dict):
                    yield f"param.{path}.{param}", path, "param", info
    else:
        for i, info in _flatten(body.get("input"), ""):
            yield f"{base}.grad_output.{i}", path, "backward_grad_output", info
        for i, info in _flatten(body.get("output"), ""):
            yield f"{base}.grad_input.{i}", path, "backward_grad_input", info


def _earlier_gradient_sums(data: dict[str, Any]) -> set[str]:
    """parameters_grad entries before a module's last one: running sums after earlier micro-batches, not the step's
    gradient."""
    last: dict[str, tuple[int, str]] = {}
    for entry in data:
        m = _ENTRY.match(entry)
        if m and m["dir"] == "parameters_grad":
            key = m["path"]
            if key not in last or int(m["call"]) > last[key][0]:
                last[key] = (int(m["call"]), entry)
    keep = {entry for _, entry in last.values()}
    return {e for e in data if ".parameters_grad." in e and e not in keep}


def _finite_or_none(value: Any) -> tuple[float | None, bool, bool]:
    """(value if finite, is NaN, is infinite): msprobe's statistics include non-finite elements."""
    if value is None or isinstance(value, str):
        try:
            value = None if value is None else float(value)
        except ValueError:
            return None, False, False
    if value is None:
        return None, False, False
    v = float(value)
    return (v if math.isfinite(v) else None), math.isnan(v), math.isinf(v)


def _record(seq: int, name: str, module: str, kind: str, info: dict[str, Any], tensor_mode: bool) -> dict[str, Any]:
    shape = list(info.get("shape") or [])
    rec: dict[str, Any] = {"seq": seq, "name": name, "module": module, "kind": kind, "shape": shape,
                           "dtype": _our_dtype(info.get("dtype", "")), "count": int(np.prod(shape)) if shape else 1}
    nan = inf = False
    for ours, theirs in (("min", "Min"), ("max", "Max"), ("mean", "Mean"), ("norm", "Norm")):
        rec[ours], is_nan, is_inf = _finite_or_none(info.get(theirs))
        nan, inf = nan or is_nan, inf or is_inf
    # msprobe does not count NaN/Inf: a non-finite statistic flags that there is at least one
    rec["nan"], rec["inf"], rec["nonfinite_counted"] = int(nan), int(inf and not nan), False
    if tensor_mode and info.get("data_name"):
        rec["file"] = f"{TENSOR_DATA}/{info['data_name']}"
    return rec


def read_msprobe_dump(path: Path) -> Dump:
    """Read one msprobe step/rank folder (ours or one msprobe wrote) as a :class:`Dump` with our tensor names."""
    path = Path(path)
    file = path / DUMP_JSON
    try:
        raw = json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DumpError(f"{path}: no {DUMP_JSON}; point at an msprobe step{{N}}/rank{{R}} folder or its root") from None
    except json.JSONDecodeError as e:
        raise DumpError(f"{file} is not valid JSON ({e.msg} at line {e.lineno}, column {e.colno}): it is truncated "
                        f"or damaged; dump the step again") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("data"), dict):
        raise DumpError(f"{file} has no 'data' object: not an msprobe dump.json")
    task = raw.get("task")
    if task not in ("statistics", "tensor"):
        raise DumpError(
            f"{file}: msprobe task '{task}' holds no tensor values to compare; dump with task statistics or tensor"
        )
    records: list[dict[str, Any]] = []
    earlier = _earlier_gradient_sums(raw["data"])
    for entry, body in raw["data"].items():
        if isinstance(body, dict) and entry not in earlier:
            for name, module, kind, info in _tensors(entry, body):
                records.append(_record(len(records), name, module, kind, info, task == "tensor"))
    ours = raw.get(META_KEY) or {}
    step, rank = re.fullmatch(r"step(\d+)", path.parent.name), re.fullmatch(r"rank(\d+)", path.name)
    # outside a process group msprobe names the folder proc<PID>: the only rank
    meta = {"step": int(step[1]) if step else None, "rank": int(rank[1]) if rank else 0, **ours,
            "mode": task, "format": "msprobe", "framework": raw.get("framework"), "level": raw.get("level"),
            "tensors": len(records)}
    return Dump(path, meta, records)
