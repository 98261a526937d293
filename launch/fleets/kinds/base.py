"""The fleet-kind protocol and the teardown outcome every kind returns.

Pure: no I/O here. The kinds do their I/O (``LocalFleet.down``, ``pulumi destroy``) inside
``tear_down``, importing it lazily, so planning (which asks a kind for its power-off hook) stays
free of subprocess, paramiko and Pulumi.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, ClassVar, Protocol

if TYPE_CHECKING:
    from launch.job.fleet_refs import FleetRef
    from launch.job.inventory import Host, Inventory
    from launch.nodelib.fleetrun_protocol import BucketCommands

Say = Callable[[str], None]
Probe = Callable[["Host", float], bool]


class TeardownState(str, Enum):
    """How the "tear the fleet down" step of a run ended. Callers branch on this, never on text."""

    NOT_REQUESTED = "not_requested"
    """Nothing ran on the fleet (interrupted before the launch): nothing to decide."""
    SKIPPED = "skipped"
    """The playbook's policy keeps the fleet for this outcome (``never``, ``on_success`` + failure)."""
    BLOCKED = "blocked"
    """Some node's artifacts are not safe (stop or pull failed): the fleet is kept so nothing is lost."""
    KEPT = "kept"
    """The kind never removes its machines (lab machines); the run's processes were stopped."""
    DONE = "done"
    """The fleet was removed and the kind confirmed that nothing of it remains."""
    FAILED = "failed"
    """The teardown was attempted and did not finish, or left something behind (it may bill)."""


@dataclass(frozen=True)
class TeardownOutcome:
    state: TeardownState
    message: str

    def __str__(self) -> str:
        return f"{self.state.value}: {self.message}"

    @property
    def blocked(self) -> bool:
        return self.state is TeardownState.BLOCKED

    def to_json(self) -> dict[str, str]:
        return {"state": self.state.value, "message": self.message}


class InstanceLifetime(Protocol):
    """A time at which the cloud itself ends a fleet's instances, armed from the laptop for a
    kept-warm fleet (``launch.run.warm``): the backstop neither the nodes nor the laptop can
    miss. Only stack fleets have one (``launch.fleets.stack_lifetime``)."""

    def arm(self, until: float, say: Say) -> str:
        """End the instances at Unix time ``until`` (rounded up to the minute), replacing any
        lifetime armed before; returns what was armed, one line for the run's record. Raises
        ``FleetrunError`` when it could not be armed."""
        ...

    def disarm(self, say: Say) -> None:
        """Remove the lifetime (a run claimed the fleet). Raises ``FleetrunError`` on failure."""
        ...


