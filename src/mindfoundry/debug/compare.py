"""Compare two dumps tensor by tensor (MindStudio-Probe style), without either engine installed.

Tensors are matched by their engine-independent name and listed in dump A's execution order, so
the first row judged an error is where the two runs start to differ; everything after it may only
carry the error forward. Dump B is the reference (the baseline, as msprobe's bench data): relative
errors are taken against B's values.

Verdict rule. Huawei's PyTorch accuracy comparison (CANN 7.0 docs, "计算精度评价指标",
https://www.hiascend.com/doc_center/source/zh/canncommercial/700/modeldevpt/ptmigr/AImpug_000197.html)
marks a tensor "Accuracy Reached: No" when cosine < 0.99 and MaxAbsErr > 0.001, and also when
cosine < 0.9 or MaxAbsErr > 1 alone. We keep the first, joint rule as the *error* rule and leave
out the two unconditional ones: cosine alone is noise on near-zero tensors (a tiny absolute error
must pass), and an absolute error of 1 is ordinary rounding on bf16 logits of magnitude 30. On top
we add a *warning* band in the spirit of msprobe's thousandth / five-thousandth error ratios:
cosine < 0.9999, or more than 1% of elements off by more than 0.5% relative.

Metrics are computed in float64 over fixed-size chunks of memory-mapped arrays, one tensor pair at
a time, so comparing dumps of a large model needs memory for one chunk, not for the model.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mindfoundry.debug.dump import Dump, DumpError, dump_leaves, read_dump

TINY = 1e-7          # floor of |b| in relative errors, so exact zeros in B do not divide by zero
CHUNK = 1 << 20      # elements per streamed chunk (8 MiB per float64 operand)
VERDICTS = ("pass", "warning", "error")
_ACTIVATION = re.compile(r"\.(forward|backward)\.\d+\.(input|output|grad_output|grad_input)\.\d+$")
_INTEGRAL = re.compile(r"int|bool", re.IGNORECASE)  # int64, Int32, torch.uint8, bool, Bool


@dataclass(frozen=True)
class Thresholds:
    """Verdict limits; see the module docstring for where the defaults come from."""

    cosine_error: float = 0.99       # error if cosine < this AND max_abs > abs_error
    abs_error: float = 1e-3          # absolute errors up to this always pass (near-zero values)
    cosine_warning: float = 0.9999   # warning if cosine < this ...
    rel_share_warning: float = 0.01  # ... or this share of elements has relative error > 5/1000
    stats_rel_error: float = 0.05    # statistics mode: error if mean or norm differ by more (and by > abs_error)
    stats_rel_warning: float = 0.005  # statistics mode: warning if mean, norm, min or max differ by more


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
    mean_rel_diff: float | None = None
    norm_rel_diff: float | None = None
    min_rel_diff: float | None = None
    max_rel_diff: float | None = None
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
        """Unmatched forward/backward tensors: the two runs executed different modules or calls."""
        return [n for n in self.only_a + self.only_b if _ACTIVATION.search(n)]

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


_AGGREGATES = ("model", "loss")
_SOURCE = {"forward_output": (".output.0", ".input.0"), "backward_grad_input": (".grad_input.0", ".grad_output.0")}


def relative_error(row: TensorComparison | None) -> float:
    """Size of the difference relative to the reference: RMSE / RMS(B) with arrays, else the norm's relative difference."""
    if row is None:
        return 0.0
    if row.rmse is not None and row.norm_b:
        count = math.prod(row.shape_b) or 1
        return row.rmse / (row.norm_b / math.sqrt(count))
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
    return {"cosine": cosine, "max_abs": max_abs, "max_rel": max_rel, "rmse": math.sqrt(sq / n) if n else 0.0,
            "rel_over_1e3": over1 / n if n else 0.0, "rel_over_5e3": over5 / n if n else 0.0, "mismatch": mismatch}


def _rel_diff(x: float | None, y: float | None) -> float | None:
    return None if x is None or y is None else abs(x - y) / max(abs(y), TINY)


def _nonfinite(record: dict[str, Any]) -> tuple[int, int]:
    return int(record.get("nan") or 0), int(record.get("inf") or 0)


def _row(ra: dict[str, Any], rb: dict[str, Any]) -> TensorComparison:
    """A row with shapes, dtypes and the index statistics of both sides; no verdict yet."""
    row = TensorComparison(
        name=ra["name"], module=ra["module"], kind=ra["kind"], seq=ra["seq"],
        shape_a=tuple(ra["shape"]), shape_b=tuple(rb["shape"]), dtype_a=ra["dtype"], dtype_b=rb["dtype"],
        nonfinite_a=sum(_nonfinite(ra)), nonfinite_b=sum(_nonfinite(rb)))
    for stat in ("mean", "norm", "min", "max"):
        setattr(row, f"{stat}_a", ra.get(stat))
        setattr(row, f"{stat}_b", rb.get(stat))
        setattr(row, f"{stat}_rel_diff", _rel_diff(ra.get(stat), rb.get(stat)))
    return row


