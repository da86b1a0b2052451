"""Framework-free parts of the dump: selections, statistics, writer/reader, probe naming, locator."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from mindfoundry.config.selection import parse_selection
from mindfoundry.debug.dump import DumpError, DumpWriter
from mindfoundry.debug.dump_folders import dump_leaves, read_dump
from mindfoundry.debug.locate import locate_overflow
from mindfoundry.debug.probe import Injection, Probe
from mindfoundry.debug.stats import tensor_stats


def test_selection_parses_numbers_and_ranges() -> None:
    sel = parse_selection("0|50-100| 7")
    assert [v for v in range(200) if v in sel] == [0, 7, *range(50, 101)]
    assert sel.last == 100 and not parse_selection("")
    for bad, part in (("1|x-5", "'x-5'"), ("9-3", "'9-3'"), ("-2", "'-2'")):
        with pytest.raises(ValueError, match=part):
            parse_selection(bad)


def test_stats_are_exact_and_skip_nonfinite() -> None:
    a = np.array([[1.0, -2.0], [3.0, 4.0]], np.float32)
    s = tensor_stats(a)
    assert s == {
        "count": 4,
        "nan": 0,
        "inf": 0,
        "min": -2.0,
        "max": 4.0,
        "mean": 1.5,
        "norm": pytest.approx(math.sqrt(30)),
    }
    b = np.array([1.0, np.nan, np.inf, -np.inf, 3.0], np.float32)
    s = tensor_stats(b)
    assert (s["nan"], s["inf"], s["min"], s["max"], s["mean"]) == (1, 2, 1.0, 3.0, 2.0)
    assert tensor_stats(np.full(3, np.nan, np.float32))["mean"] is None
    assert tensor_stats(np.array([3, 1, 2], np.int32))["max"] == 3.0
    half = tensor_stats(np.full(1000, 300.0, np.float16))  # the norm would overflow in fp16: computed wider
    assert half["norm"] == pytest.approx(300.0 * math.sqrt(1000))


def test_writer_streams_and_reader_checks(tmp_path) -> None:
    w = DumpWriter(tmp_path, 3, 0, "tensor", {"backend": "x"})
    w.record("a.forward.0.output.0", "a", "forward_output", np.arange(6, dtype=np.float32).reshape(2, 3))
    # the index line is on disk before close: a crash mid-step keeps what was captured
    assert json.loads((w.dir / "index.jsonl").read_text().splitlines()[0])["max"] == 5.0
    w.record("b.forward.0.output.0", "b", "forward_output", np.ones(2, np.float32))
    path = w.close(loss=1.5)
    assert dump_leaves(tmp_path) == [path] and path.name == "rank0" and path.parent.name == "step3"
    d = read_dump(path)
    assert d.meta["loss"] == 1.5 and d.meta["tensors"] == 2 and [r["seq"] for r in d.records] == [0, 1]
    np.testing.assert_array_equal(d.array(d.records[0]), np.arange(6).reshape(2, 3))
    with pytest.raises(FileExistsError, match="already holds a dump"):
        DumpWriter(tmp_path, 3, 0, "tensor", {})
    (path / "meta.json").unlink()
    with pytest.raises(DumpError, match="interrupted"):
        read_dump(path)
    with pytest.raises(DumpError, match="does not exist"):
        dump_leaves(tmp_path / "nope")


def test_probe_names_calls_and_selects(tmp_path) -> None:
    w = DumpWriter(tmp_path, 1, 0, "statistics", {})
    p = Probe(w, modules=["layers.1.*"], directions=["forward", "params"])
    assert p.modules(["model", "layers.0.mlp", "layers.1.mlp", "layers.1.attn"]) == ["layers.1.mlp", "layers.1.attn"]
    for call in range(2):  # two micro-batches
        p.forward_input("layers.1.mlp", np.ones(2, np.float32))
        p.forward_output("layers.1.mlp", np.ones(2, np.float32))
    p.backward("layers.1.mlp", np.ones(2, np.float32), np.ones(2, np.float32))  # backward not selected
    p.tensor("params", "layers.1.mlp.up_proj.weight", np.ones(2, np.float32))
    p.tensor("params", "layers.0.mlp.up_proj.weight", np.ones(2, np.float32))  # module not selected
    w.close()
    names = [r["name"] for r in read_dump(w.dir).records]
    assert names == [
        "layers.1.mlp.forward.0.input.0",
        "layers.1.mlp.forward.0.output.0",
        "layers.1.mlp.forward.1.input.0",
        "layers.1.mlp.forward.1.output.0",
        "param.layers.1.mlp.up_proj.weight",
    ]
    with pytest.raises(ValueError, match="match no module"):
        Probe(w, modules=["layer.*"]).modules(["layers.0"])
    with pytest.raises(ValueError, match="not a module of this model"):
        Probe(None, inject=Injection("layers.9")).modules(["layers.0"])
    inj = Probe(None, inject=Injection("a", "backward"))
    assert inj.injection("a", "forward") is None and inj.injection("a", "backward") == math.inf
    assert inj.injection("a", "backward") is None  # once per step


def test_locator_reports_first_nonfinite_with_its_input(tmp_path) -> None:
    w = DumpWriter(tmp_path, 1, 0, "statistics", {})
    ok, bad = np.ones(4, np.float32), np.array([1, np.inf, 1, 1], np.float32)
    w.record("a.forward.0.input.0", "a", "forward_input", ok)
    w.record("a.forward.0.output.0", "a", "forward_output", ok)
    w.record("b.forward.0.input.0", "b", "forward_input", ok)
    w.record("b.forward.0.output.0", "b", "forward_output", bad)
    w.record("c.forward.0.output.0", "c", "forward_output", bad)
    w.close()
    found = locate_overflow(read_dump(w.dir))
    assert (found.module, found.direction, found.given["name"]) == ("b", "forward", "b.forward.0.input.0")
    assert "1 Inf of 4" in found.message() and "its input was finite" in found.message()


def test_debug_steps_are_refused_under_a_multi_process_launch(tmp_path) -> None:
    from mf_testing import tiny_config
    from mindfoundry.debug.probe import ProbeError
    from mindfoundry.train.debug_steps import StepDebugger

    cfg = tiny_config(debug={"dump": {"steps": "3"}})
    assert StepDebugger(cfg, tmp_path, world_size=1).single_process
    with pytest.raises(ProbeError, match="run in a single process.*mindfoundry dump CONFIG --steps"):
        StepDebugger(cfg, tmp_path, world_size=2)
    assert not StepDebugger(
        tiny_config(), tmp_path, world_size=2
    ).single_process  # no dump asked: fine, locator replays


def test_dump_choices_from_the_command_line_are_validated(tmp_path) -> None:
    """`mindfoundry dump --steps` gets the selection's own message (not pydantic's help URL), and no steps is refused.
    """
    from mf_testing import tiny_config
    from mindfoundry.config.load import ConfigError
    from mindfoundry.workflows.replay import DumpChoice, replay_config

    cfg = tiny_config()
    with pytest.raises(ConfigError) as bad:
        replay_config(cfg, DumpChoice(steps="1|x-5"), tmp_path)
    assert str(bad.value) == "steps '1|x-5': 'x-5' is not a number or a range like '50-100' (write e.g. '1|50-100')"
    with pytest.raises(ConfigError, match="no steps to dump: pass --steps"):
        replay_config(cfg, DumpChoice(), tmp_path)
    replayed = replay_config(cfg, DumpChoice(steps="2", mode="tensor"), tmp_path)
    assert (replayed.debug.dump.steps, replayed.debug.dump.mode, replayed.run_dir) == (
        "2",
        "tensor",
        str(tmp_path / "replay"),
    )
