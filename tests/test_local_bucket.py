"""The local fleet's S3 server (``fab local.up --bucket``) as a node or a local user meets it: S3
only, and only for requests signed with the fleet's own key; serving as ``nobody``."""

from __future__ import annotations

import http.client
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from launch.fleets.local import bucket
from launch.fleets.local.naming import FleetNames
from launch.fleets.local.s3_server import ACCESS_KEY

pytestmark = pytest.mark.skipif(not bucket.have_moto(), reason="moto is not installed here")

NAMES = FleetNames(prefix="tsb", subnet=4)


@pytest.fixture
def server(fleetrun_home: Path) -> Iterator[tuple[str, str]]:
    """The fleet's server on 127.0.0.1 (the bridge's address in a fleet); (endpoint, secret)."""
    NAMES.state_dir.mkdir(parents=True, exist_ok=True)
    _name, endpoint = bucket.start(NAMES, "127.0.0.1")
    try:
        yield endpoint, str(bucket.fleet_secret(NAMES.state_dir))
    finally:
        for pid in bucket.server_pids(NAMES.state_dir):
            os.kill(pid, signal.SIGTERM)


def ask(
    endpoint: str, method: str, path: str, headers: dict[str, str], body: bytes = b""
) -> tuple[int, bytes]:
    host, port = endpoint.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request(method, path, body=body, headers=headers)
        response = conn.getresponse()
        return response.status, response.read(65536)
    finally:
        conn.close()


def signed(
    endpoint: str, method: str, path: str, secret: str, service: str = "s3", body: bytes = b""
) -> dict[str, str]:
    """Headers of a request signed as the AWS CLI signs it, for ``service`` with ``secret``."""
    from botocore.auth import S3SigV4Auth, SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    request = AWSRequest(method=method, url=f"{endpoint}{path}", data=body)
    signer = S3SigV4Auth if service == "s3" else SigV4Auth
    signer(Credentials(ACCESS_KEY, secret), service, "us-east-1").add_auth(request)
    return {k: str(v) for k, v in request.headers.items()}


def test_the_bucket_server_serves_s3_to_the_fleets_key_only(server: tuple[str, str]) -> None:
    endpoint, secret = server
    name = bucket.bucket_name(NAMES)
    # the fleet's key: the bucket up made, an object put and read back
    status, _ = ask(
        endpoint, "PUT", f"/{name}/k", signed(endpoint, "PUT", f"/{name}/k", secret, body=b"v"), b"v"
    )
    assert status == 200
    status, body = ask(endpoint, "GET", f"/{name}/k", signed(endpoint, "GET", f"/{name}/k", secret))
    assert (status, body) == (200, b"v")
    # other credentials, or none: refused before moto sees them
    status, body = ask(
        endpoint, "GET", f"/{name}/k", signed(endpoint, "GET", f"/{name}/k", "not-the-fleets-secret")
    )
    assert status == 403 and b"fleet's secret" in body
    assert ask(endpoint, "GET", f"/{name}/k", {})[0] == 403
    # another service's call, even signed with the fleet's key: moto's Batch (Docker), IAM, STS
    batch = "/v1/createcomputeenvironment"
    status, body = ask(
        endpoint, "POST", batch, signed(endpoint, "POST", batch, secret, "batch", b"{}"), b"{}"
    )
    assert status == 403 and b"S3 only" in body
    iam = b"Action=CreateUser&UserName=x&Version=2010-05-08"
    status, body = ask(endpoint, "POST", "/", signed(endpoint, "POST", "/", secret, "iam", iam), iam)
    assert status == 403 and b"S3 only" in body
    sts = b"Action=GetCallerIdentity&Version=2011-06-15"
    status, body = ask(endpoint, "POST", "/", signed(endpoint, "POST", "/", secret, "sts", sts), sts)
    assert status == 403 and b"S3 only" in body
    # moto's own control API is not there either: its reset empties nothing
    path = "/moto-api/reset"
    assert ask(endpoint, "POST", path, signed(endpoint, "POST", path, secret))[0] != 200
    assert ask(endpoint, "GET", f"/{name}/k", signed(endpoint, "GET", f"/{name}/k", secret)) == (200, b"v")


@pytest.mark.skipif(os.geteuid() != 0, reason="dropping to nobody needs root")
def test_the_bucket_server_serves_as_nobody(server: tuple[str, str]) -> None:
    (pid,) = bucket.server_pids(NAMES.state_dir)
    uids = next(x for x in Path(f"/proc/{pid}/status").read_text().splitlines() if x.startswith("Uid:"))
    assert set(uids.split()[1:]) == {"65534"}, uids
    secret_file = NAMES.state_dir / bucket.SECRET_FILE
    assert secret_file.stat().st_mode & 0o077 == 0, "the fleet's key is readable by others"
