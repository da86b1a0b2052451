"""Checkpoints on object storage (a real S3 server): committed by the marker written last, retention that deletes the
marker first, `ckpt verify` that finds a changed, deleted or unmarked object, leftovers of killed writers removed."""

from __future__ import annotations

import json

import numpy as np
import pytest

from mindfoundry.checkpoint.directory import CheckpointDir, Retention, save_checkpoint
from mindfoundry.cli.main import main
from mindfoundry.storage.remote import Remote, StorageError


def write_steps(directory: CheckpointDir, steps, retention: Retention = Retention(keep_last=2)) -> None:
    rng = np.random.default_rng(0)
    for step in steps:
        weights = {"w": rng.standard_normal((64, 32)).astype(np.float32)}
        moments = {"exp_avg.w": weights["w"] * 0.1, "exp_avg_sq.w": weights["w"] ** 2}
        save_checkpoint(directory, step, weights, moments, {"consumed_samples": 8 * step, "val_loss": 1.0 / step,
                                                            "val_step": step}, retention,
                        extra_files={"data_manifest.json": b"{}"})


def test_checkpoints_are_committed_marker_last_and_pruned_marker_first(s3, tmp_path) -> None:
    bucket = s3.bucket()
    directory = CheckpointDir(Remote(f"s3://{bucket}/run/ckpt"), staging=tmp_path / "staging",
                              cache_dir=str(tmp_path / "cache"))
    write_steps(directory, [1, 2, 3], Retention(keep_last=2, keep_best=False))
    keys = s3.keys(bucket, "run/ckpt/")
    assert {k.split("/")[2] for k in keys} == {"step_00000002", "step_00000003", "latest", "best"}
    assert s3.get(bucket, "run/ckpt/latest") == b"step_00000003\n"
    assert s3.get(bucket, "run/ckpt/best") == b"step_00000003\n"  # the lowest val loss of those kept (1/3)
    files = [k.split("/", 3)[3] for k in keys if k.startswith("run/ckpt/step_00000003/")]
    assert sorted(files) == ["data_manifest.json", "manifest.json", "manifest.sha256", "model.safetensors",
                             "optimizer.safetensors", "trainer_state.json"]
    assert [p.name for p in directory.committed()] == ["step_00000002", "step_00000003"]
    assert not any(tmp_path.joinpath("staging").iterdir())  # the staged folders are gone once uploaded
    # resuming reads a verified local copy, named by its URL
    path, skipped = directory.find_resumable()
    assert path.parent == directory.cache and skipped == []
    assert directory.origin(path) == Remote(f"s3://{bucket}/run/ckpt/step_00000003")
    assert json.loads((path / "trainer_state.json").read_text())["consumed_samples"] == 24


def test_ckpt_verify_of_a_url_finds_changed_deleted_and_unmarked_objects(s3, tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("MF_CACHE_DIR", str(tmp_path / "cache"))
    bucket = s3.bucket()
    url = f"s3://{bucket}/run/ckpt"
    write_steps(CheckpointDir(Remote(url), staging=tmp_path / "staging"), [1, 2, 3], Retention(keep_last=3))
    assert main(["ckpt", "verify", url]) == 0
    assert capsys.readouterr().out.count("sha256 verified") == 3

    model = "run/ckpt/step_00000003/model.safetensors"
    blob = bytearray(s3.get(bucket, model))
    blob[-1] ^= 0x01  # one bit of the last weight
    s3.put(bucket, model, bytes(blob))
    s3.client().delete_object(Bucket=bucket, Key="run/ckpt/step_00000002/optimizer.safetensors")
    s3.client().delete_object(Bucket=bucket, Key="run/ckpt/step_00000001/manifest.sha256")
    assert main(["ckpt", "verify", url]) == 2  # step 1 is no longer committed: not listed; 2 and 3 are invalid
    out = capsys.readouterr().out
    assert f"{url}/step_00000003/model.safetensors: sha256 does not match the manifest" in out
    assert f"{url}/step_00000002/optimizer.safetensors: file listed in the manifest is missing" in out
    assert main(["ckpt", "verify", f"{url}/step_00000001"]) == 2
    assert f"{url}/step_00000001: no manifest.json/manifest.sha256; the checkpoint was never committed" in (
        capsys.readouterr().out)
    # resuming falls back past all three: none is valid
    path, skipped = CheckpointDir(Remote(url)).find_resumable()
    assert path is None and len(skipped) == 2


def test_a_killed_writers_leftovers_are_removed_at_the_next_start(s3, tmp_path) -> None:
    bucket = s3.bucket()
    directory = CheckpointDir(Remote(f"s3://{bucket}/ckpt"), staging=tmp_path / "staging")
    write_steps(directory, [2])
    # a step whose objects were uploaded but not its marker, and an unfinished multipart upload
    s3.put(bucket, "ckpt/step_00000004/model.safetensors", b"partial")
    upload = s3.client().create_multipart_upload(Bucket=bucket, Key="ckpt/step_00000004/optimizer.safetensors")
    s3.client().upload_part(Bucket=bucket, Key="ckpt/step_00000004/optimizer.safetensors", PartNumber=1,
                            UploadId=upload["UploadId"], Body=b"x" * (5 * 2**20))
    (tmp_path / "staging" / ".tmp-step_00000004-99").mkdir(parents=True)
    assert [p.name for p in directory.committed()] == ["step_00000002"]
    removed = directory.clean_interrupted()
    assert removed == [".tmp-step_00000004-99", "1 unfinished upload(s)",
                       "step_00000004 (objects without a commit marker)"]
    assert not s3.client().list_multipart_uploads(Bucket=bucket).get("Uploads")
    assert {k.split("/")[1] for k in s3.keys(bucket)} == {"step_00000002", "latest", "best"}


def test_a_missing_bucket_is_one_line(s3, tmp_path) -> None:
    directory = CheckpointDir(Remote("s3://no-such-bucket-mf/ckpt"), staging=tmp_path / "staging")
    with pytest.raises(StorageError) as caught:
        directory.committed()
    assert str(caught.value).startswith("bucket 'no-such-bucket-mf' does not exist at http://127.0.0.1:")
