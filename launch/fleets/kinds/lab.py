"""Lab machines: a static hosts.yaml of machines the lab owns. Untrusted input, never torn down.

The file is the user's (often copied, edited, shared), so it may say only which hosts exist and
how to reach them: ``defaults`` and ``hosts``. Anything that decides what fleetrun destroys or
powers off (``teardown``, ``stack``, ``cluster_id``, ``bucket``, ``cloud``, ``fleet``) is refused
with one line naming the file and the key, so a copy of the local fleet's own inventory.yaml, or
a file with ``teardown: pulumi-stack``, cannot power off lab machines or destroy a stack. The
inventory it returns is always a ``LabFleet``: no power-off, no bucket, teardown keeps the machines.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from launch.fleets.kinds.base import (
    Probe,
    Say,
    SiteMachines,
    StandingMachines,
    TeardownOutcome,
    TeardownState,
)
from launch.fleets.kinds.refs import LabFleet
from launch.job.inventory import (  # noqa: F401 - re-exported: the registry loads labs from here
    ALLOWED_KEYS,
    REFUSED_KEYS,
    load_lab_inventory,
)
from launch.planning.remote_layout import NO_POWEROFF_HOOK

if TYPE_CHECKING:
    from launch.job.inventory import Host

REPLACE_POLL_S = 5.0


POWEROFF_HOOK = NO_POWEROFF_HOOK


class LabKind(StandingMachines, SiteMachines):
    name: ClassVar[str] = "lab"

    def __init__(self, ref: LabFleet) -> None:
        self.ref = ref

    def holding(self) -> LabFleet:
        """The reference as given: these machines are not asked for per run."""
        return self.ref

    def describe(self) -> str:
        return "lab machines"

    def poweroff_hook(self) -> str:
        return POWEROFF_HOOK

    def tear_down(self, say: Say) -> TeardownOutcome:
        return TeardownOutcome(
            TeardownState.KEPT, "lab machines are never torn down; the run's processes were stopped"
        )

    def tags(self) -> dict[str, str]:
        return {}

    def replace(self, host: Host, say: Say, timeout_s: float, probe: Probe | None = None) -> Host | None:
        """Lab machines are not made by fleetrun: wait (up to ``timeout_s``) for the host's sshd to
        answer again (a reboot, a network fixed) and give back the same host, its pinned key
        unchanged (a changed key is still refused when the run connects). None when it stays away.

        ``probe`` asks as the run reaches the host: a host behind a jump host through it (this
        machine has no route to its address; ``Fleet.answers``). Without one, a direct check."""
        from launch.transport.reachability import wait_for_sshd

        say(f"{host.name}: lab machine; waiting up to {timeout_s:.0f} s for it to answer again")
        return host if wait_for_sshd(host, timeout_s, poll_s=REPLACE_POLL_S, check=probe) else None

    def renew(self, host: Host, say: Say, timeout_s: float, probe: Probe | None = None) -> Host | None:
        """None: a lab machine is not fleetrun's to power off, wipe or swap (only fleetrun's own
        files on it are); a bad one is left out of the run, and a spare of the inventory, if any,
        takes its place before this is asked."""
        say(f"{host.name}: lab machine; fleetrun never renews or powers one off")
        return None
