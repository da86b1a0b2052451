"""Compare two dumps tensor by tensor (MindStudio-Probe style), without either engine installed.

Tensors are matched by their engine-independent name and listed in dump A's execution order, so
the first row judged an error is where the two runs start to differ; everything after it may only
carry the error forward. Dump B is the reference (the baseline, as msprobe's bench data): relative
errors are taken against B's values.

Verdict rule: a tensor passes only when it matches in direction *and* magnitude, each measured
against the reference's own scale. Direction is the cosine similarity; magnitude the relative RMS
error ``rel_rmse = RMSE(A - B) / RMS(B)``. Huawei's PyTorch accuracy comparison (CANN 7.0,
"计算精度评价指标") starts from cosine >= 0.99; but an absolute floor (its MaxAbsErr <= 0.001) lets
any tensor whose values are small pass whatever it holds — a shuffled, sign-flipped gradient of
size 1e-4 has cosine ~0 and passes it. So the floor applies only to tensors that are numerically
zero on both sides (RMS <= ``zero_rms``), and:

- error: cosine < 0.99, or ``rel_rmse`` > 5% (a wrong scale that rounding cannot explain: bf16
  keeps 2^-9 = 0.2% per value, and a whole bf16 model drifts ~1% from fp32);
- warning: cosine < 0.9999 or ``rel_rmse`` > 1e-4. Two correct fp32 runs of the same model, one
  per engine, stay near 1e-6: anything above the warning band is where they part.

The shares of elements off by more than 0.1% / 0.5% of their own value (msprobe's thousandth and
five-thousandth ratios) are reported but do not judge: an element near zero makes any rounding a
huge relative error, while a few elements badly wrong already raise ``rel_rmse``.

Metrics are computed in float64 over fixed-size chunks of memory-mapped arrays, one tensor pair at
a time, so comparing dumps of a large model needs memory for one chunk, not for the model.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from mindfoundry.debug.dump import Dump, DumpError
from mindfoundry.debug.dump_folders import dump_leaves, read_dump
from mindfoundry.debug.msprobe import representable

TINY = 1e-7          # floor of |b| in relative errors, so exact zeros in B do not divide by zero
CHUNK = 1 << 20      # elements per streamed chunk (8 MiB per float64 operand)
VERDICTS = ("pass", "warning", "error")
_ACTIVATION = re.compile(r"\.(forward|backward)\.(\d+)\.(input|output|grad_output|grad_input)\.[\w.]+$")
_INTEGRAL = re.compile(r"int|bool", re.IGNORECASE)  # int64, Int32, torch.uint8, bool, Bool


@dataclass(frozen=True)
class Thresholds:
    """Verdict limits; see the module docstring for where the defaults come from."""

    cosine_error: float = 0.99       # error if cosine < this ...
    rel_error: float = 0.05          # ... or RMSE / RMS(B) > this
    cosine_warning: float = 0.9999   # warning if cosine < this ...
    rel_warning: float = 1e-4        # ... or RMSE / RMS(B) > this
    zero_rms: float = 1e-12  # a tensor whose RMS is at most this on both sides is zero: it passes
    stats_rel_error: float = 0.05  # statistics mode: error if the norm differs by more, or the mean by more of the RMS
    stats_rel_warning: float = 0.005  # statistics mode: warning if mean, norm, min or max differ by more (of the scale)


@dataclass
class TensorComparison:
    """One matched tensor. Tensor-mode metrics are None in statistics mode (and on a shape mismatch);
    the statistics (mean/norm/min/max of the finite elements, from the index) are always filled."""

    name: str
    module: str
    kind: str
    seq: int  # execution order in dump A
    shape_a: tuple[int, ...]
    shape_b: tuple[int, ...]
    dtype_a: str
    dtype_b: str
    cosine: float | None = None
    max_abs: float | None = None
    max_rel: float | None = None      # max |a-b| / max(|b|, TINY)
    rmse: float | None = None
    rel_rmse: float | None = None     # rmse / RMS(B): the size of the difference on the reference's scale
    rel_over_1e3: float | None = None  # share of elements with relative error > 1/1000
    rel_over_5e3: float | None = None  # > 5/1000
    mean_a: float | None = None
    mean_b: float | None = None
    norm_a: float | None = None
    norm_b: float | None = None
    min_a: float | None = None
    min_b: float | None = None
    max_a: float | None = None
    max_b: float | None = None
    mean_rel_diff: float | None = None  # |mean_a - mean_b| / RMS(B)
    norm_rel_diff: float | None = None  # |norm_a - norm_b| / norm_b
    min_rel_diff: float | None = None   # |min_a - min_b| / B's largest magnitude
    max_rel_diff: float | None = None   # |max_a - max_b| / B's largest magnitude
    nonfinite_a: int = 0
    nonfinite_b: int = 0
    verdict: str = "pass"
    reason: str = ""


def _badness(row: TensorComparison) -> tuple[int, float, float]:
    """Larger is worse: verdict, then lower cosine, then larger max_abs (norm difference in statistics mode)."""
    magnitude = row.max_abs if row.max_abs is not None else row.norm_rel_diff
    return VERDICTS.index(row.verdict), -(1.0 if row.cosine is None else row.cosine), magnitude or 0.0


@dataclass
class Comparison:
    """Two dump leaves compared; `rows` follow dump A's execution order."""

    a: Path
    b: Path
    meta_a: dict[str, Any]
    meta_b: dict[str, Any]
    mode: str  # "tensor" when both dumps hold arrays, else "statistics"
    rows: list[TensorComparison]
    only_a: list[str]
    only_b: list[str]
    thresholds: Thresholds = field(default_factory=Thresholds)

    def first_divergence(self) -> TensorComparison | None:
        """The first tensor, in execution order, that is not a pass. Warnings count: two correct
        fp32 runs of the same model pass every tensor by orders of magnitude, so the first warning
        is already where they part (a changed epsilon can stay a warning for one module and only
        become an error downstream)."""
        return next((r for r in self.rows if r.verdict != "pass"), None)

    def first_error(self) -> TensorComparison | None:
        return next((r for r in self.rows if r.verdict == "error"), None)

    def lowest_cosine(self) -> TensorComparison | None:
        rows = [r for r in self.rows if r.cosine is not None]
        return min(rows, key=lambda r: r.cosine) if rows else None

    def counts(self) -> dict[str, int]:
        out = dict.fromkeys(VERDICTS, 0)
        for r in self.rows:
            out[r.verdict] += 1
        return out

    def unmatched_activations(self) -> list[str]:
        """Forward/backward tensors of a module call that the other dump lacks entirely: the two runs
        executed different modules or calls. A call both dumps hold may differ in how many of its
        arguments were recorded (msprobe's PrecisionDebugger records every positional argument, our
        hooks the first): such extras are listed in only_a/only_b but do not fail the comparison."""
        calls = {_call(r.name) for r in self.rows}
        return [n for n in self.only_a + self.only_b if _ACTIVATION.search(n) and _call(n) not in calls]

    def passed(self) -> bool:
        """No error row and no unmatched activation. Unmatched parameters, gradients and optimizer
        moments do not fail the comparison: they differ when the dumps selected different
        directions or parameter patterns, which says nothing about the numerics."""
        return not self.first_error() and not self.unmatched_activations()

    def worst_modules(self, k: int = 5) -> list[dict[str, Any]]:
        """The k modules that introduce the most error, worst first.

        A module's *introduced* error is how much worse its output is than its input (forward: the
        relative RMSE of the output minus that of the input; backward: of the gradient it sends
        minus the gradient it receives; a parameter's own relative error counts as introduced).
        Ranking by introduced rather than absolute error puts the culprit ahead of the modules
        downstream that merely carry its error on. The whole model ('model') and the loss are
        aggregates of everything and are not ranked."""
        by_name = {r.name: r for r in self.rows}
        groups: dict[str, list[TensorComparison]] = {}
        for r in self.rows:
            if r.module not in _AGGREGATES:
                groups.setdefault(r.module, []).append(r)

        def top(values: list[float | None], pick) -> float | None:
            present = [v for v in values if v is not None]
            return pick(present) if present else None

        out = [{
            "module": module,
            "introduced": max((_introduced(r, by_name) for r in rows), default=0.0),
            "tensors": len(rows),
            "errors": sum(r.verdict == "error" for r in rows),
            "warnings": sum(r.verdict == "warning" for r in rows),
            "min_cosine": top([r.cosine for r in rows], min),
            "max_abs": top([r.max_abs for r in rows], max),
            "max_rel": top([r.max_rel for r in rows], max),
            "max_norm_rel_diff": top([r.norm_rel_diff for r in rows], max),
            "worst": max(rows, key=_badness).name,
        } for module, rows in groups.items()]
        out.sort(key=lambda m: (-m["introduced"], -m["errors"], 1.0 if m["min_cosine"] is None else m["min_cosine"]))
        return out[:k]


