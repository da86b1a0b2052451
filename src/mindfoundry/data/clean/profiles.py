"""Cleaning profiles and the pipeline that chains blocks for one source.

The blocks always run in the order of the data.clean sections (:data:`~mindfoundry.config.clean.CLEAN_BLOCKS`); a
*profile* picks which of them apply
to a source, and each block's settings section can switch it off (``enabled: false``):

- ``prose``: every block (Chinese and English text);
- ``docs``: every block, with the settings of :data:`PROFILE_SETTINGS`: boilerplate only at a
  document's edges (in manuals and API references a line many pages share, "Traceback (most
  recent call last):", is content) and repetition limits for reference text;
- ``code``: only what cannot damage source code: mojibake, control characters, length and the language rule
  (judged on the comments, strings and prose lines). NFKC would rewrite string literals, boilerplate removal would
  delete ``import os`` (a line many files share), and the prose heuristics reject indentation and symbol-dense lines;
- ``none``: no cleaning (dedup still applies);
- ``auto`` (the default): per document, the profile of what the document is, read from its content
  (:func:`~mindfoundry.data.clean.kind.document_kind`: code lines, headings, option lists, markup), so a
  source of manuals with a few prose chapters, or of code with READMEs, gets each document's fair rules.

Settings are plain mappings (one per section, keys = the section's fields), validated by each
block through its section class.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from mindfoundry.config.clean import CLEAN_BLOCKS, GOPHER_DUPLICATE_NGRAMS
from mindfoundry.data.clean.block import Block, BlockStats
from mindfoundry.data.clean.boilerplate import BoilerplateRemover, FrequentLines
from mindfoundry.data.clean.garbled import MojibakeFilter, SymbolRunFilter, SymbolRunRemover
from mindfoundry.data.clean.junk import JunkRemover
from mindfoundry.data.clean.kind import KINDS, Kind, document_kind
from mindfoundry.data.clean.language import LanguageFilter
from mindfoundry.data.clean.normalize import ControlCharRemover, NfkcNormalizer, TimestampRemover
from mindfoundry.data.clean.quality import LengthFilter, QualityFilter, ScriptFilter
from mindfoundry.data.clean.repetition import RepetitionFilter
from mindfoundry.data.document import Document

Settings = Mapping[str, Mapping[str, Any]]

#: The blocks of each data.clean section, in the order they run within it (symbol runs: drop the documents they
#: dominate, then delete the runs from the rest). The sections run in config order (CLEAN_BLOCKS).
SECTION_BLOCKS: dict[str, tuple[type[Block], ...]] = {
    "mojibake": (MojibakeFilter,), "control_chars": (ControlCharRemover,), "nfkc": (NfkcNormalizer,),
    "timestamps": (TimestampRemover,), "junk": (JunkRemover,), "boilerplate": (BoilerplateRemover,),
    "symbol_runs": (SymbolRunFilter, SymbolRunRemover), "length": (LengthFilter,), "script": (ScriptFilter,),
    "language": (LanguageFilter,), "repetition": (RepetitionFilter,), "quality": (QualityFilter,),
}
#: The data.clean section of each block name (``symbol_run_filter`` is set in ``symbol_runs``): what a message names.
BLOCK_SECTION: dict[str, str] = {cls.name: section for section, classes in SECTION_BLOCKS.items() for cls in classes}
#: The profile that picks one of the kinds' profiles per document.
AUTO = "auto"
PROFILES: dict[str, tuple[str, ...]] = {
    "prose": CLEAN_BLOCKS,
    "docs": CLEAN_BLOCKS,
    "code": ("mojibake", "control_chars", "length", "language"),
    "none": (),
}


#: Settings a profile gives its blocks, under whatever a source sets itself. Manuals and API references name
#: their subject over and over and repeat phrasings across options ("this option may be specified multiple
#: times"): for them the top n-gram rule is off and the duplicate n-gram limits doubled (measured on 300 real
#: man pages: docs/data-format.md). Shared lines are content there, so boilerplate goes only at the edges.
PROFILE_SETTINGS: dict[str, dict[str, dict[str, Any]]] = {
    "docs": {
        "boilerplate": {"body_lines": False},
        "repetition": {
            "top_ngrams": None,
            "duplicate_ngrams": {n: 2 * limit for n, limit in GOPHER_DUPLICATE_NGRAMS.items()},
        },
    }
}


def with_profile(settings: Mapping[str, Any], block: str, profile: str) -> dict[str, Any]:
    """One block's settings with what ``profile`` sets for it (:data:`PROFILE_SETTINGS`) on top."""
    return dict(settings) | PROFILE_SETTINGS.get(profile, {}).get(block, {})


