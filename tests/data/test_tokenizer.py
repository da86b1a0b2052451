"""Tests for byte-level BPE training, loading and batch encoding."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from mindfoundry.data.ingest.builtin import read_builtin
from mindfoundry.data.ingest.files import SourceStats
from mindfoundry.data.tokenizer import (
    EOS,
    PAD,
    TokenizerError,
    encode_batch,
    eos_id,
    load_tokenizer,
    pad_id,
    tokenizer_hash,
    train_tokenizer,
)

VOCAB = 512
MIXED = [
    "人民日报：新年讲话，迈向充满希望的新世纪。",
    "To be, or not to be: that is the question.",
    "def f(x):\r\n\treturn {'k': x ** 2}  # tabs, CRLF\n",
    "emoji 😀🚀 and rare bytes \u0000\u00ff\U0010fffd, never seen in training",
    "a literal <|endoftext|> inside a document stays text",
    "",
]
_CORPUS_CODE = """
import sys
from mindfoundry.data.ingest.builtin import read_builtin
from mindfoundry.data.ingest.files import SourceStats
from mindfoundry.data.tokenizer import tokenizer_hash, train_tokenizer

texts = [d.text for d in read_builtin("python_stdlib", stats=SourceStats(), max_bytes=150_000)]
texts += ["人民日报：新年讲话，迈向充满希望的新世纪。"] * 20
print(tokenizer_hash(train_tokenizer(texts, {vocab})))
"""


@pytest.fixture(scope="module")
def corpus() -> list[str]:
    texts = [d.text for d in read_builtin("python_stdlib", stats=SourceStats(), max_bytes=150_000)]
    return texts + ["人民日报：新年讲话，迈向充满希望的新世纪。"] * 20


@pytest.fixture(scope="module")
def tokenizer(corpus: list[str]) -> Tokenizer:
    return train_tokenizer(iter(corpus), VOCAB)


def test_vocab_and_special_token_ids(tokenizer: Tokenizer) -> None:
    assert tokenizer.get_vocab_size() == VOCAB
    assert eos_id(tokenizer) == 0 and tokenizer.id_to_token(0) == EOS
    assert pad_id(tokenizer) == 1 and tokenizer.id_to_token(1) == PAD


def test_training_is_deterministic_across_runs_and_thread_counts(
    corpus: list[str], tokenizer: Tokenizer
) -> None:
    assert tokenizer_hash(train_tokenizer(corpus, VOCAB)) == tokenizer_hash(tokenizer)
    env = {**os.environ, "RAYON_RS_NUM_CPUS": "1", "TOKENIZERS_PARALLELISM": "false"}
    result = subprocess.run(
        [sys.executable, "-c", _CORPUS_CODE.format(vocab=VOCAB)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert result.stdout.strip() == tokenizer_hash(tokenizer)


def test_round_trip_is_lossless(tokenizer: Tokenizer) -> None:
    for text, ids in zip(MIXED, encode_batch(tokenizer, MIXED)):
        assert tokenizer.decode(ids[:-1].tolist()) == text


def test_encode_batch_appends_exactly_one_eos(tokenizer: Tokenizer) -> None:
    encoded = encode_batch(tokenizer, MIXED)
    assert len(encoded) == len(MIXED)
    for text, ids in zip(MIXED, encoded):
        assert ids.dtype == np.int32
        assert ids[-1] == eos_id(tokenizer)
        assert np.count_nonzero(ids == eos_id(tokenizer)) == 1
        assert ids[:-1].tolist() == tokenizer.encode(text).ids
    assert encoded[-1].tolist() == [eos_id(tokenizer)]


def test_save_and_load_round_trip(tokenizer: Tokenizer, tmp_path: Path) -> None:
    path = tmp_path / "tokenizer.json"
    tokenizer.save(str(path))
    loaded = load_tokenizer(path)
    assert tokenizer_hash(loaded) == tokenizer_hash(tokenizer)
    assert [a.tolist() for a in encode_batch(loaded, MIXED)] == [
        a.tolist() for a in encode_batch(tokenizer, MIXED)
    ]


def test_load_errors(tokenizer: Tokenizer, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="missing.json"):
        load_tokenizer(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(TokenizerError, match="not valid JSON"):
        load_tokenizer(tmp_path / "bad.json")
    (tmp_path / "other.json").write_text('{"hello": 1}', encoding="utf-8")
    with pytest.raises(TokenizerError, match="not a Hugging Face tokenizer"):
        load_tokenizer(tmp_path / "other.json")
    spec = json.loads(tokenizer.to_str())
    spec["added_tokens"] = [t for t in spec["added_tokens"] if t["content"] != EOS]
    del spec["model"]["vocab"][EOS]
    (tmp_path / "no_eos.json").write_text(json.dumps(spec), encoding="utf-8")
    with pytest.raises(TokenizerError, match="endoftext"):
        load_tokenizer(tmp_path / "no_eos.json")


def test_training_argument_errors() -> None:
    with pytest.raises(ValueError, match="vocab_size"):
        train_tokenizer(["text"], 100)
