"""Byte-level BPE tokenizer (Hugging Face ``tokenizers``): training, loading, batch encoding.

Byte-level BPE starts from all 256 byte symbols, so any text (Chinese, code, emoji, invalid
markup) is encodable and decodes back to exactly the same string: no ``<unk>``, no lossy
normalisation. The two special tokens get fixed ids (``EOS`` = 0, ``PAD`` = 1) so that packed
token files and model configs can rely on them. Tokenizers returned by :func:`train_tokenizer`
and :func:`load_tokenizer` encode a literal ``"<|endoftext|>"`` inside a document as plain text
(``encode_special_tokens = True``; the flag is not serialized, hence set on load), so scraped
text cannot inject a document boundary: ``EOS`` appears only where :func:`encode_batch` puts it.

Determinism (measured with tokenizers 0.23.3): training on the same texts in the same order
with the same settings gives a byte-identical ``to_str()`` across processes, with parallelism
on or off (``TOKENIZERS_PARALLELISM``) and with 1 to 16 worker threads (``RAYON_RS_NUM_CPUS``).
The BPE trainer breaks count ties by token order rather than by hash-map order, so nothing has
to be forced off; :func:`tokenizer_hash` lets a run record and check the result.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from pathlib import Path

import numpy as np
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

from mindfoundry.config.storage_config import StorageConfig
from mindfoundry.errors import InputMissingError, MindFoundryError
from mindfoundry.model.spec import PAD_ID
from mindfoundry.storage.location import Location
from mindfoundry.storage.resolve import locate

EOS = "<|endoftext|>"
PAD = "<|pad|>"
SPECIAL_TOKENS: tuple[str, ...] = (EOS, PAD)  # ids 0 and 1 (PAD_ID), in this order
#: The masked-LM input token (model.objective: mlm), added after training as the last id.
MASK = "<|mask|>"
#: The placeholder of an image's tokens before its caption (model.objective: caption; LLaVA's image_token_id), added
#: after training as the last id.
IMAGE = "<|image|>"
#: The special token each objective adds after training (the others add none).
OBJECTIVE_TOKENS = {"mlm": MASK, "caption": IMAGE}

_BYTE_ALPHABET_SIZE = 256
MIN_VOCAB_SIZE = _BYTE_ALPHABET_SIZE + len(SPECIAL_TOKENS)


class TokenizerError(MindFoundryError, ValueError):
    """A tokenizer file is unusable or a tokenizer lacks a required special token."""


def train_tokenizer(
    texts: Iterable[str], vocab_size: int, *, min_frequency: int = 2, mask_token: bool = False,
    extra_token: str | None = None
) -> Tokenizer:
    """Train a byte-level BPE tokenizer on ``texts``, streamed (memory stays bounded).

    ``vocab_size`` counts the special tokens and the 256 byte symbols, so it must be at least
    258 (259 with an ``extra_token``, :data:`MASK` with ``mask_token``: BPE then learns one token fewer and that token
    takes the last id, so the ids of EOS and PAD stay fixed). BPE training involves no randomness: the output
    depends only on the texts, their order and the settings (see the module docstring), so it
    takes no seed.
    """
    extra_token = MASK if mask_token else extra_token
    extra = extra_token is not None
    least = MIN_VOCAB_SIZE + extra
    if vocab_size < least:
        raise ValueError(
            f"vocab_size must be at least {least} (256 byte symbols + "
            f"{len(SPECIAL_TOKENS) + extra} special tokens), got {vocab_size}"
        )
    if min_frequency < 1:
        raise ValueError(f"min_frequency must be >= 1, got {min_frequency}")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - extra,
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    tokenizer.encode_special_tokens = True
    if pad_id(tokenizer) != PAD_ID:
        raise AssertionError(f"BPE training put {PAD} at id {pad_id(tokenizer)}, not {PAD_ID}")
    return with_special_token(tokenizer, extra_token, vocab_size) if extra_token else tokenizer


def with_mask_token(tokenizer: Tokenizer, vocab_size: int) -> Tokenizer:
    """``tokenizer`` with the :data:`MASK` special token (:func:`with_special_token`)."""
    return with_special_token(tokenizer, MASK, vocab_size)


def with_special_token(tokenizer: Tokenizer, token: str, vocab_size: int) -> Tokenizer:
    """``tokenizer`` with the special ``token`` of an objective (:data:`OBJECTIVE_TOKENS`; added as its next id when
    it has none), for a model of ``vocab_size`` tokens; TokenizerError when that id would not fit the model."""
    if token in _special_contents(tokenizer):
        return tokenizer
    if tokenizer.get_vocab_size() >= vocab_size:
        objective = next(name for name, t in OBJECTIVE_TOKENS.items() if t == token)
        raise TokenizerError(
            f"the tokenizer has {tokenizer.get_vocab_size()} tokens, all of model.vocab_size={vocab_size}: no room for "
            f"the {'mask' if token == MASK else 'image'} token {token!r} of model.objective={objective}; raise "
            f"model.vocab_size to "
            f"{tokenizer.get_vocab_size() + 1} or train the tokenizer with the {objective} objective "
            "(data.tokenizer.path: null)"
        )
    tokenizer.add_special_tokens([AddedToken(token, special=True, normalized=False)])
    return tokenizer


def load_tokenizer(path: str | Location, storage: StorageConfig | None = None) -> Tokenizer:
    """Load a ``tokenizer.json`` (a file, or an object reached with ``storage``), checking it is valid and defines the
    ``EOS`` special token."""
    return read_tokenizer(path, storage)[0]


def read_tokenizer(path: str | Location, storage: StorageConfig | None = None) -> tuple[Tokenizer, bytes]:
    """:func:`load_tokenizer`, and the file's bytes as they were read (what a run keeps: the file may change later)."""
    path = locate(path, storage)
    if not path.is_file():
        raise InputMissingError(
            f"tokenizer file {path} does not exist; train one first or fix the tokenizer path"
        )
    data = path.read_bytes()
    raw = data.decode("utf-8")
    try:
        json.loads(raw)
    except ValueError as exc:
        raise TokenizerError(f"{path} is not valid JSON ({exc}); is it a tokenizer.json?") from exc
    try:
        tokenizer = Tokenizer.from_str(raw)
    except Exception as exc:  # tokenizers raises a bare Exception for schema errors
        raise TokenizerError(f"{path} is not a Hugging Face tokenizer file: {exc}") from exc
    eos_id(tokenizer)
    tokenizer.encode_special_tokens = True
    return tokenizer, data


