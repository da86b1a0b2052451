"""A run whose checkpoints live in a bucket (a real S3 server), used the way a user does: `ckpt list`, `eval`,
`generate` and `export` of a checkpoint URL (the export also to a URL), with the same numbers and bytes as from a local
copy; secrets given in the config never written out or printed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from mindfoundry.cli.main import main
from mindfoundry.config.storage_config import REDACTED

SECRET = "top-secret-value-0123456789"


@pytest.fixture
def s3_run(s3, tiny_run, tmp_path):
    """A 6-step torch run checkpointing to s3://BUCKET/ckpt (every 3 steps), with credentials written in its config
    (moto takes any); its config file and the bucket."""
    bucket = s3.bucket()
    config = tiny_run("s3run", backend="torch", checkpoint={"dir": f"s3://{bucket}/ckpt", "every": 3},
                      storage={"options": {"s3": {"key": "AKIA-in-the-config", "secret": SECRET}}})
    assert main(["train", str(config)]) == 0
    return config, bucket


def test_checkpoint_urls_serve_list_eval_generate_and_export(s3_run, s3, tmp_path, capsys) -> None:
    config, bucket = s3_run
    url = f"s3://{bucket}/ckpt"
    capsys.readouterr()
    assert main(["ckpt", "list", url]) == 0
    listing = capsys.readouterr().out
    assert "step_00000003" in listing and "step_00000006  (latest)  (best)" in listing and "INVALID" not in listing
    # the same checkpoint from the bucket and from a local copy of its objects: the same evaluation and generation
    local = tmp_path / "copy" / "step_00000006"
    for key in s3.keys(bucket, "ckpt/step_00000006/"):
        target = local / key.split("/", 2)[2]
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(s3.get(bucket, key))
    results = {}
    for name, where in (("url", f"{url}/step_00000006"), ("local", str(local))):
        assert main(["eval", where, "--json", str(tmp_path / f"{name}.json")]) == 0
        results[name] = json.loads((tmp_path / f"{name}.json").read_text())
        assert main(["generate", where, "--prompt", "def ", "--temperature", "0", "--max-new-tokens", "8",
                     "--json"]) == 0
        results[name]["generation"] = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert results["url"]["validation"] == results["local"]["validation"] and results["url"]["validation"]
    assert results["url"]["generation"] == results["local"]["generation"]
    # export from the bucket to the bucket: the objects a local export writes, committed by commit.json
    assert main(["export", str(local), "--out", str(tmp_path / "hf")]) == 0
    assert main(["export", f"{url}/step_00000006", "--out", f"s3://{bucket}/hf"]) == 0
    exported = {key[3:]: s3.get(bucket, key) for key in s3.keys(bucket, "hf/") if key != "hf/commit.json"}
    assert exported == {p.name: p.read_bytes() for p in (tmp_path / "hf").iterdir()}
    assert sorted(json.loads(s3.get(bucket, "hf/commit.json"))["objects"]) == sorted(exported)
    assert main(["export", f"{url}/step_00000006", "--out", f"s3://{bucket}/hf"]) == 2  # never over objects
    assert "already exists and is not an empty folder" in capsys.readouterr().err


def test_secrets_in_the_config_are_never_written_out_or_printed(s3, tiny_run, tmp_path, capsys) -> None:
    bucket = s3.bucket()
    config = tiny_run("secret", data__output_dir=f"s3://{bucket}/data",
                      storage={"options": {"s3": {"key": "AKIA-not-a-real-key", "secret": SECRET}}})
    assert main(["config", "show", str(config)]) == 0
    shown = yaml.safe_load(capsys.readouterr().out)
    assert shown["storage"]["options"]["s3"] == {"key": REDACTED, "secret": REDACTED}
    # moto accepts any key: prepare runs with the config's credentials; nothing written holds them
    assert main(["prepare", str(config)]) == 0
    captured = capsys.readouterr()
    assert SECRET not in captured.out + captured.err
    written = b"".join(s3.get(bucket, key) for key in s3.keys(bucket))
    assert SECRET.encode() not in written
    # a wrong endpoint with the secret in the config: the error names the endpoint, never the secret
    tree = yaml.safe_load(config.read_text())
    tree["storage"]["endpoint_url"] = "http://127.0.0.1:9"
    tree["storage"]["retries"] = 0
    tree["data"]["output_dir"] = f"s3://{bucket}/elsewhere"
    config.write_text(yaml.safe_dump(tree))
    assert main(["prepare", str(config)]) == 2
    err = capsys.readouterr().err
    assert "cannot reach the storage endpoint http://127.0.0.1:9" in err and SECRET not in err


def test_what_train_writes_holds_no_secret(s3_run, s3, capsys) -> None:
    config, bucket = s3_run
    run_dir = Path(yaml.safe_load(config.read_text())["run_dir"])
    written = [p.read_bytes() for p in run_dir.rglob("*") if p.is_file()]
    written += [s3.get(bucket, key) for key in s3.keys(bucket)]
    assert all(SECRET.encode() not in blob for blob in written) and len(written) > 20
    kept = yaml.safe_load(s3.get(bucket, "ckpt/step_00000006/config.yaml"))  # the checkpoint's own config
    assert kept["storage"]["options"]["s3"] == {"key": REDACTED, "secret": REDACTED}


def test_a_profile_in_the_aws_files_is_enough(s3, tiny_run, tmp_path, monkeypatch) -> None:
    """No key, secret or endpoint in the environment or the config: AWS_PROFILE names a profile of ~/.aws/credentials
    and ~/.aws/config (its endpoint_url), as botocore reads them; storage.profile does the same from the config."""
    from s3_server import ACCESS_KEY, SECRET_KEY

    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(name)
    (tmp_path / "credentials").write_text(f"[lab]\naws_access_key_id = {ACCESS_KEY}\n"
                                          f"aws_secret_access_key = {SECRET_KEY}\n")
    (tmp_path / "config").write_text(f"[profile lab]\nregion = us-east-1\nendpoint_url = {s3.endpoint}\n")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    bucket = s3.bucket()
    monkeypatch.setenv("AWS_PROFILE", "lab")
    assert main(["prepare", str(tiny_run("profiled", data__output_dir=f"s3://{bucket}/a"))]) == 0
    monkeypatch.delenv("AWS_PROFILE")
    assert main(["prepare", str(tiny_run("named", data__output_dir=f"s3://{bucket}/b",
                                         storage={"profile": "lab"}))]) == 0
    assert {k.split("/")[0] for k in s3.keys(bucket) if k.endswith("commit.json")} == {"a", "b"}


def test_any_installed_fsspec_protocol_is_a_source(tiny_run, tmp_path, corpus_dir) -> None:
    """fsspec's in-memory file system (memory://) as the sources of a prepare: the same shards as the local files."""
    import fsspec

    from mindfoundry.config.load import load_config
    from mindfoundry.data.prepare.pipeline import prepare_data

    memory = fsspec.filesystem("memory")
    memory.pipe("/corpus/code.jsonl", (corpus_dir / "code.jsonl").read_bytes())
    for path in sorted((corpus_dir / "txt").iterdir()):
        memory.pipe(f"/corpus/txt/{path.name}", path.read_bytes())
    local = prepare_data(load_config(tiny_run("files")), log=lambda _: None)
    remote = prepare_data(load_config(tiny_run("memory", data__sources=[
        {"name": "code", "paths": ["memory://corpus/code.jsonl"]},
        {"name": "asyncio", "paths": ["memory://corpus/txt"]}])), log=lambda _: None)
    for shard in ("train/code.bin", "train/asyncio.bin", "validation/code.bin", "validation/asyncio.bin"):
        assert (remote.root / shard).read_bytes() == (local.root / shard).read_bytes()


