"""Writing Megatron shards (the layout: :mod:`.indexed`): a document at a time, or by concatenating shards.

Both write the ``.bin`` as they go and the ``.idx`` from :func:`~mindfoundry.data.dataset.indexed.index_sections`,
so a shard made of parts is byte for byte the shard one writer given every document makes.
"""

from __future__ import annotations

import hashlib
import os
from array import array
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import BinaryIO

import numpy as np
import numpy.typing as npt

from mindfoundry import atomic
from mindfoundry.data.dataset.indexed import DType, IndexedDataset, ShardInfo, index_sections, shard_paths
from mindfoundry.errors import OutputExistsError

#: The index stores sequence lengths as int32.
_INT32_MAX = int(np.iinfo(np.int32).max)


class IndexedDatasetWriter:
    """Streams documents into a new shard; the shard only appears once ``finalize`` succeeds.

    Tokens go to ``.bin.tmp`` as documents arrive (only per-document lengths stay in memory),
    the index is written to ``.idx.tmp`` at the end, and both are renamed into place last, the
    ``.idx`` after the ``.bin``. A crash therefore never leaves a complete-looking shard.
    Used as a context manager, the shard is finalized on normal exit (unless ``finalize`` was
    already called inside the block to obtain the ShardInfo) and the temporary files are
    removed if the block raises.
    """

    def __init__(
        self, path_prefix: str | Path, dtype: npt.DTypeLike, *, overwrite: bool = False
    ) -> None:
        self._prefix = str(path_prefix)
        self._code = DType.from_numpy(dtype)
        self._dtype = self._code.to_numpy()
        if self._dtype.kind not in "iu":
            raise ValueError(f"token shards need an integer dtype, got {self._dtype.name}")
        self._bin_path, self._idx_path = shard_paths(path_prefix)
        self._bin_tmp = Path(f"{self._bin_path}.tmp")
        self._idx_tmp = Path(f"{self._idx_path}.tmp")
        self._overwrite = overwrite
        self._refuse_existing()
        self._bin_path.parent.mkdir(parents=True, exist_ok=True)
        self._lengths = array("q")
        self._num_tokens = 0
        self._bin_hash = hashlib.sha256()
        # Stays open across add_document calls; None once finalized or aborted.
        self._bin_file: BinaryIO | None = open(self._bin_tmp, "wb")

    def _refuse_existing(self) -> None:
        """Protect finished shards from being clobbered by an accidental re-run."""
        existing = [p for p in (self._bin_path, self._idx_path) if p.exists()]
        if existing and not self._overwrite:
            names = ", ".join(str(p) for p in existing)
            raise OutputExistsError(
                f"shard already exists ({names}); pass overwrite=True to replace it"
            )

    def add_document(self, tokens: np.ndarray | Sequence[int]) -> None:
        """Append one document (a 1-D sequence of token ids, normally ending with EOS)."""
        if self._bin_file is None:
            raise RuntimeError(f"writer for {self._prefix} is already finalized or aborted")
        data = np.ascontiguousarray(self._checked_tokens(tokens))
        if data.size > _INT32_MAX:
            raise ValueError(
                f"document has {data.size} tokens; the index stores lengths as int32 "
                f"(max {_INT32_MAX}); split the document"
            )
        self._bin_file.write(data.data)
        self._bin_hash.update(data.data)
        self._lengths.append(data.size)
        self._num_tokens += data.size

    def _checked_tokens(self, tokens: np.ndarray | Sequence[int]) -> np.ndarray:
        """Cast to the shard dtype, refusing anything the cast would silently change."""
        arr = np.asarray(tokens)
        if arr.ndim != 1:
            raise ValueError(f"a document must be a 1-D token sequence, got shape {arr.shape}")
        if arr.size == 0:
            return np.empty(0, dtype=self._dtype)
        if arr.dtype.kind not in "biu":
            raise TypeError(f"token ids must be integers, got dtype {arr.dtype}")
        info = np.iinfo(self._dtype)
        out_of_range = (arr < info.min) | (arr > info.max)
        if out_of_range.any():
            value = arr[np.argmax(out_of_range)]
            raise ValueError(
                f"token id {value} does not fit the shard dtype {self._dtype.name} "
                f"(range {info.min}..{info.max}); use a wider dtype (see dtype_for_vocab)"
            )
        return arr.astype(self._dtype, copy=False)

    def finalize(self) -> ShardInfo:
        """Write the index, make both files durable and rename them into place."""
        if self._bin_file is None:
            raise RuntimeError(f"writer for {self._prefix} is already finalized or aborted")
        try:
            _close_durably(self._bin_file)
            self._bin_file = None
            idx_sha256 = self._write_index()
            self._refuse_existing()
            atomic.publish_files([(self._bin_tmp, self._bin_path), (self._idx_tmp, self._idx_path)])
        except BaseException:
            self.abort()
            raise
        return ShardInfo(
            path_prefix=self._prefix,
            num_documents=len(self._lengths),
            num_tokens=self._num_tokens,
            dtype=self._dtype.name,
            bin_sha256=self._bin_hash.hexdigest(),
            idx_sha256=idx_sha256,
        )

    def _write_index(self) -> str:
        """Write ``.idx.tmp`` and return its sha256."""
        return _write_durably(
            self._idx_tmp, index_sections(self._dtype, [np.frombuffer(self._lengths, dtype=np.int64)])
        )

    def abort(self) -> None:
        """Discard everything written so far; no shard files are left behind."""
        if self._bin_file is not None:
            self._bin_file.close()
            self._bin_file = None
        self._bin_tmp.unlink(missing_ok=True)
        self._idx_tmp.unlink(missing_ok=True)

    def __enter__(self) -> IndexedDatasetWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is not None:
            self.abort()
        elif self._bin_file is not None:
            self.finalize()


