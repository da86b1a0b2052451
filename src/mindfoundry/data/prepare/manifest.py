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

from mindfoundry.config.data_config import SourceConfig
from mindfoundry.data.clean.block import BlockStats
from mindfoundry.data.clean.profiles import BLOCK_SECTION
from mindfoundry.data.dataset.prepared import SPLITS, DataError
from mindfoundry.data.prepare.results import CleanResult, ReadResult, ShardResult

#: prepare warns about a source whose characters the cleaning rules removed more than this share of.
RULE_WARNING_SHARE = 0.05


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
    dedup_chars: Counter[str] = field(default_factory=Counter)
    splits: dict[str, Counter[str]] = field(default_factory=lambda: {split: Counter() for split in SPLITS})

    def add_read(self, result: ReadResult) -> None:
        self.stats.update(result.stats)
        self.files += result.files
        self.notes += result.notes
        self.add_blocks(result)

    def add_blocks(self, result: ReadResult | CleanResult) -> None:
        """A cleaning stage's block counts (the read stage's blocks come before the clean stage's)."""
        for name, counts in result.blocks.items():
            self.blocks.setdefault(name, BlockStats()).merge(BlockStats.from_dict(counts))

    def add_shards(self, result: ShardResult) -> None:
        for split in SPLITS:
            self.splits[split].update(result.splits[split])
        self.dedup_chars.update(result.dedup_chars)

    @property
    def kept(self) -> int:
        return sum(counts["documents"] for counts in self.splits.values())

    def removed(self) -> dict[str, int]:
        """``{"block.reason": documents}`` for every non-zero drop, cleaning then dedup."""
        out = {
            f"{name}.{reason}": n for name, stats in self.blocks.items() for reason, n in sorted(stats.dropped.items())
        }
        out.update({f"dedup.{kind}": n for kind, n in sorted(self.dedup.items())})
        return {key: n for key, n in out.items() if n}

    def removed_chars(self) -> dict[str, int]:
        """``{"block.reason": characters}``: the characters of the documents each rule dropped, what each block's
        edits deleted (``"block.edits"``), then dedup's drops."""
        out = {
            f"{name}.{reason}": n
            for name, stats in self.blocks.items()
            for reason, n in sorted(stats.dropped_chars.items())
        }
        out.update({f"{name}.edits": stats.chars_removed for name, stats in self.blocks.items()})
        out.update({f"dedup.{kind}": n for kind, n in sorted(self.dedup_chars.items())})
        return {key: n for key, n in out.items() if n}

    def chars(self) -> dict[str, int]:
        """Characters read, removed by the cleaning rules (dropped documents and edits), added by edits, removed by
        dedup, and kept: read - removed_by_rules + added_by_edits - removed_by_dedup = kept."""
        removed = self.removed_chars()
        dedup = sum(n for key, n in removed.items() if key.startswith("dedup."))
        return {"read": self.stats["chars"], "removed_by_rules": sum(removed.values()) - dedup,
                "added_by_edits": sum(stats.chars_added for stats in self.blocks.values()), "removed_by_dedup": dedup,
                "kept": sum(counts["chars"] for counts in self.splits.values())}

    def entry(self) -> dict[str, Any]:
        """The source's entry in the manifest's ``sources``."""
        src = self.src
        counters = {key: self.stats[key] for key in self.stats}
        languages = self.languages()
        return {
            "name": src.name,
            "category": src.category,
            "builtin": src.builtin,
            "paths": src.paths,
            "stats": counters,
            "removed": self.removed(),
            "kept": self.kept,
            "files": self.files,
            "splits": {
                split: {k: self.splits[split][k] for k in ("documents", "tokens", "bytes", "chars")} for split in SPLITS
            },
            "chars": self.chars(),
            "removed_chars": self.removed_chars(),
            **({"languages": languages} if languages else {}),
        }

    def languages(self) -> dict[str, int]:
        """Characters per language of the documents the language block identified, most first (empty when it did
        not run)."""
        block = self.blocks.get("language")
        return dict(sorted(block.labels.items(), key=lambda kv: (-kv[1], kv[0]))) if block else {}

    def rule_warning(self, share: float = RULE_WARNING_SHARE) -> str | None:
        """A warning when the cleaning rules (not dedup) removed more than ``share`` of the source's characters: the
        block that removed most, and the setting that would keep its text."""
        chars = self.chars()
        if not chars["read"] or chars["removed_by_rules"] <= share * chars["read"]:
            return None
        by_block: Counter[str] = Counter()
        for key, n in self.removed_chars().items():
            if not key.startswith("dedup."):
                by_block[key.split(".", 1)[0]] += n
        block, most = by_block.most_common(1)[0]
        reasons = ", ".join(
            f"{key.split('.', 1)[1]} {n:,}"
            for key, n in sorted(self.removed_chars().items(), key=lambda kv: -kv[1])
            if key.startswith(f"{block}.")
        )
        section = BLOCK_SECTION.get(block, block)
        return (
            f"warning: cleaning removed {chars['removed_by_rules'] / chars['read']:.1%} of source '{self.src.name}''s "
            f"characters, {most / chars['read']:.1%} by the {block} block ({reasons}): if that is good text, relax "
            f"data.clean.{section}, or set it for this source only (clean: {{{section}: {{enabled: false}}}} or "
            f"another clean.profile); `mindfoundry data drops CONFIG --block {block}` shows what went"
        )

    def check_read(self) -> None:
        """A source that yields nothing is a mistake: say what reading skipped."""
        if self.stats["documents"] == 0:
            notes = "; ".join(self.notes)
            s = self.stats
            raise DataError(
                f"source '{self.src.name}' produced no documents (read {len(self.files)} files, skipped "
                f"{s['skipped_empty']} empty, {s['skipped_too_long']} too long, {s['skipped_non_utf8']} non-UTF-8, "
                f"{s['skipped_missing_text']} without the text field{'; ' + notes if notes else ''}): "
                "check its paths and format"
            )

    def check_kept(self, kept: int) -> None:
        """A source that curation emptied is a mistake: say which rules removed it."""
        if kept == 0:
            reasons = ", ".join(
                f"{reason} {n}" for reason, n in sorted(self.removed().items(), key=lambda kv: -kv[1])[:3]
            )
            raise DataError(
                f"source '{self.src.name}': all {self.stats['documents']} documents it read were removed ({reasons}): "
                "relax those limits in data.clean, or set this source's clean.profile (e.g. 'code' or 'none')"
            )


