"""Megatron-compatible indexed token shards (``.bin`` + ``.idx``, the "MMIDIDX" layout).

The on-disk format is byte-for-byte the one of Megatron-LM's
``megatron/core/datasets/indexed_dataset.py`` so shards can be exchanged with Megatron tooling.
All values are little-endian. The ``.idx`` file holds::

    9 bytes   magic b"MMIDIDX\\x00\\x00"
    <Q        version (1)
    <B        dtype code (see DType)
    <Q        sequence count N
    <Q        document count D (= len(document_indices))
    int32[N]  sequence lengths, in tokens
    int64[N]  sequence pointers, byte offset of each sequence in .bin
    int64[D]  document indices: 0, then the running sequence count after each document

The ``.bin`` file is the raw concatenation of every sequence's tokens in the shard dtype.
The writer stores one sequence per document, so N sequences == N documents and
``document_indices == [0, 1, ..., N]``.

This module is framework-free on purpose: data preparation and loading must work without
MindSpore or PyTorch installed.
"""

from __future__ import annotations

import dataclasses
import enum
import struct
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from mindfoundry.errors import MindFoundryError, describe_path

__all__ = [
    "DType",
    "IndexedDataset",
    "ShardError",
    "ShardInfo",
    "dtype_for_vocab",
    "index_sections",
    "shard_paths",
    "verify_tokens",
]

_MAGIC = b"MMIDIDX\x00\x00"
_VERSION = 1
# magic, version, dtype code, sequence count, document count; "<" means no padding (34 bytes).
_HEADER = struct.Struct("<9sQBQQ")
_LENGTH_DTYPE = np.dtype("<i4")
_POINTER_DTYPE = np.dtype("<i8")
# Megatron switches to int32 tokens at this vocab size (it keeps a little headroom below 2**16).
_UINT16_VOCAB_LIMIT = 65500
# Index entries read per step while a shard is validated on open (1-2 MB).
_VALIDATE_CHUNK = 1 << 18
# Tokens scanned per step by verify_tokens: 1M tokens (2-4 MB) keeps the scan's memory bounded.
_VERIFY_CHUNK_TOKENS = 1 << 20
_REMEDY = "Re-run `mindfoundry prepare` to rebuild this shard."


class ShardError(MindFoundryError, ValueError):
    """A shard on disk is missing, truncated, corrupted or holds tokens outside the vocab."""


def _shard_error(path: Path, problem: str) -> ShardError:
    """Build a ShardError that names the file, the problem and how to fix it."""
    return ShardError(f"{path}: {problem}. {_REMEDY}")


class DType(enum.IntEnum):
    """Megatron's dtype codes, as stored in the ``.idx`` header."""

    UINT8 = 1
    INT8 = 2
    INT16 = 3
    INT32 = 4
    INT64 = 5
    FLOAT64 = 6
    FLOAT32 = 7
    UINT16 = 8

    def to_numpy(self) -> np.dtype[Any]:
        """The explicit little-endian numpy dtype, so files read the same on any host."""
        return np.dtype(_NUMPY_BY_CODE[self])

    @classmethod
    def from_numpy(cls, dtype: npt.DTypeLike) -> DType:
        """Map a numpy dtype (any byte order) to its Megatron code."""
        dt = np.dtype(dtype)
        try:
            return _CODE_BY_KIND[(dt.kind, dt.itemsize)]
        except KeyError:
            supported = ", ".join(np.dtype(s).name for s in _NUMPY_BY_CODE.values())
            raise ValueError(f"dtype {dt} has no Megatron code; supported: {supported}") from None


_NUMPY_BY_CODE: dict[DType, str] = {
    DType.UINT8: "u1",
    DType.INT8: "i1",
    DType.INT16: "<i2",
    DType.INT32: "<i4",
    DType.INT64: "<i8",
    DType.FLOAT64: "<f8",
    DType.FLOAT32: "<f4",
    DType.UINT16: "<u2",
}
# Keyed by (kind, itemsize) rather than dtype equality so big-endian dtypes map too.
_CODE_BY_KIND: dict[tuple[str, int], DType] = {
    (np.dtype(s).kind, np.dtype(s).itemsize): code for code, s in _NUMPY_BY_CODE.items()
}


