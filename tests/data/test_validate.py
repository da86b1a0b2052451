"""`data validate` and `data inspect`: every problem of every shard named, readable reports."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
from rich.console import Console

from mindfoundry.cli.main import main
from mindfoundry.data.dataset.inspect import inspect_prepared, length_histogram, render_inspect
from mindfoundry.data.dataset.packing import PackedSamples
from mindfoundry.data.dataset.shard_writer import IndexedDatasetWriter
from mindfoundry.data.dataset.validate import validate_prepared

EOS = 0


def rewrite_shard(root: Path, rel: str, docs: list[list[int]], *, update_manifest: bool = True) -> str:
    """Replace a prepared shard with ``docs`` (and, by default, make the manifest agree with it)."""
    with IndexedDatasetWriter(root / rel, np.uint16, overwrite=True) as writer:
        for doc in docs:
            writer.add_document(doc)
        info = writer.finalize()
    if update_manifest:
        path = root / "manifest.json"
        manifest = json.loads(path.read_text())
        split, name = rel.split("/")
        entry = next(s for s in manifest["splits"][split]["shards"] if s["path"] == rel)
        old = (entry["num_documents"], entry["num_tokens"])
        entry.update(
            num_documents=info.num_documents,
            num_tokens=info.num_tokens,
            bin_sha256=info.bin_sha256,
            idx_sha256=info.idx_sha256,
        )
        counts = next(s for s in manifest["sources"] if s["name"] == name)["splits"][split]
        counts.update(documents=info.num_documents, tokens=info.num_tokens)
        total = manifest["splits"][split]
        total.update(
            documents=total["documents"] - old[0] + info.num_documents,
            tokens=total["tokens"] - old[1] + info.num_tokens,
        )
        path.write_text(json.dumps(manifest))
    return str(root / rel)


def test_prepared_data_passes(tiny_prepared) -> None:
    cfg, data = tiny_prepared
    report = validate_prepared(data.root, vocab_size=cfg.model.vocab_size, seq_len=cfg.train.seq_len)
    assert report.ok and report.messages() == []
    assert [(s.split, s.source, s.status) for s in report.shards] == [
        ("train", "code", "pass"),
        ("train", "asyncio", "pass"),
        ("validation", "code", "pass"),
        ("validation", "asyncio", "pass"),
    ]
    code, shard = report.shards[0], data.shards["train"][0]
    assert (code.documents, code.tokens) == (len(shard), shard.num_tokens)
    assert code.samples == len(PackedSamples([shard], cfg.train.seq_len, pad_id=1))
    assert code.lengths["min"] <= code.lengths["median"] <= code.lengths["max"]


def test_bad_tokens_and_documents_are_named_per_shard(tiny_prepared) -> None:
    cfg, data = tiny_prepared
    shard = rewrite_shard(
        data.root,
        "train/code",
        [[5, 6, EOS], [600, 7, EOS], [EOS], [8, 9], [10, EOS, 11, EOS], [12, 12, EOS], [12, 12, EOS]],
    )
    report = validate_prepared(data.root, vocab_size=cfg.model.vocab_size, seq_len=cfg.train.seq_len)
    assert not report.ok
    assert report.messages() == [
        f"{shard}: token ids span 0..600, outside the vocab 0..511",
        f"{shard}: 1 empty documents (no tokens besides EOS), the first is document 2",
        f"{shard}: 1 documents do not end with EOS (id 0)",
        f"{shard}: EOS (id 0) occurs 1 times inside documents: false document boundaries",
    ]
    assert report.shards[0].status == "fail" and report.shards[0].duplicate_ratio == 1 / 7
    assert [s.status for s in report.shards[1:]] == ["pass"] * 3


def test_a_train_split_too_small_for_one_sample_fails(tiny_prepared) -> None:
    cfg, data = tiny_prepared
    rewrite_shard(data.root, "train/code", [[EOS]])
    rewrite_shard(data.root, "train/asyncio", [])
    report = validate_prepared(data.root, vocab_size=cfg.model.vocab_size, seq_len=cfg.train.seq_len)
    assert report.problems == [
        "the train split is too small for one sample of seq_len=32: add data or lower train.seq_len"
    ]
    assert report.shards[0].warnings == [
        "too small for one sample of seq_len=32 (1 tokens): a mixture never draws from it"
    ]


def test_corrupted_or_changed_shards_fail_on_the_command_line(tiny_run, capsys) -> None:
    config = str(tiny_run())
    assert main(["prepare", config]) == 0
    capsys.readouterr()
    assert main(["data", "validate", config]) == 0
    assert "all 4 shards pass" in capsys.readouterr().err
    root = Path(config).parent / "run" / "data"
    bin_path = root / "train" / "asyncio.bin"
    raw = bytearray(bin_path.read_bytes())
    raw[10] ^= 0xFF
    bin_path.write_bytes(bytes(raw))  # same size: only the sha256 can tell
    with open(root / "validation" / "code.bin", "r+b") as f:
        f.truncate(100)
    assert main(["data", "validate", config]) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert lines[0] == (
        f"error: {root}/train/asyncio: asyncio.bin changed since it was prepared (sha256 differs from the manifest): "
        "re-run `mindfoundry prepare --overwrite`"
    )
    assert lines[1].startswith(
        f"error: {root}/validation/code: cannot be opened: {root}/validation/code.bin: truncated: 100 bytes"
    )
    assert "Traceback" not in err


def test_validate_without_prepared_data_says_what_to_run(tiny_run, capsys) -> None:
    assert main(["data", "validate", str(tiny_run())]) == 2
    assert "manifest.json missing): run `mindfoundry prepare CONFIG` first" in capsys.readouterr().err


def test_inspect_shows_samples_tokens_lengths_and_removals(tiny_prepared, tiny_run, capsys) -> None:
    cfg, data = tiny_prepared
    report = inspect_prepared(data.root, per_category=2, max_chars=40)
    assert list(report.samples) == ["code", "asyncio"] and all(len(v) == 2 for v in report.samples.values())
    assert all(len(text) <= 40 and "\n" not in text for texts in report.samples.values() for text in texts)
    assert report.tokens["code"]["train"] == data.manifest["sources"][0]["splits"]["train"]["tokens"]
    assert sum(n for _, n in report.histogram) == data.manifest["splits"]["train"]["documents"]
    assert report.removals["code"]["skipped_empty"] == 0
    out = io.StringIO()
    render_inspect(report, Console(file=out, width=120))
    text = out.getvalue()
    for part in ("tokens per category and split", "train document lengths", "█", "skipped empty", "asyncio"):
        assert part in text
    assert main(["data", "inspect", str(tiny_run()), "--samples", "1"]) == 0
    assert "tokens per category and split" in capsys.readouterr().out


def test_length_histogram_buckets_by_powers_of_two() -> None:
    assert length_histogram(np.array([1, 2, 3, 4, 9, 9])) == [
        ("      1-1      ", 1), ("      2-3      ", 2), ("      4-7      ", 1), ("      8-15     ", 2)]


def test_inspect_sets_the_raw_share_beside_the_target_and_the_realised_share(tiny_prepared, tiny_run, capsys) -> None:
    """A category that is most of the tokens may be a small part of what is trained on: inspect says both."""
    from mindfoundry.config.data_config import MixtureConfig
    from mindfoundry.data.dataset.inspect import mixture_shares

    cfg, data = tiny_prepared
    tokens = {s["name"]: s["splits"]["train"]["tokens"] for s in data.manifest["sources"]}
    raw = tokens["code"] / sum(tokens.values())
    plain = mixture_shares(data, None, seq_len=32, seed=7, shuffle=True, planned=48)
    assert plain["code"] == {"raw": raw, "target": raw, "realised": raw}  # no mixture: one stream by size
    mixed = mixture_shares(data, MixtureConfig(weights={"code": 1, "asyncio": 9}, block_size=10), seq_len=32, seed=7,
                           shuffle=True, planned=48)
    assert mixed["code"]["raw"] == raw and mixed["code"]["target"] == 0.1
    assert mixed["code"]["realised"] == 5 / 48  # 1 of every 10 positions in 4 whole blocks, then 1 in the last 8
    assert main(["data", "inspect", str(tiny_run()), "--samples", "1", "--set", "data.mixture.weights.code=1",
                 "--set", "data.mixture.weights.asyncio=9", "--set", "data.mixture.block_size=10"]) == 0
    out = capsys.readouterr().out
    planned = cfg.train.steps * cfg.parallel.layout().global_batch(cfg.train)
    assert "raw share of train tokens" in out and "target share" in out and f"realised ({planned:,} samples)" in out
