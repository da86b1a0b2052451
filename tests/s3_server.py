"""A real S3 server for tests: moto's ``moto_server`` (moto[server]) on a free port of this machine.

It speaks the S3 HTTP API as AWS, Huawei OBS and MinIO do, so s3fs, boto3 and MindFoundry talk to it exactly as to
those; nothing is mocked inside the process under test. :class:`S3Server` starts one, gives the AWS variables that
point a client at it, makes buckets, and can turn on authentication (IAM users with their own keys and policies) for
the credential and permission tests.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

#: What every test client uses while authentication is off (moto then accepts any key).
ACCESS_KEY, SECRET_KEY = "mf-test-access", "mf-test-secret-do-not-print-0123456789"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class S3Server:
    """One ``moto_server`` process (see the module docstring)."""

    def __init__(self, log: Path) -> None:
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        command = shutil.which("moto_server", path=str(Path(sys.executable).parent)) or shutil.which("moto_server")
        if command is None:
            raise RuntimeError("moto_server not found: pip install 'moto[server]' (the dev extra)")
        self.log = log
        self._log = open(log, "wb")
        self.process = subprocess.Popen([command, "-H", "127.0.0.1", "-p", str(self.port)], stdout=self._log,
                                        stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{self.endpoint}/moto-api/", timeout=1).close()
                break
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"moto_server did not start (see {log})") from None
                time.sleep(0.1)

    def env(self, access_key: str = ACCESS_KEY, secret_key: str = SECRET_KEY) -> dict[str, str]:
        """The AWS variables that point a client (this process's, a subprocess's) at this server."""
        return {
            "AWS_ACCESS_KEY_ID": access_key,
            "AWS_SECRET_ACCESS_KEY": secret_key,
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_EC2_METADATA_DISABLED": "true",  # never ask an instance metadata service for credentials
            "AWS_CONFIG_FILE": os.devnull,
            "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
        }

    def client(self, service: str = "s3", **env: str) -> Any:
        import boto3

        settings = self.env(**env)
        return boto3.client(service, endpoint_url=self.endpoint, region_name="us-east-1",
                            aws_access_key_id=settings["AWS_ACCESS_KEY_ID"],
                            aws_secret_access_key=settings["AWS_SECRET_ACCESS_KEY"])

    def gets(self, bucket: str, key: str) -> int:
        """How many times the object was read (GET requests in the server's access log)."""
        self._log.flush()
        return self.log.read_text(errors="replace").count(f'"GET /{bucket}/{key} HTTP')

    def bucket(self, prefix: str = "mf") -> str:
        """A new, empty bucket; its name."""
        name = f"{prefix}-{uuid.uuid4().hex[:12]}"
        self.client().create_bucket(Bucket=name)
        return name

    def keys(self, bucket: str, prefix: str = "") -> list[str]:
        """Every object key under ``prefix`` of ``bucket``, sorted."""
        pages = self.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        return sorted(obj["Key"] for page in pages for obj in page.get("Contents", []))

    def get(self, bucket: str, key: str) -> bytes:
        return self.client().get_object(Bucket=bucket, Key=key)["Body"].read()

    def put(self, bucket: str, key: str, data: bytes) -> None:
        self.client().put_object(Bucket=bucket, Key=key, Body=data)

    def upload_tree(self, folder: Path, bucket: str, prefix: str) -> None:
        """Every file below ``folder`` as an object under ``prefix``."""
        s3 = self.client()
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            s3.upload_file(str(path), bucket, f"{prefix}/{path.relative_to(folder).as_posix()}")

    def require_auth(self, users: dict[str, list[str]]) -> dict[str, tuple[str, str]]:
        """Create IAM users allowed ``actions`` each ({name: ["s3:GetObject", ...]}), then turn authentication on:
        from now on only their keys are accepted, with their permissions. Returns {name: (access key, secret)}."""
        self.authentication(False)
        iam = self.client("iam")
        keys = {}
        for name, actions in users.items():
            iam.create_user(UserName=name)
            policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": actions, "Resource": "*"}]}
            iam.put_user_policy(UserName=name, PolicyName="access", PolicyDocument=json.dumps(policy))
            key = iam.create_access_key(UserName=name)["AccessKey"]
            keys[name] = (key["AccessKeyId"], key["SecretAccessKey"])
        self.authentication(True)
        return keys

    @contextlib.contextmanager
    def unguarded(self) -> Iterator[None]:
        """Authentication off for the block (the test's own set-up and look-ups), then on again."""
        self.authentication(False)
        try:
            yield
        finally:
            self.authentication(True)

    def authentication(self, on: bool) -> None:
        """Check every request's credentials and permissions (on), or accept any (off: how a test sets up objects)."""
        request = urllib.request.Request(f"{self.endpoint}/moto-api/reset-auth", data=b"0" if on else b"inf",
                                         method="POST", headers={"Content-Type": "text/plain"})
        urllib.request.urlopen(request, timeout=10).close()

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self._log.close()


class TcpProxy:
    """A TCP proxy in front of a server (the S3 server): forwards every connection, optionally slowly (``delay_s``
    before each chunk the client sends), and can cut every connection (:meth:`cut`): what a flaky network or a dying
    link does to a client. Counts the connections it accepted, so a test sees the client's retries."""

    def __init__(self, target_port: int, delay_s: float = 0.0) -> None:
        import threading

        self.target = ("127.0.0.1", target_port)
        self.delay_s = delay_s
        self.cutting = threading.Event()
        self.connections = 0
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = self._server.getsockname()[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._open: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def cut(self, on: bool = True) -> None:
        """From now on (``on``), every connection is closed as soon as it carries data; open ones are closed too."""
        if on:
            self.cutting.set()
            with self._lock:
                for sock in self._open:
                    _close(sock)
                self._open.clear()
        else:
            self.cutting.clear()

    def _accept(self) -> None:
        import threading

        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            with self._lock:
                self.connections += 1
            if self.cutting.is_set():
                threading.Thread(target=self._drop, args=(client,), daemon=True).start()
                continue
            try:
                upstream = socket.create_connection(self.target)
            except OSError:
                _close(client)
                continue
            with self._lock:
                self._open += [client, upstream]
            threading.Thread(target=self._pipe, args=(client, upstream, self.delay_s), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, 0.0), daemon=True).start()

    @staticmethod
    def _drop(client: socket.socket) -> None:
        try:
            client.recv(1024)  # the request starts: the link dies under it
        except OSError:
            pass
        _close(client)

    def _pipe(self, source: socket.socket, sink: socket.socket, delay_s: float) -> None:
        try:
            while data := source.recv(65536):
                if self.cutting.is_set():
                    break
                if delay_s:
                    time.sleep(delay_s)
                sink.sendall(data)
        except OSError:
            pass
        _close(source)
        _close(sink)

    def close(self) -> None:
        self.cut()
        _close(self._server)


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()
