"""``fab train --wait`` and ``fab queue``: taking shared machines in arrival order.

The queue files and their rules are in ``launch.planning.queue``; here are the connections. A
waiting run refreshes its entry on every machine it needs each poll and starts once it is first
among the live entries on all of them; then a ``QueueHold`` keeps refreshing the entries from a
thread (its own connections) until the run ended, and removes them. Ctrl-C while waiting removes
them too. The GPU check at claim time (``launch.planning.claim``) still refuses GPUs that other
users' processes hold outside fleetrun.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

from launch.errors import FleetrunError, HostError
from launch.job.inventory import Host, Inventory
from launch.planning import queue
from launch.reports.safe_text import clean
from launch.transport.ssh import Fleet, NodeConnection

POLL_S = 2.0


def ttl_s() -> float:
    """How long an entry lives without a refresh (``FLEETRUN_QUEUE_TTL_S``; default 60 s)."""
    try:
        value = float(os.environ.get("FLEETRUN_QUEUE_TTL_S", queue.DEFAULT_TTL_S))
    except ValueError:
        return queue.DEFAULT_TTL_S
    return value if 1.0 <= value <= 3600.0 else queue.DEFAULT_TTL_S


def owner() -> str:
    """Who waits, as ``fab queue`` shows it: this laptop's user and host."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "?"
    return clean(f"{user}@{socket.gethostname()}", 120)


def _act(fleet: Fleet, action: str, run_id: str, ttl: float) -> dict[str, list[queue.Entry]]:
    """Run one queue action on every machine; its listing per host (a failure raises ``HostError``)."""
    who = owner()

    def one(conn: NodeConnection) -> list[queue.Entry]:
        command = queue.script_command(conn.host.python, action, run_id, who, ttl)
        result = conn.run_with_input(command, queue.SCRIPT.encode(), timeout=30)
        problem = queue.queue_error(result.stdout)
        if not result.ok or problem:
            raise HostError(conn.host.name, f"queue: {problem or clean(result.stderr.strip()[-200:])}")
        return queue.parse_listing(result.stdout)

    out: dict[str, list[queue.Entry]] = {}
    for name, res in fleet.map(one, deadline=60).items():
        if isinstance(res, BaseException):
            if action == "leave":
                continue  # best effort: an entry left behind expires by itself
            raise res if isinstance(res, FleetrunError) else HostError(name, f"queue: {res}")
        out[name] = res
    return out


class QueueHold:
    """The run's entries, refreshed from a thread until ``release`` (then removed)."""

    def __init__(self, hosts: list[Host], known_hosts: Path, run_id: str, ttl: float) -> None:
        self.fleet = Fleet(hosts, known_hosts)
        self.run_id, self.ttl = run_id, ttl
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._refresh, name="fleetrun-queue-hold", daemon=True)
        self._thread.start()

    def _refresh(self) -> None:
        while not self._stop.wait(max(1.0, self.ttl / 4)):
            with contextlib.suppress(Exception):  # a missed refresh is retried; the TTL allows 3
                _act(self.fleet, "touch", self.run_id, self.ttl)

    def release(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        with contextlib.suppress(Exception):
            _act(self.fleet, "leave", self.run_id, self.ttl)
        self.fleet.close()


def wait_turn(
    inventory: Inventory, known_hosts: Path, run_id: str, say: Callable[[str], None] = print
) -> QueueHold:
    """Queue on every host of ``inventory`` and return once this run is first on all of them."""
    ttl = ttl_s()
    fleet = Fleet(inventory.hosts, known_hosts)
    shown = ""
    try:
        listing = _act(fleet, "enqueue", run_id, ttl)
        while True:
            waiting = {
                name: queue.ahead_of(entries, run_id, ttl) for name, entries in listing.items() if entries
            }
            blockers = {name: ahead for name, ahead in waiting.items() if ahead}
            if not blockers:
                break
            line = "; ".join(
                f"{name}: behind {', '.join(f'{e.run_id} ({e.owner or e.user})' for e in ahead[:3])}"
                for name, ahead in sorted(blockers.items())[:4]
            )
            if line != shown:
                say(clean(f"waiting for the machines (arrival order): {line}", 600))
                shown = line
            time.sleep(POLL_S)
            listing = _act(fleet, "touch", run_id, ttl)
    except BaseException:  # Ctrl-C or an error: the entries go, nobody waits behind a ghost
        with contextlib.suppress(Exception):
            _act(fleet, "leave", run_id, ttl)
        fleet.close()
        raise
    fleet.close()
    say(f"run {run_id}: its turn on {len(inventory.hosts)} machine(s)")
    return QueueHold(list(inventory.hosts), known_hosts, run_id, ttl)


def show_queue(inventory: Inventory, known_hosts: Path, say: Callable[[str], None] = print) -> int:
    """``fab queue``: per machine, who holds it (first live entry) and who waits; how many live entries."""
    ttl = ttl_s()
    live = 0
    with Fleet(inventory.hosts, known_hosts) as fleet:
        listing = _act(fleet, "list", "-", ttl)
    for host in inventory.hosts:
        entries = [e for e in listing.get(host.name, []) if e.live(ttl)]
        live += len(entries)
        if not entries:
            say(f"{clean(host.name, 100)}: free")
            continue
        first, rest = entries[0], entries[1:]
        say(
            f"{clean(host.name, 100)}: held by {clean(first.run_id, 130)} ({clean(first.owner or first.user, 130)})"
        )
        for position, entry in enumerate(rest, 1):
            say(
                f"  {position}. waiting: {clean(entry.run_id, 130)} ({clean(entry.owner or entry.user, 130)})"
            )
    return live
