"""A run's state and its context: what the life cycle's stages take and give back.

``RunState`` is the run as it stands: the plan, the inventory and its pinned host keys, which
attempt this is, the rendezvous port, the checkpoint the attempt resumes from, which nodes hold
the current node library, the attempts that ended, and where the time went. It is frozen: a
stage returns a new one (``dataclasses.replace``), so no stage edits what another stage holds,
and what a stage changed is its return value.

``RunContext`` is what the stages work with and do not change: the machines (a ``FleetPort``),
the rsync steps, the reporter, the run records, the run folder, the clock and the options. It
is replaced only when the machines change (a later attempt on replaced nodes gets a new port).
The clock goes in here, so the unit tests drive the whole life cycle, recovery included, on a
fake clock and a fake fleet (``tests/fakefleet.py``).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from launch.job.inventory import Host, Inventory
from launch.job.spec import JobSpec
from launch.planning.plan import LaunchPlan, NodePlan
from launch.rules.metrics_stream import LossPoint
from launch.rules.recovery import AttemptEnd, Drained, Renewal
from launch.run.clock import Clock
from launch.run.records import RunRecords
from launch.run.reporter import Reporter
from launch.run.run_folder import RunFolder
from launch.run.target import WatchTarget
from launch.run.transfers import Transfers
from launch.settings import DEFAULT_FANOUT
from launch.transport.port import FleetPort

if TYPE_CHECKING:
    from launch.run.peer_copies import PeerCopies
    from launch.run.queue_turn import QueueHold

AskKeepRunning = Callable[[str], bool]
"""Asked on Ctrl-C while watching (with the run id): True keeps the job running on its nodes."""


@dataclass
class RunOptions:
    poll_interval: float = 1.0
    max_parallel: int = DEFAULT_FANOUT
    completion_grace_s: float = 30.0
    allow_busy_gpus: bool = False
    """Start even where other users' processes hold the GPUs this run would use."""
    skip_doctor: bool = False
    """Launch without the pre-launch doctor checks (connect and the node library check still run)."""
    spares: tuple[Host, ...] = ()
    """Healthy hosts of the inventory the job did not take: a host left out after a ``gpu_fault``
    is replaced by the first one still unused."""


@dataclass(frozen=True)
class RunContext:
    """What the stages use and never change (see the module docstring)."""

    spec: JobSpec
    port: FleetPort
    folder: RunFolder
    records: RunRecords
    reporter: Reporter
    transfers: Transfers = field(default_factory=Transfers)
    options: RunOptions = field(default_factory=RunOptions)
    clock: Clock = time
    ask_keep_running: AskKeepRunning | None = None
    peers: PeerCopies | None = None
    """The run's recorded saves and their copies to a peer node (``launch.run.peer_copies``):
    every attempt's watcher feeds it; the checkpoint spread before a later attempt reads it."""
    hold: QueueHold | None = None
    """The run's turn on shared machines (``launch.run.queue_turn``): released once the wrap-up's
    teardown is over, before the ``on_end`` hooks run (``launch.run.lifecycle.wrap_up_run``)."""

    def with_port(self, port: FleetPort) -> RunContext:
        return dataclasses.replace(self, port=port)


@dataclass(frozen=True)
class RunState:
    """A run as it stands between two stages (see the module docstring). Never edited."""

    plan: LaunchPlan
    inventory: Inventory
    known_hosts: Path
    target: WatchTarget
    """What a watcher needs (``watch.json``): re-attaching starts from it."""
    attempt: int = 1
    """Sent to every node as ``attempt`` with ``launch.sh`` (``FLEETRUN_ATTEMPT``)."""
    rdzv_port: int | None = None
    resume_from: str | None = None
    """For a later attempt: the checkpoint every node resumes from (``FLEETRUN_RESUME_FROM``)."""
    resume_record: str | None = None
    """Where the coming attempt resumes from and why (the attempt record's ``resumed_from``)."""
    drained: tuple[Drained, ...] = ()
    """Each preempted node's drain before its replacement (``launch.run.drain``), for the record
    of the attempt that just ended."""
    renewed: tuple[Renewal, ...] = ()
    """Nodes the recovery under way gave a new machine (``FleetKind.renew``), for the record of
    the attempt that just ended."""
    not_taken: tuple[tuple[str, str], ...] = ()
    """Machines the recovery under way checked and did not take (a spare or a new machine with a
    bad GPU), each with why, for the record of the attempt that just ended."""
    grace_cut: tuple[str, ...] = ()
    """Survivors whose ranks the stop killed without their grace (none was stepping: blocked with
    the lost peer), for the record of the attempt that just ended."""
    lib_current: frozenset[str] = frozenset()
    """Nodes whose copy of the node library is current (the sync skips it there)."""
    started_job: bool = False
    """Whether anything was started on a node: from then on every exit stops and pulls first."""
    timings: Mapping[str, float] = field(default_factory=dict)
    """Seconds per stage of the run's first start (and of the wrap-up), kept in ``summary.json``."""
    recovery_timings: Mapping[str, float] = field(default_factory=dict)
    """Seconds per step of the recovery now under way (recorded with the attempt it starts)."""
    started_by: Mapping[str, float] = field(default_factory=dict)
    """The same for the recovery that started the current attempt."""
    ended: tuple[AttemptEnd, ...] = ()
    """The attempts that ended, oldest first."""
    histories: tuple[tuple[int, tuple[LossPoint, ...]], ...] = ()
    """Each ended attempt's loss history (for the plot across attempts)."""
    false_alarms: int = 0
    """Times the unreachable rule fired and every node it named answered a re-check."""

    @property
    def hosts(self) -> list[Host]:
        return [n.host for n in self.plan.nodes]

    @property
    def nodes(self) -> dict[str, NodePlan]:
        return {n.host.name: n for n in self.plan.nodes}

    def timed(self, step: str, seconds: float) -> RunState:
        """This state with ``step``'s time added: to the run's timings during the first start,
        to the recovery's when a later attempt is being started."""
        if self.attempt > 1:
            return self.recovery_timed(step, seconds)
        return dataclasses.replace(self, timings={**self.timings, step: seconds})

    def recovery_timed(self, step: str, seconds: float) -> RunState:
        return dataclasses.replace(self, recovery_timings={**self.recovery_timings, step: seconds})
