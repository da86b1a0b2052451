"""`prepare --preview N`: what cleaning would do to the first N documents of each source, without writing anything.

Each source's first ``n`` documents are read and cleaned by its profile's blocks, exactly as
``prepare`` would clean them, with one difference a preview cannot avoid: the boilerplate
pre-pass counts lines over the previewed documents only, so a line counts as boilerplate when it
is frequent *among them* (``min_documents`` is capped at half of the previewed documents of the
sources that run the block). Dedup needs the whole corpus and is not previewed. The result is the
drop-log lines (:mod:`~mindfoundry.data.clean.droplog`) of every dropped or edited document.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field
from typing import Any

from mindfoundry.config.data_config import DataConfig
from mindfoundry.config.storage_config import StorageConfig
from mindfoundry.data.clean.boilerplate import LineCounter
from mindfoundry.data.clean.curate import CUT, clean_chunk, clean_profile, runs_block, source_pipeline
from mindfoundry.data.document import Document
from mindfoundry.data.ingest.files import SourceStats
from mindfoundry.data.ingest.inputs import read_source
from mindfoundry.errors import MindFoundryError


class PreviewError(MindFoundryError, ValueError):
    """A preview that cannot run as asked."""


@dataclass
class SourcePreview:
    """One source's previewed documents: how many were read and kept, and what happened to the others."""

    name: str
    profile: str
    read: int = 0
    kept: int = 0
    events: list[dict[str, Any]] = field(default_factory=list)
    #: The documents kept, as cleaned (what a quality bench or test compares with the input).
    documents: list[Document] = field(default_factory=list)


def preview_cleaning(data: DataConfig, n: int, storage: StorageConfig | None = None) -> tuple[list[SourcePreview], int]:
    """Clean the first ``n`` documents of every source; return each source's preview and the boilerplate
    ``min_documents`` used over the previewed documents."""
    if n < 1:
        raise PreviewError(f"--preview needs at least 1 document per source, got {n}")
    docs = [list(enumerate(itertools.islice(read_source(data, i, SourceStats(), storage), n)))
            for i in range(len(data.sources))]
    settings = data.clean.boilerplate
    counted = [i for i, src in enumerate(data.sources) if runs_block(data, src, CUT)]
    min_documents = max(2, min(settings.min_documents, sum(len(docs[i]) for i in counted) // 2))
    counter = LineCounter(settings.min_line_chars, settings.edge_lines)
    first = [clean_chunk(source_pipeline(data, src, "before"), docs[i]) for i, src in enumerate(data.sources)]
    for i in counted:
        for _, doc in first[i][0]:
            counter.add(doc.text, doc.source)
    lines = counter.frequent(min_documents, settings.min_source_share)
    previews = []
    for i, src in enumerate(data.sources):
        (kept_before, lines_before), pipeline = first[i], source_pipeline(data, src, "from", lines)
        kept, lines_after = clean_chunk(pipeline, kept_before)
        events = [line for _, line in heapq.merge(lines_before, lines_after, key=lambda item: item[0])]
        previews.append(
            SourcePreview(
                src.name,
                clean_profile(data, src),
                read=len(docs[i]),
                kept=len(kept),
                events=events,
                documents=[doc for _, doc in kept],
            )
        )
    return previews, min_documents
