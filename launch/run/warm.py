"""``keep_warm_s``: after a run, keep the fleet up that long instead of tearing it down.

A researcher who runs again in five minutes should not wait for a new cluster (SageMaker's warm
pools, SkyPilot's autostop); one who does not should not pay for an idle one. So when the
playbook's teardown would remove the fleet, each node instead gets a timer of its own
(``fleetrun_warm``, started detached): it powers the node off after ``keep_warm_s`` unless a new
run claimed the node, with or without the laptop. The next ``fab train`` on the same inventory
reuses the nodes: its sync sends only what changed and its setup is skipped while unchanged.

Only fleets whose nodes may power themselves off (stack and local fleets) are kept warm; lab
machines are never powered off, so there the playbook's teardown applies as it is.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from pathlib import Path

from launch.fleets.kinds.base import TeardownOutcome, TeardownState
from launch.fleets.kinds.registry import fleet_kind
from launch.job.inventory import Inventory
from launch.planning import remote_layout as layout
from launch.rules.stoprules import Teardown, should_teardown
from launch.transport.ssh import Fleet

TIMER = f"{layout.LIB}/fleetrun_warm.py"


def applies(inventory: Inventory, keep_warm_s: float | None) -> bool:
    """Whether a run on this inventory is kept warm instead of torn down."""
    return bool(keep_warm_s) and bool(getattr(fleet_kind(inventory.fleet), "can_power_off", False))


def wanted(policy: Teardown, outcome: str | None, teardown_state: str) -> bool:
    """Whether the playbook's own teardown would have removed the fleet after this run (and
    nothing blocked it: a node whose artifacts are not safe keeps the fleet up, warm or not)."""
    return should_teardown(policy, outcome) and teardown_state != "blocked"  # type: ignore[arg-type]


def arm(
    inventory: Inventory, known_hosts: Path, seconds: float, say: Callable[[str], None]
) -> dict[str, str]:
    """Start each node's timer; returns the nodes where it could not be started (name -> why)."""
    command = (
        # one simple command put in the background, its own fds redirected: nothing of it holds
        # the SSH channel open (a backgrounded ``a && b`` would, until the timer ended)
        f'mkdir -p "$HOME/{layout.ROOT}"; setsid nohup python3 "$HOME/{TIMER}" {shlex.quote(f"{seconds:g}")} '
        f'>> "$HOME/{layout.ROOT}/warm.log" 2>&1 < /dev/null & echo armed'
    )
    failed: dict[str, str] = {}
    with Fleet(inventory.hosts, known_hosts) as fleet:
        for name, result in fleet.run(command, timeout=30).items():
            if isinstance(result, BaseException):
                failed[name] = str(result)
            elif not result.ok or "armed" not in result.stdout:
                failed[name] = (result.stderr or result.stdout).strip()[-200:] or f"exit {result.exit_code}"
    for name, why in failed.items():
        say(f"  {name}: could not keep warm ({why}); tear it down by hand if it is not needed")
    say(f"  kept warm: each node powers itself off in {seconds:g} s unless a new run claims it")
    return failed


def kept_outcome(policy: Teardown, seconds: float) -> TeardownOutcome:
    """What the run's report says of its teardown when the fleet was kept warm instead."""
    return TeardownOutcome(
        TeardownState.SKIPPED,
        f"kept warm for {seconds:g} s instead (teardown: {policy.value}): each node powers itself off "
        "then unless a new run claims it",
    )
