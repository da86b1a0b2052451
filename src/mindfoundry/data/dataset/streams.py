"""Mask streams: which numbering a sample position belongs to, so that the text masks (:mod:`.masking`) and the
image masks (:mod:`.image_masking`) of a training position, a validation sample and a scored text window differ."""

TRAIN, VALIDATION, TEXTS = 0, 1, 2
