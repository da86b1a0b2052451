"""Reports of a dump comparison: CSV for spreadsheets and scripts, plain lines for a terminal, and one
self-contained HTML file (figure embedded as base64 PNG, no scripts, no network) in the style of
`mindfoundry report`.

The HTML leads with what a person debugging a divergence needs first: the first tensor judged an
error in execution order, the lowest cosine, and the five worst modules; the full table follows,
rows coloured by verdict.
"""

from __future__ import annotations

import csv
import dataclasses
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
from matplotlib.figure import Figure

from mindfoundry.debug.compare import Comparison, TensorComparison
from mindfoundry.report.plots import WIDTH, to_png
from mindfoundry.report.render import CSS, _e, _num

FIELDS = [f.name for f in dataclasses.fields(TensorComparison)]
VERDICT_COLORS = {"pass": "#2ca02c", "warning": "#ff7f0e", "error": "#d62728"}
LOG_FLOOR = 1e-12  # zeros drawn here on logarithmic axes
EXTRA_CSS = """
tr.warning td { background: #fff4d6; }
tr.error td { background: #fde2e1; }
.verdict-pass { color: #1a7f37; font-weight: bold; }
.verdict-fail { color: #c62828; font-weight: bold; }
"""


def _cell(value: Any) -> str:
    """CSV cell: floats in full precision (repr), shapes as 4x8, None empty."""
    if value is None:
        return ""
    if isinstance(value, tuple):
        return "x".join(map(str, value)) or "scalar"
    return repr(value) if isinstance(value, float) else str(value)


def write_csv(cmp: Comparison, path: Path) -> Path:
    """One row per matched tensor in execution order, every field of TensorComparison."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(FIELDS)
        for row in cmp.rows:
            writer.writerow([_cell(getattr(row, name)) for name in FIELDS])
    return path


# -- plain text ------------------------------------------------------------------------------
def _side(meta: dict[str, Any]) -> str:
    parts = [str(meta[k]) for k in ("backend", "precision") if meta.get(k)]
    return f" ({', '.join(parts)})" if parts else ""


def describe(row: TensorComparison) -> str:
    """One tensor's key numbers, for the summary."""
    if row.cosine is not None:
        return (f"cosine {row.cosine:.6g}, relative RMS error {row.rel_rmse:.4g}, max abs {row.max_abs:.4g}, "
                f"max rel {row.max_rel:.4g}, rel>0.5% {row.rel_over_5e3:.2%}")
    return f"mean {_num(row.mean_a)} vs {_num(row.mean_b)}, norm {_num(row.norm_a)} vs {_num(row.norm_b)}"


def _module_line(m: dict[str, Any]) -> str:
    numbers = (f"min cosine {_num(m['min_cosine'], '.6g')}, max abs {_num(m['max_abs'], '.4g')}"
               if m["min_cosine"] is not None else f"norm differs up to {_num(m['max_norm_rel_diff'], '.2%')}")
    return (
        f"{m['module']}: introduces {m['introduced']:.3g} relative error; {m['errors']} error, {m['warnings']} warning "
        f"of {m['tensors']}; {numbers}; worst {m['worst']}"
    )


def summary_lines(cmp: Comparison) -> list[str]:
    """Counts, first divergence with its numbers, lowest cosine and the five worst modules."""
    c = cmp.counts()
    lines = [f"A: {cmp.a}{_side(cmp.meta_a)}", f"B: {cmp.b}{_side(cmp.meta_b)} (reference)",
             f"{cmp.mode} mode: {len(cmp.rows)} tensors compared: {c['pass']} pass, {c['warning']} warning, "
             f"{c['error']} error; {len(cmp.only_a)} only in A, {len(cmp.only_b)} only in B"]
    first = cmp.first_divergence()
    if first is None:
        lines.append("first divergence: none")
    else:
        lines.append(f"first divergence: #{first.seq} {first.name} ({first.kind}): {first.reason}")
        lines.append(f"  {describe(first)}")
    low = cmp.lowest_cosine()
    if low is not None:
        lines.append(f"lowest cosine: #{low.seq} {low.name}: {describe(low)}")
    lines.append("top-5 modules (by the error they introduce: output error minus input error):")
    lines += [f"  {_module_line(m)}" for m in cmp.worst_modules(5)]
    unmatched = cmp.unmatched_activations()
    if unmatched:
        lines.append(
            f"unmatched forward/backward tensors: {', '.join(unmatched[:5])}" + (" ..." if len(unmatched) > 5 else "")
        )
    lines.append("PASSED" if cmp.passed() else "FAILED")
    return lines


