"""An S3 server on loopback for tests and benchmarks: moto in a subprocess, with one bucket (moto, boto3
and s3fs are the test extras)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

_ENV = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL")
_SERVERS: dict[str, subprocess.Popen] = {}  # s3://BUCKET -> its running server


def kill_server(url: str) -> None:
    """Kill the server behind ``url`` (a moto_s3 URL) now, mid-whatever: as a server that crashed or a
    network that went away; the context's exit then has nothing left to stop."""
    server = _SERVERS[url]
    server.kill()
    server.wait(timeout=30)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _create_bucket(bucket: str, log: Path | None) -> None:
    """Make ``bucket`` once the server answers (it takes a moment to start); RuntimeError if it never does."""
    import boto3

    for _ in range(100):
        try:
            boto3.client("s3").create_bucket(Bucket=bucket)
            return
        except Exception:  # noqa: BLE001 - the server is still starting
            time.sleep(0.1)
    raise RuntimeError(f"moto server did not start: {log.read_text()[-2000:] if log else '(no log kept)'}")


@contextmanager
def moto_s3(bucket: str, log: Path | None = None) -> Iterator[str]:
    """``s3://BUCKET`` on a moto server at 127.0.0.1: while the context lasts, the AWS_* variables point
    every client (and child process) at it; afterwards they are restored and the server stopped. The
    server's output goes to ``log`` if given."""
    port = _free_port()
    out = open(log, "w") if log is not None else subprocess.DEVNULL  # noqa: SIM115 - closed below
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                              stdout=out, stderr=subprocess.STDOUT)
    old = {k: os.environ.get(k) for k in _ENV}
    os.environ.update(dict(zip(_ENV, ("testing", "testing", "us-east-1", f"http://127.0.0.1:{port}"))))
    _SERVERS[f"s3://{bucket}"] = server
    try:
        _create_bucket(bucket, log)
        yield f"s3://{bucket}"
    finally:
        _SERVERS.pop(f"s3://{bucket}", None)
        server.terminate()
        server.wait(timeout=30)
        if log is not None:
            out.close()
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
