"""A local S3-compatible server for tests (moto's server mode), and the bucket commands to reach it.

The bucket path is tested for real: the nodes (or this machine, for unit tests) run the real
``aws`` CLI against this server with ``AWS_ENDPOINT_URL`` and dummy keys. The server listens on
one address only: loopback for unit tests, the local fleet's bridge address for fleet tests, so
nothing outside this machine (or outside the fleet) can reach it. moto keeps its buckets in the
process, across servers: each test module uses bucket names of its own. Reusable by other tests::

    with S3Server("10.41.0.1") as s3:          # or S3Server() for 127.0.0.1
        s3.create_bucket("ckpt")
        commands = s3.commands("ckpt", "runs/r1")   # BucketCommands for guard.json
        s3.keys("ckpt", "runs/r1/checkpoints/")
"""

from __future__ import annotations

import os
import shutil
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

from launch.nodelib.fleetrun_protocol import BucketCommands

DUMMY_ENV = {
    "AWS_ACCESS_KEY_ID": "fleetrun-test",
    "AWS_SECRET_ACCESS_KEY": "fleetrun-test",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def aws_cli() -> str | None:
    """The ``aws`` CLI of this checkout's venv (a dev dependency), else on PATH."""
    beside = Path(sys.executable).parent / "aws"
    return str(beside) if beside.exists() else shutil.which("aws")


def free_port(address: str) -> int:
    with socket.socket() as sock:
        sock.bind((address, 0))
        return int(sock.getsockname()[1])


class S3Server:
    """moto's S3 server on ``address`` (a free port), in a thread of this process."""

    def __init__(self, address: str = "127.0.0.1", port: int | None = None) -> None:
        self.address = address
        self.port = port or free_port(address)
        self._server: Any = None

    @property
    def endpoint(self) -> str:
        return f"http://{self.address}:{self.port}"

    def __enter__(self) -> S3Server:
        from moto.server import ThreadedMotoServer

        self._server = ThreadedMotoServer(ip_address=self.address, port=self.port, verbose=False)
        self._server.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None

    def client(self) -> Any:
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=DUMMY_ENV["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=DUMMY_ENV["AWS_SECRET_ACCESS_KEY"],
            region_name=DUMMY_ENV["AWS_DEFAULT_REGION"],
        )

    def create_bucket(self, name: str) -> None:
        self.client().create_bucket(Bucket=name)

    def keys(self, bucket: str, prefix: str = "") -> list[str]:
        out: list[str] = []
        for page in self.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            out += [item["Key"] for item in page.get("Contents", [])]
        return sorted(out)

    def get(self, bucket: str, key: str) -> bytes:
        return bytes(self.client().get_object(Bucket=bucket, Key=key)["Body"].read())

    def put(self, bucket: str, key: str, data: bytes) -> None:
        self.client().put_object(Bucket=bucket, Key=key, Body=data)

    def env(self) -> dict[str, str]:
        return {**DUMMY_ENV, "AWS_ENDPOINT_URL": self.endpoint}

    def commands(self, bucket: str, prefix: str, cli: str | None = None) -> BucketCommands:
        """The bucket commands a node uses, the same the laptop's S3 module gives, with this endpoint."""
        from launch.fleets.clouds.aws import AwsOps

        commands = AwsOps().bucket_commands(bucket, prefix)
        argv0 = cli or "aws"
        return BucketCommands(
            url=commands.url,
            copy=(argv0, *commands.copy[1:]),
            sync=(argv0, *commands.sync[1:]),
            remove=(argv0, *commands.remove[1:]),
            env=self.env(),
        )


def have_s3_tools() -> str:
    """Why the S3 tests cannot run here ("" when they can): moto and the aws CLI are dev deps."""
    try:
        import moto.server  # noqa: F401
    except ImportError:
        return "moto[server] is not installed (pip install -e '.[dev]')"
    if aws_cli() is None:
        return "the aws CLI is not installed (pip install -e '.[dev]')"
    return ""


def serve_bucket(bucket: str) -> Iterator[S3Server]:
    """For a module fixture (``yield from``): a loopback server with ``bucket`` created; the
    module is skipped, saying why, where moto or the aws CLI is missing."""
    import pytest  # here, not at the top: bench/ imports this module without pytest

    missing = have_s3_tools()
    if missing:
        pytest.skip(missing)
    with S3Server() as server:
        server.create_bucket(bucket)
        yield server


os.environ.setdefault("MOTO_ALLOW_NONEXISTENT_REGION", "true")
