"""Nodes the watcher already lost: one short probe in the wrap-up, then no more waiting on them.

A node judged unreachable (its link went down, it powered off) makes every wrap-up step on it
(stop, pull, upload) wait for its full connect and command timeouts: with a 10 s limit the
decision came on time but ``fab train`` exited long after. The wrap-up probes such nodes once
with a short deadline; a node that answers is handled like any other (the cut may have healed),
one that does not is skipped by those steps and recorded as not stopped and not pulled. Its
missing pull still blocks the teardown, as any failed pull does: it may hold the only copy.
"""

from __future__ import annotations

import copy
from collections.abc import Collection

from launch.run.watch import Watcher
from launch.transport.ssh import Fleet

__all__ = ["PROBE_S", "confirm_lost", "without"]

PROBE_S = 3.0
"""How long a node the watcher lost gets to answer ``true`` before the wrap-up leaves it out."""


def confirm_lost(fleet: Fleet, watcher: Watcher | None, probe_s: float = PROBE_S) -> dict[str, str]:
    """Nodes the watcher saw as unreachable at its last poll that fail a ``probe_s`` probe now:
    name -> why. Their connections are closed, so later steps (the key revoke) skip them too."""
    if watcher is None:
        return {}
    suspects = [
        h for h in fleet.hosts if h.name in watcher.nodes and watcher.nodes[h.name].state == "unreachable"
    ]
    if not suspects:
        return {}
    results = fleet.map(lambda c: c.run("true", timeout=probe_s), hosts=suspects, deadline=probe_s + 1)
    lost: dict[str, str] = {}
    for name, res in results.items():
        if isinstance(res, BaseException):
            lost[name] = f"unreachable (the watcher lost it and a {probe_s:.0f} s probe failed: {res})"
            fleet.connections[name].close()
    return lost


def without(fleet: Fleet, names: Collection[str]) -> Fleet:
    """The same fleet (same connections) with ``names`` left out of its fan-outs."""
    if not names:
        return fleet
    view = copy.copy(fleet)
    view.hosts = [h for h in fleet.hosts if h.name not in names]
    return view