# -- HTML ------------------------------------------------------------------------------------
Column = tuple[str, Callable[[TensorComparison], Any], str]  # header, getter, format ("" = text)
_COMMON: list[Column] = [("#", lambda r: r.seq, "d"), ("name", lambda r: r.name, ""), ("kind", lambda r: r.kind, ""),
                         ("shape A", lambda r: _cell(r.shape_a), ""), ("shape B", lambda r: _cell(r.shape_b), ""),
                         ("dtype A / B", lambda r: f"{r.dtype_a} / {r.dtype_b}", "")]
_TENSOR: list[Column] = [("cosine", lambda r: r.cosine, ".6g"), ("rel RMS err", lambda r: r.rel_rmse, ".4g"),
                         ("max abs", lambda r: r.max_abs, ".4g"),
                         ("max rel", lambda r: r.max_rel, ".4g"), ("rmse", lambda r: r.rmse, ".4g"),
                         ("rel>0.1%", lambda r: r.rel_over_1e3, ".2%"), ("rel>0.5%", lambda r: r.rel_over_5e3, ".2%")]
_STATS: list[Column] = [
    (f"{s} {side}", (lambda r, k=f"{s}_{side.lower()}": getattr(r, k)), ".6g")
    for s in ("mean", "norm")
    for side in ("A", "B")
] + [(f"{s} rel diff", (lambda r, k=f"{s}_rel_diff": getattr(r, k)), ".2%") for s in ("mean", "norm", "min", "max")]
_TAIL: list[Column] = [("NaN/Inf A / B", lambda r: f"{r.nonfinite_a} / {r.nonfinite_b}", ""),
                       ("verdict", lambda r: r.verdict, ""), ("reason", lambda r: r.reason, "")]


