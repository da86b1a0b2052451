"""Test helpers shared across folders (on sys.path via pytest's `pythonpath = tests`)."""

from __future__ import annotations

import fcntl
import os
import pickle
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

import numpy as np
import pytest

from mindfoundry.config.load import validate
from mindfoundry.config.parallel_config import Layout
from mindfoundry.config.schema import RunConfig
from mindfoundry.data.dataset.packing import IGNORE_INDEX
from mindfoundry.data.execute.stage import Stage, TaskResult
from mindfoundry.data.execute.workdir import WorkDir
from mindfoundry.parallel.layout import launch_layout
from mindfoundry.train.stop import Preempted

T = TypeVar("T")


def shared_once(factory: pytest.TempPathFactory, name: str, make: Callable[[Path], T]) -> T:
    """``make(folder)`` once per test run, its result shared by the xdist workers: the first worker to ask builds it
    in a folder of the run's temporary root (under a file lock) and the others read its pickled result, instead of
    each worker building its own copy of an expensive module or session fixture. Without xdist, once per session.
    What it returns (and what its paths point at) must never be changed by a test."""
    base = factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # the run's root, shared by its workers
    folder, done = root / f"shared-{name}", root / f"shared-{name}.pickle"
    with open(root / f"shared-{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.is_file():
            folder.mkdir(exist_ok=True)
            result = make(folder)
            done.write_bytes(pickle.dumps(result))
            return result
    return pickle.loads(done.read_bytes())


#: `--set` overrides that shrink configs/demo.yaml (and demo-mlm.yaml) to a test-sized run on the same corpora.
DEMO_TEST_SIZE = [
    "model.vocab_size=1024",
    "model.d_model=64",
    "model.n_layers=2",
    "model.n_heads=4",
    "model.n_kv_heads=2",
    "data.sources.0.max_bytes=150000",
    "data.sources.1.max_bytes=100000",
    "data.sources.2.max_bytes=150000",
    "data.sources.3.max_bytes=150000",
    "data.validation_fraction=0.05",
    "train.steps=40",
    "train.seq_len=64",
    "train.micro_batch_size=8",
    "train.eval_every=20",
    "train.eval_samples=32",
    "optim.warmup_steps=5",
    "optim.lr=5e-3",
    "checkpoint.every=20",
    "monitor.progress=false",
    "generate.max_new_tokens=8",
]


def tiny_run_tree(corpus: Path, run_dir: Path, **overrides) -> dict:
    tree = {
        "name": "tiny",
        "run_dir": str(run_dir),
        "seed": 7,
        "model": {"vocab_size": 512, "d_model": 32, "n_layers": 2, "n_heads": 2, "max_seq_len": 64},
        "data": {
            "sources": [
                {"name": "code", "paths": [str(corpus / "code.jsonl")]},
                {"name": "asyncio", "paths": [str(corpus / "txt")]},
            ],
            "validation_fraction": 0.1,
        },
        "train": {
            "steps": 6,
            "micro_batch_size": 4,
            "grad_accum": 2,
            "seq_len": 32,
            "eval_every": 0,
            "eval_samples": 8,
        },
        "optim": {"warmup_steps": 2, "lr": 1e-2},
        "checkpoint": {"every": 3, "keep_last": 5},
        "monitor": {"progress": False, "detail_every": 3},
    }
    return _overridden(tree, overrides)


def write_digits(root: Path, count: int) -> Path:
    """The first ``count`` of scikit-learn's handwritten digits as 16 x 16 PNGs with sidecar captions ("the handwritten
    digit three"): a real labelled image-text corpus for the image objectives."""
    from PIL import Image

    from mindfoundry.data.images.digits import NAMES, digits_images

    images, labels = digits_images(16)
    folder = root / "digits"
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        Image.fromarray(images[i]).save(folder / f"{i:05d}.png")
        (folder / f"{i:05d}.txt").write_text(f"the handwritten digit {NAMES[labels[i]]}")
    return folder


def tiny_mae_tree(digits: Path, prepared: Path, run_dir: Path, **overrides) -> dict:
    """A tiny masked-autoencoder run on :func:`write_digits`' images, whose prepared data is ``prepared`` (shared)."""
    tree = {
        "name": "tiny-mae", "run_dir": str(run_dir), "seed": 7,
        "model": {"objective": "mae", "vocab_size": 300,
                  "vision": {"patch_size": 4, "d_model": 32, "n_layers": 2, "n_heads": 2},
                  "mae": {"decoder_d_model": 16, "decoder_layers": 1, "decoder_heads": 2}},
        "data": {"sources": [{"name": "digits", "paths": [str(digits)], "modality": "image_text"}],
                 "images": {"size": 16, "near": False}, "validation_fraction": 0.1, "output_dir": str(prepared)},
        "train": {"steps": 6, "micro_batch_size": 8, "grad_accum": 2, "eval_every": 0, "eval_samples": 1000},
        "optim": {"warmup_steps": 2, "lr": 1e-2},
        "checkpoint": {"every": 2, "keep_last": 5},
        "monitor": {"progress": False, "detail_every": 3},
    }
    return _overridden(tree, overrides)


def tiny_caption_tree(digits: Path, prepared: Path, run_dir: Path, **overrides) -> dict:
    """A tiny captioner on :func:`write_digits`' images and captions (16 image tokens, 16 caption slots), whose
    prepared data (its tokenizer holds <|image|>) is ``prepared`` (shared)."""
    tree = tiny_mae_tree(digits, prepared, run_dir)
    tree["name"] = "tiny-caption"
    tree["model"] = {"objective": "caption", "vocab_size": 300, "d_model": 32, "n_layers": 2, "n_heads": 2,
                     "max_seq_len": 32, "vision": tree["model"]["vision"]}
    tree["train"]["seq_len"] = 16
    return _overridden(tree, overrides)


def _overridden(tree: dict, overrides: dict) -> dict:
    """``tree`` with "section__field" (or top-level) overrides."""
    for key, value in overrides.items():
        section, _, field = key.partition("__")
        if field:
            tree.setdefault(section, {})[field] = value
        else:
            tree[section] = value
    return tree


def tiny_config(**sections) -> RunConfig:
    """A tiny resolved config (no data is read) with per-section overrides."""
    tree = {
        "data": {"sources": [{"name": "c", "paths": ["x"]}]},
        "model": {"vocab_size": 300, "d_model": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "max_seq_len": 64},
        "train": {"micro_batch_size": 4, "seq_len": 16, "steps": 200},
        "optim": {"warmup_steps": 0, "lr": 3e-3},
    }
    for name, values in sections.items():
        tree[name] = {**tree.get(name, {}), **values} if isinstance(values, dict) else values
    return validate(tree)


def padded_markov_samples(n: int, vocab: int, seq: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Learnable streams (each token determines the next); each sample's last 0..seq/2 labels are padding."""
    rng = np.random.default_rng(seed)
    table = rng.integers(0, vocab, vocab)
    tokens = np.empty((n, seq + 1), np.int32)
    tokens[:, 0] = rng.integers(0, vocab, n)
    for t in range(1, seq + 1):
        tokens[:, t] = table[tokens[:, t - 1]]
    ids, labels = tokens[:, :-1].copy(), tokens[:, 1:].copy()
    for row, pad in enumerate(rng.integers(0, seq // 2 + 1, n)):
        if pad:
            labels[row, -pad:] = IGNORE_INDEX
            ids[row, -pad:] = 0
    return ids, labels


class ArraySource:
    """A BatchSource over fixed samples: global positions are row numbers."""

    def __init__(self, ids: np.ndarray, labels: np.ndarray):
        self.ids, self.labels = ids, labels

    def get_batch(self, start: int, count: int) -> tuple[np.ndarray, np.ndarray]:
        return self.ids[start:start + count], self.labels[start:start + count]


def markov_batches(vocab: int, steps: int, shape: tuple[int, int, int], seed: int = 0) -> np.ndarray:
    """Learnable token streams (each token determines the next) so the loss really moves: [steps, *shape[:2],
    shape[2]+1]."""
    rng = np.random.default_rng(seed)
    table = rng.integers(0, vocab, vocab)
    out = np.empty((steps, *shape[:2], shape[2] + 1), np.int32)
    out[..., 0] = rng.integers(0, vocab, (steps, *shape[:2]))
    for t in range(1, shape[2] + 1):
        out[..., t] = table[out[..., t - 1]]
    return out


def random_checkpoint(cfg: RunConfig, data, *, seed: int = 3, **model):
    """A checkpoint of a tiny run (with `model` overrides) whose every weight, norms included, is random; the run dir
    gets the config.yaml training writes. Returns (checkpoint folder, weights, config)."""
    from mindfoundry.checkpoint.directory import Retention, save_checkpoint
    from mindfoundry.config.load import to_yaml
    from mindfoundry.model.spec import ModelSpec, init_weights

    cfg = validate(cfg.model_dump(mode="json") | {"model": cfg.model.model_dump(mode="json") | model})
    run = Path(cfg.run_dir)
    (run / "config.yaml").write_text(to_yaml(cfg))
    rng = np.random.default_rng(seed)
    weights = {
        n: (w + rng.normal(0, 0.05, w.shape)).astype(np.float32)
        for n, w in init_weights(ModelSpec.from_config(cfg.model), 1).items()
    }
    moments = {f"{k}.{n}": np.zeros_like(w) for n, w in weights.items() for k in ("exp_avg", "exp_avg_sq")}
    state = {"adam_step": 1, "consumed_samples": 8, "consumed_tokens": 256}
    path = Path(save_checkpoint(run, 1, weights, moments, state, Retention(),
                                extra_files={"data_manifest.json": data.manifest_bytes}))
    return path, weights, cfg


def decoded_documents(data) -> list[str]:
    """Every document of a prepared folder's shards (train, then validation), decoded; each must end with EOS."""
    from mindfoundry.data.tokenizer import eos_id

    out = []
    for split in ("train", "validation"):
        for shard in data.shards[split]:
            for i in range(len(shard)):
                ids = shard[i].tolist()
                assert ids[-1] == eos_id(data.tokenizer)
                out.append(data.tokenizer.decode(ids[:-1], skip_special_tokens=False))
    return out


def rewrite_as_rank_slices(ckpt_dir: Path, parallel: dict, devices: int) -> Path:
    """Rewrite a run's full checkpoint folder in place as a MindSpore semi-auto cluster of `devices` ranks under the
    `parallel` layout writes it: per-rank slices and the strategy file (checkpoint.format: sharded, rank_slices).
    Same step, state and data manifest; committed anew through the store."""
    from mindfoundry.backends.mindspore.strategies import parameter_layouts, plan_strategies
    from mindfoundry.checkpoint.directory import Retention, save_checkpoint
    from mindfoundry.checkpoint.rank_slices import write_rank_slices, write_strategy
    from mindfoundry.checkpoint.reader import load_checkpoint
    from mindfoundry.checkpoint.run_files import run_config
    from mindfoundry.model.spec import ModelSpec

    ckpt = load_checkpoint(ckpt_dir)
    cfg = run_config(ckpt_dir)
    cfg = validate(cfg.model_dump(mode="json") | {"parallel": parallel})
    spec = ModelSpec.from_config(cfg.model)
    layouts = parameter_layouts(plan_strategies(cfg, spec, launched(cfg, devices)), spec)

    def writer(folders) -> None:
        for folder, arrays in zip(folders, (ckpt.weights, ckpt.optimizer)):
            for rank in range(devices):
                write_rank_slices(folder, arrays, layouts, rank)
            write_strategy(folder, layouts)

    return Path(save_checkpoint(
        Path(ckpt_dir).parent.parent,
        ckpt.state["step"],
        None,
        None,
        ckpt.state,
        Retention(keep_last=100),
        {"data_manifest.json": (Path(ckpt_dir) / "data_manifest.json").read_bytes()},
        writer=writer,
    ))


@contextmanager
def small_disk(path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` (e.g. "300k") mounted at ``path`` while the block runs, so a test can fill a disk;
    the test is skipped where mounting needs privileges this process lacks."""
    import pytest

    path.mkdir(parents=True, exist_ok=True)
    if subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True
    ).returncode:
        pytest.skip("cannot mount a small tmpfs here (needs root): the full-disk case is not exercised")
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=True)


class StopAt:
    """Raises Preempted at the N-th wrapped file operation (an fsync, a rename, ...), counting from 0: how the
    start-up signal handler stops a claim (Preempted raised where the process is)."""

    def __init__(self, n: int) -> None:
        self.n, self.seen = n, 0

    def wrap(self, op):
        def stopped(*args, **kwargs):
            if self.seen == self.n:
                raise Preempted("stopped by SIGTERM before the first step")
            self.seen += 1
            return op(*args, **kwargs)
        return stopped


def launched(cfg: RunConfig, devices: int) -> Layout:
    """The layout `cfg` gets when msrun starts `devices` workers (checked against every layout rule, as at launch)."""
    return launch_layout(cfg, env={"MS_WORKER_NUM": str(devices)})


class FailOneStallOne(Stage[TaskResult]):
    """A stage of two tasks for the executors: task 0 fails after half a second, task 1 writes its process id to
    ``pid_file`` and would run for a minute."""

    name, result_type = "fail_one_stall_one", TaskResult

    def __init__(self, work: WorkDir, pid_file: Path) -> None:
        super().__init__(work)
        self.pid_file = pid_file

    def tasks(self) -> int:
        return 2

    def run(self, task: int, out: Path) -> TaskResult:
        if task == 0:
            time.sleep(0.5)
            raise RuntimeError("task 0 failed")
        self.pid_file.write_text(str(os.getpid()))
        time.sleep(60)
        return TaskResult()