def _nonfinite_reason(ra: dict[str, Any], rb: dict[str, Any]) -> str:
    (na, ia), (nb, ib) = _nonfinite(ra), _nonfinite(rb)
    if (na, ia) == (nb, ib):
        return f"NaN/Inf at different positions (A and B both have {na} NaN and {ia} Inf)"
    return f"A has {na} NaN and {ia} Inf, B has {nb} NaN and {ib} Inf"


def _judge_tensor(row: TensorComparison, m: dict[str, Any], integral: bool, t: Thresholds) -> tuple[str, str]:
    cos, max_abs, share = m["cosine"], m["max_abs"], m["rel_over_5e3"]
    if integral:
        return ("pass", "integer values identical") if max_abs == 0 else \
            ("error", f"integer values differ (max abs {max_abs:.6g}, {m['rel_over_1e3']:.1%} of elements)")
    if cos < t.cosine_error and max_abs > t.abs_error:
        return "error", f"cosine {cos:.4g} < {t.cosine_error:g} and max abs {max_abs:.3g} > {t.abs_error:g}"
    same_nonfinite = f"; {row.nonfinite_a} NaN/Inf in the same places on both sides" if row.nonfinite_a else ""
    if max_abs <= t.abs_error:
        return "pass", f"max abs {max_abs:.3g} <= {t.abs_error:g}{same_nonfinite}"
    if cos < t.cosine_warning:
        return "warning", f"cosine {cos:.6g} < {t.cosine_warning:g} (max abs {max_abs:.3g})"
    if share > t.rel_share_warning:
        return "warning", f"{share:.1%} of elements have relative error > 0.005 (limit {t.rel_share_warning:.1%})"
    return "pass", f"cosine {cos:.6g}, {share:.2%} of elements off by > 0.5%{same_nonfinite}"


def _judge_stats(row: TensorComparison, integral: bool, t: Thresholds) -> tuple[str, str]:
    """Statistics mode: the relative difference of mean and norm decides errors; of any stat, warnings.
    A difference no larger than abs_error never counts, as in tensor mode."""
    diffs = []
    for stat in ("mean", "norm", "min", "max"):
        x, y, rel = getattr(row, f"{stat}_a"), getattr(row, f"{stat}_b"), getattr(row, f"{stat}_rel_diff")
        if x is None and y is None:
            continue
        if rel is None:
            return "error", f"{stat} is {x} in A but {y} in B"
        if integral and x != y:
            return "error", f"integer tensor: {stat} {x:.6g} in A vs {y:.6g} in B"
        if abs(x - y) > t.abs_error:
            diffs.append((stat, x, y, rel))
    for stat, x, y, rel in diffs:
        if stat in ("mean", "norm") and rel > t.stats_rel_error:
            return "error", f"{stat} differs by {rel:.2%} ({x:.6g} vs {y:.6g}) > {t.stats_rel_error:.1%}"
    for stat, x, y, rel in diffs:
        if rel > t.stats_rel_warning:
            return "warning", f"{stat} differs by {rel:.2%} ({x:.6g} vs {y:.6g}) > {t.stats_rel_warning:.1%}"
    return "pass", f"mean, norm, min and max agree within {t.stats_rel_warning:.1%} (or {t.abs_error:g} absolute)"


def _compare_pair(da: Dump, ra: dict[str, Any], db: Dump, rb: dict[str, Any], mode: str, t: Thresholds) -> TensorComparison:
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
    for key in ("cosine", "max_abs", "max_rel", "rmse", "rel_over_1e3", "rel_over_5e3"):
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
    rows = [_compare_pair(da, ra, db, by_b[ra["name"]], mode, t) for ra in da.records if ra["name"] in by_b]
    return Comparison(
        a=da.path, b=db.path, meta_a=da.meta, meta_b=db.meta, mode=mode, rows=rows,
        only_a=[r["name"] for r in da.records if r["name"] not in by_b],
        only_b=[r["name"] for r in db.records if r["name"] not in names_a], thresholds=t)


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
    """Compare every step{N}/rank{R} of two dump roots, paired by relative path; both must hold the same leaves."""
    a, b = Path(a), Path(b)
    rel_a = {p.relative_to(a): p for p in dump_leaves(a)}
    rel_b = {p.relative_to(b): p for p in dump_leaves(b)}
    missing = [f"{rel} (only in {a})" for rel in rel_a if rel not in rel_b] + \
              [f"{rel} (only in {b})" for rel in rel_b if rel not in rel_a]
    if missing:
        raise DumpError(f"the dump trees hold different leaves: {', '.join(missing)}; "
                        f"dump the same steps and ranks on both sides, or compare single leaves with compare_dumps")
    return [_compare(read_dump(rel_a[rel]), read_dump(rel_b[rel]), thresholds) for rel in rel_a]
