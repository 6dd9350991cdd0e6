"""A real S3 API for the tests: moto's server on 127.0.0.1 inside the test process.

In the test process (``ThreadedMotoServer``), so that a stop and a start on
the same port keep the buckets (moto's state lives in this process; a server
process of its own would lose them on restart). Credentials are fakes set in
the environment, as the AWS chain reads them; subprocesses get the same
variables through ``env``.
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid

import pytest


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MotoS3:
    """One moto server on a fixed port, stoppable and restartable in-process."""

    def __init__(self) -> None:
        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one log line per request otherwise
        self.port = _free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self.env = {"AWS_ACCESS_KEY_ID": "testing-key", "AWS_SECRET_ACCESS_KEY": "testing-secret",
                    "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": self.endpoint}
        self.running = False

    def start(self) -> None:
        for _ in range(100):  # the port of a just-stopped server may linger a moment
            try:
                self._server.start()
                break
            except OSError:
                time.sleep(0.1)
        self.running = True

    def stop(self) -> None:
        self._server.stop()
        self.running = False

    def bucket(self) -> str:
        """A fresh bucket (one per test: the server is shared)."""
        import boto3

        name = f"rw-{uuid.uuid4().hex[:12]}"
        boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1").create_bucket(Bucket=name)
        return name


_SERVER: MotoS3 | None = None


@pytest.fixture(scope="session")
def moto_s3() -> MotoS3:
    """The session's S3 server (one port for the whole run: fsspec caches filesystems per endpoint-less key)."""
    pytest.importorskip("moto.server", reason="pip install 'runwatch[test]' (moto)")
    pytest.importorskip("s3fs", reason="pip install 'runwatch[s3]'")
    global _SERVER
    if _SERVER is None:
        _SERVER = MotoS3()
        os.environ.update(_SERVER.env)
        _SERVER.start()
    if not _SERVER.running:
        _SERVER.start()
    return _SERVER


@pytest.fixture
def s3_root(moto_s3: MotoS3) -> str:
    """An empty runwatch root on the S3 server: ``s3://<fresh bucket>/fleet``."""
    return f"s3://{moto_s3.bucket()}/fleet"
