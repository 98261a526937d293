"""The package layers of ``launch``, top to bottom: imports only point down (or sideways within
one layer, without a cycle). Written down here once; ``tests/test_layout.py`` reads every real
import (``ast`` over ``launch/``, imports inside functions and under ``TYPE_CHECKING`` included)
and fails on an upward import, a pair of packages importing each other, or a module cycle.

* ``cli``: the commands (Fabric tasks and what they call).
* ``run``: one run's life cycle over a fleet port (stages, watcher, recovery, wrap-up, records).
* ``fleets``: where machines come from (fleet kinds, the local fleet, cloud stacks).
* ``transport``: reaching the machines (the fleet port, SSH, rsync).
* ``planning``: what to run where (launch plans, launchers, the node-side layout).
* ``job``: the playbook and the inventory, validated.
* ``rules`` and ``reports``: pure decisions (stop rules, recovery, pricing) and views.
* ``nodelib`` and the top-level modules (``errors``, ``settings``, ``paths``, ``processes``,
  this one): what everything may use; ``nodelib`` is also shipped to the nodes.

Where a lower layer seems to need a higher one, pass a function or a value down instead, or move
the plain data to the lower layer (``job.fleet_refs``, ``reports.run_record``).
"""

from __future__ import annotations

BASE = "(base)"
"""The layer of the top-level modules (``launch.errors``, ``launch.paths``, ...)."""

LAYERS: tuple[tuple[str, ...], ...] = (
    ("cli",),
    ("run",),
    ("fleets",),
    ("transport",),
    ("planning",),
    ("job",),
    ("rules", "reports"),
    ("nodelib", BASE),
)
"""Top to bottom; the packages of one tuple share a layer."""


def layer_of(package: str) -> int:
    """The layer index of a package of ``launch`` (0 = top); ``BASE`` for a top-level module."""
    for index, layer in enumerate(LAYERS):
        if package in layer:
            return index
    raise KeyError(f"launch.{package} is in no layer of launch.layers.LAYERS")
