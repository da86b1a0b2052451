"""Bad storage input through the CLI, against a real S3 server with authentication on (IAM users with their own keys and
policies): a missing bucket, no credentials, wrong credentials, an unreachable endpoint, read-only credentials, an
object deleted mid-run. Each is one line and exit 2, nothing is committed half, and no secret is printed."""

from __future__ import annotations

import pytest

from mindfoundry.cli.main import main
from mindfoundry.data.prepare import pipeline
from s3_server import S3Server, free_port


@pytest.fixture(scope="module")
def guarded(tmp_path_factory, corpus_dir):
    """An S3 server that checks credentials: a bucket holding the test corpus, a read-write and a read-only user."""
    server = S3Server(tmp_path_factory.mktemp("s3-auth") / "moto.log")
    bucket = server.bucket("guarded")
    server.upload_tree(corpus_dir, bucket, "corpus")
    keys = server.require_auth({"rw": ["s3:*"], "ro": ["s3:GetObject", "s3:ListBucket"], "wo": ["s3:PutObject"]})
    yield server, bucket, keys
    server.stop()


def use(monkeypatch, server: S3Server, key: str | None, secret: str | None, endpoint: str | None = None) -> None:
    """This process's AWS variables: the server's, with these credentials (None: none at all)."""
    for name, value in server.env().items():
        monkeypatch.setenv(name, value)
    if endpoint is not None:
        monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    for name, value in (("AWS_ACCESS_KEY_ID", key), ("AWS_SECRET_ACCESS_KEY", secret)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)


def one_line(capsys, code: int, *secrets: str) -> str:
    """The one error line of a command that exited ``code`` = 2, checked to hold no secret and no traceback."""
    captured = capsys.readouterr()
    assert code == 2, captured.err
    lines = [line for line in captured.err.splitlines() if line.startswith(("error:", "config error:"))]
    assert len(lines) == 1 and "Traceback" not in captured.err, captured.err
    for secret in secrets:
        assert secret not in captured.err + captured.out
    return lines[0]


def prepare_to(bucket: str, tiny_run, name: str, *extra: str) -> list[str]:
    """`prepare` of the corpus in the bucket into ``s3://BUCKET/NAME``."""
    return ["prepare", str(tiny_run(name)), "--set", f"data.sources.0.paths=[s3://{bucket}/corpus/code.jsonl]",
            "--set", f"data.sources.1.paths=[s3://{bucket}/corpus/txt]", "--set",
            f"data.output_dir=s3://{bucket}/out-{name}", *extra]


def test_each_bad_storage_input_is_one_line(guarded, tiny_run, capsys, monkeypatch) -> None:
    server, bucket, keys = guarded
    rw, ro = keys["rw"], keys["ro"]

    use(monkeypatch, server, *rw)
    line = one_line(capsys, main(prepare_to("no-such-bucket", tiny_run, "a")), rw[1])
    assert line.startswith(f"error: bucket 'no-such-bucket' does not exist at {server.endpoint} (looking up "
                           "s3://no-such-bucket/out-a/commit.json): create it or fix the URL"), line

    use(monkeypatch, server, None, None)
    line = one_line(capsys, main(prepare_to(bucket, tiny_run, "b")))
    assert line == (f"error: no credentials for looking up s3://{bucket}/out-b/commit.json: set AWS_ACCESS_KEY_ID and "
                    "AWS_SECRET_ACCESS_KEY (or AWS_PROFILE, ~/.aws/credentials, storage.profile)"), line

    use(monkeypatch, server, rw[0], "not-the-secret-" + rw[1][:8])
    line = one_line(capsys, main(prepare_to(bucket, tiny_run, "c")), rw[1], "not-the-secret-" + rw[1][:8])
    assert line.startswith(f"error: the storage at {server.endpoint} refused the credentials (SignatureDoesNotMatch) "
                           f"looking up s3://{bucket}/out-c/commit.json: check AWS_ACCESS_KEY_ID"), line

    use(monkeypatch, server, *rw, endpoint=f"http://127.0.0.1:{free_port()}")
    line = one_line(capsys, main(prepare_to(bucket, tiny_run, "d", "--set", "storage.retries=1")), rw[1])
    assert line.startswith("error: cannot reach the storage endpoint http://127.0.0.1:"), line
    assert "after 1 retries: check storage.endpoint_url / AWS_ENDPOINT_URL and the network" in line

    use(monkeypatch, server, *ro)
    line = one_line(capsys, main(prepare_to(bucket, tiny_run, "e")), ro[1])
    assert line.startswith(f"error: permission denied writing to s3://{bucket}/out-e (AccessDenied)"), line
    assert "the credentials in use may not write there (a bucket policy or read-only credentials)" in line
    # without s3:ListBucket, S3 answers a missing object's HEAD with 403: whether the output exists cannot be told
    use(monkeypatch, server, *keys["wo"])
    line = one_line(capsys, main(prepare_to(bucket, tiny_run, "h")), keys["wo"][1])
    assert line == (f"error: permission denied looking up s3://{bucket}/out-h/commit.json (403; listing s3://{bucket}: "
                    "AccessDenied): the credentials in use may not list the bucket (s3:ListBucket), and without that "
                    "S3 answers 403 for an object that does not exist, so whether it exists cannot be told; grant "
                    "s3:ListBucket and s3:GetObject on the prefix or choose another location"), line
    use(monkeypatch, server, *ro)
    # read-only credentials read: the same config with a local output prepares
    assert main(prepare_to(bucket, tiny_run, "f")[:-2]) == 0
    capsys.readouterr()
    with server.unguarded():
        assert [k for k in server.keys(bucket) if not k.startswith("corpus/")] == []  # nothing written, nothing half


