"""Nodes the watcher already lost: one short probe, run while the others are stopped and pulled.

A node judged unreachable (its link went down, it powered off) makes every wrap-up step on it
(stop, pull, upload) wait for its full connect and command timeouts: with a 10 s limit the
decision came on time but ``fab train`` exited long after. So the wrap-up probes such nodes once
with a short deadline, in the background (``LostProbe``), while it stops and pulls every other
node: the probe then costs the wrap-up nothing when the survivors' stop and pull take as long
(with a lost peer they do: a 2 s SIGTERM grace, then the pull). A node that answers the probe is
handled like any other afterwards (the cut may have healed); one that does not is left out of
stop, pull and upload and recorded as not stopped and not pulled. Its missing pull still blocks
the teardown, as any failed pull does: it may hold the only copy.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Collection

from launch.run.watch import Watcher
from launch.transport.port import CommandResult, FleetPort, NodeLink
from launch.transport.port import without as port_without
from launch.transport.ssh import NodeConnection

__all__ = ["PROBE_S", "LostProbe", "confirm_lost", "only", "probe", "suspects", "without"]

PROBE_S = 3.0
"""How long a node the watcher lost gets to answer ``true`` before the wrap-up leaves it out."""


def suspects(fleet: FleetPort, watcher: Watcher | None) -> list[str]:
    """The fleet's nodes the watcher could not reach at its last poll, in fleet order."""
    if watcher is None:
        return []
    return [
        h.name
        for h in fleet.hosts
        if h.name in watcher.nodes and watcher.nodes[h.name].state == "unreachable"
    ]


def probe(fleet: FleetPort, conn: NodeLink, probe_s: float) -> CommandResult:
    """``true`` on the node over a fresh connection whose connect is bounded by ``probe_s``.

    The fleet's own connection connects with the usual 10 s timeout. To a node whose link is
    down that connect blocks its thread for the whole 10 s, long after the fan-out's deadline
    gave up on it, and ``fab train`` cannot exit before its worker threads have ended (it
    measured 5.8 s after the wrap-up). The fresh connection has the same pinned host keys
    (``RejectPolicy``, fleetrun's known_hosts) and shares the fleet's jump hosts. A stand-in
    connection (a test double) has no socket to hang on and is used as it is.
    """
    if not isinstance(conn, NodeConnection):
        return conn.run("true", timeout=probe_s)
    short = NodeConnection(
        conn.host, fleet.known_hosts, connect_timeout=max(1, math.ceil(probe_s)), jumps=fleet.jumps
    )
    try:
        return short.run("true", timeout=probe_s)
    finally:
        short.close()


def confirm_lost(fleet: FleetPort, names: Collection[str], probe_s: float = PROBE_S) -> dict[str, str]:
    """Of ``names``, the nodes that fail a ``probe_s`` probe now: name -> why. Their connections
    are closed, so later steps (the key revoke) skip them too.

    The fan-out's deadline is the probe's own: a reconnect to a node whose link is down waits for
    TCP, not for the command timeout, and the deadline is what cuts it off."""
    targets = [h for h in fleet.hosts if h.name in names]
    if not targets:
        return {}
    results = fleet.map(lambda c: probe(fleet, c, probe_s), hosts=targets, deadline=probe_s)
    lost: dict[str, str] = {}
    for name, exc in results.failed.items():
        lost[name] = f"unreachable (the watcher lost it and a {probe_s:.0f} s probe failed: {exc})"
        fleet.connections[name].close()
    return lost


class LostProbe:
    """``confirm_lost`` on the watcher's suspects, in a thread started at once; ``result`` joins it.

    Only the suspects' connections are used by the thread, so the wrap-up's fan-outs over the
    other nodes run beside it without sharing a connection. A probe that crashed (a bug) counts
    as every suspect having answered: they are then stopped and pulled with their full timeouts,
    which is slow but loses nothing.
    """

    def __init__(self, fleet: FleetPort, names: Collection[str], probe_s: float = PROBE_S) -> None:
        self.suspects: frozenset[str] = frozenset(names)
        self._lost: dict[str, str] = {}
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        if self.suspects:
            self._thread = threading.Thread(
                target=self._run, args=(fleet, probe_s), name="fleetrun-probe-lost", daemon=True
            )
            self._thread.start()

    @classmethod
    def start(cls, fleet: FleetPort, watcher: Watcher | None, probe_s: float = PROBE_S) -> LostProbe:
        return cls(fleet, suspects(fleet, watcher), probe_s)

    def _run(self, fleet: FleetPort, probe_s: float) -> None:
        try:
            self._lost = confirm_lost(fleet, self.suspects, probe_s)
        except BaseException as exc:  # noqa: BLE001 - re-raised by ``result`` in the wrap-up's thread
            self._error = exc

    def result(self) -> dict[str, str]:
        """The suspects that failed the probe (name -> why), once it is done; re-raises its crash."""
        if self._thread is not None:
            self._thread.join()
        if self._error is not None:
            raise self._error
        return dict(self._lost)

    def answered(self, lost: Collection[str]) -> list[str]:
        """The suspects not in ``lost``: they answered the probe (or it crashed)."""
        return sorted(self.suspects - set(lost))


def without(fleet: FleetPort, names: Collection[str]) -> FleetPort:
    """The same fleet (same connections) with ``names`` left out of its fan-outs."""
    return port_without(fleet, names)


def only(fleet: FleetPort, names: Collection[str]) -> FleetPort:
    """The same fleet (same connections) reduced to ``names``."""
    return fleet.subset(names)
