"""The spot notice daemon's entry point (``python -m launch.fleets.local.spot_daemon PREFIX SUBNET
NODES``), apart from ``launch.fleets.local.spot``, which the fleet imports: a module run with
``-m`` must not be imported already."""

from __future__ import annotations

import sys

from launch.fleets.local.naming import FleetNames
from launch.fleets.local.spot import serve

if __name__ == "__main__":
    serve(FleetNames(prefix=sys.argv[1], subnet=int(sys.argv[2])), int(sys.argv[3]))
