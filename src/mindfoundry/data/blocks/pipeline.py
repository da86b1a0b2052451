"""Cleaning profiles and the pipeline that chains blocks for one source.

The blocks always run in the order of :data:`BLOCK_ORDER`; a *profile* picks which of them apply
to a source, and each block's settings section can switch it off (``enabled: false``):

- ``prose``: every block (Chinese and English text);
- ``code``: only what cannot damage source code: mojibake, control characters and length.
  NFKC would rewrite string literals, boilerplate removal would delete ``import os`` (a line
  many files share), and the prose heuristics reject indentation and symbol-dense lines;
- ``none``: no cleaning (dedup still applies);
- ``auto`` (the default): ``code`` for sources of category ``code``, ``prose`` otherwise.

Settings are plain mappings (one per block, keys = constructor arguments plus ``enabled``), so
this package does not depend on the config schema.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from mindfoundry.data.blocks.base import Block
from mindfoundry.data.blocks.boilerplate import BoilerplateRemover
from mindfoundry.data.blocks.garbled import MojibakeFilter, SymbolRunFilter, SymbolRunRemover
from mindfoundry.data.blocks.normalize import ControlCharRemover, NfkcNormalizer, TimestampRemover
from mindfoundry.data.blocks.quality import LengthFilter, QualityFilter, RepetitionFilter, ScriptFilter
from mindfoundry.data.document import Document

Settings = Mapping[str, Mapping[str, Any]]

BLOCK_ORDER: tuple[str, ...] = (
    "mojibake", "control_chars", "nfkc", "timestamps", "boilerplate",
    "symbol_runs", "length", "script", "repetition", "quality",
)
PROFILES: dict[str, tuple[str, ...]] = {
    "prose": BLOCK_ORDER,
    "code": ("mojibake", "control_chars", "length"),
    "none": (),
}


def resolve_profile(profile: str, category: str) -> str:
    """The concrete profile of a source: ``auto`` becomes ``code`` or ``prose`` by category."""
    if profile == "auto":
        return "code" if category == "code" else "prose"
    if profile not in PROFILES:
        raise ValueError(f"unknown cleaning profile {profile!r}: choose auto, {', '.join(PROFILES)}")
    return profile


def active_sections(settings: Settings, profile: str) -> list[str]:
    """Names of the blocks that run for ``profile``, in pipeline order."""
    return [name for name in PROFILES[profile] if settings[name].get("enabled", True)]


def _args(section: Mapping[str, Any], *names: str) -> dict[str, Any]:
    return {name: section[name] for name in names}


def _kwargs(section: Mapping[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in section.items() if key != "enabled"}


_FACTORIES: dict[str, Callable[[Mapping[str, Any], frozenset[int]], list[Block]]] = {
    "mojibake": lambda s, _: [MojibakeFilter(**_kwargs(s))],
    "control_chars": lambda s, _: [ControlCharRemover()],
    "nfkc": lambda s, _: [NfkcNormalizer(**_kwargs(s))],
    "timestamps": lambda s, _: [TimestampRemover()],
    "boilerplate": lambda s, lines: [BoilerplateRemover(lines, **_args(s, "min_line_chars", "ad_patterns"))],
    "symbol_runs": lambda s, _: [
        SymbolRunFilter(**_kwargs(s)),
        SymbolRunRemover(**_args(s, "min_run")),
    ],
    "length": lambda s, _: [LengthFilter(**_kwargs(s))],
    "script": lambda s, _: [ScriptFilter(**_kwargs(s))],
    "repetition": lambda s, _: [RepetitionFilter(**_kwargs(s))],
    "quality": lambda s, _: [QualityFilter(**_kwargs(s))],
}


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
    frequent_lines: frozenset[int] = frozenset(),
    until: str | None = None,
) -> CleaningPipeline:
    """The pipeline of one source: the active blocks of ``profile`` configured by ``settings``.

    ``frequent_lines`` are the boilerplate line keys from the corpus-wide pre-pass. ``until``
    stops before the named block (the boilerplate pre-pass counts lines as that block sees them).
    """
    blocks: list[Block] = []
    for name in active_sections(settings, profile):
        if name == until:
            break
        blocks.extend(_FACTORIES[name](settings[name], frequent_lines))
    return CleaningPipeline(blocks)
