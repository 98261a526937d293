"""One run as the run records keep it (``launch.run.records`` stores it in SQLite).

Plain data, here with the views that render it (``launch.reports.views``, ``launch.reports.compare``),
so the reports read records without importing the SQLite store of the layer above them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Literal

RunState = Literal["running", "succeeded", "failed", "stopped", "interrupted"]


@dataclass(frozen=True)
class RunRecord:
    """One run as stored; JSON columns are decoded."""

    id: str
    playbook_path: str | None
    playbook_name: str | None
    playbook_hash: str | None
    git_commit: str | None
    inventory: dict[str, Any]
    launcher: str | None
    started_at: float
    ended_at: float | None
    state: RunState
    stop_rule: str | None
    stop_reason: str | None
    exit_codes: dict[str, int | None]
    last_metrics: dict[str, Any]
    cost_usd: float | None
    run_dir: str | None
    artifacts: list[str] = field(default_factory=list)
    watcher_pid: int | None = None
    watcher_host: str | None = None
    heartbeat_at: float | None = None
    hyperparameters: dict[str, Any] = field(default_factory=dict)
    attempts: list[dict[str, Any]] = field(default_factory=list)
    """With ``recovery:``: one entry per attempt (``launch.rules.recovery.AttemptEnd.to_json``)."""
    overrides: dict[str, Any] = field(default_factory=dict)
    """``--set key=value`` of the run: dotted key -> value (``launch.job.overrides``)."""
    sweep_id: str | None = None
    """The ``fab sweep`` this run is a variant of, if any."""
    energy_kwh: float | None = None
    """GPU energy over every attempt so far (kWh); None without GPU power readings, never 0 for unknown."""
    energy_by_attempt: dict[str, Any] = field(default_factory=dict)
    """Each attempt's GPU energy: attempt number (text) -> kWh (``launch.rules.energy.RunEnergy``)."""

    @property
    def scheduler_jobs(self) -> str:
        """The scheduler allocations the run was given (a Slurm cluster's job ids, from the
        inventory it recorded: ``fleet.job_ids``), comma-separated; "" for a fleet without."""
        fleet = self.inventory.get("fleet") if isinstance(self.inventory, dict) else None
        ids = fleet.get("job_ids") if isinstance(fleet, dict) else None
        if not isinstance(ids, list):
            return ""
        return ",".join(str(i) for i in ids[:8] if isinstance(i, int) and not isinstance(i, bool))

    def duration_s(self, now: float | None = None) -> float:
        """Seconds from start to end (or to ``now`` while not ended)."""
        end = self.ended_at if self.ended_at is not None else (now if now is not None else time.time())
        return max(0.0, end - self.started_at)
