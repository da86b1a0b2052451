"""checkpoint.format: sharded — every rank writes its shards (torch.distributed.checkpoint), rank 0 commits.

Fast tests: the store's commit of engine-written files (manifest, verification, fallback,
retention), the config rule, and a one-process torch round trip (save, reshard-load, consolidate,
export to one safetensors file that both engines load). The slow test launches real runs
(``mindfoundry launch``, gloo): FSDP(2) writes a sharded checkpoint at step 3, which continues
under TP(2) and in one process with the losses of an uninterrupted FSDP(2) run, loads exactly
into FSDP(2) x TP(2), survives a corrupted shard file by falling back, and exports to the
full format's model.safetensors byte for byte.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from mindfoundry.checkpoint.directory import Retention, find_resumable, list_checkpoints, save_checkpoint
from mindfoundry.checkpoint.reader import load_checkpoint
from mindfoundry.checkpoint.store import (
    MODEL_DIR,
    OPTIMIZER_DIR,
    CheckpointError,
    is_sharded,
    shard_folders,
    verify_checkpoint,
)
from mindfoundry.config.load import ConfigError, to_yaml
from mindfoundry.parallel.layout import launch_layout

WORKER = Path(__file__).with_name("sharded_worker.py")


def fake_writer(folders: tuple[Path, Path]) -> None:
    """What two ranks' DCP saves leave in the temporary folder's two shard folders: safetensors files of random
    pieces (verification parses their headers)."""
    rng = np.random.default_rng()
    for folder in folders:
        folder.mkdir()
        for rank in (1, 2):
            save_file({"piece": rng.standard_normal(16 + rank, dtype=np.float32)},
                      str(folder / f"shard-0000{rank}-model-00001-of-00001.safetensors"))


def test_engine_written_files_are_committed_verified_and_retained(tmp_path: Path) -> None:
    extra = {"data_manifest.json": b"{}\n"}
    for step in (1, 2, 3):
        path = Path(save_checkpoint(tmp_path, step, None, None, {"consumed_samples": step}, Retention(keep_last=2),
                               extra_files=extra, writer=fake_writer))
    assert is_sharded(path) and [p.name for p in list_checkpoints(tmp_path)] == ["step_00000002", "step_00000003"]
    files = json.loads((path / "manifest.json").read_text())["files"]
    assert sorted(files) == [
        "data_manifest.json",
        *(
            f"{sub}/shard-0000{r}-model-00001-of-00001.safetensors"
            for sub in (MODEL_DIR, OPTIMIZER_DIR)
            for r in (1, 2)
        ),
        "trainer_state.json",
    ]
    assert load_checkpoint(path, tensors=False).state == {"consumed_samples": 3, "step": 3}
    shard = path / OPTIMIZER_DIR / "shard-00002-model-00001-of-00001.safetensors"
    data = shard.read_bytes()
    shard.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    with pytest.raises(CheckpointError, match="optimizer/shard-00002-model-00001-of-00001.safetensors: sha256"):
        verify_checkpoint(path)
    found, skipped = find_resumable(tmp_path)
    assert found is not None and found.name == "step_00000002" and "shard-00002" in skipped[0]
    (found / MODEL_DIR / "shard-00001-model-00001-of-00001.safetensors").unlink()  # a rank's file lost
    found, skipped = find_resumable(tmp_path)
    assert (
        found is None
        and "model/shard-00001-model-00001-of-00001.safetensors: file listed in the manifest is missing" in skipped[1]
    )


def test_writer_and_arrays_are_exclusive(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="writer"):
        save_checkpoint(tmp_path, 1, {"w": np.zeros(2, np.float32)}, {}, {}, writer=fake_writer)
    with pytest.raises(ValueError, match="writer"):
        save_checkpoint(tmp_path, 1, None, None, {})

    def failing(tmp: Path) -> None:  # e.g. one rank's DCP write failed: every rank's save raises
        fake_writer(tmp)
        raise RuntimeError("rank 1 could not write")

    with pytest.raises(RuntimeError, match="rank 1"):
        save_checkpoint(tmp_path, 1, None, None, {}, writer=failing)
    assert not list_checkpoints(tmp_path) and not list((tmp_path / "checkpoints").iterdir())  # no .tmp- folder left


def test_mindspore_shards_exactly_its_semi_auto_layouts(make_config) -> None:
    """MindSpore writes rank slices for the layouts it runs in semi-auto mode (Ascend), and only for those."""
    with pytest.raises(
        ConfigError, match="checkpoint.format='sharded' with backend mindspore is the form of semi-auto parallel"
    ):
        make_config(checkpoint={"format": "sharded"}, backend="mindspore")
    ascend = {"backend": "mindspore", "device": "ascend", "parallel": {"tp": 2}}
    with pytest.raises(
        ConfigError,
        match=r"parallel tp=2: the MindSpore engine runs this layout in semi-auto parallel mode.*"
        r"set checkpoint.format: sharded",
    ):
        make_config(**ascend)
    assert make_config(checkpoint={"format": "sharded"}, **ascend).checkpoint.format == "sharded"
    assert make_config(checkpoint={"format": "sharded"}, backend="torch").checkpoint.format == "sharded"
    assert make_config().checkpoint.format == "full"


# -- one process, torch engine -------------------------------------------------------------------


@pytest.fixture
def saved(tmp_path: Path, make_config):
    """A torch backend after 2 AdamW steps and its sharded checkpoint (one process: one shard file per folder)."""
    pytest.importorskip("torch")
    from mindfoundry.backends.base import create_backend
    from mindfoundry.model.spec import ModelSpec, init_weights

    cfg = make_config(backend="torch", checkpoint={"format": "sharded"})
    spec = ModelSpec.from_config(cfg.model)
    backend = create_backend(cfg, spec, launch_layout(cfg))
    backend.load_weights(init_weights(spec, 3))
    for t in (1, 2):
        _step(backend, cfg, t)
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(to_yaml(cfg))
    path = Path(save_checkpoint(run, 2, None, None, {"adam_step": 2}, writer=backend.save_sharded))
    return cfg, spec, backend, path


def _batch(t: int) -> tuple[np.ndarray, np.ndarray]:
    tokens = np.random.default_rng(t).integers(0, 300, (1, 4, 17))
    return tokens[..., :-1], tokens[..., 1:]


def _step(backend, cfg, t: int) -> float:
    from mindfoundry.train.schedule import step_scalars

    ids, labels = _batch(t)
    return backend.train_step(ids, labels, step_scalars(t, 10, cfg.optim, labels.size, adam_step=t)).loss


def test_one_process_round_trip_continues_exactly(saved) -> None:
    from mindfoundry.backends.base import create_backend
    from mindfoundry.model.spec import init_weights

    cfg, spec, backend, path = saved
    # one process: rank 1 of 1; its pieces in 3 files per folder (embedding + final norm, layer 0, layer 1)
    assert sorted(p.relative_to(path).as_posix() for p in path.rglob("*.safetensors")) == [
        f"{sub}/shard-00001-model-0000{f}-of-00003.safetensors" for sub in ("model", "optimizer") for f in (1, 2, 3)]
    other = create_backend(cfg, spec, launch_layout(cfg))
    other.load_weights(init_weights(spec, 99))
    other.load_sharded(shard_folders(path), 2)
    for mine, theirs in ((backend.weights(), other.weights()), (backend.optimizer_state(), other.optimizer_state())):
        assert mine.keys() == theirs.keys() and all(np.array_equal(mine[k], theirs[k]) for k in mine)
    assert _step(other, cfg, 3) == _step(backend, cfg, 3)  # AdamW's step count restored too
    assert all(np.array_equal(a, b) for a, b in zip(backend.weights().values(), other.weights().values()))


def test_another_model_is_refused_by_name(saved, make_config) -> None:
    from mindfoundry.backends.base import create_backend
    from mindfoundry.model.spec import ModelSpec

    _, _, _, path = saved
    cfg = make_config(backend="torch", model={"n_layers": 3})
    with pytest.raises(ValueError, match=r"weights do not match the model: missing \['layers.2"):
        create_backend(cfg, ModelSpec.from_config(cfg.model), launch_layout(cfg)).load_sharded(shard_folders(path), 2)


def test_export_is_the_full_format_file_and_loads_in_both_engines(saved, tmp_path: Path, capsys) -> None:
    from safetensors.numpy import load_file

    from mindfoundry.backends.base import create_backend
    from mindfoundry.checkpoint.convert import export_checkpoint
    from mindfoundry.cli.main import main

    cfg, spec, backend, path = saved
    ckpt = load_checkpoint(path)  # consolidated in this process
    assert ckpt.state["adam_step"] == 2
    for mine, read in ((backend.weights(), ckpt.weights), (backend.optimizer_state(), ckpt.optimizer)):
        assert mine.keys() == read.keys() and all(np.array_equal(mine[k], read[k]) for k in mine)
    full = Path(save_checkpoint(tmp_path / "full", 2, backend.weights(), backend.optimizer_state(), {"adam_step": 2}))
    out = Path(export_checkpoint(path, tmp_path / "weights.safetensors"))
    assert out.read_bytes() == (full / "model.safetensors").read_bytes()
    assert main(["ckpt", "inspect", str(path)]) == 0 and main(["ckpt", "verify", str(path)]) == 0
    text = capsys.readouterr().out
    assert "model/ (sharded, 3 shard files, torch.distributed.checkpoint)" in text and "ok" in text
    ids = _batch(7)[0][0]
    expected = backend.logits(ids)
    torch_again = create_backend(cfg, spec, launch_layout(cfg))
    torch_again.load_weights(load_file(str(out)))
    assert np.array_equal(torch_again.logits(ids), expected)
    pytest.importorskip("mindspore")
    ms = create_backend(
        cfg.model_copy(
            update={"backend": "mindspore", "checkpoint": cfg.checkpoint.model_copy(update={"format": "full"})}
        ),
        spec,
        launch_layout(cfg),
    )
    ms.load_weights(load_file(str(out)))
    assert np.abs(ms.logits(ids) - expected).max() < 1e-5
    ms.load_optimizer_state(
        ckpt.optimizer, 2
    )  # what the trainer does with a sharded checkpoint on an engine without load_sharded
    assert all(np.array_equal(v, ckpt.optimizer[k]) for k, v in ms.optimizer_state().items())


# -- several processes (mindfoundry launch, torchrun, gloo) ---------------------------------------


def _segments(run: Path) -> list[list[float]]:
    """Losses of each start/resume of a run, in order."""
    out: list[list[float]] = []
    for row in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()):
        if row.get("event") in ("start", "resume"):
            out.append([])
        elif "loss" in row and "event" not in row:
            out[-1].append(row["loss"])
    return out


def _close(a: list[float], b: list[float]) -> bool:
    return len(a) == len(b) and max(abs(x / y - 1) for x, y in zip(a, b)) < 1e-5


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.slow
def test_fsdp_sharded_checkpoint_resumes_under_tp_and_one_process(tiny_run, tmp_path: Path, capsys) -> None:
    pytest.importorskip("torch")
    from mindfoundry.cli.main import main
    from mindfoundry.parallel.launch import free_port

    times: dict[str, float] = {}

    def run(name: str, args: list[str]) -> None:
        t0 = time.perf_counter()
        assert main(args) == 0, capsys.readouterr().err[-3000:]
        times[name] = round(time.perf_counter() - t0, 1)

    sets = ["--set", "backend=torch", "--set", "monitor.detail_every=0"]
    sharded = [*sets, "--set", "checkpoint.format=sharded"]
    fsdp2 = ["--set", "parallel.dp_shard=2"]  # micro 4 x accum 2 x dp 2: a global batch of 16 sequences
    one_batch = ["--set", "train.grad_accum=4"]  # the same 16 sequences with dp = 1 (TP(2), one process)
    ref, cfg = tiny_run("ref"), tiny_run("fsdp")
    # the uninterrupted FSDP(2) run, full format (its step-3 model.safetensors is the export's reference)
    run("ref_fsdp_full", ["launch", "train", str(ref), *sets, *fsdp2, "--master-port", str(free_port())])
    # the same run, sharded, stopped after its step-3 checkpoint
    run(
        "fsdp_sharded_to_3",
        ["launch", "train", str(cfg), *sharded, *fsdp2, "--master-port", str(free_port()), "--stop-at-step", "3"],
    )
    step3 = tmp_path / "fsdp" / "checkpoints" / "step_00000003"
    files = sorted(p.relative_to(step3).as_posix() for p in step3.rglob("*") if p.is_file())
    assert files == sorted(["config.yaml", "data_manifest.json", "manifest.json", "manifest.sha256", "tokenizer.json",
                            "trainer_state.json"]
                           + [f"{sub}/shard-0000{r}-model-0000{f}-of-00003.safetensors"
                              for sub in ("model", "optimizer") for r in (1, 2) for f in (1, 2, 3)])
    assert set(json.loads((step3 / "manifest.json").read_text())["files"]) == set(files) - {
        "manifest.json",
        "manifest.sha256",
    }
    # continue under TP(2): every rank reads the pieces of the FSDP shards it needs
    run("tp_resume_4_to_6", ["launch", "train", str(cfg), *sharded, "--set", "parallel.tp=2", *one_batch,
                             "--master-port", str(free_port()), "--resume", "auto"])
    # FSDP(2) x TP(2): loads exactly what the full-format run holds at step 3
    t0 = time.perf_counter()
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    }
    env["OMP_NUM_THREADS"] = "1"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node=4",
            str(WORKER),
            str(cfg),
            str(step3),
            str(tmp_path / "fsdp_tp.npz"),
            json.dumps({"dp_shard": 2, "tp": 2}),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    times["load_fsdp2xtp2"] = round(time.perf_counter() - t0, 1)
    full = load_checkpoint(tmp_path / "ref" / "checkpoints" / "step_00000003")
    loaded = dict(np.load(tmp_path / "fsdp_tp.npz"))
    expected = {**full.weights, **full.optimizer}
    assert loaded.keys() == expected.keys() and all(np.array_equal(loaded[k], expected[k]) for k in expected)
    info = json.loads((tmp_path / "fsdp_tp.json").read_text())
    assert info["adam_steps"] == [3.0] and info["mesh"] == ["dp_replicate", "dp_shard", "tp"]
    q = "layers.0.attn.q_proj.weight"
    assert [s[q] for s in info["local_shapes"]] == [[8, 32]] * 4  # (32, 32) cut in 4 along the rows: dp_shard x tp
    # a corrupted shard of the newest checkpoint: verify names it, resume falls back to step 3 (one process this time)
    step6 = tmp_path / "fsdp" / "checkpoints" / "step_00000006"
    shard = step6 / "optimizer" / "shard-00002-model-00002-of-00003.safetensors"  # rank 1's moments of layer 0
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x10
    shard.write_bytes(bytes(data))
    capsys.readouterr()
    assert main(["ckpt", "verify", str(step6)]) == 2
    assert "optimizer/shard-00002-model-00002-of-00003.safetensors: sha256 does not match" in capsys.readouterr().out
    run("one_process_resume_4_to_6", ["train", str(cfg), *sharded, *one_batch, "--resume", "auto"])
    err = capsys.readouterr().err
    assert (
        "skipping checkpoint" in err
        and "shard-00002-model-00002-of-00003.safetensors" in err
        and "step_00000003" in err
    )
    # same losses as the uninterrupted FSDP(2) run: 1-3 under FSDP, 4-6 under TP(2), 4-6 again in one process
    (reference,) = _segments(tmp_path / "ref")
    first, under_tp, alone = _segments(tmp_path / "fsdp")
    assert (
        len(reference) == 6
        and _close(first, reference[:3])
        and _close(under_tp, reference[3:])
        and _close(alone, reference[3:])
    )
    # export: one file, byte for byte the full-format checkpoint's model.safetensors of the same step
    out = tmp_path / "step3.safetensors"
    t0 = time.perf_counter()
    assert main(["convert", str(step3), str(out)]) == 0
    times["export"] = round(time.perf_counter() - t0, 2)
    assert _sha(out) == _sha(tmp_path / "ref" / "checkpoints" / "step_00000003" / "model.safetensors")
    events = [json.loads(line) for line in (tmp_path / "fsdp" / "metrics.jsonl").read_text().splitlines()]
    saves = [e["seconds"] for e in events if e.get("event") == "checkpoint"]
    ref_saves = [json.loads(line)["seconds"] for line in (tmp_path / "ref" / "metrics.jsonl").read_text().splitlines()
                 if '"checkpoint"' in line]
    print(
        json.dumps({"wall_s": times, "sharded_save_s": saves, "full_save_s": ref_saves})
    )  # numbers for docs/checkpoints.md
