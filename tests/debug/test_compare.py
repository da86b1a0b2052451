"""Dump comparison on real dumps written by DumpWriter: metrics against hand-computed values,
verdicts, first divergence, statistics mode, tree pairing and the CSV/HTML/text reports."""

from __future__ import annotations

import csv
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mindfoundry.debug import compare as compare_mod
from mindfoundry.debug.compare import Thresholds, compare_dumps, compare_trees
from mindfoundry.debug.dump import DumpError, DumpWriter
from mindfoundry.report.compare_report import summary_lines, write_csv, write_html

RNG = np.random.default_rng(0)
TOKENS = np.array([[3, 17, 4, 9], [1, 0, 22, 5]], dtype=np.int64)
HIDDEN = RNG.normal(size=(2, 4, 8))
MLP_B = np.array([1.0, 2.0, 3.0, 4.0])
MLP_A = np.array([1.0, 2.0, 3.0, -4.0])  # one sign flipped: the injected bug


def write(root: Path, tensors: list[tuple[str, str, str, np.ndarray]], mode: str = "tensor",
          step: int = 1, rank: int = 0) -> Path:
    w = DumpWriter(root, step, rank, mode, {"backend": "numpy", "precision": "fp64"})
    for name, module, kind, array in tensors:
        w.record(name, module, kind, array)
    return w.close()


def fwd(module: str, array: np.ndarray, kind: str = "forward_output") -> tuple[str, str, str, np.ndarray]:
    slot = "input" if kind == "forward_input" else "output"
    return f"{module}.forward.0.{slot}.0", module, kind, array


def model_tensors(bug: bool) -> list[tuple[str, str, str, np.ndarray]]:
    """Eight tensors in execution order; with `bug`, seq 3 is wrong and later ones carry a small error."""
    late = 1.01 if bug else 1.0
    return [
        fwd("embed", TOKENS, "forward_input"),
        fwd("embed", HIDDEN),
        fwd("layers.0.attn", HIDDEN * 2),
        fwd("layers.0.mlp", MLP_A if bug else MLP_B),
        fwd("layers.1.attn", HIDDEN * late),                          # 1% everywhere: warning
        fwd("layers.1.mlp", HIDDEN * (1 + 1e-6 if bug else 1.0)),     # 1e-6 relative: pass
        fwd("norm", HIDDEN * 3 * late),                               # warning
        ("loss.forward.0.output.0", "loss", "loss", np.array(2.5 * (1.001 if bug else 1.0))),
    ]


def test_identical_dumps_pass(tmp_path: Path):
    a = write(tmp_path / "a", model_tensors(bug=False))
    b = write(tmp_path / "b", model_tensors(bug=False))
    cmp = compare_dumps(a, b)
    assert cmp.mode == "tensor" and len(cmp.rows) == 8 and not cmp.only_a and not cmp.only_b
    assert cmp.counts() == {"pass": 8, "warning": 0, "error": 0}
    assert cmp.first_divergence() is None and cmp.passed()
    for row in cmp.rows:
        assert row.cosine == 1.0 and row.max_abs == 0.0 and row.rmse == 0.0 and row.rel_over_1e3 == 0.0
    assert [r.seq for r in cmp.rows] == list(range(8))


