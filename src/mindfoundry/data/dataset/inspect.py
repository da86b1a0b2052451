"""`mindfoundry data inspect`: what is actually in a prepared folder, readable in a terminal.

Looking at decoded samples catches what counters cannot (markup left in, a wrong text field,
mojibake); the length histogram shows whether documents are mostly shorter than a sample; the
token counts per category and split are what the mixture weights act on, and next to each
category's raw share of the tokens stand its target share of the training samples and the share it
gets over the run's planned samples (a category that is 40% of the tokens may be 10% of what is
trained on); the removal counters say how much of each source was dropped on the way, and why.

Framework-free on purpose.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from rich import box
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from mindfoundry.config.data_config import MixtureConfig
from mindfoundry.data.dataset.mixture import build_mixture
from mindfoundry.data.dataset.prepared import SPLITS, TOKENIZER, PreparedData, read_manifest
from mindfoundry.data.dataset.validate import open_shard
from mindfoundry.data.prepare.manifest import language_mix
from mindfoundry.data.tokenizer import load_tokenizer

__all__ = ["InspectReport", "inspect_prepared", "length_histogram", "mixture_shares", "render_inspect"]

# Manifest source keys that are identity or provenance, not counts of what was removed.
_NOT_REMOVALS = {"name", "category", "builtin", "paths", "files", "splits", "languages"}
_BAR_WIDTH = 40


@dataclass
class InspectReport:
    root: Path
    samples: dict[str, list[str]]  # category -> decoded, truncated training documents
    tokens: dict[str, dict[str, int]]  # category -> split -> tokens
    histogram: list[tuple[str, int]]  # (bucket label, documents) over the train split
    removals: dict[str, dict[str, Any]]  # source -> flattened counters from the manifest
    shares: dict[str, dict[str, float]] | None = None  # category -> raw / target / realised share of training samples
    planned: int = 0  # the training samples the realised shares are counted over
    languages: dict[str, dict[str, int]] | None = None  # source -> language -> characters (data.clean.language)
    images: dict[str, Any] | None = None  # the manifest's images section, for image sources


def mixture_shares(data: PreparedData, mixture: MixtureConfig | None, *, seq_len: int, seed: int, shuffle: bool,
                   planned: int) -> dict[str, dict[str, float]]:
    """Per category: its raw share (of the training tokens), its target share of the training samples (the mixture's
    weights; without a mixture, the raw share: one stream in proportion to size) and the share it actually gets over
    the ``planned`` samples of the run (the mixture's positions 0..planned-1)."""
    tokens: dict[str, int] = {}
    for source in data.manifest["sources"]:
        category = source["category"] or source["name"]
        tokens[category] = tokens.get(category, 0) + source["splits"]["train"]["tokens"]
    total = max(sum(tokens.values()), 1)
    raw = {category: n / total for category, n in tokens.items()}
    if mixture is None:
        return {category: {"raw": share, "target": share, "realised": share} for category, share in raw.items()}
    realised = build_mixture(data, mixture, seq_len=seq_len, seed=seed, shuffle=shuffle).realized(0, planned)[
        "categories"
    ]
    return {category: {"raw": raw[category], "target": row["target"], "realised": row["realized"]}
            for category, row in realised.items()}


def inspect_prepared(root: str | Path, *, per_category: int = 3, max_chars: int = 160, seed: int = 0) -> InspectReport:
    """Gather the report; ``per_category`` documents per category are drawn with ``seed``."""
    root = Path(root)
    manifest, _ = read_manifest(root)
    tok = load_tokenizer(root / TOKENIZER)
    rng = np.random.RandomState(seed)
    samples: dict[str, list[str]] = {}
    tokens: dict[str, dict[str, int]] = {}
    train_lengths = []
    for source in manifest["sources"]:
        category = source["category"] or source["name"]
        counts = tokens.setdefault(category, dict.fromkeys(SPLITS, 0))
        for split in SPLITS:
            counts[split] += source["splits"][split]["tokens"]
        ds = open_shard(root / "train" / source["name"])
        train_lengths.append(np.asarray(ds.sequence_lengths))
        picks = rng.choice(len(ds), size=min(per_category, len(ds)), replace=False) if len(ds) else []
        samples.setdefault(category, []).extend(
            _preview(tok.decode(ds[int(i)].tolist()), max_chars) for i in sorted(picks)
        )
    lengths = np.concatenate(train_lengths) if train_lengths else np.empty(0, dtype=np.int64)
    removals = {s["name"]: _removal_counters(s) for s in manifest["sources"]}
    languages = {s["name"]: s["languages"] for s in manifest["sources"] if s.get("languages")}
    return InspectReport(root, samples, tokens, length_histogram(lengths), removals, languages=languages or None,
                         images=manifest.get("images"))


def _preview(text: str, max_chars: int) -> str:
    """One line: newlines shown as ⏎, cut at ``max_chars`` with an ellipsis."""
    flat = text.replace("\r\n", "\n").replace("\n", "⏎")
    return flat if len(flat) <= max_chars else flat[: max_chars - 1] + "…"


def _removal_counters(source: dict[str, Any]) -> dict[str, Any]:
    """The source's read/skip counters (``stats``) plus any other counters it carries (e.g. per filter)."""
    extra = {k: v for k, v in source.items() if k not in _NOT_REMOVALS}
    return _flatten({**extra.pop("stats", {}), **extra})


def _flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested counters (e.g. per-filter removals) as ``outer.inner`` keys."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def length_histogram(lengths: np.ndarray) -> list[tuple[str, int]]:
    """Documents per power-of-two length bucket ``[2^k, 2^(k+1))`` tokens, from the shortest to the longest."""
    if lengths.size == 0:
        return []
    exponents = np.floor(np.log2(np.maximum(lengths, 1))).astype(np.int64)
    counts = np.bincount(exponents)
    first = int(exponents.min())
    return [(f"{2**k:>7,}-{2 ** (k + 1) - 1:<7,}", int(counts[k])) for k in range(first, counts.size)]


def render_inspect(report: InspectReport, console: Console) -> None:
    """Print the parts: samples per category, token counts and shares, length histogram, removals."""
    for category, texts in report.samples.items():
        console.print(f"[bold]{category}[/]")
        for text in texts:
            console.print(Text(f"  • {text}"), soft_wrap=True)
    if report.tokens or not report.images:  # text sources, or nothing at all (say so with the empty tables)
        console.print(_token_table(report.tokens, report.shares, report.planned))
        console.print(_histogram(report.histogram))
        console.print(_removal_table(report.removals))
    if report.languages:
        console.print(_language_table(report.languages))
    if report.images:
        console.print(_image_table(report.images))


def _image_table(images: dict[str, Any]) -> Table:
    """Per image source: read, kept, removed as copies, each split's images, and why the others were dropped."""
    held = {(entry["source"], split): entry["images"] for split in SPLITS
            for entry in images["splits"][split]["shards"]}
    table = Table(title=f"images ({images['settings']['size']} px pixel shards)", box=box.SIMPLE_HEAD)
    for col in ("source", "modality", "read", "kept", "copies removed", *SPLITS, "dropped (reason: images)"):
        table.add_column(col)
    for source in images["sources"]:
        name = source["name"]
        table.add_row(name, source["modality"], f"{source['read']:,}", f"{source['kept']:,}",
                      f"{source['dedup_removed']:,}", *(f"{held.get((name, split), 0):,}" for split in SPLITS),
                      ", ".join(f"{reason}: {count:,}" for reason, count in source["dropped"].items()) or "-")
    return table


def _token_table(tokens: dict[str, dict[str, int]], shares: dict[str, dict[str, float]] | None, planned: int) -> Table:
    """Tokens per category and split; its raw share of the training tokens, and -- what training draws -- its target
    share of the samples and the share it gets over the run's planned samples."""
    table = Table(title="tokens per category and split", box=box.SIMPLE_HEAD)
    table.add_column("category")
    realised = f"realised ({planned:,} samples)" if planned else "realised"
    for column in (*SPLITS, "raw share of train tokens", *(("target share", realised) if shares else ())):
        table.add_column(column, justify="right")
    total = max(sum(t["train"] for t in tokens.values()), 1)
    for category, t in tokens.items():
        row = [category, *(f"{t[s]:,}" for s in SPLITS), f"{100 * t['train'] / total:.1f}%"]
        if shares:
            row += [f"{100 * shares[category]['target']:.1f}%", f"{100 * shares[category]['realised']:.1f}%"]
        table.add_row(*row)
    return table


def _histogram(buckets: list[tuple[str, int]]) -> Group:
    """Text-mode bars, scaled to the fullest bucket."""
    peak = max((n for _, n in buckets), default=1)
    lines = [Text(f"{label} tokens │{'█' * round(_BAR_WIDTH * n / peak):<{_BAR_WIDTH}} {n:,}") for label, n in buckets]
    return Group(Text("\ntrain document lengths", style="bold"), *lines)


def _removal_table(removals: dict[str, dict[str, Any]]) -> Table:
    """One row per counter (read, skipped, removed by each filter), one column per source.

    Counters as rows keep the table narrow however many filters report, since sources are few.
    """
    keys = list(dict.fromkeys(k for counters in removals.values() for k in counters))
    rows = [(key.replace("_", " "), [_cell(counters.get(key, "-")) for counters in removals.values()]) for key in keys]
    return _source_table("read and removed per source (manifest)", "counter", list(removals), rows)


def _language_table(languages: dict[str, dict[str, int]]) -> Table:
    """Characters per language of each source's documents as the language block identified them (before the rules
    after it and dedup), and the mix in shares."""
    codes = list(dict.fromkeys(code for counts in languages.values() for code in counts))
    rows = [(code, [_cell(counts.get(code, 0)) for counts in languages.values()]) for code in codes]
    rows.append(("mix", [language_mix(counts) for counts in languages.values()]))
    return _source_table("characters per language (identified by data.clean.language)", "language", list(languages),
                         rows)


def _source_table(title: str, head: str, sources: list[str], rows: list[tuple[str, list[str]]]) -> Table:
    """A table with one column per source and the given rows (a label and a cell per source)."""
    table = Table(title=title, box=box.SIMPLE_HEAD)
    table.add_column(head)
    for source in sources:
        table.add_column(source, justify="right")
    for label, cells in rows:
        table.add_row(label, *cells)
    return table


def _cell(value: Any) -> str:
    return f"{value:,}" if isinstance(value, int) else str(value)