def _call(name: str) -> str:
    """'layers.0.attn.forward.1' of 'layers.0.attn.forward.1.input.0'."""
    return _ACTIVATION.sub(lambda m: f".{m[1]}.{m[2]}", name)


_AGGREGATES = ("model", "loss")
_SOURCE = {"forward_output": (".output.0", ".input.0"), "backward_grad_input": (".grad_input.0", ".grad_output.0")}


def relative_error(row: TensorComparison | None) -> float:
    """Size of the difference relative to the reference: RMSE / RMS(B) with arrays, else the norm's relative difference.
    """
    if row is None:
        return 0.0
    if row.rel_rmse is not None:
        return row.rel_rmse if math.isfinite(row.rel_rmse) else 1.0
    return row.norm_rel_diff or 0.0


def _introduced(row: TensorComparison, by_name: dict[str, TensorComparison]) -> float:
    """Error of `row` beyond that of what its module was given (0 for gradients and moments: derived values)."""
    if row.kind == "param":
        return relative_error(row)
    if row.kind not in _SOURCE:
        return 0.0
    produced, given = _SOURCE[row.kind]
    return max(relative_error(row) - relative_error(by_name.get(row.name.replace(produced, given))), 0.0)


# -- metrics ---------------------------------------------------------------------------------
def _tensor_metrics(a: np.ndarray, b: np.ndarray) -> dict[str, Any]:
    """Streams both flattened arrays in chunks; metrics cover positions finite on both sides, and
    `mismatch` counts positions whose NaN/Inf pattern differs (NaN vs number, +Inf vs -Inf, ...)."""
    fa, fb = a.reshape(-1), b.reshape(-1)
    n = over1 = over5 = mismatch = 0
    dot = aa = bb = sq = max_abs = max_rel = 0.0
    for start in range(0, fa.size, CHUNK):
        x = np.asarray(fa[start:start + CHUNK], dtype=np.float64)
        y = np.asarray(fb[start:start + CHUNK], dtype=np.float64)
        both = np.isfinite(x) & np.isfinite(y)
        if not both.all():
            same = (x == y) | (np.isnan(x) & np.isnan(y))
            mismatch += int(np.count_nonzero(~both & ~same))
            x, y = x[both], y[both]
        if x.size == 0:
            continue
        d = np.abs(x - y)
        rel = d / np.maximum(np.abs(y), TINY)
        n += x.size
        dot += float(np.dot(x, y))
        aa += float(np.dot(x, x))
        bb += float(np.dot(y, y))
        sq += float(np.dot(d, d))
        max_abs = max(max_abs, float(d.max()))
        max_rel = max(max_rel, float(rel.max()))
        over1 += int(np.count_nonzero(rel > 1e-3))
        over5 += int(np.count_nonzero(rel > 5e-3))
    if max_abs == 0.0:
        cosine = 1.0  # identical finite values (all-zero included), exactly
    elif aa == 0.0 or bb == 0.0:
        cosine = 0.0
    else:
        cosine = min(1.0, max(-1.0, dot / (math.sqrt(aa) * math.sqrt(bb))))
    rmse = math.sqrt(sq / n) if n else 0.0
    rms_a, rms_b = (math.sqrt(v / n) if n else 0.0 for v in (aa, bb))
    rel_rmse = 0.0 if rmse == 0.0 else rmse / rms_b if rms_b else math.inf
    return {"cosine": cosine, "max_abs": max_abs, "max_rel": max_rel, "rmse": rmse, "rel_rmse": rel_rmse,
            "rms_a": rms_a, "rms_b": rms_b, "rel_over_1e3": over1 / n if n else 0.0,
            "rel_over_5e3": over5 / n if n else 0.0, "mismatch": mismatch}