def test_first_divergence_and_propagated_errors(tmp_path: Path):
    a = write(tmp_path / "a", model_tensors(bug=True))
    b = write(tmp_path / "b", model_tensors(bug=False))
    cmp = compare_dumps(tmp_path / "a", tmp_path / "b")  # roots holding one leaf each
    assert cmp.a == a and cmp.b == b
    assert [r.verdict for r in cmp.rows] == ["pass", "pass", "pass", "error", "warning", "pass", "warning", "warning"]

    first = cmp.first_divergence()
    assert first is not None and first.name == "layers.0.mlp.forward.0.output.0" and first.seq == 3
    # a = [1, 2, 3, -4], b = [1, 2, 3, 4]: a.b = -2, |a|^2 = |b|^2 = 30, a - b = [0, 0, 0, -8]
    assert first.cosine == pytest.approx(-2 / 30, abs=1e-15)
    assert first.max_abs == 8.0 and first.rmse == pytest.approx(4.0) and first.max_rel == pytest.approx(2.0)
    assert first.rel_over_1e3 == first.rel_over_5e3 == 0.25
    assert "cosine -0.06667 < 0.99" in first.reason and first.rel_rmse == pytest.approx(4.0 / math.sqrt(7.5))
    assert cmp.lowest_cosine() is first

    attn = cmp.rows[4]  # a = 1.01 b: same direction, every element 1% off
    assert attn.cosine == pytest.approx(1.0, abs=1e-12)
    assert attn.max_abs == pytest.approx(0.01 * np.abs(HIDDEN).max())
    assert attn.rmse == pytest.approx(0.01 * math.sqrt(np.mean(HIDDEN ** 2)))
    assert (
        attn.rel_over_5e3 == 1.0
        and attn.rel_rmse == pytest.approx(0.01)
        and "relative RMS error 0.01 > 0.0001" in attn.reason
    )
    assert cmp.rows[5].rel_rmse == pytest.approx(1e-6) and cmp.rows[5].verdict == "pass"
    assert cmp.rows[7].reason.startswith(
        "relative RMS error 0.001 > 0.0001"
    )  # the loss 0.1% off: same weights, a real difference

    worst = cmp.worst_modules(5)
    assert worst[0]["module"] == "layers.0.mlp" and worst[0]["errors"] == 1
    assert worst[0]["worst"] == first.name and worst[0]["min_cosine"] == first.cosine and worst[0]["max_abs"] == 8.0
    assert {m["module"] for m in worst[1:3]} == {"layers.1.attn", "norm"}
    assert not cmp.passed() and cmp.counts() == {"pass": 4, "warning": 3, "error": 1}


def test_tiny_relative_error_passes_and_transpose_fails(tmp_path: Path):
    m = RNG.normal(size=(16, 16))
    a = write(tmp_path / "a", [fwd("tiny", m * (1 + 1e-6)), fwd("perm", m.T)])
    b = write(tmp_path / "b", [fwd("tiny", m), fwd("perm", m)])
    tiny, perm = compare_dumps(a, b).rows
    assert tiny.verdict == "pass" and tiny.cosine == pytest.approx(1.0) and tiny.max_abs < 1e-5
    expected_cos = float(np.dot(m.T.ravel(), m.ravel()) / np.dot(m.ravel(), m.ravel()))
    assert perm.verdict == "error" and perm.cosine == pytest.approx(expected_cos)
    assert perm.max_abs == pytest.approx(np.abs(m.T - m).max())


def test_error_tiny_on_the_tensors_scale_passes_despite_huge_elementwise_relative_error(tmp_path: Path):
    b_vals = np.array([0.0, 1e-9, -2e-9, 5.0])
    a = write(tmp_path / "a", [fwd("x", b_vals + np.array([1e-7, 3e-8, 0.0, 0.0]))])
    b = write(tmp_path / "b", [fwd("x", b_vals)])
    (row,) = compare_dumps(a, b).rows
    assert row.max_rel == pytest.approx(1e-7 / 1e-7) and row.rel_over_5e3 == 0.5  # relative to max(|b|, 1e-7)
    assert row.rel_rmse == pytest.approx(math.sqrt((1e-14 + 9e-16) / 4) / 2.5)  # 2.1e-8 of the tensor's RMS
    assert row.verdict == "pass" and row.reason.startswith("cosine 1, relative RMS error 2.09e-08")


