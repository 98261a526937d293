"""How a fleet goes away after a run: asks the inventory's fleet kind (``launch.fleets.kinds``).

local   ``LocalFleet(prefix).down()``: namespaces, users, processes, files; confirmed empty.
stack   ``pulumi destroy`` through the Automation API (buckets are retained), then a check that
        no instance of the cluster remains.
lab     a lab's own machines: the run's processes were stopped; the machines stay.

Whatever the kind raises becomes a ``FAILED`` outcome with its message: a teardown that did not
finish is reported (it may still bill), never lost in a traceback after the run was recorded.
"""

from __future__ import annotations

from launch.errors import FleetrunError
from launch.fleets.kinds.base import Say, TeardownOutcome, TeardownState
from launch.fleets.kinds.registry import fleet_kind
from launch.job.inventory import Inventory

__all__ = ["TeardownOutcome", "TeardownState", "tear_down"]


def tear_down(inventory: Inventory, say: Say = print) -> TeardownOutcome:
    try:
        return fleet_kind(inventory.fleet).tear_down(say)
    except FleetrunError as exc:
        return TeardownOutcome(TeardownState.FAILED, str(exc))
