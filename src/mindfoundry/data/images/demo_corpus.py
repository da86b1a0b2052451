"""The image demo corpus: Noto Color Emoji's bitmaps captioned with their Unicode CLDR names (English, and Chinese
beside it), written as a WebDataset shard in img2dataset's layout -- what ``configs/demo-images.yaml`` prepares --
and beside it the handwritten digits the linear probe may fit on (:mod:`.digits`; its held-out ones never), captioned
"the handwritten digit three", which the image objectives' demos add (``configs/demo-mae.yaml``).

Both come from Debian packages (a package registry, never a hub), fetched once into a cache with ``apt-get
download`` and unpacked with ``dpkg-deb -x``: ``fonts-noto-color-emoji`` (the font, OFL-1.1; its bitmaps are the
font's CBDT table, read with fontTools) and ``unicode-cldr-core`` (the CLDR annotations, Unicode licence: the
``tts`` name of every emoji and, in ``annotationsDerived``, of every sequence: skin tones, flags, families). A glyph
stands for the characters that map to it (cmap) or that its ligature is made of (GSUB); an emoji with no English
name in CLDR is left out (the font's private glyphs).
"""

from __future__ import annotations

import io
import json
import subprocess
import tarfile
import xml.etree.ElementTree as ElementTree
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from PIL import Image

from mindfoundry.atomic import fsync_path, publish_files, publish_folder
from mindfoundry.data.images.digits import NAMES, digits_images, probe_split
from mindfoundry.errors import InputMissingError

PACKAGES = ("fonts-noto-color-emoji", "unicode-cldr-core")
#: The variation selector an emoji sequence may carry (CLDR names the sequence without it).
_EMOJI_STYLE = "\ufe0f"


@dataclass(frozen=True)
class Emoji:
    """One emoji: the characters it stands for, its bitmap (PNG bytes) and its CLDR names."""

    sequence: str
    png: bytes
    english: str
    chinese: str | None


def fetch(cache: Path) -> Path:
    """The two packages unpacked under ``cache`` (downloaded and unpacked the first time); ``cache``."""
    debs = cache / "debs"
    debs.mkdir(parents=True, exist_ok=True)
    missing = [name for name in PACKAGES if not (cache / name).is_dir()]
    for name in missing:
        if not list(debs.glob(f"{name}_*.deb")):
            try:
                subprocess.run(["apt-get", "download", name], cwd=debs, check=True, capture_output=True, text=True)
            except (OSError, subprocess.CalledProcessError) as exc:
                detail = getattr(exc, "stderr", "") or str(exc)
                raise InputMissingError(
                    f"could not download the Debian package {name} with apt-get ({detail.strip()}): the image demo "
                    f"needs apt-get and a Debian package mirror (run `apt-get update` first), or put {name}_*.deb in "
                    f"{debs}") from None
        deb = sorted(debs.glob(f"{name}_*.deb"))[-1]
        subprocess.run(["dpkg-deb", "-x", str(deb), str(cache / f"{name}.partial")], check=True)
        publish_folder(cache / f"{name}.partial", cache / name)
    return cache


def emoji(cache: Path) -> Iterator[Emoji]:
    """Every emoji of the font with an English CLDR name, in glyph-name order (see the module docstring)."""
    from fontTools.ttLib import TTFont

    font = TTFont(next((cache / "fonts-noto-color-emoji").rglob("NotoColorEmoji.ttf")))
    english, chinese = _names(cache, "en"), _names(cache, "zh")
    sequences = glyph_sequences(font)
    strike = font["CBDT"].strikeData[0]
    for glyph in sorted(strike):
        named = [s for s in (s.replace(_EMOJI_STYLE, "") for s in sequences.get(glyph, [])) if s in english]
        if named:
            yield Emoji(named[0], strike[glyph].imageData, english[named[0]], chinese.get(named[0]))