def dtype_for_vocab(vocab_size: int) -> np.dtype[Any]:
    """Smallest token dtype for a vocab, using Megatron's rule (uint16 below 65500, else int32)."""
    if vocab_size <= 0:
        raise ValueError(f"vocab_size must be positive, got {vocab_size}")
    code = DType.UINT16 if vocab_size < _UINT16_VOCAB_LIMIT else DType.INT32
    return code.to_numpy()


def shard_paths(path_prefix: str | Path) -> tuple[Path, Path]:
    """``prefix.bin`` and ``prefix.idx``; suffixes are appended, since prefixes may contain dots."""
    prefix = str(path_prefix)
    return Path(prefix + ".bin"), Path(prefix + ".idx")


@dataclasses.dataclass(frozen=True)
class ShardInfo:
    """Summary of a finalized shard, recorded in manifests to detect stale or altered shards."""

    path_prefix: str
    num_documents: int
    num_tokens: int
    dtype: str
    bin_sha256: str
    idx_sha256: str

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON representation."""
        return dataclasses.asdict(self)


def index_sections(dtype: npt.DTypeLike, parts: Sequence[np.ndarray]) -> Iterator[bytes]:
    """The ``.idx`` of a shard whose sequences have the lengths in ``parts`` (arrays, in order), as its bytes: the
    header, then every part's lengths, every part's pointers, the document indices. One part's arrays are in
    memory at a time, so a shard of parts is indexed without holding all its lengths
    (:mod:`mindfoundry.data.dataset.shard_writer` writes both with it)."""
    dtype = np.dtype(dtype)
    count = sum(len(lengths) for lengths in parts)
    yield _HEADER.pack(_MAGIC, _VERSION, int(DType.from_numpy(dtype)), count, count + 1)
    for lengths in parts:
        yield np.asarray(lengths).astype(_LENGTH_DTYPE).tobytes()
    offset = 0
    for lengths in parts:
        sizes = np.asarray(lengths, dtype=np.int64)
        pointers = np.zeros(sizes.size, dtype=np.int64)
        np.cumsum(sizes[:-1], out=pointers[1:])
        yield ((pointers + offset) * dtype.itemsize).astype(_POINTER_DTYPE).tobytes()
        offset += int(sizes.sum())
    for start in range(0, count + 1, _VALIDATE_CHUNK):  # the writer stores one sequence per document: 0, 1, ..., N
        yield np.arange(start, min(start + _VALIDATE_CHUNK, count + 1), dtype=_POINTER_DTYPE).tobytes()


class IndexedDataset:
    """Read-only, memory-mapped view of a shard, validated on open.

    Indexing is by sequence, as in Megatron; shards from IndexedDatasetWriter hold one sequence
    per document, so ``len(ds)`` is the document count. Returned arrays are read-only views
    into the mapped ``.bin`` file, so opening even a very large shard costs almost no memory.
    """

    def __init__(self, path_prefix: str | Path) -> None:
        self._prefix = str(path_prefix)
        self._bin_path, self._idx_path = shard_paths(path_prefix)
        for path in (self._idx_path, self._bin_path):
            if not path.is_file():
                kind = describe_path(path)
                raise _shard_error(path, "file is missing" if kind == "missing" else f"is {kind}, not a file")
        self._code, num_sequences, num_doc_indices = self._read_header()
        self._dtype = self._code.to_numpy()
        self._idx_map = np.memmap(self._idx_path, dtype=np.uint8, mode="r")
        self._lengths, self._pointers, self._document_indices = self._index_arrays(
            num_sequences, num_doc_indices
        )
        self._num_tokens = self._validate_lengths()
        self._validate_bin_size()
        self._validate_pointers()
        self._validate_document_indices()
        self._tokens = self._map_tokens()

    def _read_header(self) -> tuple[DType, int, int]:
        with open(self._idx_path, "rb") as f:
            raw = f.read(_HEADER.size)
        if len(raw) < _HEADER.size:
            raise _shard_error(
                self._idx_path,
                f"truncated: {len(raw)} bytes, shorter than the {_HEADER.size}-byte header",
            )
        magic, version, code, num_sequences, num_doc_indices = _HEADER.unpack(raw)
        if magic != _MAGIC:
            raise _shard_error(
                self._idx_path, f"bad magic {magic!r} (expected {_MAGIC!r}); not an MMIDIDX index"
            )
        if version != _VERSION:
            raise _shard_error(
                self._idx_path, f"unsupported index version {version} (expected {_VERSION})"
            )
        try:
            dtype_code = DType(code)
        except ValueError:
            raise _shard_error(self._idx_path, f"unknown dtype code {code}") from None
        return dtype_code, num_sequences, num_doc_indices

    def _index_arrays(
        self, num_sequences: int, num_doc_indices: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Slice the three index arrays out of the mapped ``.idx`` after checking its size."""
        pointers_at = _HEADER.size + num_sequences * _LENGTH_DTYPE.itemsize
        doc_indices_at = pointers_at + num_sequences * _POINTER_DTYPE.itemsize
        expected = doc_indices_at + num_doc_indices * _POINTER_DTYPE.itemsize
        actual = self._idx_map.size
        if actual != expected:
            state = "truncated" if actual < expected else "has trailing bytes"
            raise _shard_error(
                self._idx_path,
                f"{state}: {actual} bytes but the header ({num_sequences} sequences, "
                f"{num_doc_indices} document indices) implies {expected}",
            )
        buf = self._idx_map
        lengths = np.frombuffer(buf, _LENGTH_DTYPE, num_sequences, _HEADER.size)
        pointers = np.frombuffer(buf, _POINTER_DTYPE, num_sequences, pointers_at)
        doc_indices = np.frombuffer(buf, _POINTER_DTYPE, num_doc_indices, doc_indices_at)
        return lengths, pointers, doc_indices

    def _chunks(self, array: np.ndarray) -> Iterator[tuple[int, np.ndarray]]:
        """``(start, entries)`` of one of the index arrays, read from the file :data:`_VALIDATE_CHUNK` entries at a
        time: a scan of the memory map would leave every page it touched resident, so checking a shard's index
        would hold memory in proportion to its documents."""
        offset = array.ctypes.data - self._idx_map.ctypes.data
        with open(self._idx_path, "rb") as f:
            f.seek(offset)
            for start in range(0, array.size, _VALIDATE_CHUNK):
                yield start, np.fromfile(f, dtype=array.dtype, count=min(_VALIDATE_CHUNK, array.size - start))

    def _validate_lengths(self) -> int:
        """No sequence length is negative; return the token count."""
        total = 0
        for _, lengths in self._chunks(self._lengths):
            if lengths.size and int(lengths.min()) < 0:
                raise _shard_error(self._idx_path, "corrupted: negative sequence length")
            total += int(lengths.sum(dtype=np.int64))
        return total

    def _validate_bin_size(self) -> None:
        expected = self._num_tokens * self._dtype.itemsize
        actual = self._bin_path.stat().st_size
        if actual != expected:
            state = "truncated" if actual < expected else "larger than its index implies"
            raise _shard_error(
                self._bin_path,
                f"{state}: {actual} bytes but {self._idx_path.name} lists {self._num_tokens} "
                f"{self._dtype.name} tokens ({expected} bytes)",
            )

    def _validate_pointers(self) -> None:
        offset = 0
        for (start, lengths), (_, pointers) in zip(
            self._chunks(self._lengths), self._chunks(self._pointers), strict=True
        ):
            expected = np.empty(lengths.size, dtype=np.int64)
            expected[:1] = offset
            np.cumsum(lengths[:-1], dtype=np.int64, out=expected[1:])
            expected[1:] += offset
            expected *= self._dtype.itemsize
            if not np.array_equal(pointers, expected):
                first = int(np.argmax(pointers != expected))
                raise _shard_error(
                    self._idx_path,
                    f"corrupted: sequence pointer {start + first} is {int(pointers[first])}, "
                    f"expected {int(expected[first])} from the sequence lengths",
                )
            offset += int(lengths.sum(dtype=np.int64))

    def _validate_document_indices(self) -> None:
        num_sequences = self._lengths.size
        last = None
        for start, doc in self._chunks(self._document_indices):
            if start == 0 and int(doc[0]) != 0:
                raise _shard_error(self._idx_path, "corrupted: document indices do not start at 0")
            if bool((np.diff(doc) < 0).any()) or (last is not None and int(doc[0]) < last):
                raise _shard_error(
                    self._idx_path, "corrupted: document indices are not monotonically increasing"
                )
            last = int(doc[-1])
        if last is None:
            raise _shard_error(self._idx_path, "corrupted: document indices do not start at 0")
        if last != num_sequences:
            raise _shard_error(
                self._idx_path,
                f"corrupted: last document index is {last}, expected the sequence count {num_sequences}",
            )

    def _map_tokens(self) -> np.ndarray:
        # mmap cannot map an empty file; an empty shard simply has no tokens.
        if self._num_tokens == 0:
            return np.empty(0, dtype=self._dtype)
        return np.memmap(self._bin_path, dtype=self._dtype, mode="r", shape=(self._num_tokens,))

    @property
    def path_prefix(self) -> str:
        return self._prefix

    @property
    def bin_path(self) -> Path:
        return self._bin_path

    @property
    def idx_path(self) -> Path:
        return self._idx_path

    @property
    def dtype(self) -> np.dtype[Any]:
        return self._dtype

    @property
    def num_tokens(self) -> int:
        return self._num_tokens

    @property
    def sequence_lengths(self) -> np.ndarray:
        return self._lengths

    @property
    def sequence_pointers(self) -> np.ndarray:
        return self._pointers

    def tokens(self) -> np.ndarray:
        """All tokens of the shard as one flat read-only view of ``.bin``."""
        return self._tokens

    def __len__(self) -> int:
        return int(self._lengths.size)

    def __getitem__(self, i: int) -> np.ndarray:
        """Tokens of sequence ``i`` (0 <= i < len), as a view without copying."""
        if not 0 <= i < len(self):
            raise IndexError(f"sequence index {i} out of range for {len(self)} sequences")
        start = int(self._pointers[i]) // self._dtype.itemsize
        return self._tokens[start : start + int(self._lengths[i])]