def test_small_values_are_judged_on_their_own_scale(tmp_path: Path):
    """A tensor of small values (a gradient of size 1e-4) no longer passes on an absolute floor: a shuffled,
    sign-flipped copy (same norm, cosine ~0) is an error, and a 1e-3 relative change a warning."""
    grad = RNG.normal(size=(32, 32)) * 1e-4
    scrambled = -RNG.permutation(grad.ravel()).reshape(grad.shape)
    a = write(tmp_path / "a", [("grad.w", "w", "grad", scrambled), ("grad.v", "v", "grad", grad * (1 + 1e-3)),
                               ("grad.zero", "z", "grad", np.zeros(8)), ("grad.tiny", "t", "grad", np.full(8, 1e-13))])
    b = write(tmp_path / "b", [("grad.w", "w", "grad", grad), ("grad.v", "v", "grad", grad),
                               ("grad.zero", "z", "grad", np.zeros(8)), ("grad.tiny", "t", "grad", np.zeros(8))])
    w, v, zero, tiny = compare_dumps(a, b).rows
    assert (
        np.linalg.norm(scrambled) == pytest.approx(np.linalg.norm(grad)) and w.max_abs < 1e-3
    )  # the old floor passed it
    assert w.verdict == "error" and abs(w.cosine) < 0.1 and "cosine" in w.reason
    assert v.verdict == "warning" and v.rel_rmse == pytest.approx(1e-3)
    assert zero.verdict == "pass" and tiny.verdict == "pass" and "numerically zero" in tiny.reason
    # statistics mode sees the changed magnitude, not the shuffle (same norm, extremes of the same size)
    sa = write(tmp_path / "sa", [("grad.v", "v", "grad", grad * 1.1)], mode="statistics")
    sb = write(tmp_path / "sb", [("grad.v", "v", "grad", grad)], mode="statistics")
    (row,) = compare_dumps(sa, sb).rows
    assert row.verdict == "error" and "norm differs by 10.00% of the reference's norm" in row.reason


def test_integer_tensors_compare_exactly(tmp_path: Path):
    other = TOKENS.copy()
    other[1, 2] = 23
    a = write(tmp_path / "a", [fwd("embed", TOKENS, "forward_input"), fwd("head", TOKENS, "forward_input")])
    b = write(tmp_path / "b", [fwd("embed", other, "forward_input"), fwd("head", TOKENS, "forward_input")])
    changed, same = compare_dumps(a, b).rows
    assert changed.verdict == "error" and changed.max_abs == 1.0 and "integer" in changed.reason
    assert changed.cosine > 0.99  # a float rule would pass this one token off by one
    assert same.verdict == "pass" and same.reason == "integer values identical"


def test_nonfinite_values(tmp_path: Path):
    x = RNG.normal(size=(4, 8))
    nan_x = x.copy()
    nan_x[0, :3] = np.nan
    a = write(tmp_path / "a", [fwd("one_side", nan_x), fwd("both", nan_x), fwd("moved", nan_x)])
    moved = x.copy()
    moved[1, :3] = np.nan
    b = write(tmp_path / "b", [fwd("one_side", x), fwd("both", nan_x), fwd("moved", moved)])
    one_side, both, moved_row = compare_dumps(a, b).rows
    assert one_side.verdict == "error" and one_side.reason == "A has 3 NaN and 0 Inf, B has 0 NaN and 0 Inf"
    assert (one_side.nonfinite_a, one_side.nonfinite_b) == (3, 0)
    assert one_side.cosine == 1.0 and one_side.max_abs == 0.0  # metrics over positions finite on both sides
    assert both.verdict == "pass" and both.cosine == 1.0 and "3 NaN/Inf in the same places" in both.reason
    assert moved_row.verdict == "error" and "NaN/Inf at different positions" in moved_row.reason


def test_chunked_metrics_match_one_chunk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    x = RNG.normal(size=1000)
    y = x + RNG.normal(scale=1e-2, size=1000)
    x[[5, 700]] = np.inf
    y[[5, 700]] = np.inf
    a = write(tmp_path / "a", [fwd("x", x)])
    b = write(tmp_path / "b", [fwd("x", y)])
    (whole,) = compare_dumps(a, b).rows
    monkeypatch.setattr(compare_mod, "CHUNK", 7)
    (chunked,) = compare_dumps(a, b).rows
    for key in ("cosine", "max_abs", "max_rel", "rmse", "rel_over_1e3", "rel_over_5e3"):
        assert getattr(chunked, key) == pytest.approx(getattr(whole, key), rel=1e-12)
    finite = np.isfinite(x)
    assert whole.rmse == pytest.approx(math.sqrt(np.mean((x[finite] - y[finite]) ** 2)))
    assert whole.verdict == chunked.verdict