class FleetKind(Protocol):
    """One kind of fleet. Instances are built from the inventory's fleet reference."""

    name: ClassVar[str]
    """The registry key, equal to the reference's ``kind``."""
    can_power_off: ClassVar[bool]
    """Whether the on-node watchdog may power its own node off (never for lab machines)."""

    def describe(self) -> str:
        """One line naming the fleet, for messages."""
        ...

    def poweroff_hook(self) -> str:
        """The shell script nodes install as ``~/.fleetrun/poweroff`` (the watchdog's last step)."""
        ...

    def bucket_upload_argv(self, dest: str) -> list[str] | None:
        """The command a node runs to copy its run directory (``{src}``) to ``dest`` under the
        fleet's bucket, or None when the fleet has no bucket."""
        ...

    def bucket_download_argv(self, src: str) -> list[str] | None:
        """The command a node runs to copy ``src`` under the fleet's bucket into a local folder
        (``{dest}``): a playbook's ``{bucket: ...}`` data channel. None when the fleet has no bucket."""
        ...

    def bucket_commands(self, prefix: str) -> BucketCommands | None:
        """How nodes copy checkpoints to and from ``prefix`` under the fleet's bucket (the checkpoint
        helper, the watchdog before a node goes), or None without a bucket."""
        ...

    def preemption_poller(self) -> str:
        """The preemption-notice poller the watchdog runs (``fleetrun_protocol.POLLERS``), or ""."""
        ...

    def acquire(self, inventory: Inventory, nodes: int, job_name: str, say: Say, wait: bool) -> Inventory:
        """The machines for one run, before it is planned: the inventory as it is where they
        exist already (lab, local, stack); a scheduler's kind asks for ``nodes`` of them and
        gives the inventory of what it got, its reference naming what it holds (Slurm's job
        id), waiting in its queue only with ``wait``. May raise ``FleetrunError``."""
        ...

    def health(self) -> list[tuple[str, str]]:
        """``fab doctor``'s checks of the fleet itself, before its nodes: (level, line) with level
        ``ok``, ``warning`` or ``error`` (a scheduler's login host and partition); none where
        the nodes are the whole fleet."""
        ...

    def lost_nodes(self, names: list[str]) -> dict[str, str]:
        """The nodes among ``names`` that the fleet itself says are gone while they may still
        answer SSH (a scheduler marked them DOWN or DRAIN): name -> why, in the fleet's words.
        The watcher asks this as it polls, the recovery before it replaces nodes; empty where
        the nodes are the whole truth (lab, local, stack). May raise ``FleetrunError``."""
        ...

    def holding(self) -> FleetRef:
        """The fleet's reference as it stands now, naming everything the run holds: a
        scheduler's kind adds the allocations its ``replace``/``renew`` made (Slurm's job ids)
        to the one ``acquire`` named. The recovery puts it in the run's inventory and record,
        so the next attempt's plan, ``fab runs`` and ``fab show`` name every allocation; the
        reference as it was given where nothing is asked for per run."""
        ...

    def release(self, say: Say) -> None:
        """Give back what ``acquire`` took, for a run that ends before it starts (its teardown
        does it otherwise); nothing where ``acquire`` took nothing."""
        ...

    def tear_down(self, say: Say) -> TeardownOutcome:
        """Remove the fleet and confirm nothing remains. May raise ``FleetrunError``."""
        ...

    def tags(self) -> dict[str, str]:
        """The tags/labels that mark this fleet's resources (what a leftovers audit looks for)."""
        ...

    def lifetime(self) -> InstanceLifetime | None:
        """The cloud-side lifetime of a kept-warm fleet, or None: lab machines are never powered
        off (promise 3), and a local fleet has no cloud (its laptop timer keeps its deadline)."""
        ...

    def replace(self, host: Host, say: Say, timeout_s: float, probe: Probe | None = None) -> Host | None:
        """A working machine in place of ``host``, which a run lost (``recovery:``): its ``Host``,
        with the new pinned host key when the machine is new, or None when this kind cannot give
        one within ``timeout_s`` (the run then goes on without it when elastic, else fails).
        The old machine's processes are assumed gone; only the new one is synced and set up.
        ``probe(host, timeout)``: whether the host's sshd answers, asked as the run reaches it
        (through its jump host; ``Fleet.answers``); a direct TCP connect when not given."""
        ...

    def renew(self, host: Host, say: Say, timeout_s: float, probe: Probe | None = None) -> Host | None:
        """A new machine in place of ``host``, which still answers but must not be used again in
        this run (a ``gpu_fault``, a straggler ``exclude``): its ``Host`` (same name, the new
        address and pinned host key), or None when this kind does not make machines (lab machines
        are other people's: fleetrun never powers them off or renews them) or cannot make one
        within ``timeout_s``. The run's processes on ``host`` were stopped already; what is left
        of it is the kind's to end (a cloud instance is terminated by its replacement).
        ``probe`` as for ``replace``. Recovery asks for this only when no spare of the inventory
        is left, and asks once per recovery (``launch.run.attempts.take_spare``)."""
        ...


class StandingMachines:
    """``acquire`` and ``release`` of a kind whose machines exist before any run (lab machines,
    the local fleet, a stack): nothing to ask for, nothing to give back per run."""

    def acquire(self, inventory: Inventory, nodes: int, job_name: str, say: Say, wait: bool) -> Inventory:
        return inventory

    def release(self, say: Say) -> None:
        return None

    def health(self) -> list[tuple[str, str]]:
        return []

    def lost_nodes(self, names: list[str]) -> dict[str, str]:
        """None: no scheduler stands between the run and these machines."""
        return {}


class SiteMachines:
    """What a kind whose machines belong to the site (lab machines, a Slurm cluster's nodes) answers
    alike: fleetrun never powers them off (promise 3), so no instance lifetime; no bucket of the
    fleet's own; no preemption notices to poll."""

    can_power_off: ClassVar[bool] = False

    def bucket_upload_argv(self, dest: str) -> list[str] | None:
        return None

    def bucket_download_argv(self, src: str) -> list[str] | None:
        return None

    def bucket_commands(self, prefix: str) -> BucketCommands | None:
        return None

    def preemption_poller(self) -> str:
        return ""

    def lifetime(self) -> InstanceLifetime | None:
        """Never: a site's machines are not fleetrun's to end (promise 3)."""
        return None


UPLOAD_SOURCE = "{src}"
"""Placeholder in an upload argv for the node's run directory (filled in on the node)."""