def glyph_sequences(font: object) -> dict[str, list[str]]:
    """{glyph: the character sequences it stands for}: the cmap's code point, else every GSUB ligature that makes
    it (the font makes some ZWJ sequences from their characters in both orders)."""
    by_code = {glyph: chr(code) for code, glyph in font.getBestCmap().items()}
    found: dict[str, list[str]] = {glyph: [char] for glyph, char in by_code.items()}
    for lookup in font["GSUB"].table.LookupList.Lookup:
        for table in lookup.SubTable:
            table = getattr(table, "ExtSubTable", table)
            for first, ligatures in getattr(table, "ligatures", {}).items():
                for ligature in ligatures:
                    parts = [first, *ligature.Component]
                    if ligature.LigGlyph not in by_code and all(part in by_code for part in parts):
                        found.setdefault(ligature.LigGlyph, []).append("".join(by_code[p] for p in parts))
    return found


def _names(cache: Path, language: str) -> dict[str, str]:
    """{emoji sequence: its CLDR text-to-speech name} in ``language`` (annotations, then the derived ones)."""
    root = cache / "unicode-cldr-core" / "usr/share/unicode/cldr/common"
    names: dict[str, str] = {}
    for folder in ("annotations", "annotationsDerived"):
        for node in ElementTree.parse(root / folder / f"{language}.xml").getroot().iter("annotation"):
            if node.get("type") == "tts" and node.text:
                names.setdefault(node.get("cp", "").replace(_EMOJI_STYLE, ""), node.text.strip())
    return names


def write_digits(out: Path, size: int = 32) -> int:
    """The probe's fitted digits as ``out/digits/00000.tar`` (``KEY.png`` at ``size``, ``KEY.txt`` its caption,
    ``KEY.json`` its label), written to a temporary name and renamed; the images written. An existing shard is left."""
    shard = out / "digits" / "00000.tar"
    if shard.is_file():
        with tarfile.open(shard) as tar:
            return sum(name.endswith(".png") for name in tar.getnames())
    images, labels = digits_images(size)
    fit, _ = probe_split(labels)
    members = []
    for i in fit.tolist():
        png = io.BytesIO()
        Image.fromarray(images[i]).save(png, format="PNG")
        members.append((f"{i:09d}", png.getvalue(), f"the handwritten digit {NAMES[labels[i]]}",
                        {"label": int(labels[i]), "index": i}))
    _write_shard(shard, members)
    return len(members)


def _write_shard(shard: Path, members: list[tuple[str, bytes, str, dict]]) -> None:
    """A WebDataset tar of (key, png, caption, json) samples, written to a temporary name and renamed."""
    shard.parent.mkdir(parents=True, exist_ok=True)
    partial = shard.with_suffix(".tar.partial")
    with tarfile.open(partial, "w", format=tarfile.USTAR_FORMAT) as tar:
        for key, png, caption, meta in members:
            for name, blob in ((f"{key}.png", png), (f"{key}.txt", caption.encode()),
                               (f"{key}.json", json.dumps(meta, ensure_ascii=False).encode())):
                info = tarfile.TarInfo(name)
                info.size, info.mtime, info.mode = len(blob), 0, 0o644
                tar.addfile(info, io.BytesIO(blob))
    fsync_path(partial)
    publish_files([(partial, shard)])


def write_corpus(cache: Path, out: Path, limit: int | None = None) -> int:
    """The emoji as ``out/emoji/00000.tar`` (``KEY.png``, ``KEY.txt`` the English name, ``KEY.json`` with the
    Chinese name and the code points), written to a temporary name and renamed; the pairs written. An existing
    corpus is left as it is."""
    shard = out / "emoji" / "00000.tar"
    if shard.is_file():
        with tarfile.open(shard) as tar:
            return sum(name.endswith(".png") for name in tar.getnames())
    members = []
    for item in emoji(fetch(cache)):
        if limit is not None and len(members) >= limit:
            break
        meta = {"caption": item.english, "zh": item.chinese,
                "codepoints": " ".join(f"U+{ord(c):04X}" for c in item.sequence)}
        members.append((f"{len(members):09d}", item.png, item.english, meta))
    _write_shard(shard, members)
    return len(members)