def test_shape_mismatch_and_unmatched_names(tmp_path: Path):
    a = write(tmp_path / "a", [fwd("x", np.ones((2, 3))), fwd("only_a", np.ones(2)),
                               ("grad.w", "", "grad", np.ones(2))])
    b = write(tmp_path / "b", [fwd("x", np.ones((3, 2))), fwd("only_b", np.ones(2))])
    cmp = compare_dumps(a, b)
    (row,) = cmp.rows
    assert row.verdict == "error" and row.reason == "shape [2, 3] in A vs [3, 2] in B" and row.cosine is None
    assert cmp.only_a == ["only_a.forward.0.output.0", "grad.w"] and cmp.only_b == ["only_b.forward.0.output.0"]
    assert cmp.unmatched_activations() == ["only_a.forward.0.output.0", "only_b.forward.0.output.0"]


def test_unmatched_gradients_do_not_fail(tmp_path: Path):
    a = write(tmp_path / "a", [fwd("x", np.ones(3)), ("grad.w", "", "grad", np.ones(2))])
    b = write(tmp_path / "b", [fwd("x", np.ones(3))])
    cmp = compare_dumps(a, b)
    assert cmp.only_a == ["grad.w"] and cmp.passed()


def test_statistics_mode_detects_changed_mean(tmp_path: Path):
    x = RNG.normal(size=(8, 8))
    a = write(tmp_path / "a", [fwd("same", x), fwd("shifted", x + 0.5), fwd("nudged", x * 1.01)], mode="statistics")
    b = write(tmp_path / "b", [fwd("same", x), fwd("shifted", x), fwd("nudged", x)], mode="tensor")
    cmp = compare_dumps(a, b)
    assert cmp.mode == "statistics"
    same, shifted, nudged = cmp.rows
    assert same.verdict == "pass" and same.cosine is None and same.mean_rel_diff == 0.0
    assert shifted.mean_a == pytest.approx(x.mean() + 0.5) and shifted.mean_b == pytest.approx(x.mean())
    assert shifted.mean_rel_diff == pytest.approx(0.5 / np.sqrt(np.mean(x * x)))  # on B's RMS, as the verdict judges it
    assert shifted.verdict == "error" and shifted.reason.startswith("mean differs by")
    assert nudged.norm_rel_diff == pytest.approx(0.01) and nudged.verdict == "warning"
    assert cmp.first_divergence() is shifted and cmp.worst_modules(1)[0]["module"] == "shifted"
    assert cmp.lowest_cosine() is None


def test_statistics_mode_nonfinite_counts(tmp_path: Path):
    x = RNG.normal(size=16)
    y = x.copy()
    y[2] = np.inf
    a = write(tmp_path / "a", [fwd("x", y)], mode="statistics")
    b = write(tmp_path / "b", [fwd("x", x)], mode="statistics")
    (row,) = compare_dumps(a, b).rows
    assert row.verdict == "error" and row.reason == "A has 0 NaN and 1 Inf, B has 0 NaN and 0 Inf"