def test_every_path_flag_and_key_takes_a_url_or_refuses_it_by_name(s3_run, s3, tmp_path, capsys,
                                                                   monkeypatch) -> None:
    """The keys and flags that took a path but not a URL, each differently (issue #48): a tokenizer, a MindRecord
    export, an evaluation's JSON and task file, a conversion, all at URLs; run_dir refused by name; and a command
    given only a URL reaches the store through --set storage.endpoint_url (no AWS_ENDPOINT_URL)."""
    config, bucket = s3_run
    step = f"s3://{bucket}/ckpt/step_00000006"
    tasks = Path(__file__).resolve().parents[2] / "examples" / "lm_eval" / "mc.jsonl"
    s3.put(bucket, "tasks/mc.jsonl", tasks.read_bytes())
    assert main(["eval", step, "--tasks", f"s3://{bucket}/tasks/mc.jsonl", "--json", f"s3://{bucket}/eval.json"]) == 0
    result = json.loads(s3.get(bucket, "eval.json"))
    assert result["tasks"]["mc.jsonl"]["overall"]["questions"] == len(tasks.read_text().splitlines())
    assert main(["convert", step, f"s3://{bucket}/weights.safetensors"]) == 0
    from safetensors.numpy import load

    weights = load(s3.get(bucket, "weights.safetensors"))
    assert weights.keys() == load(s3.get(bucket, "ckpt/step_00000006/model.safetensors")).keys()
    # the run's tokenizer from a URL: a prepare that reuses it writes the same tokenizer.json
    s3.put(bucket, "tok/tokenizer.json", s3.get(bucket, "ckpt/step_00000006/tokenizer.json"))
    assert main(["prepare", str(config), "--set", f"data.tokenizer.path=s3://{bucket}/tok/tokenizer.json", "--set",
                 f"data.output_dir=s3://{bucket}/data-tok", "--set", f"run_dir={tmp_path / 'tok-run'}"]) == 0
    assert s3.get(bucket, "data-tok/tokenizer.json") == s3.get(bucket, "tok/tokenizer.json")
    assert main(["data", "mindrecord", str(config), "--out", f"s3://{bucket}/mr"]) == 0
    committed = json.loads(s3.get(bucket, "mr/commit.json"))["objects"]
    assert {"train.mindrecord", "train.mindrecord.db", "validation.mindrecord"} <= set(committed)
    assert not list(Path.cwd().glob("s3:*"))  # nothing written to a local folder named like the URL
    capsys.readouterr()
    assert main(["train", str(config), "--set", f"run_dir=s3://{bucket}/run"]) == 2
    assert (f"run_dir='s3://{bucket}/run' cannot be a URL: the run's lock, config, metrics and logs are local files"
            in capsys.readouterr().err)
    # no endpoint in the environment: the flag reaches the store
    endpoint = s3.endpoint
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    assert main(["ckpt", "list", f"s3://{bucket}/ckpt", "--set", f"storage.endpoint_url={endpoint}"]) == 0
    assert "step_00000006  (latest)" in capsys.readouterr().out
    assert main(["ckpt", "list", f"s3://{bucket}/ckpt", "--set", "train.steps=3"]) == 2
    assert "--set train: this command takes no config, only storage.* settings" in capsys.readouterr().err


