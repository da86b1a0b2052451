"""msprobe's dump layout written and read without msprobe, .pt files without torch, and bad dump folders."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import numpy as np
import pytest

from mindfoundry.debug.compare import compare_dumps
from mindfoundry.debug.dump import DumpError, DumpWriter
from mindfoundry.debug.dump_folders import dump_leaves, open_writer, read_dump
from mindfoundry.debug.locate import locate_overflow
from mindfoundry.debug.stats import tensor_stats
from mindfoundry.debug.torch_files import TorchFileError, read_pt, write_pt

CLASSES = {"model": "Transformer", "layers.0.attn": "Attention", "layers.0.attn.q_proj": "Linear"}
RNG = np.random.default_rng(0)
# (name, module, kind, array): one step of two micro-batches as the probe hands it over
STEP = [
    (
        "param.layers.0.attn.q_proj.weight",
        "layers.0.attn.q_proj",
        "param",
        RNG.standard_normal((4, 4)).astype(np.float32),
    ),
    *[
        t
        for call in (0, 1)
        for t in (
            (
                f"layers.0.attn.forward.{call}.input.0",
                "layers.0.attn",
                "forward_input",
                RNG.standard_normal((2, 3, 4)).astype(np.float32),
            ),
            (
                f"layers.0.attn.q_proj.forward.{call}.input.0",
                "layers.0.attn.q_proj",
                "forward_input",
                RNG.standard_normal((2, 3, 4)).astype(np.float32),
            ),
            (
                f"layers.0.attn.q_proj.forward.{call}.output.0",
                "layers.0.attn.q_proj",
                "forward_output",
                RNG.standard_normal((2, 3, 4)).astype(np.float32),
            ),
            (
                f"layers.0.attn.forward.{call}.output.0",
                "layers.0.attn",
                "forward_output",
                RNG.standard_normal((2, 3, 4)).astype(np.float32),
            ),
            (
                f"model.forward.{call}.output.0",
                "model",
                "forward_output",
                RNG.standard_normal((2, 3, 8)).astype(np.float32),
            ),
            (f"loss.forward.{call}.output.0", "loss", "loss", np.float32(2.5)),
            (
                f"layers.0.attn.backward.{call}.grad_output.0",
                "layers.0.attn",
                "backward_grad_output",
                RNG.standard_normal((2, 3, 4)).astype(np.float32),
            ),
            (
                f"layers.0.attn.backward.{call}.grad_input.0",
                "layers.0.attn",
                "backward_grad_input",
                RNG.standard_normal((2, 3, 4)).astype(np.float32),
            ),
        )
    ],
    (
        "grad.layers.0.attn.q_proj.weight",
        "layers.0.attn.q_proj",
        "grad",
        RNG.standard_normal((4, 4)).astype(np.float32),
    ),
    (
        "exp_avg.layers.0.attn.q_proj.weight",
        "layers.0.attn.q_proj",
        "exp_avg",
        RNG.standard_normal((4, 4)).astype(np.float32),
    ),
]
NOT_IN_MSPROBE = ("model.", "loss.", "exp_avg.")


def write(root: Path, fmt: str, backend: str = "torch", mode: str = "tensor", step=STEP) -> Path:
    w = open_writer(fmt, root, 1, 0, mode, {"backend": backend}, backend, CLASSES, micro_batches=2)
    for name, module, kind, array in step:
        w.record(name, module, kind, array)
    return w.close(loss=5.0)


def test_pt_files_open_in_torch_and_torch_files_open_here(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    p = tmp_path / "t.pt"
    for a in (
        RNG.standard_normal((3, 4)).astype(np.float32),
        RNG.integers(0, 9, 5),
        np.array(2.5),
        np.array([True, False]),
        RNG.standard_normal((2, 3)).astype(np.float16),
        np.zeros((0, 3), np.float32),
    ):
        write_pt(p, a)
        t = torch.load(p)  # weights_only, torch's default: only a tensor's globals
        assert t.dtype == torch.from_numpy(a).dtype and tuple(t.shape) == a.shape and np.array_equal(t.numpy(), a)
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    for t in (
        base.t(),
        base[1:, 2:5],
        base[::2],
        base.to(torch.bfloat16),
    ):  # views keep the whole storage, offset and strides
        torch.save(t, p)
        assert np.array_equal(read_pt(p), t.float().numpy())


def test_pt_reader_runs_no_code_and_wants_one_tensor(tmp_path: Path) -> None:
    evil = tmp_path / "evil.pt"
    with zipfile.ZipFile(evil, "w") as z:
        z.writestr("evil/data.pkl", b"cos\nsystem\n(S'touch pwned'\ntR.")
    with pytest.raises(TorchFileError, match="refusing os.system"):
        read_pt(evil)
    assert not (tmp_path / "pwned").exists()
    (tmp_path / "junk.pt").write_bytes(b"not a zip")
    with pytest.raises(TorchFileError, match="not a readable torch.save file"):
        read_pt(tmp_path / "junk.pt")


@pytest.mark.parametrize(
    "backend,prefix,suffix,dtype",
    [("torch", "Module", ".pt", "torch.float32"), ("mindspore", "Cell", ".npy", "Float32")],
)
def test_msprobe_layout_round_trips_to_our_names(tmp_path: Path, backend, prefix, suffix, dtype) -> None:
    leaf = write(tmp_path / "ms", "msprobe", backend)
    assert sorted(p.name for p in leaf.iterdir()) == ["construct.json", "dump.json", "dump_tensor_data", "stack.json"]
    raw = json.loads((leaf / "dump.json").read_text())
    assert (raw["task"], raw["level"], raw["framework"]) == (
        "tensor",
        "L0",
        "pytorch" if backend == "torch" else "mindspore",
    )
    assert (
        raw["mindfoundry"]["loss"] == 5.0 and raw["mindfoundry"]["not_in_msprobe_format"] == 5
    )  # model x2, loss x2, exp_avg
    q = f"{prefix}.layers.0.attn.q_proj.Linear"
    assert sorted(raw["data"]) == sorted(
        [f"{prefix}.layers.0.attn.Attention.{d}.{c}" for d in ("forward", "backward") for c in (0, 1)]
        + [f"{q}.forward.0", f"{q}.forward.1", f"{q}.parameters_grad.1"]
    )
    fwd = raw["data"][f"{q}.forward.1"]
    assert (
        set(fwd) == {"input_args", "input_kwargs", "output", "parameters"}
        and fwd["parameters"]["weight"]["requires_grad"] is True
    )
    assert fwd["output"][0]["dtype"] == dtype and fwd["output"][0]["data_name"] == f"{q}.forward.1.output.0{suffix}"
    grad = raw["data"][f"{q}.parameters_grad.1"]["weight"][
        0
    ]  # the step's gradient: msprobe's sum after the last micro-batch
    assert grad["data_name"] == f"{q}.parameters_grad.1.weight{suffix}" and grad["requires_grad"] is False
    assert (
        json.loads((leaf / "construct.json").read_text())[f"{q}.forward.1"]
        == f"{prefix}.layers.0.attn.Attention.forward.1"
    )
    assert (leaf / "dump_tensor_data" / f"{prefix}.layers.0.attn.Attention.backward.0.input.0{suffix}").is_file()

    dump = read_dump(leaf)
    kept = [(n, a) for n, _, _, a in STEP if not n.startswith(NOT_IN_MSPROBE)]
    assert sorted(r["name"] for r in dump.records) == sorted(n for n, _ in kept)
    by_name = dump.by_name()
    for name, array in kept:
        assert np.array_equal(dump.array(by_name[name]), array), name
        assert by_name[name]["norm"] == pytest.approx(tensor_stats(array)["norm"], rel=1e-6)
    # an msprobe dump compares with our own format, either side
    native = write(tmp_path / "native", "mindfoundry", backend)
    for a, b in ((leaf, native), (native, leaf)):
        cmp = compare_dumps(a, b)
        assert cmp.passed() and cmp.counts() == {"pass": len(kept), "warning": 0, "error": 0}


def test_statistics_mode_and_non_finite_values(tmp_path: Path, capsys) -> None:
    from mindfoundry.cli.main import main

    broken = [
        (n, m, k, np.full_like(a, np.inf) if n == "layers.0.attn.q_proj.forward.1.output.0" else a)
        for n, m, k, a in STEP
    ]
    leaf = write(tmp_path / "d", "msprobe", mode="statistics", step=broken)
    raw = json.loads((leaf / "dump.json").read_text())
    assert raw["dump_data_dir"] is None and not (leaf / "dump_tensor_data").exists()
    out = raw["data"]["Module.layers.0.attn.q_proj.Linear.forward.1"]["output"][0]
    assert out["Max"] == out["Norm"] == float("inf")  # msprobe's statistics run over every element
    found = locate_overflow(read_dump(leaf))
    assert found.record["name"] == "layers.0.attn.q_proj.forward.1.output.0"
    assert main(["locate", str(tmp_path / "d")]) == 1
    assert (
        "layers.0.attn.q_proj.forward.1.output.0 (Inf of 24): first non-finite tensor of the step; its input was finite"
        in capsys.readouterr().err
    )


def test_bad_dump_folders_are_named(tmp_path: Path) -> None:
    leaf = write(tmp_path / "ms", "msprobe")
    text = (leaf / "dump.json").read_text()
    (leaf / "dump.json").write_text(text[: len(text) // 2])  # a copy cut short
    with pytest.raises(
        DumpError, match=r"dump.json is not valid JSON \(.* at line \d+, column \d+\): it is truncated or damaged"
    ):
        read_dump(leaf)
    (leaf / "dump.json").write_text(text)

    mixed = write(tmp_path / "mixed", "msprobe")
    DumpWriter(tmp_path / "mixed", 1, 0, "statistics", {}).close()  # our files into the same step1/rank0
    with pytest.raises(DumpError, match="mixes formats: it holds both index.jsonl .* and dump.json"):
        read_dump(mixed)

    tree = tmp_path / "tree"
    write(tree / "a", "msprobe")
    write(tree / "b", "mindfoundry")
    with pytest.raises(DumpError, match="mixes MindFoundry and msprobe dumps .*compare one format's folder at a time"):
        dump_leaves(tree)

    (leaf / "dump.json").write_text(json.dumps({**json.loads(text), "task": "overflow_check"}))
    with pytest.raises(DumpError, match="msprobe task 'overflow_check' holds no tensor values"):
        read_dump(leaf)
    (leaf / "dump.json").write_text(text)

    files = sorted((leaf / "dump_tensor_data").iterdir())
    files[0].write_bytes(b"garbage")
    files[1].unlink()
    dump = read_dump(leaf)
    by_file = {r.get("file", "").split("/")[-1]: r for r in dump.records}
    with pytest.raises(DumpError, match="not a readable torch.save file .*the dump is damaged"):
        dump.array(by_file[files[0].name])
    with pytest.raises(DumpError, match="is listed in the dump's index but missing: the dump is incomplete"):
        dump.array(by_file[files[1].name])