def _stat_scales(rb: dict[str, Any]) -> dict[str, float | None]:
    """What each statistic's difference is measured against, all from the reference B: the norm against B's
    norm, the mean against B's RMS (a mean near zero would make any change look huge), min and max against
    B's largest magnitude. The table, the plots and the statistics verdict all use these."""
    norm = rb.get("norm")
    extremes = [abs(v) for v in (rb.get("min"), rb.get("max")) if v is not None]
    largest = max(extremes) if extremes else None
    rms = None if norm is None else norm / math.sqrt(math.prod(rb["shape"]) or 1)
    return {"norm": norm, "mean": rms, "min": largest, "max": largest}


def _nonfinite(record: dict[str, Any]) -> tuple[int, int]:
    return int(record.get("nan") or 0), int(record.get("inf") or 0)


def _row(ra: dict[str, Any], rb: dict[str, Any]) -> TensorComparison:
    """A row with shapes, dtypes and the index statistics of both sides; no verdict yet."""
    row = TensorComparison(
        name=ra["name"], module=ra["module"], kind=ra["kind"], seq=ra["seq"],
        shape_a=tuple(ra["shape"]), shape_b=tuple(rb["shape"]), dtype_a=ra["dtype"], dtype_b=rb["dtype"],
        nonfinite_a=sum(_nonfinite(ra)), nonfinite_b=sum(_nonfinite(rb)))
    scales = _stat_scales(rb)
    for stat in ("mean", "norm", "min", "max"):
        x, y = ra.get(stat), rb.get(stat)
        setattr(row, f"{stat}_a", x)
        setattr(row, f"{stat}_b", y)
        setattr(
            row,
            f"{stat}_rel_diff",
            None if x is None or y is None else abs(x - y) / max(abs(scales[stat] or 0.0), TINY),
        )
    return row


