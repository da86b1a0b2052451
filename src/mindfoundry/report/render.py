"""`mindfoundry report`: one self-contained HTML file (figures embedded as base64 PNG, no scripts,
no network) that shows a run, or overlays two runs on the same axes.

Every section has a stable id (`overview`, `loss`, `lr`, `grad-norm`, `layers`, `throughput`,
`memory`, `events`, `data`, `config`, `environment`) so a reader can link to it and tests can find it.
"""

from __future__ import annotations

import datetime as dt
import html
import json
import statistics
import tarfile
from pathlib import Path
from typing import Any, Iterable, Sequence

from mindfoundry.data.dataset.prepared import DataError
from mindfoundry.data.prepare.manifest import language_mix
from mindfoundry.monitor.health import HealthConfig
from mindfoundry.report import plots
from mindfoundry.report.contact_sheet import contact_sheets
from mindfoundry.report.run_data import RunData, load_run

SECTIONS = (
    ("overview", "Overview"),
    ("loss", "Loss"),
    ("lr", "Learning rate"),
    ("grad-norm", "Gradient norm"),
    ("layers", "Per-layer norms"),
    ("throughput", "Throughput and MFU"),
    ("memory", "Memory"),
    ("hardware", "Hardware"),
    ("events", "Health events and anomalies"),
    ("data", "Data mixture"),
    ("config", "Config"),
    ("environment", "Environment"),
)

CSS = """
.sheet { display: flex; flex-wrap: wrap; gap: 6px; }
.tile { margin: 0; width: 96px; font-size: 11px; line-height: 1.2; }
.tile img { width: 64px; height: 64px; image-rendering: pixelated; display: block; }
body { font-family: -apple-system, 'Segoe UI', Helvetica, Arial, 'PingFang SC', 'Microsoft YaHei', 'Noto Sans CJK SC',
       'WenQuanYi Zen Hei', sans-serif; margin: 0 auto; max-width: 1140px;
       padding: 0 20px 40px; color: #1d1d1f; line-height: 1.45; }
h1 { margin: 24px 0 4px; font-size: 26px; }
h2 { margin-top: 34px; padding-top: 10px; border-top: 1px solid #ddd; font-size: 20px; }
nav { font-size: 14px; margin: 10px 0 6px; }
nav a { margin-right: 12px; color: #0b5cad; text-decoration: none; }
img { max-width: 100%; display: block; margin: 8px 0; }
table { border-collapse: collapse; margin: 8px 0; font-size: 14px; }
th, td { border: 1px solid #ddd; padding: 4px 10px; text-align: left; vertical-align: top; }
th { background: #f4f4f6; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
pre { background: #f6f8fa; padding: 10px; overflow-x: auto; font-size: 12px; max-height: 480px; }
.note { color: #666; font-style: italic; }
.subtitle { color: #555; margin: 0 0 8px; }
td.text { font-family: monospace; font-size: 12px; }
"""


def _e(value: Any) -> str:
    return html.escape(str(value))


def _num(value: Any, fmt: str = ",.4g") -> str:
    return format(value, fmt) if isinstance(value, (int, float)) and not isinstance(value, bool) else "–"


def _table(header: Sequence[str], rows: Iterable[Sequence[Any]], numeric_from: int | None = None, css: str = "") -> str:
    """An HTML table; cells from column `numeric_from` on are right-aligned numbers, the others get class `css`."""
    text_open = f"<td class=\"{css}\">" if css else "<td>"

    def cell(j: int, value: Any) -> str:
        return (
            f'<td class="num">{_e(value)}</td>'
            if numeric_from is not None and j >= numeric_from
            else f"{text_open}{_e(value)}</td>"
        )

    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(cell(j, c) for j, c in enumerate(row)) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _img(png: str | None, alt: str, missing: str) -> str:
    if png is None:
        return f"<p class=\"note\">{_e(missing)}</p>"
    return f"<img alt=\"{_e(alt)}\" src=\"data:image/png;base64,{png}\">"


def _one_line(text: str) -> str:
    """Generated text on one line, newlines shown as ⏎ (as `mindfoundry data inspect` prints documents)."""
    return text.replace("\n", "⏎")


def _labels(runs: Sequence[RunData]) -> None:
    """Name runs by folder and engine; runs in same-named folders get their parent folder too."""
    names = [run.path.resolve().name for run in runs]
    for run, name in zip(runs, names):
        base = f"{run.path.resolve().parent.name}/{name}" if names.count(name) > 1 else name
        run.label = f"{base} ({run.backend})" if run.backend else base


