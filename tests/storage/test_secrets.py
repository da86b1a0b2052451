"""No secret is ever printed or written: every command that takes a config, or a URL, run with three distinctive
secrets -- one written in the config's ``storage.options``, one given with ``--set``, one in the AWS variables --
against a real S3 server; stdout, stderr, the run directory, the node cache and every object of the bucket are
scanned."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from mindfoundry.cli.main import main

IN_CONFIG = "secret-in-the-config-7f3a9c"
IN_SET = "secret-on-the-command-line-51e0b2"
IN_ENV = "secret-in-the-environment-c4d8e6"
SECRETS = (IN_CONFIG, IN_SET, IN_ENV)


def hits(text: str | bytes) -> list[str]:
    data = text.encode() if isinstance(text, str) else text
    return [s for s in SECRETS if s.encode() in data]


def folder_hits(*folders: Path) -> list[str]:
    """'path: secret' for every file under ``folders`` that holds a secret."""
    return [f"{p}: {s}" for folder in folders for p in sorted(folder.rglob("*")) if p.is_file()
            for s in hits(p.read_bytes())]


def hold_lock(run_dir: Path, config: Path) -> subprocess.Popen:
    """A process that claims RUN_DIR's lock the way `train` does, under a command line holding a secret, and waits."""
    code = textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        sys.argv = ["mindfoundry", "train", {str(config)!r}, "--set", "storage.options.s3.token={IN_SET}"]
        from mindfoundry.train.run_lock import acquire
        acquire(Path({str(run_dir)!r}))
        print("held", flush=True)
        time.sleep(600)
    """)
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    return holder


@pytest.mark.slow
def test_no_command_prints_or_writes_a_secret(s3, tiny_run, tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", IN_ENV)  # moto accepts any credentials
    bucket = s3.bucket()
    config = tiny_run("secret", backend="torch", data__output_dir=f"s3://{bucket}/data",
                      checkpoint={"dir": f"s3://{bucket}/ckpt", "every": 2, "keep_last": 5},
                      train={"steps": 4, "micro_batch_size": 4, "grad_accum": 1, "seq_len": 32, "eval_every": 2,
                             "eval_samples": 8},
                      storage={"options": {"s3": {"secret": IN_CONFIG, "key": "AKIA-in-the-config"}}})
    run_dir = Path(yaml.safe_load(config.read_text())["run_dir"])
    given = ["--set", f"storage.options.s3.token={IN_SET}"]
    step = f"s3://{bucket}/ckpt/step_00000004"
    commands = [
        ["config", "show", str(config), *given],
        ["config", "validate", str(config), *given],
        ["prepare", str(config), *given],
        ["train", str(config), *given],
        ["train", str(config), "--resume", "auto", "--set", "train.steps=6", *given],  # resumed, settings changed
        ["run", str(config), "--resume", "auto", "--set", "train.steps=6", *given],
        ["data", "validate", str(config), *given],
        ["data", "inspect", str(config), *given],
        ["data", "drops", str(config), *given],
        ["data", "mindrecord", str(config), "--out", str(tmp_path / "mr"), *given],
        ["ckpt", "list", f"s3://{bucket}/ckpt"],
        ["ckpt", "verify", f"s3://{bucket}/ckpt"],
        ["ckpt", "best", f"s3://{bucket}/ckpt"],
        ["ckpt", "inspect", step],
        ["eval", step, "--json", str(tmp_path / "eval.json")],
        ["generate", step, "--prompt", "def ", "--max-new-tokens", "4", "--temperature", "0"],
        ["export", step, "--out", f"s3://{bucket}/hf"],
    ]
    for command in commands:
        code = main(command)
        captured = capsys.readouterr()
        assert code == 0, (command, captured.err[-2000:])
        assert hits(captured.out + captured.err) == [], command
    resumed = [c for c in commands if "--resume" in c]
    assert resumed  # the resume that prints "continuing the run with changed settings" printed no secret

    # a second writer is refused while a process holds the run's lock; a killed holder's lock is taken over
    holder = hold_lock(run_dir, config)
    try:
        assert hits((run_dir / ".lock").read_bytes()) == []
        assert main(["train", str(config), "--resume", "auto", *given]) == 2
        captured = capsys.readouterr()
        assert "is being written by pid" in captured.err and hits(captured.out + captured.err) == []
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert main(["train", str(config), "--resume", "auto", "--set", "train.steps=8", *given]) == 0
    captured = capsys.readouterr()
    assert "taking over the lock of pid" in captured.out + captured.err
    assert hits(captured.out + captured.err) == []

    assert folder_hits(run_dir, tmp_path / "mr", Path(os.environ["MF_CACHE_DIR"])) == []
    objects = s3.keys(bucket)
    assert len(objects) > 30
    assert [key for key in objects if hits(s3.get(bucket, key))] == []
