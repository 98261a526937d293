"""The product's cloud metadata endpoint (``launch.fleets.local.spot``), misbehaving on demand,
for preemption-notice tests and the benchmark.

The flows (EC2's IMDSv2, GCE's) are the product's own ``spot.Handler``; what this adds is test
control through files: the notice is on while ``<control>/notice`` exists (its time is now);
``<control>/mode`` makes the endpoint misbehave (``500``, ``garbage``, ``slow``,
``expire-tokens``: tokens issued before the mode was set answer 401). Every request is counted
in ``<control>/requests``.

Run in a node's network namespace at 169.254.169.254 (the fleet test), or on loopback::

    python tests/metadataserver.py ADDRESS PORT CONTROL_DIR
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

if __name__ == "__main__":  # run as a script: the product package from this checkout
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from launch.fleets.local.spot import Handler as CloudFlows
from launch.fleets.local.spot import MetadataEndpoint


class Handler(CloudFlows):
    server: MetadataServer

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
        if not self._misbehave():
            super().do_PUT()

    def do_GET(self) -> None:  # noqa: N802
        self.server.count(self.path)
        if not self._misbehave():
            super().do_GET()


class MetadataServer(MetadataEndpoint):
    def __init__(self, address: str, port: int, control: Path) -> None:
        super().__init__((address, port), Handler)
        self.control = control

    def notice_deadline(self) -> float | None:
        return time.time() if (self.control / "notice").exists() else None

    def valid(self, token: str) -> bool:
        with self.lock:
            issued = self.tokens.get(token)
        revoked_before = self.mode_set_at() if self.mode() == "expire-tokens" else 0.0
        return issued is not None and issued >= revoked_before

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
