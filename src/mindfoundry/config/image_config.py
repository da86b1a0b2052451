"""The ``data.images`` section: how image sources (``modality: image_text`` or ``image``) are judged, deduplicated,
split and written (the image stages of `prepare`, :mod:`mindfoundry.data.images`)."""

from __future__ import annotations

from pydantic import Field, model_validator

from mindfoundry.config.section import Section


class ImagesConfig(Section):
    """Decode checks, size filters, exact and near-duplicate removal, the split by near-duplicate cluster, and the
    pixel shards' size. Every image is decoded once at prepare time, the same way for every consumer."""

    min_side: int = Field(16, ge=1, le=65_536, description="Drop an image whose shorter side (upright) is shorter.")
    max_aspect: float = Field(4.0, ge=1.0, le=1000.0, description="Drop an image whose long side is more than this "
                              "many times its short side.")
    max_pixels: int = Field(
        40_000_000, ge=1, description="Drop an image whose header declares more pixels, before it is decoded (a "
        "decompression bomb: a small PNG that inflates to gigabytes).")
    size: int = Field(64, ge=8, le=4096, description="Side of the square uint8 pixel shards (shorter side resized, "
                      "PIL bicubic, then the centre cut), what the trainers read without decoding.")
    exact: bool = Field(True, description="Drop an image whose decoded pixels equal an earlier image's.")
    near: bool = Field(True, description="Drop an image that is a near copy of an earlier kept image: hashes within "
                       "near_distance and looks at least near_likeness alike.")
    near_distance: int = Field(
        12, ge=0, le=32, description="Bits (of the 64-bit DCT hashes: the whole image's against the other's whole "
        "or centre) within which two images are compared as possible near copies.")
    near_likeness: float = Field(
        0.82, ge=0.0, le=1.0, description="How alike the looks of two images within near_distance must be for the "
        "later to be dropped (luma up to brightness and contrast, colour up to saturation, after a small crop). 12 "
        "and 0.82, chosen on half of a bench of real images with resized, re-encoded, cropped and recoloured copies, "
        "give precision 0.991 and recall 0.965 on the other half (bench/image_dedup_quality.py).")
    split_distance: int = Field(
        12, ge=0, le=32, description="Bits within which images count as one cluster for the train/validation split "
        "(variants of one image: sizes, skin tones, colours): a cluster is never on both sides.")
    caption_max_chars: int = Field(1000, ge=1, description="Drop a pair whose caption is longer (cut text, a page "
                                   "scraped as a caption).")

    @model_validator(mode="after")
    def _distances(self) -> ImagesConfig:
        if self.split_distance < self.near_distance:
            raise ValueError(f"split_distance={self.split_distance} is below near_distance={self.near_distance}: "
                             "near copies that are kept must land on one side of the split; raise split_distance to "
                             f"{self.near_distance} or more")
        return self