def _nonfinite_reason(ra: dict[str, Any], rb: dict[str, Any]) -> str:
    (na, ia), (nb, ib) = _nonfinite(ra), _nonfinite(rb)
    if (na, ia) == (nb, ib):
        return f"NaN/Inf at different positions (A and B both have {na} NaN and {ia} Inf)"
    return f"A has {na} NaN and {ia} Inf, B has {nb} NaN and {ib} Inf"


def _judge_tensor(row: TensorComparison, m: dict[str, Any], integral: bool, t: Thresholds) -> tuple[str, str]:
    cos, rel = m["cosine"], m["rel_rmse"]
    if integral:
        return ("pass", "integer values identical") if m["max_abs"] == 0 else \
            ("error", f"integer values differ (max abs {m['max_abs']:.6g}, {m['rel_over_1e3']:.1%} of elements)")
    same_nonfinite = f"; {row.nonfinite_a} NaN/Inf in the same places on both sides" if row.nonfinite_a else ""
    if m["rms_a"] <= t.zero_rms and m["rms_b"] <= t.zero_rms:
        return (
            "pass",
            f"numerically zero on both sides (RMS {m['rms_a']:.3g} and {m['rms_b']:.3g} <= "
            f"{t.zero_rms:g}){same_nonfinite}",
        )
    if cos < t.cosine_error:
        return "error", f"cosine {cos:.4g} < {t.cosine_error:g} (relative RMS error {rel:.3g})"
    if rel > t.rel_error:
        return "error", f"relative RMS error {rel:.3g} > {t.rel_error:g} (cosine {cos:.6g}): the magnitudes differ"
    if cos < t.cosine_warning:
        return "warning", f"cosine {cos:.6g} < {t.cosine_warning:g} (relative RMS error {rel:.3g})"
    if rel > t.rel_warning:
        return "warning", f"relative RMS error {rel:.3g} > {t.rel_warning:g} (cosine {cos:.6g})"
    return "pass", f"cosine {cos:.6g}, relative RMS error {rel:.3g}{same_nonfinite}"