def test_reports(tmp_path: Path):
    write(tmp_path / "a", model_tensors(bug=True))
    write(tmp_path / "b", model_tensors(bug=False))
    cmp = compare_dumps(tmp_path / "a", tmp_path / "b")

    with open(write_csv(cmp, tmp_path / "out" / "cmp.csv"), newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 8 and rows[3]["name"] == "layers.0.mlp.forward.0.output.0"
    assert float(rows[3]["max_abs"]) == 8.0 and float(rows[3]["cosine"]) == pytest.approx(-2 / 30)
    assert rows[3]["verdict"] == "error" and rows[3]["shape_a"] == "4" and rows[7]["shape_a"] == "scalar"
    assert rows[0]["dtype_a"] == "int64" and rows[0]["mean_rel_diff"] == "0.0"

    page = write_html(cmp, tmp_path / "cmp.html").read_text(encoding="utf-8")
    assert "layers.0.mlp.forward.0.output.0" in page and 'id="worst-modules"' in page
    assert page.count("<img") == 1 and "data:image/png;base64," in page
    assert "<script" not in page and "http" not in page.replace("http-equiv", "")
    assert page.count('<tr class="error"') == 1 and page.count('<tr class="warning"') == 3

    lines = summary_lines(cmp)
    assert any(line.startswith("first divergence: #3 layers.0.mlp.forward.0.output.0") for line in lines)
    head = next(i for i, line in enumerate(lines) if line.startswith("top-5 modules"))
    assert (
        lines[head + 1].startswith("  layers.0.mlp: introduces")
        and "1 error" in lines[head + 1]
        and lines[-1] == "FAILED"
    )


def test_statistics_report_and_empty_comparison(tmp_path: Path):
    write(tmp_path / "a", [fwd("x", np.ones(4) * 2)], mode="statistics")
    write(tmp_path / "b", [fwd("x", np.ones(4))], mode="statistics")
    write(tmp_path / "c", [], mode="statistics")  # a dump whose selection matched nothing
    write(tmp_path / "d", [fwd("y", np.ones(4))], mode="statistics")
    stats = compare_dumps(tmp_path / "a", tmp_path / "b")
    empty = compare_dumps(tmp_path / "a", tmp_path / "c")
    with pytest.raises(
        DumpError, match=r"no tensor name in common.*A holds e.g. \['x.forward.0.output.0'\], B e.g. \['y.forward"
    ):
        compare_dumps(tmp_path / "a", tmp_path / "d")  # different models: said so, with names from each side
    page = write_html([stats, empty], tmp_path / "two.html").read_text(encoding="utf-8")
    assert page.count("<img") == 1 and "No matched tensors to plot." in page and "<nav>" in page
    assert "norm differs up to 100.00%" in "\n".join(summary_lines(stats))


def test_compare_trees_pairs_leaves(tmp_path: Path):
    for root in ("a", "b"):
        for rank in (0, 1):
            write(tmp_path / root, [fwd("x", np.full(3, rank + 1.0))], step=1, rank=rank)
    cmps = compare_trees(tmp_path / "a", tmp_path / "b")
    assert [(c.a.relative_to(tmp_path / "a"), c.b.relative_to(tmp_path / "b")) for c in cmps] == \
        [(Path("step1/rank0"), Path("step1/rank0")), (Path("step1/rank1"), Path("step1/rank1"))]
    assert all(c.passed() for c in cmps)
    with pytest.raises(DumpError, match="holds 2 dumps .*step1/rank0, step1/rank1.*compare_trees"):
        compare_dumps(tmp_path / "a", tmp_path / "b")

    write(tmp_path / "a", [fwd("x", np.ones(3))], step=2, rank=0)
    with pytest.raises(DumpError, match=r"step2/rank0 \(only in .*a\)"):
        compare_trees(tmp_path / "a", tmp_path / "b")


def test_interrupted_dump_is_rejected(tmp_path: Path):
    w = DumpWriter(tmp_path / "a", 1, 0, "tensor", {})
    w.record("x.forward.0.output.0", "x", "forward_output", np.ones(3))  # never closed: no meta.json
    b = write(tmp_path / "b", [fwd("x", np.ones(3))])
    with pytest.raises(DumpError, match="meta.json is missing"):
        compare_dumps(tmp_path / "a", b)


def test_thresholds_are_configurable(tmp_path: Path):
    a = write(tmp_path / "a", [fwd("x", HIDDEN * 1.01)])
    b = write(tmp_path / "b", [fwd("x", HIDDEN)])
    assert compare_dumps(a, b).rows[0].verdict == "warning"
    assert compare_dumps(a, b, Thresholds(rel_error=1.0)).rows[0].verdict != "error"


def test_no_engine_imported():
    code = ("import sys, mindfoundry.debug.compare, mindfoundry.report.compare_report; "
            "print([m for m in sys.modules if m.split('.')[0] in ('torch', 'mindspore')])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
