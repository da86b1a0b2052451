"""The one interface every cleaning step implements, and the counters it keeps.

A block turns a stream of documents into a stream of documents (``run(docs)`` is a generator),
so blocks chain lazily and a whole corpus flows through in bounded memory. Subclasses write one
method and the base class does the bookkeeping, so every block reports the same way:

- a :class:`Filter` answers ``filter(doc)`` with ``True`` (keep) or a :class:`Drop` naming the
  reason, the measured value and the limit it broke;
- a :class:`Transform` answers ``transform(doc)`` with the edited document, ``None`` to drop it as
  left empty or a :class:`Drop` naming why; it may call :meth:`Block.count` to record what kind of edit it made.

The base class counts documents seen, kept, dropped per reason, changed, and characters removed,
so a manifest can say exactly what each block removed and why. With ``log_events`` on, a block also
keeps one :class:`Event` per document it dropped or edited (the drop log, ``drops.jsonl.gz``).
Blocks never read files and never import a training framework.

A block's parameters and their defaults are its ``data.clean`` section's fields
(:mod:`mindfoundry.config.clean`), the one place they are written: ``LengthFilter(min_chars=5)``
validates its keyword arguments through ``LengthConfig`` and keeps the result as ``settings``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, NamedTuple

from mindfoundry.config.clean import BlockSection
from mindfoundry.data.document import Document

#: Drop reason of a transform that left nothing but whitespace.
EMPTY = "empty_after_cleaning"
#: Characters of a document (or of what an edit removed) quoted in a drop-log event.
EXCERPT_CHARS = 200


class Drop(NamedTuple):
    """A filter's reason to drop a document, with the measured ``value`` and the ``limit`` it broke
    (both ``None`` where the rule is not a number, e.g. "no letters at all"), and ``details`` for its drop-log line
    (the language a document was identified as)."""

    reason: str
    value: float | None = None
    limit: float | None = None
    details: dict[str, Any] | None = None


Verdict = Literal[True] | Drop


def event(doc: Document, block: str, action: Literal["drop", "edit"], reason: str, value: float | None,
          threshold: float | None, excerpt: str, **extra: Any) -> dict[str, Any]:
    """One line of the drop log: which document (source, path, record), which block, why, and a quote."""
    rounded = round(value, 4) if isinstance(value, float) else value
    return {**doc.origin(), "block": block, "reason": reason, "action": action, "value": rounded,
            "threshold": threshold, "excerpt": excerpt[:EXCERPT_CHARS], **extra}


def changed_span(before: str, after: str, context: int = 20) -> str:
    """The part of ``before`` an edit touched, with ``context`` characters either side: what lies between the
    common prefix and the common suffix (found by bisection on slice equality, which compares in C, so long
    documents cost little)."""
    limit = min(len(before), len(after))
    low, high = 0, limit
    while low < high:  # longest common prefix
        mid = (low + high + 1) // 2
        low, high = (mid, high) if before[:mid] == after[:mid] else (low, mid - 1)
    prefix = low
    low, high = 0, limit - prefix
    while low < high:  # longest common suffix not overlapping the prefix
        mid = (low + high + 1) // 2
        low, high = (mid, high) if before[len(before) - mid:] == after[len(after) - mid:] else (low, mid - 1)
    return before[max(prefix - context, 0):len(before) - max(low - context, 0)]


@dataclass
class BlockStats:
    """What one block did to the documents that went through it.

    ``dropped`` maps a reason to the number of documents dropped for it and ``dropped_chars`` to
    their characters (what a reason costs is measured in text, not documents: one dropped manual
    page can outweigh a hundred dropped bylines); ``edits`` maps an edit kind (for example
    ``"repeated_line"``) to how many times it was applied; ``changed`` counts documents whose text
    a transform modified, ``chars_removed`` the characters it removed and ``chars_added`` those an
    edit added (NFKC turns one ligature into two letters), so characters read, removed and kept add up.
    ``labels`` sums the characters of the documents seen per label a block gives them (a language).
    """

    seen: int = 0
    kept: int = 0
    changed: int = 0
    chars_removed: int = 0
    dropped: Counter[str] = field(default_factory=Counter)
    dropped_chars: Counter[str] = field(default_factory=Counter)
    edits: Counter[str] = field(default_factory=Counter)
    chars_added: int = 0
    labels: Counter[str] = field(default_factory=Counter)

    def merge(self, other: BlockStats) -> None:
        """Add another run's counts (to total a block over several sources)."""
        self.seen += other.seen
        self.kept += other.kept
        self.changed += other.changed
        self.chars_removed += other.chars_removed
        self.dropped.update(other.dropped)
        self.dropped_chars.update(other.dropped_chars)
        self.chars_added += other.chars_added
        self.edits.update(other.edits)
        self.labels.update(other.labels)

    @classmethod
    def from_dict(cls, value: dict[str, Any]) -> BlockStats:
        """The counts :meth:`to_dict` wrote (a task's result, read back by the process that adds them up)."""
        return cls(value["seen"], value["kept"], value["changed"], value["chars_removed"], Counter(value["dropped"]),
                   Counter(value["dropped_chars"]), Counter(value["edits"]), value["chars_added"],
                   Counter(value.get("labels", {})))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready counts with reasons sorted by name (stable manifests)."""
        return {
            "seen": self.seen,
            "kept": self.kept,
            "dropped": dict(sorted(self.dropped.items())),
            "dropped_chars": dict(sorted(self.dropped_chars.items())),
            "changed": self.changed,
            "chars_removed": self.chars_removed,
            "chars_added": self.chars_added,
            "edits": dict(sorted(self.edits.items())),
            **({"labels": dict(sorted(self.labels.items()))} if self.labels else {}),
        }


class Block(ABC):
    """A step of the cleaning pipeline: a generator from documents to documents."""

    #: Name used in reports (the counts in manifest.json).
    name: ClassVar[str]
    #: The ``data.clean`` section whose fields are this block's parameters.
    section: ClassVar[type[BlockSection]]

    def __init__(self, **settings: Any) -> None:
        self.settings = self.section(**settings)  # ValidationError names an unknown or out-of-range parameter
        self.stats = BlockStats()
        #: Whether to keep an :func:`event` per dropped or edited document in ``events`` (the drop log).
        self.log_events = False
        self.events: list[dict[str, Any]] = []

    @classmethod
    def build(cls, settings: dict[str, Any], frequent_lines: object) -> Block:
        """The block configured by a mapping of its section's fields; ``frequent_lines`` (the boilerplate
        pre-pass's line keys, a ``boilerplate.FrequentLines``: not named here, so that the base of every block does
        not import one block's module) matter only to the block that deletes them."""
        return cls(**settings)

    @abstractmethod
    def run(self, docs: Iterable[Document]) -> Iterator[Document]:
        """Yield the documents this block keeps, edited if it edits."""

    def count(self, edit: str, times: int = 1) -> None:
        """Record ``times`` edits of kind ``edit`` (called by transforms while editing)."""
        if times:
            self.stats.edits[edit] += times


