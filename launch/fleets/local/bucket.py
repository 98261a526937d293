"""The local fleet's bucket: an S3-compatible server on the fleet's bridge (``fab local.up --bucket``).

A cloud stack gives its nodes a bucket (checkpoints, the run directory's last upload, a resume
after the disk is gone); without one, a local fleet cannot rehearse what depends on it. So ``up``
can start moto's S3 server (``python -m moto.server``, the optional extra ``fleetrun[local-bucket]``)
as the fleet's own process, listening on the bridge's address only (the nodes and this machine
reach it, nothing outside), create the bucket ``fleetrun-<prefix>``, and record both in the fleet's
inventory (``LocalFleetRef.bucket``, ``s3_endpoint``): the nodes then get the bucket exactly as a
cloud stack's nodes do, with the image's ``aws`` CLI and dummy keys. ``down`` ends the server (its
pid file, checked against its command line) with the rest of the fleet; the bucket's contents live
in the server's memory and go with it.
"""

from __future__ import annotations

import http.client
import socket
import sys
from pathlib import Path

from launch.errors import LocalFleetError
from launch.fleets.local import daemon
from launch.fleets.local.naming import FleetNames

MODULE = "moto.server"
PID_FILE = "s3.pid"
LOG_FILE = "s3.log"
START_TIMEOUT_S = 60.0


def bucket_name(names: FleetNames) -> str:
    return f"fleetrun-{names.prefix}"


def have_moto() -> bool:
    try:
        import moto.server  # noqa: F401
    except ImportError:
        return False
    return True


def _free_port(address: str) -> int:
    with socket.socket() as sock:
        sock.bind((address, 0))
        return int(sock.getsockname()[1])


def _answers(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=0.5):
            return True
    except OSError:
        return False


def start(names: FleetNames, address: str) -> tuple[str, str]:
    """Start the server on ``address`` (the bridge's), create the bucket; (bucket, endpoint)."""
    if not have_moto():
        raise LocalFleetError(
            "--bucket needs moto's S3 server on this machine: pip install 'fleetrun[local-bucket]' "
            "(or the dev extra)"
        )
    port = _free_port(address)
    daemon.start(
        names.state_dir,
        [sys.executable, "-m", MODULE, "-H", address, "-p", str(port)],
        PID_FILE,
        LOG_FILE,
        lambda: _answers(address, port),
        START_TIMEOUT_S,
        f"the fleet's S3 server on {address}:{port}",
    )
    bucket = bucket_name(names)
    create_bucket(address, port, bucket)
    return bucket, f"http://{address}:{port}"


def create_bucket(address: str, port: int, bucket: str) -> None:
    """``PUT /<bucket>`` (moto takes any credentials, none included)."""
    conn = http.client.HTTPConnection(address, port, timeout=10)
    try:
        conn.request("PUT", f"/{bucket}", headers={"Content-Length": "0"})
        response = conn.getresponse()
        response.read(4096)
        if response.status != 200:
            raise LocalFleetError(
                f"the fleet's S3 server refused to create bucket {bucket}: {response.status}"
            )
    finally:
        conn.close()


def server_pids(state_dir: Path) -> list[int]:
    """The fleet's S3 server, by its pid file and confirmed by its command line."""
    return daemon.pids(state_dir, PID_FILE, MODULE)