# -- sections --------------------------------------------------------------------------------
def _overview_rows(run: RunData) -> list[str]:
    start = run.start or {}
    steps = run.steps
    speeds = [r["tokens_per_s"] for r in steps if isinstance(r.get("tokens_per_s"), (int, float))]
    times = [r["time"] for r in steps if isinstance(r.get("time"), (int, float))]
    first, last = (run.evals[0], run.evals[-1]) if run.evals else ({}, {})
    anomalies = sum(1 for e in run.events if e["event"] == "anomaly")
    return [
        run.backend or "?", _num(start.get("parameters"), ","), _num(start.get("flops_per_token"), ","),
        _num(steps[-1]["step"], ","), _num(sum(r.get("tokens") or 0 for r in steps), ","),
        f"{(times[-1] - times[0]) / 60:.1f} min" if len(times) > 1 else "–",
        _num(statistics.median(speeds), ",.0f") if speeds else "–",
        f"{_num(first.get('val_loss'), '.4f')} → {_num(last.get('val_loss'), '.4f')}",
        f"{_num(first.get('val_perplexity'), ',.1f')} → {_num(last.get('val_perplexity'), ',.1f')}",
        f"{_num(first.get('val_bits_per_byte'), '.4f')} → {_num(last.get('val_bits_per_byte'), '.4f')}",
        f"{_num(first.get('val_accuracy'), '.3f')} → {_num(last.get('val_accuracy'), '.3f')}",
        _task_trend(first, last), str(len(run.health)), str(anomalies), start.get("memory") or "–",
        _num(max((r.get("peak_rss_mb") or 0 for r in steps), default=None) or None, ",.0f"),
    ]


def _task_trend(first: dict, last: dict) -> str:
    """Zero-shot accuracy per eval.tasks task, first -> last evaluation."""
    tasks = sorted(last.get("task_acc") or {})
    return "; ".join(f"{t} {_num((first.get('task_acc') or {}).get(t), '.3f')} → {_num(last['task_acc'][t], '.3f')}"
                     for t in tasks) or "–"


OVERVIEW_ROWS = (
    "backend",
    "parameters",
    "FLOPs/token",
    "steps",
    "tokens trained",
    "wall clock, first to last step",
    "median tokens/s",
    "held-out loss (first → last eval)",
    "held-out perplexity",
    "held-out bits/byte",
    "held-out top-1 accuracy (mlm: of the masked tokens)",
    "zero-shot accuracy (eval.tasks)",
    "health findings",
    "anomalies",
    "memory mode (memory section)",
    "peak host memory (MiB)",
)


def _overview(runs: Sequence[RunData]) -> str:
    columns = [_overview_rows(run) for run in runs]
    rows = [[name, *(col[i] for col in columns)] for i, name in enumerate(OVERVIEW_ROWS)]
    out = _table(["", *(run.label for run in runs)], rows, numeric_from=1)
    for run in runs:
        summary = run.summary or {}
        if summary.get("samples"):
            out += f"<p><b>Samples from {_e(run.label)}</b></p>"
            sample_rows = ([_one_line(s["prompt"]), _one_line(s["completion"])] for s in summary["samples"])
            out += _table(["prompt", "completion"], sample_rows, css="text")
        if summary.get("captions"):  # a captioner's: validation images' captions beside its own
            shuffled = summary["shuffled_images"]
            out += (f"<p><b>Captions by {_e(run.label)}</b> (held-out loss with each caption given another image: "
                    f"{shuffled['loss']:.4f}, {shuffled['bits_per_byte']:.4f} bits/byte)</p>")
            caption_rows = ([_one_line(c["caption"]), _one_line(c["generated"])] for c in summary["captions"])
            out += _table(["the image's caption", "generated"], caption_rows, css="text")
        for name, probe in (summary.get("probe") or {}).items():  # an image encoder's
            out += (f"<p><b>Linear probe of {_e(run.label)} on {_e(name)}</b>: accuracy {probe['accuracy']:.3f} "
                    f"({probe['random_encoder']:.3f} from a randomly initialised encoder; {probe['train_images']} "
                    f"images fitted, {probe['test_images']} held out)</p>")
    return out


def _layers(runs: Sequence[RunData]) -> str:
    parts = []
    scales = plots.layer_scales(runs)
    for run in runs:
        png = plots.layer_heatmaps(run, scales)
        parts.append(
            _img(
                png,
                f"per-layer heat maps of {run.label}",
                f"{run.label}: no per-layer records (set monitor.detail_every to record them every N steps).",
            )
        )
    return (
        '<p class="subtitle">Rows are module groups, columns the steps with a detail record; each quantity has one '
        'colour scale for all runs, logarithmic where its values span more than a decade.</p>'
        + "".join(parts)
    )


