"""What a watcher needs to know about a run (``WatchTarget``), saved as ``watch.json`` in the run
folder so a watcher that died can be re-attached with ``fab watch RUN``.

Also renders each node's ``guard.json`` (the on-node watchdog's configuration). What differs
between fleet kinds (may the watchdog power its node off, how it copies the run directory to a
bucket) comes from the inventory's fleet kind, never from a cloud name here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from launch.errors import FleetrunError
from launch.fleets.kinds.registry import fleet_kind
from launch.job.inventory import Inventory
from launch.nodelib.fleetrun_protocol import GuardConfig
from launch.rules.stoprules import StopRules, Teardown

MAX_WATCH_JSON_BYTES = 64 * 1024**2
"""``watch.json`` grows with the inventory; a file larger than this is not one fleetrun wrote."""


def run_prefix(run_id: str) -> str:
    """A run's prefix in the fleet's bucket; its checkpoints are under ``<prefix>/checkpoints/``."""
    return f"runs/{run_id}"


def bucket_dest(run_id: str, node: str) -> str:
    """Where a node's run directory goes under the fleet's bucket."""
    return f"{run_prefix(run_id)}/{node}"


@dataclass(frozen=True)
class WatchTarget:
    """What a watcher needs to know about a run; saved as ``watch.json`` for re-attaching."""

    run_id: str
    job: str
    inventory: Inventory
    starters: tuple[str, ...]
    rules: StopRules
    teardown: Teardown
    started_at: float
    folder: Path
    instance_type: str | None = None
    attempt: int = 1
    """The attempt these nodes run (a re-attached watcher goes on counting from it)."""
    keep_warm_s: float | None = None
    """The teardown, when it removes the fleet, keeps it warm this long instead (``launch.run.warm``);
    None where the playbook asks for none or the fleet cannot power off (a lab's machines)."""
    sweep_id: str | None = None
    """The ``fab sweep`` this run is a variant of: its end keeps the fleet for the sweep's other
    variants while they need it (``launch.run.sweeps``), whichever command ends it."""

    def save(self) -> Path:
        data = {
            "run_id": self.run_id,
            "job": self.job,
            "inventory": self.inventory.to_yaml_data(),
            "starters": list(self.starters),
            "rules": self.rules.model_dump(mode="json"),
            "teardown": Teardown(self.teardown).value,
            "started_at": self.started_at,
            "instance_type": self.instance_type,
            "attempt": self.attempt,
            "keep_warm_s": self.keep_warm_s,
            "sweep_id": self.sweep_id,
        }
        path = self.folder / "watch.json"
        path.write_text(json.dumps(data, indent=2, default=str))
        return path

    def upload_argv(self, node: str) -> list[str] | None:
        """The command ``node`` runs to copy its run directory (``{src}``) to the fleet's bucket."""
        return fleet_kind(self.inventory.fleet).bucket_upload_argv(bucket_dest(self.run_id, node))

    def upload_env(self) -> dict[str, str]:
        """What that command needs in its environment (the local fleet's S3 key), never on its
        command line: the fleet's bucket commands' own environment."""
        commands = fleet_kind(self.inventory.fleet).bucket_commands(run_prefix(self.run_id))
        return dict(commands.env) if commands is not None else {}

    def guard_config(self, node: str) -> GuardConfig:
        """``guard.json`` for the on-node watchdog of ``node`` (``fleetrun_guard.py``).

        ``expects_metrics`` holds on nodes that start the job's processes: the job logs its
        metrics from rank 0, which runs on one of them (the head, for launchers whose head starts
        every rank); ranks other than 0 tell their node's watchdog so, see ``fleetrun_metrics``.
        What differs between fleet kinds (the bucket upload command) comes from the kind; whether
        the node may power off is in its ``~/.fleetrun/poweroff`` hook, also the kind's.
        """
        head = self.inventory.head
        rules = self.rules
        kind = fleet_kind(self.inventory.fleet)
        return GuardConfig(
            run_id=self.run_id,
            node=node,
            started_at=self.started_at,
            peers=tuple(h.private_address for h in self.inventory.hosts if h.name != node),
            peer_port=head.port,
            starts_processes=node in self.starters,
            expects_metrics=node in self.starters,
            watcher_lost_after_s=rules.watcher_lost_after_s,
            nan_loss=rules.nan_loss,
            stall_timeout_s=rules.stall_timeout_s,
            startup_timeout_s=rules.startup_timeout_s,
            max_wall_time_s=rules.max_wall_time_s,
            unreachable_timeout_s=rules.unreachable_timeout_s,
            upload_argv=tuple(self.upload_argv(node) or ()),
            upload_env=self.upload_env(),
            bucket=kind.bucket_commands(run_prefix(self.run_id)),
            preemption=kind.preemption_poller(),
        )

    @classmethod
    def load(cls, folder: Path) -> WatchTarget:
        path = folder / "watch.json"
        with path.open("rb") as fh:
            raw = fh.read(MAX_WATCH_JSON_BYTES + 1)
        if len(raw) > MAX_WATCH_JSON_BYTES:
            raise FleetrunError(
                f"{path} is over {MAX_WATCH_JSON_BYTES} bytes: not a watch.json fleetrun wrote"
            )
        try:
            data = json.loads(raw)
            return cls(
                run_id=data["run_id"],
                job=data["job"],
                inventory=Inventory.model_validate(data["inventory"]),
                starters=tuple(data["starters"]),
                rules=StopRules.model_validate(data["rules"]),
                teardown=Teardown(data["teardown"]),
                started_at=data["started_at"],
                folder=folder,
                instance_type=data.get("instance_type"),
                attempt=_attempt(data.get("attempt", 1)),
                keep_warm_s=_keep_warm(data.get("keep_warm_s")),
                sweep_id=_sweep_id(data.get("sweep_id")),
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:  # pydantic's errors are ValueErrors
            raise FleetrunError(
                f"{path} is not a watch.json fleetrun wrote: {type(exc).__name__}: {exc}"
            ) from None


def _attempt(value: object) -> int:
    """``attempt`` of a ``watch.json`` (untrusted): a whole number from 1 (older files have none)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 10_000:
        raise ValueError(f"attempt {value!r} is not a whole number from 1 to 10000")
    return value


def _keep_warm(value: object) -> float | None:
    """``keep_warm_s`` of a ``watch.json`` (untrusted): None, or seconds as the playbook allows."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 7 * 24 * 3600:
        raise ValueError(f"keep_warm_s {value!r} is not a number of seconds from 0 to 7 days")
    return float(value)


def _sweep_id(value: object) -> str | None:
    """``sweep_id`` of a ``watch.json`` (untrusted): None, or text that names a sweep's folder."""
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > 128:
        raise ValueError(f"sweep_id {str(value)[:100]!r} is not a sweep id")
    return value
