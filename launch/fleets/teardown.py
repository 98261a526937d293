"""How a fleet goes away after a run, one entry per kind of inventory (no cloud switches elsewhere).

local-fleet   ``LocalFleet(prefix).down()``: namespaces, users, processes, files; confirmed empty.
pulumi-stack  ``pulumi destroy`` through the Automation API (buckets are retained), then a
              check that no instance of the cluster remains.
none          a lab's own machines: the run's processes were stopped; the machines stay.
"""

from __future__ import annotations

from collections.abc import Callable

from launch.errors import FleetrunError
from launch.job.inventory import Inventory

Say = Callable[[str], None]


def _local_fleet(inventory: Inventory, say: Say) -> str:
    from launch.fleets.localfleet import LocalFleet

    if not inventory.cluster_id:
        raise FleetrunError("local fleet inventory has no cluster_id (the fleet prefix); cannot tear it down")
    left = LocalFleet(prefix=inventory.cluster_id, subnet=0).down(say=say)
    remaining = {k: v for k, v in left.items() if v}
    if remaining:
        raise FleetrunError(f"local fleet {inventory.cluster_id}: teardown left {remaining}")
    return f"local fleet {inventory.cluster_id} removed; nothing left behind"


def _pulumi_stack(inventory: Inventory, say: Say) -> str:
    from launch.fleets import cloud_stack

    if not inventory.stack:
        raise FleetrunError(
            f"inventory {inventory.source} came from stack outputs without a stack name; "
            "tear it down with: fab down --stack <name>"
        )
    cloud_stack.stack_down(inventory.stack, on_output=say)
    return f"stack {inventory.stack} destroyed (buckets retained); no instance of cluster {inventory.cluster_id} remains"


def _none(inventory: Inventory, say: Say) -> str:
    return f"{inventory.source}: lab machines are not torn down; the run's processes were stopped"


# What the on-node watchdog runs to power its own node off (``~/.fleetrun/poweroff``), per kind.
# Cloud nodes are created with instance-initiated shutdown = terminate, so a shutdown ends billing.
POWEROFF_HOOKS: dict[str, str] = {
    "local-fleet": '# local fleet: the fleet\'s power daemon (root) stops this node\ntouch "$HOME/.fleetrun/poweroff-request"\n',
    "pulumi-stack": "# cloud node: shutdown terminates the instance (instance-initiated shutdown = terminate)\n"
    "sudo -n /sbin/shutdown -h now || sudo -n /sbin/poweroff\n",
    "none": '# lab machine: fleetrun stops the run\'s processes but never powers the machine off\necho "lab machine: not powered off"\n',
}

TEARDOWNS: dict[str, Callable[[Inventory, Say], str]] = {
    "local-fleet": _local_fleet,
    "pulumi-stack": _pulumi_stack,
    "none": _none,
}


def tear_down(inventory: Inventory, say: Say = print) -> str:
    try:
        action = TEARDOWNS[inventory.teardown]
    except KeyError:
        raise FleetrunError(f"unknown teardown kind {inventory.teardown!r} for {inventory.source}") from None
    return action(inventory, say)
