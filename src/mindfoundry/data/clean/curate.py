"""What curating a source means: its profile's blocks, cut in two where corpus-wide counts are needed.

Every block keeps no state from one document to the next (only counters), so a source can be
cleaned in any number of pieces, by any number of processes, and give what one pass over it
gives. One block is different: boilerplate removal needs to know which lines many documents of
the whole corpus share, counted over the text as that block sees it. So a source's pipeline is
cut at :data:`CUT` -- the blocks before it (:func:`source_pipeline` ``part="before"``) run on the
documents as read, their lines are counted corpus-wide, and the rest (``part="from"``) runs with
those counts -- and each block still runs once per document (:mod:`mindfoundry.data.prepare.pipeline`).

:func:`clean_chunk` runs a pipeline over a chunk of documents and returns the documents kept and
the drop-log lines of the chunk in document order (a document's lines in block order), keyed by
each document's *ordinal*, its position in its read task, so the lines of two halves of the
pipeline and of dedup merge into the drop log a single pass would write.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, Literal

from mindfoundry.config.clean import CLEAN_BLOCKS
from mindfoundry.config.data_config import DataConfig, SourceConfig
from mindfoundry.data.clean.block import event
from mindfoundry.data.clean.boilerplate import FrequentLines
from mindfoundry.data.clean.profiles import (
    CleaningPipeline,
    active_sections,
    build_pipeline,
    resolve_profile,
    with_profile,
)
from mindfoundry.data.document import Document

#: The block whose input needs counts over the whole corpus: where a source's pipeline is cut.
CUT = "boilerplate"
#: A chunk ends after this many documents or this many characters, whichever comes first.
CHUNK_DOCUMENTS = 512
CHUNK_CHARS = 256 * 1024

Numbered = tuple[int, Document]  # (ordinal, document)
Event = tuple[int, dict[str, Any]]  # (ordinal, drop-log line)


def clean_profile(data: DataConfig, src: SourceConfig) -> str:
    """The source's concrete cleaning profile (``none`` when ``data.clean.enabled`` is false)."""
    if not data.clean.enabled:
        return "none"
    return resolve_profile(src.clean.profile)


def clean_settings(data: DataConfig, src: SourceConfig) -> dict[str, dict[str, Any]]:
    """Each block's settings for this source: its own override section (already completed from ``data.clean``),
    else ``data.clean``'s with what the source's profile sets (:func:`with_profile`)."""
    profile = clean_profile(data, src)
    settings = {}
    for name in CLEAN_BLOCKS:
        own = getattr(src.clean, name)
        settings[name] = (
            own.model_dump() if own is not None else with_profile(getattr(data.clean, name).model_dump(), name, profile)
        )
    return settings


def runs_block(data: DataConfig, src: SourceConfig, block: str) -> bool:
    """Whether ``block`` is in this source's profile and enabled for it."""
    return block in active_sections(clean_settings(data, src), clean_profile(data, src))


def source_pipeline(data: DataConfig, src: SourceConfig, part: Literal["before", "from"],
                    frequent_lines: FrequentLines = FrequentLines()) -> CleaningPipeline:
    """The blocks of ``src``'s profile before :data:`CUT` or from it on (``frequent_lines``: the corpus-wide
    boilerplate counts the second part deletes), each keeping a drop-log line per document it drops or edits."""
    cut = CLEAN_BLOCKS.index(CUT)
    sections = CLEAN_BLOCKS[:cut] if part == "before" else CLEAN_BLOCKS[cut:]
    own = frozenset(name for name in CLEAN_BLOCKS if getattr(src.clean, name) is not None)
    pipeline = build_pipeline(clean_settings(data, src), clean_profile(data, src), frequent_lines=frequent_lines,
                              sections=sections, own=own)
    for block in pipeline.blocks:
        block.log_events = True
    return pipeline


def chunked(docs: Iterable[Numbered]) -> Iterator[list[Numbered]]:
    """Consecutive documents, at most :data:`CHUNK_DOCUMENTS` or about :data:`CHUNK_CHARS` of text per chunk."""
    chunk: list[Numbered] = []
    chars = 0
    for item in docs:
        chunk.append(item)
        chars += len(item[1].text)
        if len(chunk) >= CHUNK_DOCUMENTS or chars >= CHUNK_CHARS:
            yield chunk
            chunk, chars = [], 0
    if chunk:
        yield chunk


def clean_chunk(pipeline: CleaningPipeline, chunk: list[Numbered]) -> tuple[list[Numbered], list[Event]]:
    """The chunk's documents ``pipeline`` keeps (edited), and its drop-log lines in document order.

    The pipeline's counters go on adding up over the chunks; its blocks' lines are taken out each time.
    """
    ordinal = {(doc.path, doc.record): number for number, doc in chunk}  # (path, record) is unique within a source
    kept = [(ordinal[(doc.path, doc.record)], doc) for doc in pipeline.run(doc for _, doc in chunk)]
    lines = [(ordinal[(line["path"], line["record"])], line) for block in pipeline.blocks for line in block.events]
    for block in pipeline.blocks:
        block.events = []
    lines.sort(key=lambda item: item[0])  # stable: a document's lines stay in block order
    return kept, lines


def dedup_event(
    doc: Document, kind: str, kept: dict[str, Any], jaccard: float | None, threshold: float
) -> dict[str, Any]:
    """The drop-log line of a document dedup dropped: the twin that stays and their Jaccard similarity."""
    return event(doc, "dedup", "drop", kind, jaccard, 1.0 if kind == "exact" else threshold, doc.text,
                 kept=kept, jaccard=None if jaccard is None else round(jaccard, 4), chars=len(doc.text))