def test_resume_refuses_when_every_checkpoint_is_invalid_and_touches_nothing(s3_run, s3, capsys) -> None:
    """It logged "skipping" lines, trained from step 0 and overwrote the invalid steps' objects (issue #48)."""
    config, bucket = s3_run
    for step in (3, 6):
        key = f"ckpt/step_0000000{step}/model.safetensors"
        blob = bytearray(s3.get(bucket, key))
        blob[-1] ^= 0x01
        s3.put(bucket, key, bytes(blob))
    before = {key: s3.get(bucket, key) for key in s3.keys(bucket)}
    capsys.readouterr()
    assert main(["train", str(config), "--resume", "auto", "--set", "train.steps=8"]) == 2
    line = [x for x in capsys.readouterr().err.splitlines() if x.startswith("error:")]
    assert len(line) == 1 and line[0].startswith(f"error: --resume auto found 2 checkpoint(s) in s3://{bucket}/ckpt "
                                                 "and none verifies: "), line
    for step in (3, 6):
        assert (f"s3://{bucket}/ckpt/step_0000000{step}/model.safetensors: sha256 does not match the manifest"
                in line[0])
    assert "start over with --overwrite" in line[0]
    assert {key: s3.get(bucket, key) for key in s3.keys(bucket)} == before


@pytest.mark.parametrize("argv, argument, why", [
    (["train", "s3://b/run.yaml"], "config", "the config file is read from a local disk"),
    (["compare", "s3://b/dump", "/tmp/b"], "dump_a", "the engines' hooks write dumps as local files"),
    (["locate", "s3://b/dump"], "dump", "the engines' hooks write dumps as local files"),
    (["report", "s3://b/run"], "run_dir", "a run directory is a local folder"),
    (["launch", "train", "configs/demo.yaml", "--log-dir", "s3://b/logs"], "--log-dir", "the launcher writes each "
                                                                                       "rank's log as a local file"),
])
def test_a_flag_only_a_local_disk_serves_refuses_a_url_by_name(argv, argument, why, capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    url = next(a for a in argv if "://" in a)
    assert f"error: argument {argument}: cannot be a URL ({url}): {why}" in capsys.readouterr().err
