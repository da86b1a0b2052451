"""Tests for the content-hash train/validation split."""

from __future__ import annotations

import hashlib

import pytest

from mindfoundry.data.document import Document
from mindfoundry.data.prepare.split import content_hash, is_validation, split_documents


def _docs(count: int) -> list[Document]:
    return [
        Document(text=f"synthetic document {i} " * 3, id=f"syn:{i}", source="syn", category="t")
        for i in range(count)
    ]


def test_fraction_is_respected_on_5000_documents() -> None:
    labels = [label for label, _ in split_documents(_docs(5000), seed=7, fraction=0.1)]
    validation = labels.count("validation")
    # Binomial(5000, 0.1) has a standard deviation of ~21; allow ~4.7 sigma.
    assert abs(validation - 500) <= 100
    assert labels.count("train") == 5000 - validation


def test_split_is_deterministic_and_seed_dependent() -> None:
    docs = _docs(2000)
    first = [label for label, _ in split_documents(docs, seed=1, fraction=0.2)]
    second = [label for label, _ in split_documents(docs, seed=1, fraction=0.2)]
    other_seed = [label for label, _ in split_documents(docs, seed=2, fraction=0.2)]
    assert first == second
    assert first != other_seed


def test_identical_texts_never_straddle_the_split() -> None:
    base = _docs(1000)
    copies = [
        Document(text=f"  {d.text}\n", id=f"{d.id}:copy", source="b", category="t") for d in base
    ]
    train_hashes: set[str] = set()
    validation_hashes: set[str] = set()
    for label, doc in split_documents(base + copies, seed=3, fraction=0.3):
        (validation_hashes if label == "validation" else train_hashes).add(content_hash(doc.text))
    assert validation_hashes and train_hashes
    assert not validation_hashes & train_hashes
    assert len(validation_hashes | train_hashes) == 1000


def test_is_validation_matches_split_documents() -> None:
    docs = _docs(300)
    labels = [label for label, _ in split_documents(docs, seed=5, fraction=0.5)]
    assert labels == [
        "validation" if is_validation(d.text, seed=5, fraction=0.5) else "train" for d in docs
    ]


def test_zero_fraction_keeps_everything_in_train() -> None:
    assert all(label == "train" for label, _ in split_documents(_docs(200), seed=0, fraction=0.0))


def test_content_hash_is_sha256_of_stripped_text() -> None:
    assert content_hash("  héllo\n") == hashlib.sha256("héllo".encode("utf-8")).hexdigest()


@pytest.mark.parametrize("fraction", [-0.1, 1.0, 1.5])
def test_invalid_fraction_is_rejected_before_iteration(fraction: float) -> None:
    with pytest.raises(ValueError, match="fraction"):
        split_documents(iter(()), seed=0, fraction=fraction)
    with pytest.raises(ValueError, match="fraction"):
        is_validation("text", seed=0, fraction=fraction)


def test_seed_must_be_an_int() -> None:
    with pytest.raises(TypeError, match="seed"):
        is_validation("text", seed=True, fraction=0.1)