def _event_rows(run: RunData) -> list[list[str]]:
    rows = [[run.label, str(e["step"]), f"health: {e['rule']}", e["message"]] for e in run.health]
    for e in run.events:
        if e["event"] == "anomaly":
            rows.append(
                [
                    run.label,
                    str(e["step"]),
                    f"anomaly: {e.get('kind')}",
                    f"{e.get('reason', '')}; update {e.get('action', '?')}",
                ]
            )
    return sorted(rows, key=lambda r: int(r[1]))


def _events(runs: Sequence[RunData]) -> str:
    rows = [row for run in runs for row in _event_rows(run)]
    table = _table(["run", "step", "what", "message"], rows) if rows else \
        "<p class=\"note\">No health findings and no anomalies.</p>"
    return (
        _img(plots.timeline_plot(runs), "timeline of evaluations, checkpoints, anomalies and health findings", "")
        + '<p class="subtitle">Dotted lines in the loss, grad-norm and throughput plots mark health findings; dashed '
          'lines anomalies.</p>'
        + table
    )


def _data_table(run: RunData) -> str:
    if not run.manifest:
        return f"<p class=\"note\">{_e(run.label)}: no data manifest found (RUN_DIR/data/manifest.json).</p>"
    rows = []
    for source in run.manifest.get("sources", []):
        splits, chars = source.get("splits") or {}, source.get("chars") or {}
        read = chars.get("read")
        kept_share = f"{chars['kept'] / read:.1%}" if read and chars.get("kept") is not None else "–"
        rows.append(
            [
                source.get("name", "?"),
                source.get("category", "?"),
                _num((splits.get("train") or {}).get("tokens"), ","),
                _num((splits.get("validation") or {}).get("tokens"), ","),
                _num(source.get("kept"), ","),
                _num(read, ","),
                _num(chars.get("removed_by_rules"), ","),
                _num(chars.get("removed_by_dedup"), ","),
                kept_share,
                language_mix(source.get("languages") or {}),
            ]
        )
    caption = (
        f"<p><b>{_e(run.label)}</b>: data identity <code>{_e(str(run.manifest.get('identity', '?'))[:16])}</code>, "
        f"prepared {_e(run.manifest.get('created', '?'))}</p>"
    )
    return caption + _table(
        [
            "source",
            "category",
            "train tokens",
            "validation tokens",
            "documents kept",
            "characters read",
            "removed by rules",
            "removed by dedup",
            "characters kept",
            "languages",
        ],
        rows,
        numeric_from=2,
    )


def _data(runs: Sequence[RunData]) -> str:
    png = plots.mixture_plot(runs)
    return _img(png, "data mixture by category", "No data manifest and no mixture records.") + "".join(
        _data_table(r) + _images(r) for r in runs
    )


def _images(run: RunData) -> str:
    """Each image source: what was read, kept and removed, then its contact sheet per split (when the prepared
    folder is at hand)."""
    images = (run.manifest or {}).get("images")
    if not images:
        return ""
    rows = [[s["name"], s["modality"], _num(s["read"], ","), _num(s["kept"], ","), _num(s["dedup_removed"], ","),
             ", ".join(f"{k}: {v}" for k, v in s["dropped"].items()) or "–"] for s in images["sources"]]
    html = f"<p><b>{_e(run.label)}</b>: images ({images['settings']['size']} px pixel shards)</p>" + _table(
        ["source", "modality", "read", "kept", "copies removed", "dropped (reason: images)"], rows, numeric_from=2)
    try:
        sheets = contact_sheets(run.data_dir, images) if run.data_dir is not None else None
    except (DataError, OSError, tarfile.TarError) as exc:  # a prepared folder changed since: the report still renders
        return html + f"<p class=\"note\">No contact sheet: the prepared images cannot be read ({_e(exc)}).</p>"
    if sheets is None:
        return html + "<p class=\"note\">The prepared folder is not at hand: no contact sheet.</p>"
    for source, split, tiles in sheets:
        figures = "".join(
            f"<figure class=\"tile\"><img alt=\"{_e(t.caption or source)}\" src=\"data:image/png;base64,{t.png}\">"
            f"<figcaption>{_e(t.caption or '')}</figcaption></figure>" for t in tiles)
        html += f"<h3>{_e(source)}: {_e(split)}, first {len(tiles)}</h3><div class=\"sheet\">{figures}</div>"
    return html


def _flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(tree, dict):
        out: dict[str, Any] = {}
        for key, value in tree.items():
            out.update(_flatten(value, f"{prefix}.{key}" if prefix else str(key)))
        return out
    if isinstance(tree, list) and tree and all(isinstance(v, dict) for v in tree):
        out = {}
        for i, value in enumerate(tree):
            out.update(_flatten(value, f"{prefix}.{i}"))
        return out
    return {prefix: tree}


