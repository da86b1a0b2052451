"""What a prepared folder's manifest says of each source, added up from the stages' task results.

A source's read tasks each report what they read (counters, files with their sha256, notes),
what every cleaning block did, and what went into the shards; here those add up per source in
corpus order into the manifest's ``sources`` and ``cleaning`` entries -- the same figures one
pass over the source would give -- and into the checks and log lines of a source.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from mindfoundry.config.data import SourceConfig
from mindfoundry.data.clean.base import BlockStats
from mindfoundry.data.dataset.prepared import SPLITS, DataError

Result = dict[str, Any]


@dataclass
class SourceSummary:
    """One source over all its read tasks: reading counters, files, notes, block counts, dedup drops, splits."""

    src: SourceConfig
    profile: str
    stats: Counter[str] = field(default_factory=Counter)
    files: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    blocks: dict[str, BlockStats] = field(default_factory=dict)
    dedup: dict[str, int] = field(default_factory=dict)
    splits: dict[str, Counter[str]] = field(default_factory=lambda: {split: Counter() for split in SPLITS})

    def add_read(self, result: Result) -> None:
        self.stats.update(result["stats"])
        self.files += result["files"]
        self.notes += result["notes"]
        self.add_blocks(result)

    def add_blocks(self, result: Result) -> None:
        """A cleaning stage's block counts (the read stage's blocks come before the clean stage's)."""
        for name, counts in result["blocks"].items():
            self.blocks.setdefault(name, BlockStats()).merge(BlockStats.from_dict(counts))

    def add_shards(self, result: Result) -> None:
        for split in SPLITS:
            self.splits[split].update(result["splits"][split])

    @property
    def kept(self) -> int:
        return sum(counts["documents"] for counts in self.splits.values())

    def removed(self) -> dict[str, int]:
        """``{"block.reason": documents}`` for every non-zero drop, cleaning then dedup."""
        out = {f"{name}.{reason}": n for name, stats in self.blocks.items() for reason, n in sorted(stats.dropped.items())}
        out.update({f"dedup.{kind}": n for kind, n in sorted(self.dedup.items())})
        return {key: n for key, n in out.items() if n}

    def entry(self) -> dict[str, Any]:
        """The source's entry in the manifest's ``sources``."""
        src = self.src
        counters = {key: self.stats[key] for key in self.stats}
        return {
            "name": src.name, "category": src.category, "builtin": src.builtin, "paths": src.paths,
            "stats": counters, "removed": self.removed(), "kept": self.kept, "files": self.files,
            "splits": {split: {k: self.splits[split][k] for k in ("documents", "tokens", "bytes")} for split in SPLITS},
        }

    def check_read(self) -> None:
        """A source that yields nothing is a mistake: say what reading skipped."""
        if self.stats["documents"] == 0:
            notes = "; ".join(self.notes)
            s = self.stats
            raise DataError(f"source '{self.src.name}' produced no documents (read {len(self.files)} files, skipped "
                            f"{s['skipped_empty']} empty, {s['skipped_too_long']} too long, {s['skipped_non_utf8']} non-UTF-8, "
                            f"{s['skipped_missing_text']} without the text field{'; ' + notes if notes else ''}): "
                            "check its paths and format")

    def check_kept(self, kept: int) -> None:
        """A source that curation emptied is a mistake: say which rules removed it."""
        if kept == 0:
            reasons = ", ".join(f"{reason} {n}" for reason, n in sorted(self.removed().items(), key=lambda kv: -kv[1])[:3])
            raise DataError(f"source '{self.src.name}': all {self.stats['documents']} documents it read were removed ({reasons}): "
                            "relax those limits in data.clean, or set this source's clean.profile (e.g. 'code' or 'none')")


def cleaning(summaries: list[SourceSummary]) -> dict[str, Any]:
    """The manifest's ``cleaning``: per source its profile and block counts, and each block summed over sources."""
    totals: dict[str, BlockStats] = {}
    for summary in summaries:
        for name, stats in summary.blocks.items():
            totals.setdefault(name, BlockStats()).merge(stats)
    return {"sources": {s.src.name: {"profile": s.profile, "blocks": {n: b.to_dict() for n, b in s.blocks.items()}}
                        for s in summaries},
            "totals": {name: stats.to_dict() for name, stats in totals.items()}}


def source_line(entry: dict[str, Any]) -> str:
    """One log line per source: read, skipped on reading, removed by curation, kept."""
    stats = entry["stats"]
    skipped = {k.removeprefix("skipped_"): n for k, n in stats.items() if k.startswith("skipped_") and n}
    removed = sorted(entry["removed"].items(), key=lambda kv: -kv[1])
    parts = [f"{entry['name']}: read {stats['documents']}"]
    if skipped:
        parts.append("skipped " + ", ".join(f"{n} {reason}" for reason, n in skipped.items()))
    if removed:
        top = ", ".join(f"{n} {reason}" for reason, n in removed[:4])
        parts.append(f"removed {sum(n for _, n in removed)} ({top}{', ...' if len(removed) > 4 else ''})")
    parts.append(f"kept {entry['kept']}")
    return "; ".join(parts)