def _judge_stats(row: TensorComparison, integral: bool, t: Thresholds) -> tuple[str, str]:
    """Statistics mode: each statistic's difference on the reference's scale (:func:`_stat_scales`, the
    row's ``*_rel_diff``). Norm or mean decide errors, any of them warnings. Statistics cannot see a
    shuffled tensor (same norm, same extremes): use tensor mode for a verdict on direction."""
    root_count = math.sqrt(math.prod(row.shape_b) or 1)
    if row.norm_a is not None and row.norm_b is not None and max(row.norm_a, row.norm_b) / root_count <= t.zero_rms:
        return "pass", "numerically zero on both sides"
    diffs = []
    for stat in ("mean", "norm", "min", "max"):
        x, y = getattr(row, f"{stat}_a"), getattr(row, f"{stat}_b")
        if x is None and y is None:
            continue
        if x is None or y is None:
            return "error", f"{stat} is {x} in A but {y} in B"
        if integral and x != y:
            return "error", f"integer tensor: {stat} {x:.6g} in A vs {y:.6g} in B"
        diffs.append((stat, x, y, getattr(row, f"{stat}_rel_diff")))
    for stat, x, y, rel in diffs:
        if stat in ("mean", "norm") and rel > t.stats_rel_error:
            return (
                "error",
                f"{stat} differs by {rel:.2%} of the reference's {_SCALE[stat]} ({x:.6g} vs {y:.6g}) > "
                f"{t.stats_rel_error:.1%}",
            )
    for stat, x, y, rel in diffs:
        if rel > t.stats_rel_warning:
            return (
                "warning",
                f"{stat} differs by {rel:.2%} of the reference's {_SCALE[stat]} ({x:.6g} vs {y:.6g}) > "
                f"{t.stats_rel_warning:.1%}",
            )
    return "pass", f"mean, norm, min and max agree within {t.stats_rel_warning:.1%} of the reference's scale"


_SCALE = {"norm": "norm", "mean": "RMS", "min": "largest magnitude", "max": "largest magnitude"}


def _compare_pair(
    da: Dump, ra: dict[str, Any], db: Dump, rb: dict[str, Any], mode: str, t: Thresholds
) -> TensorComparison:
    row = _row(ra, rb)
    if row.shape_a != row.shape_b:
        row.verdict, row.reason = "error", f"shape {list(row.shape_a)} in A vs {list(row.shape_b)} in B"
        return row
    if mode == "statistics":
        if _nonfinite(ra) != _nonfinite(rb):
            row.verdict, row.reason = "error", _nonfinite_reason(ra, rb)
        else:
            row.verdict, row.reason = _judge_stats(row, bool(_INTEGRAL.search(row.dtype_a + row.dtype_b)), t)
        return row
    a, b = da.array(ra), db.array(rb)
    m = _tensor_metrics(a, b)
    for key in ("cosine", "max_abs", "max_rel", "rmse", "rel_rmse", "rel_over_1e3", "rel_over_5e3"):
        setattr(row, key, m[key])
    if m["mismatch"]:
        row.verdict, row.reason = "error", _nonfinite_reason(ra, rb)
    else:
        row.verdict, row.reason = _judge_tensor(row, m, a.dtype.kind in "iub" or b.dtype.kind in "iub", t)
    return row


