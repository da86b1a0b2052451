"""Whether a .safetensors file's header tells the truth about its bytes, read without loading a tensor.

A checksum proves a file is the one the manifest sealed, not that the file is sound: a header that claims
2^62 bytes of JSON, or a tensor of shape 2^40, resealed into the manifest, passed ``ckpt verify`` and failed
``train --resume`` with no fallback. The format (safetensors: an 8-byte little-endian header length, a JSON
header, then the tensors' bytes) is checked here: the header fits in the file, every entry has a known dtype,
a shape of non-negative integers and offsets inside the data whose span equals the shape's bytes, and the
entries cover the data without overlapping.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

from mindfoundry.errors import MindFoundryError

#: Bytes per element of each dtype safetensors writes.
ITEMSIZE = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "U16": 2, "I16": 2, "F16": 2, "BF16": 2,
            "U32": 4, "I32": 4, "F32": 4, "U64": 8, "I64": 8, "F64": 8}
#: The largest header accepted (a checkpoint's header is a few KB per thousand tensors).
MAX_HEADER_BYTES = 100 << 20


class SafetensorsHeaderError(MindFoundryError, ValueError):
    """A .safetensors file whose header does not describe its bytes."""


def check_safetensors(path: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Each tensor's dtype and shape from ``path``'s header, after checking the header against the file size;
    SafetensorsHeaderError naming the file and the lie otherwise."""
    size = path.stat().st_size
    with open(path, "rb") as fh:
        head = fh.read(8)
        if len(head) < 8:
            raise SafetensorsHeaderError(f"{path}: {size} bytes, shorter than a safetensors header length")
        (length,) = struct.unpack("<Q", head)
        if length > min(size - 8, MAX_HEADER_BYTES):
            raise SafetensorsHeaderError(f"{path}: its header claims {length:,} bytes in a file of {size:,}")
        try:
            header = json.loads(fh.read(length))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise SafetensorsHeaderError(f"{path}: its header is not JSON ({exc})") from None
    if not isinstance(header, dict):
        raise SafetensorsHeaderError(f"{path}: its header is not a mapping of tensors")
    data = size - 8 - length
    spans, out = [], {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        out[name] = _entry(path, name, entry, data)
        spans.append(tuple(entry["data_offsets"]))
    covered = 0
    for begin, end in sorted(spans):
        if begin != covered:
            raise SafetensorsHeaderError(
                f"{path}: tensor data at byte {begin:,} {'overlaps' if begin < covered else 'leaves a gap after'} "
                f"byte {covered:,}"
            )
        covered = end
    if covered != data:
        raise SafetensorsHeaderError(f"{path}: its tensors describe {covered:,} bytes of data, the file holds {data:,}")
    return out


def _entry(path: Path, name: str, entry: object, data: int) -> tuple[str, tuple[int, ...]]:
    """One header entry's dtype and shape, checked."""
    if not isinstance(entry, dict):
        raise SafetensorsHeaderError(f"{path}: tensor {name!r} has no dtype/shape/offsets entry")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if dtype not in ITEMSIZE:
        raise SafetensorsHeaderError(f"{path}: tensor {name!r} has unknown dtype {str(dtype)[:20]!r}")
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise SafetensorsHeaderError(f"{path}: tensor {name!r} has shape {str(shape)[:60]}, not a list of sizes")
    if (not isinstance(offsets, list) or len(offsets) != 2 or not all(isinstance(o, int) for o in offsets)
            or not 0 <= offsets[0] <= offsets[1] <= data):
        raise SafetensorsHeaderError(f"{path}: tensor {name!r} has offsets {str(offsets)[:60]} outside the file's "
                                     f"{data:,} bytes of data")
    if offsets[1] - offsets[0] != math.prod(shape) * ITEMSIZE[dtype]:
        raise SafetensorsHeaderError(
            f"{path}: tensor {name!r} of shape {shape} and dtype {dtype} needs "
            f"{math.prod(shape) * ITEMSIZE[dtype]:,} bytes, its offsets span {offsets[1] - offsets[0]:,}"
        )
    return dtype, tuple(shape)