def cleaning(summaries: list[SourceSummary]) -> dict[str, Any]:
    """The manifest's ``cleaning``: per source its profile and block counts, and each block summed over sources."""
    totals: dict[str, BlockStats] = {}
    for summary in summaries:
        for name, stats in summary.blocks.items():
            totals.setdefault(name, BlockStats()).merge(stats)
    return {"sources": {s.src.name: {"profile": s.profile, "blocks": {n: b.to_dict() for n, b in s.blocks.items()}}
                        for s in summaries},
            "totals": {name: stats.to_dict() for name, stats in totals.items()}}


def language_mix(languages: dict[str, int], top: int = 3) -> str:
    """``zh 91.2%, en 8.5%, und 0.3%``: the shares of the identified characters of the first ``top`` languages of a
    manifest's ``languages`` (most first, :meth:`SourceSummary.languages`), the rest summed as ``other``."""
    total = sum(languages.values())
    if not total:
        return "-"
    ranked = list(languages.items())
    parts = [f"{code} {n / total:.1%}" for code, n in ranked[:top]]
    rest = sum(n for _, n in ranked[top:])
    return ", ".join(parts + ([f"other {rest / total:.1%}"] if rest else []))


def source_line(entry: dict[str, Any]) -> str:
    """One log line per source: read, skipped on reading, removed by curation, kept, in documents and characters."""
    stats, chars = entry["stats"], entry["chars"]
    skipped = {k.removeprefix("skipped_"): n for k, n in stats.items() if k.startswith("skipped_") and n}
    removed = sorted(entry["removed"].items(), key=lambda kv: -kv[1])
    parts = [f"{entry['name']}: read {stats['documents']} ({chars['read']:,} characters)"]
    if skipped:
        parts.append("skipped " + ", ".join(f"{n} {reason}" for reason, n in skipped.items()))
    gone = chars["removed_by_rules"] + chars["removed_by_dedup"]
    if removed or gone:
        top = ", ".join(f"{n} {reason}" for reason, n in removed[:4])
        share = f"{gone / chars['read']:.1%}" if chars["read"] else "-"
        parts.append(
            f"removed {sum(n for _, n in removed)} ({top}{', ...' if len(removed) > 4 else ''}) and {gone:,} "
            f"characters ({share}: {chars['removed_by_rules']:,} by rules, {chars['removed_by_dedup']:,} by dedup)"
        )
    parts.append(f"kept {entry['kept']} ({chars['kept']:,} characters)")
    if entry.get("languages"):
        parts.append(f"languages {language_mix(entry['languages'])}")
    return "; ".join(parts)
