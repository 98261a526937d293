"""The spot notice daemon's entry point (``python -m launch.fleets.local.spot_daemon PREFIX SUBNET
NODES``), apart from ``launch.fleets.local.spot``, which the fleet imports: a module run with
``-m`` must not be imported already."""

from __future__ import annotations

import sys

from launch.fleets.local.fleet import LocalFleet
from launch.fleets.local.naming import FleetNames
from launch.fleets.local.spot import serve


def power_off(names: FleetNames, i: int) -> None:
    """The cloud takes the machine: every process of node ``i`` and its sshd end (root-only I/O)."""
    LocalFleet(prefix=names.prefix, subnet=names.subnet).stop_node(i)


if __name__ == "__main__":
    serve(FleetNames(prefix=sys.argv[1], subnet=int(sys.argv[2])), int(sys.argv[3]), power_off)