def _close_durably(f: BinaryIO) -> None:
    """Flush and fsync before closing, so the later rename never exposes unwritten data."""
    f.flush()
    os.fsync(f.fileno())
    f.close()


def _write_durably(path: Path, sections: Iterable[bytes]) -> str:
    """Write ``sections`` to ``path``, fsync it; its sha256."""
    digest = hashlib.sha256()
    with open(path, "wb") as f:
        for part in sections:
            f.write(part)
            digest.update(part)
        f.flush()
        os.fsync(f.fileno())
    return digest.hexdigest()


def concatenate_shards(parts: Sequence[str | Path], path_prefix: str | Path) -> ShardInfo:
    """One shard holding the documents of the shards ``parts`` (path prefixes), in order.

    The ``.bin`` files are concatenated and the ``.idx`` written section by section (all lengths, then all
    pointers, then the document indices), one part at a time, so memory holds one part's index, not the
    whole shard's; the result is byte for byte what one writer given every document would write.
    """
    if not parts:
        raise ValueError("no shard to concatenate")
    bin_path, idx_path = shard_paths(path_prefix)
    bin_path.parent.mkdir(parents=True, exist_ok=True)
    shards = [IndexedDataset(prefix) for prefix in parts]
    dtypes = {ds.dtype for ds in shards}
    if len(dtypes) != 1:
        raise ValueError(f"shards of different dtypes cannot be concatenated: {sorted(d.name for d in dtypes)}")
    dtype = shards[0].dtype
    bin_sha256 = _write_durably(bin_path, (chunk for ds in shards for chunk in _chunks(ds.bin_path)))
    idx_sha256 = _write_durably(idx_path, index_sections(dtype, [ds.sequence_lengths for ds in shards]))
    return ShardInfo(path_prefix=str(path_prefix), num_documents=sum(len(ds) for ds in shards),
                     num_tokens=sum(ds.num_tokens for ds in shards), dtype=dtype.name, bin_sha256=bin_sha256,
                     idx_sha256=idx_sha256)


def _chunks(path: Path, size: int = 1 << 22) -> Iterator[bytes]:
    with open(path, "rb") as f:
        while chunk := f.read(size):
            yield chunk
