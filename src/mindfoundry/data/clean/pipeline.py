"""Cleaning profiles and the pipeline that chains blocks for one source.

The blocks always run in the order of the data.clean sections (:data:`~mindfoundry.config.clean.CLEAN_BLOCKS`); a *profile* picks which of them apply
to a source, and each block's settings section can switch it off (``enabled: false``):

- ``prose``: every block (Chinese and English text);
- ``docs``: every block, with the settings of :data:`PROFILE_SETTINGS`: boilerplate only at a
  document's edges (in manuals and API references a line many pages share, "Traceback (most
  recent call last):", is content) and repetition limits for reference text;
- ``code``: only what cannot damage source code: mojibake, control characters and length.
  NFKC would rewrite string literals, boilerplate removal would delete ``import os`` (a line
  many files share), and the prose heuristics reject indentation and symbol-dense lines;
- ``none``: no cleaning (dedup still applies);
- ``auto`` (the default): ``code`` for sources of category ``code``, ``docs`` for ``docs``, ``prose`` otherwise.

Settings are plain mappings (one per section, keys = the section's fields), validated by each
block through its section class.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from mindfoundry.config.clean import CLEAN_BLOCKS, GOPHER_DUPLICATE_NGRAMS
from mindfoundry.data.clean.base import Block
from mindfoundry.data.clean.boilerplate import BoilerplateRemover, FrequentLines
from mindfoundry.data.clean.garbled import MojibakeFilter, SymbolRunFilter, SymbolRunRemover
from mindfoundry.data.clean.normalize import ControlCharRemover, NfkcNormalizer, TimestampRemover
from mindfoundry.data.clean.quality import LengthFilter, QualityFilter, RepetitionFilter, ScriptFilter
from mindfoundry.data.document import Document

Settings = Mapping[str, Mapping[str, Any]]

#: The blocks of each data.clean section, in the order they run within it (symbol runs: drop the documents they
#: dominate, then delete the runs from the rest). The sections run in config order (CLEAN_BLOCKS).
SECTION_BLOCKS: dict[str, tuple[type[Block], ...]] = {
    "mojibake": (MojibakeFilter,), "control_chars": (ControlCharRemover,), "nfkc": (NfkcNormalizer,),
    "timestamps": (TimestampRemover,), "boilerplate": (BoilerplateRemover,),
    "symbol_runs": (SymbolRunFilter, SymbolRunRemover), "length": (LengthFilter,), "script": (ScriptFilter,),
    "repetition": (RepetitionFilter,), "quality": (QualityFilter,),
}
PROFILES: dict[str, tuple[str, ...]] = {
    "prose": CLEAN_BLOCKS,
    "docs": CLEAN_BLOCKS,
    "code": ("mojibake", "control_chars", "length"),
    "none": (),
}


#: Settings a profile gives its blocks, under whatever a source sets itself. Manuals and API references name
#: their subject over and over and repeat phrasings across options ("this option may be specified multiple
#: times"): for them the top n-gram rule is off and the duplicate n-gram limits doubled (measured on 300 real
#: man pages: docs/data-format.md). Shared lines are content there, so boilerplate goes only at the edges.
PROFILE_SETTINGS: dict[str, dict[str, dict[str, Any]]] = {"docs": {
    "boilerplate": {"body_lines": False},
    "repetition": {"top_ngrams": None, "duplicate_ngrams": {n: 2 * limit for n, limit in GOPHER_DUPLICATE_NGRAMS.items()}},
}}


def with_profile(settings: Mapping[str, Any], block: str, profile: str) -> dict[str, Any]:
    """One block's settings with what ``profile`` sets for it (:data:`PROFILE_SETTINGS`) on top."""
    return dict(settings) | PROFILE_SETTINGS.get(profile, {}).get(block, {})


def resolve_profile(profile: str, category: str) -> str:
    """The concrete profile of a source: ``auto`` becomes ``code``, ``docs`` or ``prose`` by category."""
    if profile == "auto":
        return category if category in ("code", "docs") else "prose"
    if profile not in PROFILES:
        raise ValueError(f"unknown cleaning profile {profile!r}: choose auto, {', '.join(PROFILES)}")
    return profile


def active_sections(settings: Settings, profile: str) -> list[str]:
    """Names of the blocks that run for ``profile``, in pipeline order."""
    return [name for name in PROFILES[profile] if settings[name].get("enabled", True)]


class CleaningPipeline:
    """Blocks chained in order; ``run`` is lazy, ``report`` gives each block's counts."""

    def __init__(self, blocks: list[Block]) -> None:
        self.blocks = blocks

    def run(self, docs: Iterable[Document]) -> Iterator[Document]:
        stream: Iterable[Document] = docs
        for block in self.blocks:
            stream = block.run(stream)
        yield from stream

    def report(self) -> dict[str, dict[str, Any]]:
        return {block.name: block.stats.to_dict() for block in self.blocks}


def build_pipeline(
    settings: Settings,
    profile: str,
    *,
    frequent_lines: FrequentLines = FrequentLines(),
    sections: Sequence[str] = CLEAN_BLOCKS,
) -> CleaningPipeline:
    """The pipeline of one source: the active blocks of ``profile`` configured by ``settings``.

    ``frequent_lines`` are the boilerplate line keys counted over the whole corpus. ``sections`` limits
    the pipeline to those blocks (the part before the boilerplate block, whose input is what the
    lines are counted on, or the part from it on: :func:`~mindfoundry.data.clean.curate.source_pipeline`).
    """
    blocks: list[Block] = []
    for name in active_sections(settings, profile):
        if name in sections:
            blocks.extend(cls.build(dict(settings[name]), frequent_lines) for cls in SECTION_BLOCKS[name])
    return CleaningPipeline(blocks)
