"""The report's figures, as base64 PNG strings to embed in one HTML file.

Figures are built on `matplotlib.figure.Figure` directly (the Agg canvas, no pyplot), so no
display or global backend state is involved. Every function takes the list of runs and draws them
on the same axes, one colour per run, so `--compare` needs no separate code path.
"""

from __future__ import annotations

import base64
import io
import re
from typing import Sequence

import numpy as np
from matplotlib.colors import LogNorm, Normalize
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from mindfoundry.monitor.records import LAYER_KEYS, realized_shares
from mindfoundry.report.run_data import RunData

RUN_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd")
CATEGORY_COLORS = (
    "#4c72b0",
    "#dd8452",
    "#55a868",
    "#c44e52",
    "#8172b3",
    "#937860",
    "#da8bc3",
    "#8c8c8c",
    "#ccb974",
    "#64b5cd",
)
LAYER_TITLES = {
    "layer_grad_norm": "gradient norm per module",
    "layer_weight_norm": "weight norm per module",
    "layer_update_ratio": "update-to-weight ratio ||ΔW||/||W|| per module",
}
WIDTH = 11.0  # inches; at 100 dpi the images fit a 1100 px column


def to_png(fig: Figure) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _figure(rows: int = 1, height: float = 3.6) -> tuple[Figure, list]:
    fig = Figure(figsize=(WIDTH, height * rows), layout="constrained")
    axes = fig.subplots(rows, 1, sharex=True, squeeze=False)[:, 0]
    for ax in axes:
        ax.grid(True, alpha=0.3)
    axes[-1].set_xlabel("step")
    return fig, list(axes)