def test_a_source_object_deleted_mid_run_is_one_line_and_nothing_is_committed(guarded, tiny_run, capsys,
                                                                                monkeypatch) -> None:
    server, bucket, keys = guarded
    use(monkeypatch, server, *keys["rw"])
    with server.unguarded():
        server.put(bucket, "gone/a.jsonl", b'{"text": "one document of the source"}\n' * 40)
    planned = pipeline.plan_inputs

    def plan_then_delete(*args, **kwargs):
        tasks = planned(*args, **kwargs)
        with server.unguarded():
            server.client().delete_object(Bucket=bucket, Key="gone/a.jsonl")
        return tasks

    monkeypatch.setattr(pipeline, "plan_inputs", plan_then_delete)
    command = prepare_to(bucket, tiny_run, "g")
    command[command.index(f"data.sources.0.paths=[s3://{bucket}/corpus/code.jsonl]")] = (
        f"data.sources.0.paths=[s3://{bucket}/gone/a.jsonl]")
    line = one_line(capsys, main(command), keys["rw"][1])
    assert line.startswith(f"error: cannot read source file 's3://{bucket}/gone/a.jsonl' (s3://{bucket}/gone/a.jsonl "
                           "does not exist"), line
    with server.unguarded():
        assert not [k for k in server.keys(bucket, "out-g/") if k.endswith("commit.json")]


def test_a_request_the_client_gave_up_on_prints_no_traceback(caplog) -> None:
    """A connection error in an abandoned aiohttp request task (the retry or the one-line error already answered
    it) is silent on fsspec's loop; any other unretrieved error still reaches asyncio's log."""
    import asyncio
    import gc

    import fsspec.asyn

    from mindfoundry.storage.remote import _quiet_abandoned_requests

    _quiet_abandoned_requests()
    loop = fsspec.asyn.get_loop()

    async def fail(exc: BaseException) -> None:
        raise exc

    async def abandon(exc: BaseException) -> None:
        await asyncio.wait([asyncio.ensure_future(fail(exc))])  # the task finishes; nobody reads its exception

    for exc in (ConnectionResetError("Cannot write to closing transport"), RuntimeError("a real bug")):
        asyncio.run_coroutine_threadsafe(abandon(exc), loop).result(timeout=10)
        gc.collect()
    asyncio.run_coroutine_threadsafe(asyncio.sleep(0), loop).result()
    logged = [record.getMessage() + str(record.exc_info) for record in caplog.records if record.name == "asyncio"]
    assert len(logged) == 1 and "a real bug" in logged[0], logged
