"""The local fleet's bucket: an S3-compatible server on the fleet's bridge (``fab local.up --bucket``).

A cloud stack gives its nodes a bucket (checkpoints, the run directory's last upload, a resume
after the disk is gone); without one, a local fleet cannot rehearse what depends on it. So ``up``
can start moto's S3 backend (the optional extra ``fleetrun[local-bucket]``) as the fleet's own
process (``launch.fleets.local.s3_server``: S3 only, never moto's other services, whose Batch
emulation asks Docker for privileged containers), serving as ``nobody``, listening on the bridge's
address only (the nodes and this machine reach it, nothing outside), answering only requests
signed with the fleet's own key (a secret made at ``up``, kept in the fleet's state directory,
root only), create the bucket ``fleetrun-<prefix>``, and record both in the fleet's inventory
(``LocalFleetRef.bucket``, ``s3_endpoint``): the nodes then get the bucket exactly as a cloud
stack's nodes do, with the image's ``aws`` CLI and the fleet's key. ``down`` ends the server (its
pid file, checked against its command line) with the rest of the fleet; the bucket's contents live
in the server's memory and go with it.
"""

from __future__ import annotations

import http.client
import os
import secrets
import socket
import sys
from pathlib import Path

from launch.errors import LocalFleetError
from launch.fleets.local import daemon
from launch.fleets.local.naming import FleetNames

MODULE = "launch.fleets.local.s3_server"
PID_FILE = "s3.pid"
LOG_FILE = "s3.log"
SECRET_FILE = "s3.secret"
SERVER_USER = "nobody"
"""The server serves as this unprivileged user (it drops root once listening and warmed up): a
flaw in moto reached from a node is not root."""
START_TIMEOUT_S = 60.0


def bucket_name(names: FleetNames) -> str:
    return f"fleetrun-{names.prefix}"


def have_moto() -> bool:
    try:
        import moto.server  # noqa: F401
    except ImportError:
        return False
    return True


def free_port(address: str, preferred: int = 0) -> int:
    """A port free on ``address`` (the fleet's bridge): ``preferred`` when it is, else one the
    kernel picks. Shared by the fleet's servers (this bucket, the registry)."""
    if preferred:
        with socket.socket() as sock:
            try:
                sock.bind((address, preferred))
            except OSError:
                pass
            else:
                return preferred
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
    from launch.fleets.local.s3_server import SECRET_ENV

    port = free_port(address)
    key = new_secret(names.state_dir)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update({SECRET_ENV: key, "PYTHONDONTWRITEBYTECODE": "1"})
    daemon.start(
        names.state_dir,
        [sys.executable, "-m", MODULE, address, str(port), SERVER_USER],
        PID_FILE,
        LOG_FILE,
        lambda: _answers(address, port),
        START_TIMEOUT_S,
        f"the fleet's S3 server on {address}:{port}",
        cwd=Path(__file__).resolve().parents[3],
        env=env,
    )
    bucket = bucket_name(names)
    create_bucket(address, port, bucket, key)
    return bucket, f"http://{address}:{port}"


def new_secret(state_dir: Path) -> str:
    """A fresh secret key for the fleet's server, kept in its state directory (root only, 0600)."""
    key = secrets.token_urlsafe(32)
    path = state_dir / SECRET_FILE
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(key)
    return key


def fleet_secret(state_dir: Path) -> str | None:
    """The fleet's secret key (None when the fleet has none: started before keys, or gone)."""
    try:
        return (state_dir / SECRET_FILE).read_text()[:256].strip() or None
    except OSError:
        return None


def signed_headers(method: str, url: str, secret: str) -> dict[str, str]:
    """Headers that sign ``method url`` (no body) for the fleet's server (SigV4, service s3)."""
    from botocore.auth import S3SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    from launch.fleets.local.s3_server import ACCESS_KEY

    request = AWSRequest(method=method, url=url, data=b"")
    S3SigV4Auth(Credentials(ACCESS_KEY, secret), "s3", "us-east-1").add_auth(request)
    return {k: str(v) for k, v in request.headers.items()}


def create_bucket(address: str, port: int, bucket: str, secret: str) -> None:
    """``PUT /<bucket>``, signed with the fleet's key."""
    conn = http.client.HTTPConnection(address, port, timeout=10)
    try:
        headers = signed_headers("PUT", f"http://{address}:{port}/{bucket}", secret)
        conn.request("PUT", f"/{bucket}", headers={**headers, "Content-Length": "0"})
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
