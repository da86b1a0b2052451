"""One tensor in PyTorch's `torch.save` file format, read and written without torch.

msprobe's PyTorch dumps keep each tensor as a `.pt` file and its comparison loads the bench side's
tensors with `torch.load`; precision tools that judge dumps (ours included) must not need the
training framework installed, and must not run the arbitrary code an unrestricted unpickler would
execute from a file someone sent. So both directions are written here against the format itself:

    ARCHIVE/data.pkl      pickle: torch._utils._rebuild_tensor_v2(storage, offset, size, stride, ...)
    ARCHIVE/data/0        the storage's raw little-endian bytes
    ARCHIVE/version       format version ("3")
    ARCHIVE/byteorder     "little"

The reader resolves only the globals a saved tensor needs (the rebuild function, typed storage
classes, OrderedDict) and refuses everything else.
"""

from __future__ import annotations

import io
import pickle
import struct
import zipfile
from collections import OrderedDict
from pathlib import Path

import numpy as np

# torch storage class <-> numpy dtype; bfloat16 has no numpy type and is widened to float32 on read
STORAGES = {
    "DoubleStorage": np.float64, "FloatStorage": np.float32, "HalfStorage": np.float16,
    "LongStorage": np.int64, "IntStorage": np.int32, "ShortStorage": np.int16, "CharStorage": np.int8,
    "ByteStorage": np.uint8, "BoolStorage": np.bool_, "BFloat16Storage": np.uint16,
}
_STORAGE_OF = {np.dtype(v): k for k, v in STORAGES.items() if k != "BFloat16Storage"}


class TorchFileError(ValueError):
    """A `.pt` file that is not a single saved tensor."""


class _Storage:
    def __init__(self, kind: str, data: bytes):
        self.kind, self.data = kind, data


def _rebuild_tensor(storage: _Storage, offset: int, size, stride, *_ignored) -> np.ndarray:
    flat = np.frombuffer(storage.data, dtype=STORAGES[storage.kind])
    if storage.kind == "BFloat16Storage":  # bf16 is the top half of a float32
        flat = (flat.astype(np.uint32) << 16).view(np.float32)
    item = flat.itemsize
    view = np.lib.stride_tricks.as_strided(flat[offset:], shape=tuple(size), strides=tuple(s * item for s in stride))
    return np.array(view)  # a contiguous copy, detached from the zip member's bytes


class _Unpickler(pickle.Unpickler):
    def __init__(self, data: bytes, archive: zipfile.ZipFile, prefix: str):
        super().__init__(io.BytesIO(data))
        self.archive, self.prefix = archive, prefix

    def find_class(self, module: str, name: str):
        if (module, name) in (("torch._utils", "_rebuild_tensor_v2"), ("torch._utils", "_rebuild_tensor")):
            return _rebuild_tensor
        if module == "torch" and name in STORAGES:
            return name
        if (module, name) == ("collections", "OrderedDict"):
            return OrderedDict
        raise TorchFileError(f"refusing {module}.{name}: a dumped .pt file holds one tensor, nothing else")

    def persistent_load(self, pid):
        kind, storage, key = pid[0], pid[1], pid[2]
        if kind != "storage" or storage not in STORAGES:
            raise TorchFileError(f"unsupported storage {pid[:2]}")
        return _Storage(storage, self.archive.read(f"{self.prefix}/data/{key}"))


def read_pt(path: Path) -> np.ndarray:
    """The tensor a `torch.save(tensor, path)` file holds, as a numpy array (bf16 widened to float32)."""
    try:
        with zipfile.ZipFile(path) as archive:
            pickles = [n for n in archive.namelist() if n.endswith("/data.pkl")]
            if len(pickles) != 1:
                raise TorchFileError(f"{path}: not a torch.save file (found {len(pickles)} data.pkl records)")
            prefix = pickles[0][: -len("/data.pkl")]
            value = _Unpickler(archive.read(pickles[0]), archive, prefix).load()
    except (zipfile.BadZipFile, pickle.UnpicklingError, EOFError, KeyError) as e:
        raise TorchFileError(f"{path}: not a readable torch.save file ({e})") from None
    if not isinstance(value, np.ndarray):
        raise TorchFileError(f"{path}: holds a {type(value).__name__}, not one tensor")
    return value


def _string(s: str) -> bytes:
    b = s.encode("utf-8")
    return b"X" + struct.pack("<I", len(b)) + b  # BINUNICODE


def _int(i: int) -> bytes:
    return b"J" + struct.pack("<i", i)  # BININT


def _ints(values) -> bytes:
    return b"(" + b"".join(_int(v) for v in values) + b"t"  # MARK ... TUPLE


def _tensor_pickle(storage: str, shape: tuple[int, ...], numel: int) -> bytes:
    """Protocol-2 opcodes for `_rebuild_tensor_v2(storage, 0, shape, contiguous stride, False, OrderedDict())`."""
    stride, acc = [], 1
    for dim in reversed(shape):
        stride.insert(0, acc)
        acc *= dim
    pid = (
        b"("
        + _string("storage")
        + b"ctorch\n"
        + storage.encode()
        + b"\n"
        + _string("0")
        + _string("cpu")
        + _int(numel)
        + b"tQ"
    )
    return (b"\x80\x02ctorch._utils\n_rebuild_tensor_v2\n(" + pid + _int(0) + _ints(shape) + _ints(stride)
            + b"\x89ccollections\nOrderedDict\n)Rt" + b"R.")


def write_pt(path: Path, array: np.ndarray) -> None:
    """Save `array` as `torch.save(torch.from_numpy(array), path)` would (opens with `torch.load`, weights_only too)."""
    a = np.asarray(array)
    if not a.flags.c_contiguous:  # (np.ascontiguousarray would turn a 0-d tensor into 1-d)
        a = a.copy(order="C")
    if a.dtype.byteorder == ">":
        a = a.astype(a.dtype.newbyteorder("<"))
    storage = _STORAGE_OF.get(np.dtype(a.dtype.type))
    if storage is None:
        raise TorchFileError(f"no torch storage for dtype {a.dtype}")
    archive = Path(path).stem or "archive"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr(f"{archive}/data.pkl", _tensor_pickle(storage, a.shape, a.size))
        z.writestr(f"{archive}/byteorder", "little")
        z.writestr(f"{archive}/data/0", a.tobytes())
        z.writestr(f"{archive}/version", "3\n")
