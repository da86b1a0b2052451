"""Real images the project never tuned on, for the image benches: Noto Color Emoji's bitmaps and the GIMP manual's
figures, fetched from the Debian archive (a package registry, never a hub) and unpacked into a cache.

    .venv/bin/python bench/image_sources.py --fetch      # apt-get download + dpkg-deb -x into the cache

- emoji (fonts-noto-color-emoji, OFL-1.1): 3,926 colour bitmaps (136 x 128 PNG) from the font's CBDT table, read
  with fontTools; skin-tone variants of one emoji are grouped (they are near copies by design): by the sequence a
  glyph stands for (its code point, or the characters of the ligature that makes it, GSUB:
  `mindfoundry.data.images.demo_corpus.glyph_sequences`), skin-tone modifiers left out; the five skin-tone swatches
  are one group.
- gimp (gimp-help-en, GFDL-1.2+): the manual's figures: screenshots, dialogs, photos before and after a filter (PNG,
  JPEG).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from curation_sources import CACHE, fetch

PACKAGES = ("fonts-noto-color-emoji", "gimp-help-en")
#: The skin-tone modifiers (U+1F3FB..U+1F3FF) and the emoji-style variation selector.
_TONES_AND_STYLE = {chr(code) for code in range(0x1F3FB, 0x1F400)} | {"\ufe0f"}


def fetch_images(cache: Path = CACHE) -> None:
    fetch(cache, PACKAGES)


def emoji(cache: Path = CACHE) -> list[tuple[str, str, bytes]]:
    """(glyph name, group, PNG bytes) of every colour emoji bitmap, in glyph-name order; the group is the character
    sequence the glyph stands for (the demo corpus's reading of the font) without skin-tone modifiers."""
    from fontTools.ttLib import TTFont

    from mindfoundry.data.images.demo_corpus import glyph_sequences

    font = TTFont(next((cache / "fonts-noto-color-emoji").rglob("NotoColorEmoji.ttf")))
    strike = font["CBDT"].strikeData[0]
    sequences = glyph_sequences(font)

    def group(name: str) -> str:
        if name not in sequences:
            return name
        kept = "".join(c for c in sequences[name][0] if c not in _TONES_AND_STYLE)
        return kept or "skin-tone"

    return [(name, group(name), strike[name].imageData) for name in sorted(strike)]


def gimp_figures(cache: Path = CACHE) -> list[Path]:
    """The GIMP manual's figures (PNG and JPEG), in path order."""
    root = cache / "gimp-help-en"
    return sorted(p for p in root.rglob("*") if p.suffix.lower() in (".png", ".jpg", ".jpeg") and p.is_file())


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fetch", action="store_true", help="download and unpack the packages")
    args = parser.parse_args()
    if args.fetch:
        fetch_images()
    print(f"emoji: {len(emoji())} bitmaps; gimp: {len(gimp_figures())} figures (in {CACHE})")
