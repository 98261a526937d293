"""The third keeper of a warm fleet's deadline: an instance lifetime in the cloud itself.

``launch.run.warm`` keeps a fleet warm with a timer on each node and the laptop's ledger and
detached timer. Both can fail together: a process the job left behind fools the node's timer,
and a laptop that is lost, asleep for days or wiped keeps nothing. So on a cloud the laptop also
arms, when it keeps the fleet warm, a time at which the cloud ends the instances (the fleet
kind's ``InstanceLifetime``: AWS EventBridge Scheduler, GCP Cloud Scheduler; see
``launch.fleets.stack_lifetime``). Lab machines never get one (never powered off) and a local
fleet has no cloud: for them ``lifetime()`` is None and nothing happens here.

The lifetime is the deadline plus ``GRACE_S``: the laptop's teardown (which also removes the
network and audits the cloud) goes first when it can; the cloud's is the backstop. A run that
reuses the fleet disarms it as it starts (``warm.claim``), so the cloud never ends a fleet a
run is using; that run's own end arms a new one when it keeps the fleet warm again. A teardown
removes it with the stack; a teardown that failed leaves it armed.
"""

from __future__ import annotations

from collections.abc import Callable

from launch.errors import FleetrunError
from launch.fleets.kinds.registry import fleet_kind
from launch.job.inventory import Inventory
from launch.reports.safe_text import clean

GRACE_S = 300.0
"""The cloud ends the instances this long after the warm deadline (the laptop goes first)."""

Say = Callable[[str], None]


def arm(inventory: Inventory, deadline: float, say: Say) -> str | None:
    """Arm the fleet's lifetime at ``deadline`` + ``GRACE_S``; what was armed (one line), or None
    when the fleet has none or it could not be armed (said: the other two keepers remain)."""
    lifetime = fleet_kind(inventory.fleet).lifetime()
    if lifetime is None:
        return None
    try:
        armed = lifetime.arm(deadline + GRACE_S, lambda m: say(f"    {m}"))
    except FleetrunError as exc:
        say(
            f"  could not arm the instances' lifetime in the cloud ({clean(exc, 300)}); the nodes' timers "
            "and this laptop still keep the deadline"
        )
        return None
    say(f"  instance lifetime: {armed}")
    return armed


def disarm(inventory: Inventory, say: Say) -> None:
    """Remove the fleet's lifetime; raises ``FleetrunError`` when it could not be removed."""
    lifetime = fleet_kind(inventory.fleet).lifetime()
    if lifetime is not None:
        lifetime.disarm(lambda m: say(f"    {m}"))
