"""One image, decoded the same way everywhere: checked before it is decoded, turned into RGB uint8 in one place.

Every engine and every consumer of our shards sees the pixels this module makes, so each choice is made once here:

- **Checked before decoding.** The header alone gives the size; more than ``max_pixels`` (a PNG that inflates to
  gigabytes, a "decompression bomb") is refused before a byte of pixel data is decoded. Then the whole image is
  decoded: a truncated or corrupted file is refused here, not in a training step. The format is what the bytes say,
  not the file name (a JPEG named ``.png`` decodes as the JPEG it is).
- **Turned upright.** EXIF orientation is applied (a phone photo stored sideways is seen as the viewer sees it).
- **One frame.** An animated GIF, WebP or APNG contributes its first frame.
- **RGB, 8 bits.** Transparency is composited on white (an icon's transparent background is what a page shows
  behind it); palette, greyscale and 1-bit images are expanded; CMYK is converted by PIL's own rule; 16-bit
  greyscale keeps its top 8 bits (so does a 32-bit integer image holding values over 255); floating-point images are
  clipped to 0..255.
- **Sizes checked upright**: the shorter side at least ``min_side``, the long side at most ``max_aspect`` times the
  short one.

A refusal is an :class:`ImageRejected` with a drop reason (``empty``, ``undecodable``, ``truncated``,
``too_many_pixels``, ``too_small``, ``aspect``) and a detail for the drop log.
"""

from __future__ import annotations

import io
import warnings
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

#: The EXIF tag of a photo's orientation (1: stored upright).
ORIENTATION = 0x0112
#: Modes whose transparency is composited on white.
_ALPHA_MODES = ("RGBA", "LA", "PA", "RGBa", "La")


@dataclass(frozen=True)
class ImageLimits:
    """What an image must be to be kept (the ``data.images`` settings that judge one image)."""

    min_side: int = 16
    max_aspect: float = 4.0
    max_pixels: int = 40_000_000


class ImageRejected(Exception):
    """An image that is not kept: ``reason`` (the drop log's reason) and ``detail`` (what was found)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason, self.detail = reason, detail


@dataclass(frozen=True)
class Decoded:
    """An image as every later step sees it: ``pixels`` (height, width, 3) uint8 RGB, upright; ``format`` as the
    bytes say (JPEG, PNG, WEBP, GIF, BMP, ...); ``frames`` in the file (only the first is kept); ``plain``: the file
    is an RGB still image stored upright, so any reader's plain decode gives these pixels (its bytes can be handed on
    as they are)."""

    pixels: np.ndarray
    format: str
    frames: int
    plain: bool


def decode(data: bytes, limits: ImageLimits) -> Decoded:
    """``data`` decoded, normalised and checked (see the module docstring); :class:`ImageRejected` otherwise."""
    if not data:
        raise ImageRejected("empty", "0 bytes")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data))
    except UnidentifiedImageError:
        raise ImageRejected("undecodable", f"{len(data):,} bytes that no image format knows") from None
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise ImageRejected("too_many_pixels", "the header declares more pixels than PIL's decompression-bomb limit "
                            "(refused before decoding)") from None
    width, height = image.size
    if width * height > limits.max_pixels:
        raise ImageRejected("too_many_pixels", f"{width}x{height} = {width * height:,} pixels > max_pixels "
                            f"{limits.max_pixels:,} (refused before decoding)")
    frames = getattr(image, "n_frames", 1)
    try:
        image.seek(0)
        image.load()
    except (OSError, SyntaxError, ValueError, EOFError) as exc:
        raise ImageRejected("truncated", f"{image.format} {width}x{height}: {exc}") from None
    plain = frames == 1 and image.getexif().get(ORIENTATION, 1) == 1 and _plain_mode(image)
    pixels = rgb_pixels(ImageOps.exif_transpose(image))
    _check_sizes(pixels.shape[1], pixels.shape[0], limits)
    return Decoded(pixels, image.format or "unknown", frames, plain)


def rgb_pixels(image: Image.Image) -> np.ndarray:
    """A loaded image as (height, width, 3) uint8 RGB (see the module docstring for each mode's rule)."""
    mode = image.mode
    if mode.startswith("I;16") or mode in ("I", "F"):  # 16-bit (PNG), 32-bit integer or float greyscale
        values = np.asarray(image, dtype=np.float64)
        wide = mode.startswith("I;16") or (mode == "I" and values.max() > 255)  # (PIL reads some 16-bit files as I)
        grey = np.clip(values / 256 if wide else values, 0, 255).astype(np.uint8)
        return np.repeat(grey[:, :, None], 3, axis=2)
    if mode == "P" and "transparency" in image.info or mode in _ALPHA_MODES:
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        image = Image.alpha_composite(background, rgba)
    return np.asarray(image.convert("RGB"), dtype=np.uint8).copy()


def _plain_mode(image: Image.Image) -> bool:
    """Whether a reader's own ``convert("RGB")`` of the image gives :func:`rgb_pixels`: RGB, greyscale, 1-bit and
    palette images without transparency, and images whose alpha is opaque everywhere."""
    if image.mode in ("RGB", "L", "1"):
        return True
    if image.mode == "P":
        return "transparency" not in image.info
    if image.mode in _ALPHA_MODES:
        return image.getchannel("A").getextrema()[0] == 255
    return False


def _check_sizes(width: int, height: int, limits: ImageLimits) -> None:
    short, long = min(width, height), max(width, height)
    if short < limits.min_side:
        raise ImageRejected("too_small", f"{width}x{height}: the shorter side is under min_side {limits.min_side}")
    if long > limits.max_aspect * short:
        raise ImageRejected("aspect", f"{width}x{height}: {long / short:.2f}:1 exceeds max_aspect "
                            f"{limits.max_aspect:g}")


def square(pixels: np.ndarray, size: int) -> np.ndarray:
    """The image at ``size`` x ``size``: its shorter side resized to ``size`` (PIL bicubic, the resize MindSpore's
    ``Inter.PILCUBIC`` and Hugging Face's image processors reproduce), then the centre cut square."""
    height, width = pixels.shape[:2]
    scale = size / min(height, width)
    resized = Image.fromarray(pixels).resize((max(size, round(width * scale)), max(size, round(height * scale))),
                                             Image.Resampling.BICUBIC)
    left, top = (resized.width - size) // 2, (resized.height - size) // 2
    return np.asarray(resized.crop((left, top, left + size, top + size)), dtype=np.uint8).copy()