def _legend(fig: Figure) -> None:
    """One legend under the plot: it never hides data, and every step axis keeps the same width,
    so a step lines up across the loss, LR, grad-norm and throughput figures."""
    handles, labels = fig.axes[0].get_legend_handles_labels()
    ncol = len(labels) if len(labels) <= 2 else -(-len(labels) // 2)  # two rows: a run's entries share a column
    fig.legend(handles, labels, loc="outside lower center", ncol=ncol, fontsize="small", frameon=False)


def _color(i: int) -> str:
    return RUN_COLORS[i % len(RUN_COLORS)]


def _line(i: int) -> dict:
    """The main line of run i: runs after the first are dashed and thinner, so when two engines agree
    (as they should) the first run still shows under the second instead of vanishing."""
    return {"color": _color(i), "linestyle": "-" if i == 0 else (0, (5, 3)), "linewidth": 2.4 if i == 0 else 1.5}


def _marker(i: int) -> dict:
    return {
        "color": _color(i),
        "marker": "os^D"[i % 4],
        "markersize": 8 if i == 0 else 5,
        "linestyle": ":",
        "linewidth": 1.2,
    }


def _category_color(j: int) -> str:
    return CATEGORY_COLORS[j % len(CATEGORY_COLORS)]


def smooth(values: Sequence[float]) -> np.ndarray:
    """Centered running median over ~1/40 of the run (5 to 101 steps): no lag on a fast-falling loss
    (unlike an EMA), and one slow or spiking step (compilation, a checkpoint, a bad batch) does not
    drag the line; the raw values are drawn faintly behind it."""
    v = np.asarray(values, dtype=np.float64)
    if v.size == 0:
        return v
    window = min(101, max(5, len(v) // 40)) | 1
    padded = np.pad(v, window // 2, constant_values=np.nan)
    return np.nanmedian(np.lib.stride_tricks.sliding_window_view(padded, window), axis=1)


def _mark_events(ax, runs: Sequence[RunData]) -> None:
    """Vertical lines at health findings (dotted) and anomalies (dashed), in the run's colour."""
    for i, run in enumerate(runs):
        for event in run.health:
            ax.axvline(event["step"], color=_color(i), linestyle=":", linewidth=1.2, alpha=0.8)
        for event in (e for e in run.events if e["event"] == "anomaly"):
            ax.axvline(event["step"], color=_color(i), linestyle="--", linewidth=1.0, alpha=0.6)


def _spikes(values: np.ndarray, trend: np.ndarray) -> np.ndarray:
    """Points far above the running median: 1 nat, or 8 robust stds of the noise if larger."""
    residual = values - trend
    noise = 1.4826 * float(np.median(np.abs(residual))) if residual.size else 0.0
    return residual > max(1.0, 8 * noise)


def loss_plot(runs: Sequence[RunData]) -> str:
    """Train and validation loss. The y range ignores spikes (far above the running median); points
    above it are drawn as markers on the top edge with their value, so one 700-nat spike does not
    flatten the whole curve."""
    fig, (ax,) = _figure(height=4.2)
    curves = []
    for i, run in enumerate(runs):
        steps, loss = (np.asarray(v, dtype=np.float64) for v in run.series("loss"))
        trend = smooth(loss)
        ax.plot(steps, trend, **_line(i), label=f"{run.label}: train (running median)")
        val_steps, val = run.series("val_loss", run.evals)
        if val:
            ax.plot(val_steps, val, **_marker(i), label=f"{run.label}: validation")
        curves.append((steps, loss, [*loss[~_spikes(loss, trend)], *val]))
    shown = [v for *_, values in curves for v in values]
    low, high = (min(shown), max(shown)) if shown else (0.0, 1.0)  # (0, 1): every loss was NaN
    pad = 0.05 * (high - low or 1.0)
    top = high + pad
    ax.set_ylim(low - pad, top + pad)
    for i, (steps, loss, _) in enumerate(curves):
        ax.plot(steps, np.minimum(loss, top), color=_color(i), alpha=0.25, linewidth=0.8)
        for step, value in zip(steps[loss > top], loss[loss > top]):
            ax.plot([step], [top], marker="^", color=_color(i), markersize=8)
            ax.annotate(
                f"{value:.1f}",
                (step, top),
                xytext=(5, -4),
                textcoords="offset points",
                fontsize="small",
                color=_color(i),
            )
    _mark_events(ax, runs)
    ax.set_ylabel("loss (nats/token)")
    _legend(fig)
    return to_png(fig)


def lr_plot(runs: Sequence[RunData]) -> str:
    fig, (ax,) = _figure(height=2.8)
    for i, run in enumerate(runs):
        ax.plot(*run.series("lr"), **_line(i), label=run.label)
    ax.set_ylabel("learning rate")
    ax.ticklabel_format(axis="y", style="sci", scilimits=(-2, 2))
    _legend(fig)
    return to_png(fig)


def grad_norm_plot(runs: Sequence[RunData], low: float | None, high: float | None) -> str:
    """Grad norm (log scale) with the clip norm of each run and the health rules' band."""
    fig, (ax,) = _figure(height=3.4)
    for i, run in enumerate(runs):
        steps, norms = run.series("grad_norm")
        ax.plot(steps, norms, color=_color(i), alpha=0.3, linewidth=0.8)
        ax.plot(steps, smooth(norms), **_line(i), label=f"{run.label} (running median)")
        clip = (run.config.get("optim") or {}).get("clip_norm")
        if isinstance(clip, (int, float)):
            ax.axhline(clip, color=_color(i), linestyle="-.", linewidth=1, label=f"{run.label}: clip_norm {clip:g}")
    for value, name in ((low, "health: low"), (high, "health: high")):
        if value is not None:
            ax.axhline(value, color="#777777", linestyle=":", linewidth=1.2, label=f"{name} ({value:g})")
    _mark_events(ax, runs)
    ax.set_yscale("log")
    ax.set_ylabel("gradient norm (before clipping)")
    _legend(fig)
    return to_png(fig)


def _module_order(name: str) -> tuple:
    """embed, layers.0 .. layers.N in numeric order, then the rest (norm, lm_head)."""
    match = re.fullmatch(r"layers\.(\d+)", name)
    if name == "embed":
        return (0, 0, name)
    return (1, int(match.group(1)), name) if match else (2, 0, name)


def _layer_grid(run: RunData, key: str) -> tuple[list[str], list[int], np.ndarray]:
    """(modules, steps, values[module, step]) of one per-layer quantity; missing or non-positive = NaN."""
    records = [r for r in run.details if r.get(key)]
    modules = sorted({m for r in records for m in r[key]}, key=_module_order)
    grid = np.array([[r[key].get(m) if isinstance(r[key].get(m), (int, float)) else np.nan for r in records]
                     for m in modules], dtype=np.float64)
    return modules, [int(r["step"]) for r in records], np.where(grid > 0, grid, np.nan)


def layer_scales(runs: Sequence[RunData]) -> dict[str, Normalize]:
    """One colour scale per quantity, shared by all runs so their heat maps compare colour for colour:
    logarithmic when the values span more than a decade (grad norms, update ratios), linear otherwise
    (weight norms), so neighbouring modules stay distinguishable."""
    scales = {}
    for key in LAYER_KEYS:
        values = np.concatenate([_layer_grid(run, key)[2].ravel() for run in runs])
        values = values[np.isfinite(values)]
        if values.size:
            low, high = float(values.min()), float(values.max())
            scales[key] = LogNorm(low, high) if high > 10 * low else Normalize(low, high)
    return scales


def layer_heatmaps(run: RunData, scales: dict[str, Normalize]) -> str | None:
    """One heat map (module x step) per per-layer quantity the run recorded."""
    keys = [k for k in LAYER_KEYS if k in scales and any(r.get(k) for r in run.details)]
    if not keys:
        return None
    fig = Figure(figsize=(WIDTH, 3.2 * len(keys)), layout="constrained")
    for ax, key in zip(fig.subplots(len(keys), 1, squeeze=False)[:, 0], keys):
        modules, steps, grid = _layer_grid(run, key)
        image = ax.imshow(grid, aspect="auto", interpolation="nearest", cmap="viridis", norm=scales[key])
        ticks = np.unique(np.linspace(0, len(steps) - 1, min(len(steps), 12)).round().astype(int))
        ax.set_xticks(ticks, [str(steps[t]) for t in ticks])
        ax.set_yticks(range(len(modules)), modules)
        ax.set_title(f"{run.label}: {LAYER_TITLES[key]}", loc="left", fontsize="medium")
        ax.set_xlabel("step")
        fig.colorbar(image, ax=ax, pad=0.01, format=lambda x, _: f"{x:.3g}").minorticks_off()
    return to_png(fig)


def throughput_plot(runs: Sequence[RunData]) -> str:
    """tokens/s, and MFU when recorded (else the model's TFLOP/s)."""
    use_mfu = any(run.has("mfu") for run in runs)
    fig, (top, bottom) = _figure(rows=2, height=2.8)
    for i, run in enumerate(runs):
        steps, speed = run.series("tokens_per_s")
        top.plot(steps, speed, color=_color(i), alpha=0.3, linewidth=0.8)
        top.plot(steps, smooth(speed), **_line(i), label=f"{run.label} (running median)")
        steps, value = run.series("mfu" if use_mfu else "model_tflops_per_s")
        bottom.plot(steps, np.asarray(value) * (100 if use_mfu else 1), **_line(i))
    _mark_events(top, runs)
    top.set_ylabel("tokens/s")
    bottom.set_ylabel("MFU (%)" if use_mfu else "model TFLOP/s")
    _legend(fig)
    return to_png(fig)


#: (step-record key, axis label) of the hardware plot's rows; a row is drawn when some run recorded its key.
HARDWARE_ROWS = (
    ("device_mem_allocated_mb", "device memory allocated (MiB)"),
    ("device_mem_reserved_mb", "device memory reserved (MiB)"),
    ("device_mem_peak_mb", "device memory peak (MiB)"),
    ("cpu_util", "machine CPU (%)"),
    ("process_cpu", "this process (% of a core)"),
    ("device_util", "device utilisation (%)"),
    ("device_temp_c", "device temperature (°C)"),
    ("device_power_w", "device power (W)"),
)


def memory_plot(runs: Sequence[RunData]) -> str | None:
    if not any(run.has("rss_mb") for run in runs):
        return None
    fig, (ax,) = _figure(height=2.8)
    for i, run in enumerate(runs):
        ax.plot(*run.series("rss_mb"), **_line(i), label=run.label)
    ax.set_ylabel("host RSS (MiB)")
    _legend(fig)
    return to_png(fig)


def hardware_plot(runs: Sequence[RunData]) -> str | None:
    """Device memory, CPU and device utilisation, temperature and power: one row per metric some run recorded."""
    rows = [(key, label) for key, label in HARDWARE_ROWS if any(run.has(key) for run in runs)]
    if not rows:
        return None
    fig, axes = _figure(rows=len(rows), height=1.9)
    for ax, (key, label) in zip(axes, rows):
        for i, run in enumerate(runs):
            ax.plot(*run.series(key), **_line(i), label=run.label if ax is axes[0] else None)
        ax.set_ylabel(label, fontsize="small")
    _legend(fig)
    return to_png(fig)


def timeline_lanes(run: RunData) -> list[tuple[str, int]]:
    """(lane, step) of everything that happened besides steps: evals, checkpoints, anomalies, findings."""
    lanes = [("evaluation", int(r["step"])) for r in run.evals]
    for event in run.events:
        if event["event"] == "checkpoint":
            lanes.append(("checkpoint", int(event["step"])))
        elif event["event"] == "anomaly":
            lanes.append((f"anomaly: {event.get('kind')}", int(event["step"])))
        elif event["event"] == "resume":
            lanes.append(("resume", int(event["step"])))
    lanes += [(f"health: {event['rule']}", int(event["step"])) for event in run.health]
    return lanes


def timeline_plot(runs: Sequence[RunData]) -> str:
    per_run = [timeline_lanes(run) for run in runs]
    names = sorted(
        {lane for lanes in per_run for lane, _ in lanes},
        key=lambda n: (n.startswith("health"), n.startswith("anomaly"), n),
    )
    fig = Figure(figsize=(WIDTH, 0.9 + 0.42 * max(len(names), 1)), layout="constrained")
    ax = fig.subplots()
    last_step = max(int(run.steps[-1]["step"]) for run in runs)
    offsets = np.linspace(-0.15, 0.15, len(runs)) if len(runs) > 1 else [0.0]
    for i, (run, lanes) in enumerate(zip(runs, per_run)):
        ys = [names.index(lane) + offsets[i] for lane, _ in lanes]
        ax.scatter([s for _, s in lanes], ys, color=_color(i), marker="D", s=28, label=run.label, zorder=3)
    ax.set_yticks(range(len(names)), names)
    ax.set_ylim(-0.7, max(len(names), 1) - 0.3)
    ax.set_xlim(-0.02 * last_step, last_step * 1.02)
    ax.grid(True, axis="x", alpha=0.3)
    ax.set_xlabel("step")
    if len(runs) > 1:
        _legend(fig)
    return to_png(fig)


def mixture_rows(run: RunData) -> list[tuple[str, dict[str, float]]]:
    """(row label, category -> share) for the data the run was given and the mixture it saw."""
    rows = []
    if run.manifest:
        tokens: dict[str, float] = {}
        for source in run.manifest.get("sources", []):
            train = ((source.get("splits") or {}).get("train") or {}).get("tokens", 0)
            category = source.get("category") or source.get("name", "?")
            tokens[category] = tokens.get(category, 0) + train
        total = sum(tokens.values())
        if total:
            rows.append(("train tokens (prepared data)", {c: t / total for c, t in tokens.items()}))
    weights = ((run.config.get("data") or {}).get("mixture") or {}).get("weights")
    if weights:
        total = sum(weights.values())
        rows.append(("target mixture (config)", {c: w / total for c, w in weights.items()}))
    # the trainer writes the realized mixture on its per-layer detail records (every monitor.detail_every steps)
    realized = next((r["mixture"] for r in reversed(run.details) if isinstance(r.get("mixture"), dict)), None)
    if realized:
        rows.append(("realized mixture (training)", realized_shares(realized)))
    return rows


def mixture_plot(runs: Sequence[RunData]) -> str | None:
    """Horizontal stacked bars of category shares, one bar per (run, kind), one colour per category."""
    bars = [
        (f"{run.label}: {name}" if len(runs) > 1 else name, shares)
        for run in runs
        for name, shares in mixture_rows(run)
    ]
    if not bars:
        return None
    categories = list(dict.fromkeys(c for _, shares in bars for c in shares))
    fig = Figure(figsize=(WIDTH, 0.8 + 0.6 * len(bars)), layout="constrained")
    ax = fig.subplots()
    for y, (_, shares) in enumerate(bars):
        left = 0.0
        for j, category in enumerate(categories):
            share = shares.get(category, 0.0)
            ax.barh(y, share, left=left, color=_category_color(j), edgecolor="white")
            if share >= 0.05:
                ax.text(
                    left + share / 2,
                    y,
                    f"{category}\n{share:.0%}",
                    ha="center",
                    va="center",
                    fontsize="small",
                    color="white",
                )
            left += share
    ax.set_yticks(range(len(bars)), [name for name, _ in bars])
    ax.invert_yaxis()
    ax.set_xlim(0, 1)
    ax.xaxis.set_major_formatter(lambda x, _: f"{x:.0%}")
    handles = [Patch(color=_category_color(j), label=category) for j, category in enumerate(categories)]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return to_png(fig)