def tokenizer_hash(tokenizer: Tokenizer) -> str:
    """sha256 of the serialized tokenizer: identifies the exact vocabulary and merges."""
    return hashlib.sha256(tokenizer.to_str().encode("utf-8")).hexdigest()


def eos_id(tokenizer: Tokenizer) -> int:
    """Id of the end-of-document token appended after every document."""
    return _special_id(tokenizer, EOS)


def pad_id(tokenizer: Tokenizer) -> int:
    """Id of the padding token (never produced by encoding text)."""
    return _special_id(tokenizer, PAD)


def mask_id(tokenizer: Tokenizer) -> int:
    """Id of the masked-LM input token (present in tokenizers made for model.objective: mlm)."""
    return _special_id(tokenizer, MASK)


def image_id(tokenizer: Tokenizer) -> int:
    """Id of the image placeholder token (present in tokenizers made for model.objective: caption)."""
    return _special_id(tokenizer, IMAGE)


def special_ids(tokenizer: Tokenizer) -> list[int]:
    """Ids of every special token (never masked or drawn as a random replacement by the mlm objective)."""
    return sorted(tokenizer.token_to_id(token) for token in _special_contents(tokenizer))


def encode_batch(tokenizer: Tokenizer, texts: list[str]) -> list[np.ndarray]:
    """Encode documents in parallel into int32 id arrays, each ending with ``EOS``.

    The EOS separates documents once they are concatenated into a token stream, so the model
    learns where a document ends. ``Tokenizer.encode_batch`` encodes on all cores (measured
    0.9-1.6 M tokens/s on 2 cores, several times a Python loop over ``encode``).
    """
    end = eos_id(tokenizer)
    encodings = tokenizer.encode_batch(texts, add_special_tokens=False)
    return [np.array([*encoding.ids, end], dtype=np.int32) for encoding in encodings]


def _special_id(tokenizer: Tokenizer, token: str) -> int:
    token_id = tokenizer.token_to_id(token)
    if token_id is None or token not in _special_contents(tokenizer):
        raise TokenizerError(
            f"tokenizer has no special token {token!r}; train it with "
            "mindfoundry.data.tokenizer.train_tokenizer"
        )
    return token_id


def _special_contents(tokenizer: Tokenizer) -> set[str]:
    added = tokenizer.get_added_tokens_decoder().values()
    return {token.content for token in added if token.special}


#: The tokenizer a worker process loaded, by (path, size, modification time): one per process, not per task, since
#: every Tokenizer that encodes keeps ~18 MB after it is dropped (tokenizers 0.23; measured: +18 MB per task).
_LOADED: dict[tuple[str, int, int], Tokenizer] = {}


def worker_tokenizer(path: Path) -> Tokenizer:
    """The tokenizer at ``path`` (a local file), loaded once per process while the file is unchanged."""
    st = path.stat()
    key = (str(path), st.st_size, st.st_mtime_ns)
    if key not in _LOADED:
        _LOADED.clear()
        _LOADED[key] = load_tokenizer(path)
    return _LOADED[key]