def _value(flat: dict[str, Any], key: str) -> str:
    if key not in flat:
        return "(absent)"
    value = flat[key]
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _config(runs: Sequence[RunData]) -> str:
    out = ""
    if len(runs) == 2:
        a, b = (_flatten(run.config) for run in runs)
        differ = [[key, _value(a, key), _value(b, key)] for key in sorted(set(a) | set(b)) if a.get(key) != b.get(key)]
        out += "<p><b>Keys that differ</b></p>" + (_table(["key", runs[0].label, runs[1].label], differ)
                                                     if differ else "<p class=\"note\">The configs are identical.</p>")
    for run in runs:
        text = run.config_text or "(no config.yaml in the run directory)"
        out += (f"<details{' open' if len(runs) == 1 else ''}><summary>{_e(run.label)}: config.yaml</summary>"
                f"<pre>{_e(text)}</pre></details>")
    return out


def _environment_rows(run: RunData) -> dict[str, str]:
    state = run.trainer_state or {}
    start = run.start or {}
    rows = {
        "run directory": str(run.path.resolve()),
        "backend": run.backend or "?",
        "device": str(run.config.get("device", "?")),
        "checkpoint step": _num(state.get("step"), ","),
    }
    rows.update({f"version: {k}": str(v) for k, v in (state.get("versions") or {}).items()})
    rows.update({f"start: {k}": str(v) for k, v in start.items() if k.startswith("version")})
    rows["data manifest sha256"] = str(state.get("data_manifest_sha256", "–"))[:16]
    rows["run identity"] = str(state.get("run_identity", "–"))[:16]
    return rows


def _environment(runs: Sequence[RunData]) -> str:
    per_run = [_environment_rows(run) for run in runs]
    keys = list(dict.fromkeys(k for rows in per_run for k in rows))
    table = _table(["", *(run.label for run in runs)], ([k, *(rows.get(k, "–") for rows in per_run)] for k in keys))
    return table + f"<p class=\"note\">Versions come from the newest checkpoint's trainer_state.json. " \
                   f"Report written {dt.datetime.now().isoformat(timespec='seconds')}.</p>"


def _health_band(runs: Sequence[RunData]) -> tuple[float | None, float | None]:
    health = ((runs[0].config.get("monitor") or {}).get("health")) or {}
    cfg = HealthConfig(**health) if isinstance(health, dict) else HealthConfig()
    return cfg.grad_norm_low, cfg.grad_norm_high


def render(runs: Sequence[RunData]) -> str:
    """The whole HTML document for one run, or several overlaid."""
    _labels(runs)
    low, high = _health_band(runs)
    body = {
        "overview": _overview(runs),
        "loss": _img(plots.loss_plot(runs), "training and validation loss", ""),
        "lr": _img(plots.lr_plot(runs), "learning rate schedule", ""),
        "grad-norm": _img(plots.grad_norm_plot(runs, low, high), "gradient norm", ""),
        "layers": _layers(runs),
        "throughput": _img(plots.throughput_plot(runs), "throughput and MFU", ""),
        "memory": _img(plots.memory_plot(runs), "host memory", "No memory records (rss_mb) in this run."),
        "hardware": _img(
            plots.hardware_plot(runs),
            "device memory, utilisation, temperature and power",
            "No hardware records in this run (they need a release that records cpu_util; the device's rows "
            "need an accelerator and its vendor tool, nvidia-smi or npu-smi).",
        ),
        "events": _events(runs),
        "data": _data(runs),
        "config": _config(runs),
        "environment": _environment(runs),
    }
    title = " vs ".join(run.label for run in runs)
    nav = "".join(f"<a href=\"#{sid}\">{_e(name)}</a>" for sid, name in SECTIONS)
    sections = "".join(f"<section id=\"{sid}\"><h2>{_e(name)}</h2>{body[sid]}</section>" for sid, name in SECTIONS)
    kind = "comparison" if len(runs) > 1 else "run report"
    return (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>mindfoundry {kind}: {_e(title)}</title>'
        f'<style>{CSS}</style></head><body><h1>{_e(title)}</h1><p class="subtitle">mindfoundry {kind}</p>'
        f"<nav>{nav}</nav>{sections}</body></html>\n"
    )


def default_output(run_dir: Path, compare: Path | None) -> Path:
    return run_dir / (f"report-vs-{compare.resolve().name}.html" if compare else "report.html")


def write_report(run_dir: str | Path, compare: str | Path | None = None, out: str | Path | None = None) -> Path:
    """Read the run(s), render, write one HTML file; returns its path."""
    runs = [load_run(run_dir)] + ([load_run(compare)] if compare else [])
    path = Path(out) if out else default_output(Path(run_dir), Path(compare) if compare else None)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(runs), encoding="utf-8")
    return path