def verify_tokens(ds: IndexedDataset, vocab_size: int) -> None:
    """Check every token id lies in ``[0, vocab_size)``, chunk by chunk to bound memory.

    An out-of-range id would otherwise only surface as an embedding lookup failure (or silent
    garbage on some backends) deep inside training.
    """
    if vocab_size <= 0:
        raise ValueError(f"vocab_size must be positive, got {vocab_size}")
    if ds.num_tokens == 0:
        return
    lo, hi = _token_range(ds)
    if lo < 0:
        raise ShardError(
            f"{ds.bin_path}: negative token id {lo} found (vocab size {vocab_size}). "
            f"The shard is corrupted or was written with the wrong dtype. {_REMEDY}"
        )
    if hi >= vocab_size:
        raise ShardError(
            f"{ds.bin_path}: max token id {hi} found but the vocab size is {vocab_size}. "
            f"The shard was tokenized with a different tokenizer. {_REMEDY}"
        )


def _token_range(ds: IndexedDataset) -> tuple[int, int]:
    """Min and max token id, read from the ``.bin`` ``_VERIFY_CHUNK_TOKENS`` tokens at a time (file reads, not the
    memory map: scanned pages of a map stay resident, so a check of every token would grow with the shard)."""
    lo, hi = None, None
    with open(ds.bin_path, "rb") as fh:
        for start in range(0, ds.num_tokens, _VERIFY_CHUNK_TOKENS):
            chunk = np.fromfile(fh, dtype=ds.dtype, count=min(_VERIFY_CHUNK_TOKENS, ds.num_tokens - start))
            lo = int(chunk.min()) if lo is None else min(lo, int(chunk.min()))
            hi = int(chunk.max()) if hi is None else max(hi, int(chunk.max()))
    assert lo is not None and hi is not None
    return lo, hi
