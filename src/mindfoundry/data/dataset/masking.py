"""Dynamic masking for the masked-LM objective (``model.objective: mlm``), a pure function of (seed, sample position).

BERT/RoBERTa's recipe on our packed samples: a sample's input window (the ``input_ids`` of
:class:`~mindfoundry.data.dataset.packing.PackedSamples`, padding included) has its ordinary
tokens -- every id that is not a special token (EOS, PAD, the mask token) -- as candidates; exactly
``round(mask_rate * candidates)`` of them (at least one) are chosen, and of those a share
``mask_token_rate`` shows the mask token, ``random_token_rate`` a random ordinary token, the rest
their own token. The labels hold the original token at chosen positions and ``IGNORE_INDEX``
elsewhere, so the engines' masked token loss is the MLM loss with no change to the loss code.

Every draw comes from ``PCG64([seed, stream, position])``: the mask of a sample depends only on
the run seed, which split it belongs to (:data:`TRAIN`, :data:`VALIDATION`, :data:`TEXTS`) and its
position (the global training position, the validation sample index, the text window index), so a
sample drawn again in a later epoch gets a new mask (dynamic masking), a resumed run and either engine
see the same masks, and the validation masks are the same at every evaluation. Framework-free.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
from tokenizers import Tokenizer

from mindfoundry.config.model_config import MLMConfig
from mindfoundry.config.schema import RunConfig
from mindfoundry.data.dataset.image_masking import PatchMasking
from mindfoundry.data.dataset.packing import IGNORE_INDEX
from mindfoundry.data.dataset.streams import TEXTS, TRAIN, VALIDATION
from mindfoundry.data.tokenizer import PAD, TokenizerError, mask_id, pad_id, special_ids
from mindfoundry.model.spec import PAD_ID
from mindfoundry.model.vision_spec import VisionSpec

__all__ = ["TEXTS", "TRAIN", "VALIDATION", "Masking", "MaskingRule", "PatchMasking", "masking_for", "masking_rule"]


@dataclass(frozen=True)
class MaskingRule:
    """The masking of one stream of samples (see the module docstring)."""

    mask_id: int
    special: np.ndarray  # ids never chosen nor drawn as replacements
    ordinary: np.ndarray  # ids a random replacement is drawn from
    mask_rate: float
    mask_token_rate: float
    random_token_rate: float
    seed: int
    stream: int = TRAIN
    #: The label of a padding row: no position of it is scored.
    pad_label: int = IGNORE_INDEX

    def for_stream(self, stream: int) -> MaskingRule:
        return replace(self, stream=stream)

    def scored(self, labels: np.ndarray) -> int:
        """How many positions of these labels carry a loss."""
        return int((labels != IGNORE_INDEX).sum())

    def apply(self, ids: np.ndarray, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(masked input_ids, labels)`` for rows ``ids`` [N, S] at sample ``positions`` [N]; int32 like the input."""
        ids = np.asarray(ids)
        masked = ids.astype(np.int32, copy=True)
        labels = np.full(ids.shape, IGNORE_INDEX, np.int32)
        for row, position in enumerate(np.asarray(positions, np.int64).tolist()):
            self._mask_row(masked[row], labels[row], int(position))
        return masked, labels

    def _mask_row(self, ids: np.ndarray, labels: np.ndarray, position: int) -> None:
        candidates = np.flatnonzero(~np.isin(ids, self.special))
        if candidates.size == 0:
            return
        rng = np.random.Generator(np.random.PCG64([self.seed, self.stream, position]))
        count = max(1, int(round(self.mask_rate * candidates.size)))
        chosen = np.sort(rng.choice(candidates, count, replace=False))
        how = rng.random(count)
        replacements = self.ordinary[rng.integers(0, self.ordinary.size, count)]
        labels[chosen] = ids[chosen]
        ids[chosen] = np.where(how < self.mask_token_rate, self.mask_id,
                               np.where(how < self.mask_token_rate + self.random_token_rate, replacements, ids[chosen]))


def masking_rule(mlm: MLMConfig, tokenizer: Tokenizer, seed: int, stream: int = TRAIN) -> MaskingRule:
    """The rule for a tokenizer made for the mlm objective; TokenizerError naming what it lacks."""
    if pad_id(tokenizer) != PAD_ID:
        raise TokenizerError(
            f"the tokenizer has {PAD!r} at id {pad_id(tokenizer)}: model.objective=mlm hides padding by id "
            f"{PAD_ID}; use a tokenizer trained by `mindfoundry prepare` (data.tokenizer.path: null)"
        )
    special = np.array(special_ids(tokenizer), np.int64)
    ordinary = np.setdiff1d(np.arange(tokenizer.get_vocab_size(), dtype=np.int64), special)
    return MaskingRule(mask_id(tokenizer), special, ordinary, mlm.mask_rate, mlm.mask_token_rate, mlm.random_token_rate,
                       seed, stream)


#: What a run masks its samples with: tokens (mlm) or image patches (mae).
Masking = MaskingRule | PatchMasking


def masking_for(cfg: RunConfig, tokenizer: Tokenizer, stream: int) -> Masking | None:
    """The masking a run applies to the samples of ``stream`` (None for model.objective: clm): the one place that
    decides."""
    if cfg.model.objective == "mae":
        spec = VisionSpec.from_config(cfg.model)
        return PatchMasking(cfg.seed, spec.num_patches, spec.kept, stream)
    if cfg.model.objective != "mlm":
        return None
    return masking_rule(cfg.model.mlm, tokenizer, cfg.seed, stream)