class Filter(Block):
    """A block that keeps or drops whole documents and never edits them."""

    def run(self, docs: Iterable[Document]) -> Iterator[Document]:
        for doc in docs:
            self.stats.seen += 1
            verdict = self.filter(doc)
            if verdict is True:
                self.stats.kept += 1
                yield doc
                continue
            self.stats.dropped[verdict.reason] += 1
            self.stats.dropped_chars[verdict.reason] += len(doc.text)
            if self.log_events:
                self.events.append(event(doc, self.name, "drop", verdict.reason, verdict.value, verdict.limit, doc.text,
                                         chars=len(doc.text), **(verdict.details or {})))

    @abstractmethod
    def filter(self, doc: Document) -> Verdict:
        """``True`` to keep ``doc``, a :class:`Drop` to drop it."""


class Transform(Block):
    """A block that edits documents; one left empty (or returned as ``None``) is dropped."""

    def run(self, docs: Iterable[Document]) -> Iterator[Document]:
        for doc in docs:
            self.stats.seen += 1
            original = doc.text
            edits_before = Counter(self.stats.edits) if self.log_events else None
            result = self.transform(doc)
            if not isinstance(result, Document) or not result.text.strip():
                drop = result if isinstance(result, Drop) else Drop(EMPTY, len(original))
                self.stats.dropped[drop.reason] += 1
                self.stats.dropped_chars[drop.reason] += len(original)
                if self.log_events:
                    self.events.append(event(doc, self.name, "drop", drop.reason, drop.value, drop.limit, original,
                                             chars=len(original), **(drop.details or {})))
                continue
            if result.text != original:
                removed = max(len(original) - len(result.text), 0)
                self.stats.changed += 1
                self.stats.chars_removed += removed
                self.stats.chars_added += max(len(result.text) - len(original), 0)
                if edits_before is not None:
                    kinds = "+".join(sorted(self.stats.edits - edits_before)) or self.name
                    self.events.append(event(doc, self.name, "edit", kinds, removed, None,
                                             changed_span(original, result.text)))
            self.stats.kept += 1
            yield result

    @abstractmethod
    def transform(self, doc: Document) -> Document | Drop | None:
        """The edited document (a new one or ``doc`` itself), a :class:`Drop` or ``None`` (left empty) to drop it."""