def resolve_profile(profile: str) -> str:
    """``profile`` once checked: ``auto`` or one of :data:`PROFILES`."""
    if profile != AUTO and profile not in PROFILES:
        raise ValueError(f"unknown cleaning profile {profile!r}: choose {AUTO}, {', '.join(PROFILES)}")
    return profile


def active_sections(settings: Settings, profile: str) -> list[str]:
    """Names of the blocks that run for ``profile`` (for ``auto``: for some kind of document), in pipeline order."""
    return [name for name in PROFILES["prose" if profile == AUTO else profile] if settings[name].get("enabled", True)]


class ByKind(Block):
    """One block per kind of document (``None``: that kind skips the block), for the ``auto`` profile: each
    document goes through the block its kind (:func:`document_kind`) gets. Counts add up under the block's name."""

    def __init__(self, blocks: Mapping[Kind, Block | None]) -> None:  # noqa: D107 -- no settings of its own
        self.blocks = dict(blocks)
        self.present = [block for block in self.blocks.values() if block is not None]
        self.name = self.present[0].name  # type: ignore[misc]
        self.settings = self.present[0].settings
        self.log_events = False
        self.events = []
        self.passed = BlockStats()  # documents of a kind that skips the block

    @property  # type: ignore[override]
    def stats(self) -> BlockStats:
        total = BlockStats()
        for part in (self.passed, *(block.stats for block in self.present)):
            total.merge(part)
        return total

    def run(self, docs: Iterable[Document]) -> Iterator[Document]:
        for doc in docs:
            block = self.blocks[document_kind(doc.text)]
            if block is None:
                self.passed.seen += 1
                self.passed.kept += 1
                yield doc
                continue
            block.log_events = self.log_events
            yield from block.run((doc,))
            if block.events:
                self.events.extend(block.events)
                block.events = []


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
    own: frozenset[str] = frozenset(),
) -> CleaningPipeline:
    """The pipeline of one source: the active blocks of ``profile`` configured by ``settings``.

    ``frequent_lines`` are the boilerplate line keys counted over the whole corpus. ``sections`` limits
    the pipeline to those blocks (the part before the boilerplate block, whose input is what the
    lines are counted on, or the part from it on: :func:`~mindfoundry.data.clean.curate.source_pipeline`).
    For ``auto``, a block whose settings differ between the kinds of document (a profile's settings, except
    in the sections ``own`` names: a source's own overrides win) or that some kind skips is a :class:`ByKind`.
    """
    blocks: list[Block] = []
    for name in active_sections(settings, profile):
        if name not in sections:
            continue
        if profile != AUTO:
            blocks.extend(cls.build(dict(settings[name]), frequent_lines) for cls in SECTION_BLOCKS[name])
            continue
        per_kind = {kind: None if name not in PROFILES[kind] else
                    dict(settings[name]) if name in own else with_profile(settings[name], name, kind) for kind in KINDS}
        for cls in SECTION_BLOCKS[name]:
            if all(value == per_kind["prose"] for value in per_kind.values()):
                blocks.append(cls.build(dict(settings[name]), frequent_lines))
            else:
                blocks.append(ByKind({kind: None if value is None else cls.build(value, frequent_lines)
                                      for kind, value in per_kind.items()}))
    return CleaningPipeline(blocks)
