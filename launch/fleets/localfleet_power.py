"""The local fleet's power button: a root daemon that stops a node when the node asks.

On a cloud, the on-node watchdog ends billing by shutting its own instance down (the instance is
created with instance-initiated shutdown = terminate). A local-fleet node cannot stop its own
sshd or namespace (it is an unprivileged user), so it writes ``~/.fleetrun/poweroff-request``
and this daemon, started by ``LocalFleet.up`` and stopped by ``down``, powers the node off:
every process of the node's user and the node's sshd are killed. The namespace and home stay
(like a stopped VM's disk) until ``local.down``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from launch.fleets.localfleet import LocalFleet


def serve(fleet: LocalFleet, interval: float = 0.5) -> None:
    prefix_len = len(f"{fleet.prefix}node")
    while fleet.state_dir.exists():
        for user in fleet.existing_users():
            request = Path("/home") / user / ".fleetrun" / "poweroff-request"
            if not request.exists() and not request.is_symlink():
                continue
            index = int(user[prefix_len:])
            fleet.stop_node(index)
            request.unlink(missing_ok=True)
            node_dir = fleet.node_dir(index)
            if node_dir.exists():
                (node_dir / "powered-off").write_text(f"{time.time()}\n")
            print(f"{time.strftime('%H:%M:%S')} powered off {user}", flush=True)
        time.sleep(interval)


if __name__ == "__main__":
    serve(LocalFleet(prefix=sys.argv[1], subnet=int(sys.argv[2]) if len(sys.argv) > 2 else 0))
