"""Tests for the Megatron-compatible indexed shard format."""

from __future__ import annotations

import hashlib
import struct
from pathlib import Path

import numpy as np
import pytest

from mindfoundry.data.dataset.indexed import DType, IndexedDataset, ShardError, dtype_for_vocab, verify_tokens
from mindfoundry.data.dataset.shard_writer import IndexedDatasetWriter


def _random_documents(vocab: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    docs = [rng.integers(0, vocab, size=int(n)) for n in rng.integers(2, 50, size=20)]
    docs.insert(3, np.array([], dtype=np.int64))
    docs.insert(7, np.array([vocab - 1]))
    return docs


def _write(prefix: Path, docs: list[np.ndarray], dtype: np.dtype) -> None:
    with IndexedDatasetWriter(prefix, dtype) as writer:
        for doc in docs:
            writer.add_document(doc)


@pytest.mark.parametrize(("dtype", "vocab"), [(np.uint16, 65_000), (np.int32, 200_000)])
def test_round_trip(tmp_path: Path, dtype: type, vocab: int) -> None:
    docs = _random_documents(vocab)
    prefix = tmp_path / "shard"
    writer = IndexedDatasetWriter(prefix, dtype)
    for doc in docs:
        writer.add_document(doc)
    info = writer.finalize()

    total = sum(len(d) for d in docs)
    assert info.num_documents == len(docs)
    assert info.num_tokens == total
    assert info.dtype == np.dtype(dtype).name
    assert info.to_dict()["path_prefix"] == str(prefix)

    ds = IndexedDataset(prefix)
    assert len(ds) == len(docs)
    assert ds.num_tokens == total
    assert ds.dtype == np.dtype(dtype)
    for i, doc in enumerate(docs):
        assert ds[i].dtype == np.dtype(dtype)
        np.testing.assert_array_equal(ds[i], doc)
    assert len(ds[3]) == 0
    np.testing.assert_array_equal(ds[7], [vocab - 1])
    np.testing.assert_array_equal(ds.tokens(), np.concatenate(docs))
    assert not ds[0].flags.owndata  # a view into the mapped .bin, not a copy
    with pytest.raises(IndexError):
        ds[len(docs)]


@pytest.mark.parametrize(("dtype", "code", "itemsize"), [(np.uint16, 8, 2), (np.int32, 4, 4)])
def test_header_is_megatron_layout(tmp_path: Path, dtype: type, code: int, itemsize: int) -> None:
    docs = [[5, 6, 7], [], [8], [9, 10]]
    prefix = tmp_path / "shard"
    with IndexedDatasetWriter(prefix, dtype) as writer:
        for doc in docs:
            writer.add_document(doc)

    raw = (tmp_path / "shard.idx").read_bytes()
    assert raw[:9] == b"MMIDIDX\x00\x00"
    (version,) = struct.unpack_from("<Q", raw, 9)
    (dtype_code,) = struct.unpack_from("<B", raw, 17)
    num_sequences, num_doc_indices = struct.unpack_from("<QQ", raw, 18)
    assert (version, dtype_code, num_sequences, num_doc_indices) == (1, code, 4, 5)
    offset = 34
    lengths = struct.unpack_from("<4i", raw, offset)
    pointers = struct.unpack_from("<4q", raw, offset + 16)
    doc_indices = struct.unpack_from("<5q", raw, offset + 16 + 32)
    assert lengths == (3, 0, 1, 2)
    assert pointers == (0, 3 * itemsize, 3 * itemsize, 4 * itemsize)
    assert doc_indices == (0, 1, 2, 3, 4)
    assert len(raw) == offset + 16 + 32 + 40

    little_endian = np.dtype(dtype).newbyteorder("<")
    expected_bin = np.array([5, 6, 7, 8, 9, 10], dtype=little_endian).tobytes()
    assert (tmp_path / "shard.bin").read_bytes() == expected_bin


def test_dtype_codes() -> None:
    assert DType.from_numpy(np.uint16) is DType.UINT16
    assert DType.from_numpy(">i4") is DType.INT32
    assert DType.INT64.to_numpy() == np.int64
    with pytest.raises(ValueError, match="no Megatron code"):
        DType.from_numpy(np.uint32)


def test_dtype_for_vocab() -> None:
    assert dtype_for_vocab(65_499) == np.uint16
    assert dtype_for_vocab(65_500) == np.int32
    with pytest.raises(ValueError):
        dtype_for_vocab(0)


def test_writer_rejects_tokens_that_do_not_fit(tmp_path: Path) -> None:
    with IndexedDatasetWriter(tmp_path / "a", np.uint16) as writer:
        with pytest.raises(ValueError, match=r"token id 70000 .*uint16"):
            writer.add_document([1, 70_000])
        with pytest.raises(ValueError, match=r"token id -1 .*uint16"):
            writer.add_document([-1])
        with pytest.raises(TypeError, match="integers"):
            writer.add_document([1.5])
        writer.add_document([1])
    assert IndexedDataset(tmp_path / "a").num_tokens == 1


def test_writer_refuses_overwrite(tmp_path: Path) -> None:
    prefix = tmp_path / "shard"
    _write(prefix, [np.array([1, 2])], np.uint16)
    with pytest.raises(FileExistsError, match="overwrite=True"):
        IndexedDatasetWriter(prefix, np.uint16)
    with IndexedDatasetWriter(prefix, np.uint16, overwrite=True) as writer:
        writer.add_document([3, 4, 5])
        info = writer.finalize()
    assert (info.num_documents, info.num_tokens) == (1, 3)
    np.testing.assert_array_equal(IndexedDataset(prefix)[0], [3, 4, 5])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shard.bin", "shard.idx"]


def test_failed_writer_leaves_no_files(tmp_path: Path) -> None:
    prefix = tmp_path / "shard"
    with pytest.raises(RuntimeError, match="boom"):
        with IndexedDatasetWriter(prefix, np.uint16) as writer:
            writer.add_document([1, 2, 3])
            assert (tmp_path / "shard.bin.tmp").exists()
            raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []


def test_finalize_reports_hashes(tmp_path: Path) -> None:
    prefix = tmp_path / "shard"
    writer = IndexedDatasetWriter(prefix, np.int32)
    writer.add_document([1, 2, 3])
    info = writer.finalize()
    assert info.bin_sha256 == hashlib.sha256((tmp_path / "shard.bin").read_bytes()).hexdigest()
    assert info.idx_sha256 == hashlib.sha256((tmp_path / "shard.idx").read_bytes()).hexdigest()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shard.bin", "shard.idx"]
    with pytest.raises(RuntimeError, match="already finalized"):
        writer.add_document([4])


@pytest.fixture
def shard(tmp_path: Path) -> Path:
    prefix = tmp_path / "shard"
    _write(prefix, [np.arange(10), np.arange(5)], np.uint16)
    return prefix


def _truncate(path: Path, nbytes: int) -> None:
    data = path.read_bytes()
    path.write_bytes(data[:-nbytes])


def test_truncated_bin(shard: Path) -> None:
    _truncate(shard.with_name("shard.bin"), 2)
    with pytest.raises(ShardError, match=r"shard\.bin: truncated.*mindfoundry prepare"):
        IndexedDataset(shard)


def test_truncated_idx(shard: Path) -> None:
    _truncate(shard.with_name("shard.idx"), 8)
    with pytest.raises(ShardError, match=r"shard\.idx: truncated"):
        IndexedDataset(shard)


def test_idx_shorter_than_header(shard: Path) -> None:
    shard.with_name("shard.idx").write_bytes(b"MMIDIDX")
    with pytest.raises(ShardError, match=r"shard\.idx: truncated"):
        IndexedDataset(shard)


def test_bad_magic(shard: Path) -> None:
    idx = shard.with_name("shard.idx")
    data = bytearray(idx.read_bytes())
    data[0] ^= 0xFF
    idx.write_bytes(bytes(data))
    with pytest.raises(ShardError, match=r"shard\.idx: bad magic"):
        IndexedDataset(shard)


def _patch_idx(shard: Path, offset: int, fmt: str, value: int) -> None:
    idx = shard.with_name("shard.idx")
    data = bytearray(idx.read_bytes())
    struct.pack_into(fmt, data, offset, value)
    idx.write_bytes(bytes(data))


def test_bad_version_and_dtype(shard: Path) -> None:
    _patch_idx(shard, 9, "<Q", 2)
    with pytest.raises(ShardError, match="unsupported index version 2"):
        IndexedDataset(shard)
    _patch_idx(shard, 9, "<Q", 1)
    _patch_idx(shard, 17, "<B", 99)
    with pytest.raises(ShardError, match="unknown dtype code 99"):
        IndexedDataset(shard)


def test_inconsistent_pointers(shard: Path) -> None:
    _patch_idx(shard, 34 + 8 + 8, "<q", 4)  # second pointer should be 10 * 2 bytes
    with pytest.raises(ShardError, match="sequence pointer 1 is 4, expected 20"):
        IndexedDataset(shard)


def test_bad_document_indices(shard: Path) -> None:
    doc_indices_at = 34 + 8 + 16
    _patch_idx(shard, doc_indices_at, "<q", 1)
    with pytest.raises(ShardError, match="do not start at 0"):
        IndexedDataset(shard)
    _patch_idx(shard, doc_indices_at, "<q", 0)
    _patch_idx(shard, doc_indices_at + 8, "<q", 5)
    with pytest.raises(ShardError, match="not monotonically increasing"):
        IndexedDataset(shard)
    _patch_idx(shard, doc_indices_at + 8, "<q", 1)
    _patch_idx(shard, doc_indices_at + 16, "<q", 3)
    with pytest.raises(ShardError, match="last document index is 3"):
        IndexedDataset(shard)


def test_missing_bin(shard: Path) -> None:
    shard.with_name("shard.bin").unlink()
    with pytest.raises(ShardError, match=r"shard\.bin: file is missing.*mindfoundry prepare"):
        IndexedDataset(shard)


def test_empty_shard(tmp_path: Path) -> None:
    prefix = tmp_path / "empty"
    _write(prefix, [], np.uint16)
    ds = IndexedDataset(prefix)
    assert len(ds) == 0
    assert ds.num_tokens == 0
    verify_tokens(ds, vocab_size=10)


def test_verify_tokens(tmp_path: Path) -> None:
    prefix = tmp_path / "shard"
    _write(prefix, [np.array([1, 2, 3]), np.array([900, 4])], np.uint16)
    ds = IndexedDataset(prefix)
    verify_tokens(ds, vocab_size=901)
    with pytest.raises(ShardError, match=r"shard\.bin: max token id 900 .* vocab size is 900"):
        verify_tokens(ds, vocab_size=900)


def test_verify_tokens_negative(tmp_path: Path) -> None:
    prefix = tmp_path / "shard"
    _write(prefix, [np.array([3, -2, 1])], np.int32)
    with pytest.raises(ShardError, match="negative token id -2"):
        verify_tokens(IndexedDataset(prefix), vocab_size=10)
