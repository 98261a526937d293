"""A cloud metadata server of our own, for preemption-notice tests and the benchmark.

Real HTTP, the real flows: EC2's IMDSv2 (PUT ``/latest/api/token`` with the TTL header, then
``GET /latest/meta-data/spot/instance-action`` with the token: 404 until the notice, 401 for a
wrong token) and GCE's (``GET /computeMetadata/v1/instance/preempted`` with
``Metadata-Flavor: Google``, answered with that header, ``FALSE`` or ``TRUE``). The notice is on
while the file ``<control>/notice`` exists; ``<control>/mode`` makes it misbehave (``500``,
``garbage``, ``slow``, ``expire-tokens``: tokens issued before the mode was set answer 401). Every request is counted in ``<control>/requests``.

Run in a node's network namespace at 169.254.169.254 (the fleet test), or on loopback::

    python tests/metadataserver.py ADDRESS PORT CONTROL_DIR
"""

from __future__ import annotations

import json
import os
import secrets
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


class Handler(BaseHTTPRequestHandler):
    server: MetadataServer

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base's name
        pass

    def _answer(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _misbehave(self) -> bool:
        mode = self.server.mode()
        if mode == "500":
            self._answer(500, b"internal error")
            return True
        if mode == "garbage":
            self._answer(200, b"\xff\x00[" * 100_000)
            return True
        if mode == "slow":
            time.sleep(5)
            self._answer(404, b"")
            return True
        return False

    def do_PUT(self) -> None:  # noqa: N802 - http.server's name
        self.server.count(self.path)
        if self._misbehave():
            return
        if self.path != "/latest/api/token":
            self._answer(404, b"")
            return
        if not self.headers.get("X-aws-ec2-metadata-token-ttl-seconds", "").isdigit():
            self._answer(400, b"missing the TTL header")
            return
        token = secrets.token_urlsafe(24)
        with self.server.lock:
            self.server.tokens[token] = time.time()
        self._answer(200, token.encode())

    def do_GET(self) -> None:  # noqa: N802
        self.server.count(self.path)
        if self._misbehave():
            return
        if self.path == "/latest/meta-data/spot/instance-action":
            token = self.headers.get("X-aws-ec2-metadata-token", "")
            with self.server.lock:
                issued = self.server.tokens.get(token)
            revoked_before = self.server.mode_set_at() if self.server.mode() == "expire-tokens" else 0.0
            if issued is None or issued < revoked_before:
                self._answer(401, b"")
                return
            if not self.server.notice():
                self._answer(404, b"")
                return
            action = {"action": "terminate", "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
            self._answer(200, json.dumps(action).encode())
            return
        if self.path == "/computeMetadata/v1/instance/preempted":
            if self.headers.get("Metadata-Flavor") != "Google":
                self._answer(403, b"missing Metadata-Flavor")
                return
            body = b"TRUE" if self.server.notice() else b"FALSE"
            self._answer(200, body, {"Metadata-Flavor": "Google"})
            return
        self._answer(404, b"")


class MetadataServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: str, port: int, control: Path) -> None:
        super().__init__((address, port), Handler)
        self.control = control
        self.tokens: dict[str, float] = {}
        self.lock = threading.Lock()

    def notice(self) -> bool:
        return (self.control / "notice").exists()

    def mode(self) -> str:
        try:
            return (self.control / "mode").read_text().strip()
        except OSError:
            return ""

    def mode_set_at(self) -> float:
        try:
            return (self.control / "mode").stat().st_mtime
        except OSError:
            return 0.0

    def count(self, path: str) -> None:
        with self.lock, open(self.control / "requests", "a", encoding="utf-8") as fh:
            fh.write(path + "\n")


def serve_in_thread(address: str, port: int, control: Path) -> MetadataServer:
    server = MetadataServer(address, port, control)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


if __name__ == "__main__":
    control_dir = Path(sys.argv[3])
    control_dir.mkdir(parents=True, exist_ok=True)
    srv = MetadataServer(sys.argv[1], int(sys.argv[2]), control_dir)
    (control_dir / "ready").write_text(str(os.getpid()))
    srv.serve_forever()
