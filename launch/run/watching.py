"""Watching a run from the laptop, the same way for a new run and a re-attached one.

``build_watcher`` is the one place a ``Watcher`` is made with its heartbeat into the run record
(last metrics and the cost so far, so ``fab runs`` shows a live run's cost). ``watch_safely`` runs
it and turns any unexpected exception (a bug, a malformed answer nobody anticipated, a full disk)
into a ``failed`` decision with the traceback saved in the run folder: the caller then wraps the
run up (stop, pull, record, teardown per policy) instead of dying with the fleet still running.
"""

from __future__ import annotations

import time
import traceback
from pathlib import Path

from rich.console import Console

from launch.fleets.kinds.registry import fleet_kind
from launch.rules.energy import RunEnergy, resume_meter
from launch.rules.pricing import cost_so_far
from launch.rules.stoprules import Observation, StopDecision
from launch.run.clock import Clock
from launch.run.records import RunRecords
from launch.run.site_lost import SiteLost
from launch.run.summary import TRACEBACK_FILE
from launch.run.target import WatchTarget
from launch.run.watch import Watcher
from launch.transport.port import FleetPort

CRASH_RULE = "fleetrun_error"


def build_watcher(
    target: WatchTarget,
    fleet: FleetPort,
    console: Console,
    records: RunRecords,
    poll_interval: float = 1.0,
    completion_grace_s: float = 30.0,
    clock: Clock = time,
) -> Watcher:
    """A watcher whose every poll refreshes the run record's heartbeat, metrics, cost and energy.

    The energy goes into the record at every poll, per attempt (``launch.rules.energy``): a
    watcher that follows the same attempt later (``fab watch RUN``) starts its meter from the
    figure so far, and the run's total sums each attempt once."""
    record = records.get(target.run_id)
    energy = RunEnergy.from_json(record.energy_by_attempt if record is not None else None)

    def heartbeat(obs: Observation) -> None:
        nonlocal energy
        price = obs.price_per_node_hour
        cost = cost_so_far(obs.fleet_size, price, obs.elapsed_s) if price > 0 else None
        fields: dict[str, object] = {"last_metrics": dict(obs.metrics.last_metrics), "cost_usd": cost}
        kwh = watcher.rule_state.energy.kwh
        if kwh is not None:
            energy = energy.with_attempt(target.attempt, kwh)
            fields |= {"energy_kwh": energy.total_kwh, "energy_by_attempt": energy.to_json()}
        records.heartbeat(target.run_id, obs.now, **fields)

    watcher = Watcher(
        target,
        fleet,
        console,
        poll_interval=poll_interval,
        completion_grace_s=completion_grace_s,
        on_poll=heartbeat,
        clock=clock,
        push_exits=clock is time,  # exits pushed by the nodes are waited on in real time
        site_lost=SiteLost(fleet_kind(target.inventory.fleet).lost_nodes),
    )
    resume_meter(watcher.rule_state.energy, energy.of_attempt(target.attempt))
    return watcher


def save_traceback(folder: Path, exc: BaseException, where: str) -> Path:
    """Append ``exc``'s traceback to the run folder's ``traceback.txt`` (several may pile up)."""
    path = folder / TRACEBACK_FILE
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    with path.open("a", encoding="utf-8") as fh:
        fh.write(f"--- {where} at {time.strftime('%Y-%m-%d %H:%M:%S')} ---\n{text}\n")
    return path


def crash_decision(folder: Path, exc: BaseException, where: str) -> StopDecision:
    """A ``failed`` decision for an unexpected exception, its traceback saved first."""
    path = save_traceback(folder, exc, where)
    message = str(exc).splitlines()[0][:300] if str(exc) else ""
    return StopDecision(
        "failed",
        CRASH_RULE,
        f"fleetrun failed while {where}: {type(exc).__name__}{': ' + message if message else ''} "
        f"(traceback in {path})",
    )


def watch_safely(watcher: Watcher, folder: Path) -> StopDecision:
    """``watcher.run()``; an unexpected exception becomes a failed decision (KeyboardInterrupt passes)."""
    try:
        return watcher.run()
    except Exception as exc:  # noqa: BLE001 - the run must still be stopped, pulled and recorded
        return crash_decision(folder, exc, "watching the run")