def _compare(da: Dump, db: Dump, t: Thresholds) -> Comparison:
    mode = "tensor" if da.meta.get("mode") == db.meta.get("mode") == "tensor" else "statistics"
    by_b = db.by_name()
    names_a = {r["name"] for r in da.records}
    comparable_a, comparable_b = _holdable_by(db), _holdable_by(da)
    rows = [_compare_pair(da, ra, db, by_b[ra["name"]], mode, t) for ra in da.records if ra["name"] in by_b]
    if not rows and da.records and db.records:
        raise DumpError(f"{da.path} and {db.path} have no tensor name in common, so they dump different models (or "
                        f"one was renamed): A holds e.g. {[r['name'] for r in da.records[:3]]}, B e.g. "
                        f"{[r['name'] for r in db.records[:3]]}; dump the same model on both sides")
    return Comparison(
        a=da.path, b=db.path, meta_a=da.meta, meta_b=db.meta, mode=mode, rows=rows,
        only_a=[r["name"] for r in da.records if r["name"] not in by_b and comparable_a(r)],
        only_b=[r["name"] for r in db.records if r["name"] not in names_a and comparable_b(r)], thresholds=t)


def _holdable_by(other: Dump) -> Callable[[dict[str, Any]], bool]:
    """Whether the other dump could hold a record: against an msprobe dump, what its layout has no place for
    (the whole model, the loss, AdamW's moments) is not missing, and not listed as unmatched."""
    if other.meta.get("format") != "msprobe":
        return lambda record: True
    return lambda record: representable(record["module"], record["kind"])


def _single_leaf(root: Path) -> Path:
    leaves = dump_leaves(root)
    if len(leaves) > 1:
        listed = ", ".join(str(p.relative_to(root)) for p in leaves)
        raise DumpError(f"{root} holds {len(leaves)} dumps ({listed}): pass one step{{N}}/rank{{R}} folder, "
                        f"or compare the whole trees with compare_trees")
    return leaves[0]


def compare_dumps(a: Path, b: Path, thresholds: Thresholds = Thresholds()) -> Comparison:
    """Compare two leaves (step{N}/rank{R} folders, or roots holding exactly one); B is the reference."""
    a, b = Path(a), Path(b)
    return _compare(read_dump(_single_leaf(a)), read_dump(_single_leaf(b)), thresholds)


def compare_trees(a: Path, b: Path, thresholds: Thresholds = Thresholds()) -> list[Comparison]:
    """Compare every step{N}/rank{R} of two dump roots, paired by relative path; both must hold the same leaves
    (two roots of one leaf each are paired whatever the leaves' folder names)."""
    a, b = Path(a), Path(b)
    rel_a = {p.relative_to(a): p for p in dump_leaves(a)}
    rel_b = {p.relative_to(b): p for p in dump_leaves(b)}
    if (
        len(rel_a) == len(rel_b) == 1
    ):  # one dump each: paired whatever their folders (msprobe's step0/proc123 vs step1/rank0)
        return [_compare(read_dump(*rel_a.values()), read_dump(*rel_b.values()), thresholds)]
    missing = [f"{rel} (only in {a})" for rel in rel_a if rel not in rel_b] + \
              [f"{rel} (only in {b})" for rel in rel_b if rel not in rel_a]
    if missing:
        raise DumpError(f"the dump trees hold different leaves: {', '.join(missing)}; "
                        f"dump the same steps and ranks on both sides, or compare single leaves with compare_dumps")
    return [_compare(read_dump(rel_a[rel]), read_dump(rel_b[rel]), thresholds) for rel in rel_a]