def _rows_table(cmp: Comparison) -> str:
    columns = _COMMON + (_TENSOR if cmp.mode == "tensor" else _STATS) + _TAIL
    head = "".join(f"<th>{_e(h)}</th>" for h, _, _ in columns)

    def cell(value: Any, fmt: str) -> str:
        return f"<td class=\"num\">{_e(_num(value, fmt))}</td>" if fmt else f"<td>{_e(value)}</td>"

    body = "".join(
        f'<tr class="{r.verdict}" id="t{r.seq}">' + "".join(cell(get(r), fmt) for _, get, fmt in columns) + "</tr>"
        for r in cmp.rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def _modules_table(cmp: Comparison) -> str:
    head = "".join(
        f"<th>{h}</th>"
        for h in (
            "module",
            "introduced error",
            "tensors",
            "errors",
            "warnings",
            "min cosine",
            "max abs",
            "max rel",
            "max norm rel diff",
            "worst tensor",
        )
    )
    body = "".join(
        "<tr>"
        + f"<td>{_e(m['module'])}</td>"
        + "".join(
            f'<td class="num">{_e(_num(m[k], fmt))}</td>'
            for k, fmt in (
                ("introduced", ".4g"),
                ("tensors", "d"),
                ("errors", "d"),
                ("warnings", "d"),
                ("min_cosine", ".6g"),
                ("max_abs", ".4g"),
                ("max_rel", ".4g"),
                ("max_norm_rel_diff", ".2%"),
            )
        )
        + f"<td>{_e(m['worst'])}</td></tr>"
        for m in cmp.worst_modules(5)
    )
    return f"<table id=\"worst-modules\"><tr>{head}</tr>{body}</table>"


def _plot(cmp: Comparison) -> str | None:
    """Cosine and relative RMS error (log) against execution order, points coloured by verdict, the first
    divergence marked; in statistics mode the relative differences of norm and mean instead."""
    rows = cmp.rows
    if not rows:
        return None
    t = cmp.thresholds
    if cmp.mode == "tensor":
        panels = [("cosine similarity", [r.cosine for r in rows], False, (t.cosine_error, t.cosine_warning)),
                  ("relative RMS error", [r.rel_rmse for r in rows], True, (t.rel_warning, t.rel_error))]
    else:
        panels = [
            (
                "norm relative difference",
                [r.norm_rel_diff for r in rows],
                True,
                (t.stats_rel_warning, t.stats_rel_error),
            ),
            (
                "mean difference / RMS(B)",
                [r.mean_rel_diff for r in rows],
                True,
                (t.stats_rel_warning, t.stats_rel_error),
            ),
        ]
    x = np.array([r.seq for r in rows])
    colors = [VERDICT_COLORS[r.verdict] for r in rows]
    first = cmp.first_divergence()
    fig = Figure(figsize=(WIDTH, 5.6), layout="constrained")
    axes = fig.subplots(2, 1, sharex=True)
    for ax, (label, values, log, limits) in zip(axes, panels):
        y = np.array([np.nan if v is None else v for v in values], dtype=np.float64)
        if log:
            y = np.maximum(y, LOG_FLOOR)
            ax.set_yscale("log")
            label += f" (0 drawn at {LOG_FLOOR:g})"
        ax.plot(x, y, color="#999999", linewidth=0.8, zorder=1)
        ax.scatter(x, y, c=colors, s=14, zorder=2)
        for limit in limits:
            ax.axhline(limit, color="#555555", linestyle=":", linewidth=1)
        if first is not None:
            ax.axvline(first.seq, color=VERDICT_COLORS["error"], linestyle="--", linewidth=1.2,
                       label=f"first divergence: {first.name}")
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
    if first is not None:
        axes[0].legend(loc="lower left", fontsize="small")
    axes[-1].set_xlabel("execution order in dump A (seq)")
    return to_png(fig)


def _leaf(path: Path) -> str:
    return f"{path.parent.name}/{path.name}"


def _section(cmp: Comparison, index: int) -> str:
    c = cmp.counts()
    first, low = cmp.first_divergence(), cmp.lowest_cosine()
    status = '<span class="verdict-pass">PASSED</span>' if cmp.passed() else '<span class="verdict-fail">FAILED</span>'
    items = [f"A: <code>{_e(cmp.a)}</code>{_e(_side(cmp.meta_a))}",
             f"B (reference): <code>{_e(cmp.b)}</code>{_e(_side(cmp.meta_b))}",
             f"{_e(cmp.mode)} mode, {len(cmp.rows)} tensors compared: {c['pass']} pass, {c['warning']} warning, "
             f"{c['error']} error; {len(cmp.only_a)} only in A, {len(cmp.only_b)} only in B. {status}"]
    if first is None:
        items.append("First divergence: none.")
    else:
        items.append(
            f'First divergence: <a href="#t{first.seq}"><b>{_e(first.name)}</b></a> (#{first.seq}, {_e(first.kind)}): '
            f"{_e(first.reason)}; {_e(describe(first))}"
        )
    if low is not None:
        items.append(f"Lowest cosine: {_e(low.name)} (#{low.seq}): {_e(describe(low))}")
    out = (
        f'<h2 id="leaf-{index}">{_e(_leaf(cmp.a))} vs {_e(_leaf(cmp.b))}</h2><ul>'
        + "".join(f"<li>{i}</li>" for i in items)
        + "</ul>"
    )
    out += "<h3>Worst modules (top 5)</h3>" + _modules_table(cmp)
    png = _plot(cmp)
    out += f"<img alt=\"comparison against execution order\" src=\"data:image/png;base64,{png}\">" if png else \
        "<p class=\"note\">No matched tensors to plot.</p>"
    for side, names in (("A", cmp.only_a), ("B", cmp.only_b)):
        if names:
            out += f"<p><b>Only in {side}:</b> {_e(', '.join(names))}</p>"
    return out + "<h3>All tensors</h3>" + _rows_table(cmp)


def write_html(cmp: Comparison | Sequence[Comparison], path: Path) -> Path:
    """One page for one comparison, or one section per (step, rank) leaf for a tree comparison."""
    comparisons = [cmp] if isinstance(cmp, Comparison) else list(cmp)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    body = "".join(_section(c, i) for i, c in enumerate(comparisons))
    if len(comparisons) > 1:
        nav = "".join(f"<a href=\"#leaf-{i}\">{_e(_leaf(c.a))}</a>" for i, c in enumerate(comparisons))
        body = f"<nav>{nav}</nav>" + body
    page = (f"<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>Dump comparison</title>"
            f"<style>{CSS}{EXTRA_CSS}</style></head><body><h1>Dump comparison</h1>{body}</body></html>")
    path.write_text(page, encoding="utf-8")
    return path
