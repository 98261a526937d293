"""After a stop decision: stop every process, pull the artifacts, record, then (maybe) tear down.

The order is the point. Nothing is torn down before the artifacts are safe: a node whose run
directory could not be pulled blocks the teardown (it may hold the only copy), and the failure
is reported, never swallowed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from launch.errors import FleetrunError
from launch.fleets.teardown import tear_down
from launch.reports.plot import plot_loss
from launch.reports.tensorboard import write_tensorboard
from launch.rules.stoprules import StopDecision, should_teardown
from launch.run.artifacts import pull, revoke_cluster_keys, stop_all, upload_to_bucket
from launch.run.records import RunRecords
from launch.run.run_folder import RunFolder
from launch.run.watch import Watcher, WatchTarget
from launch.transport.ssh import Fleet


@dataclass
class RunResult:
    run_id: str
    outcome: str  # succeeded | failed | stopped
    rule: str
    reason: str
    folder: Path
    exit_codes: dict[str, int | None]
    failed_nodes: tuple[str, ...] = ()
    first_step_after_s: float | None = None
    last_metrics: dict[str, Any] = field(default_factory=dict)
    world: dict[str, Any] | None = None
    pull_errors: dict[str, str] = field(default_factory=dict)
    stop_errors: dict[str, str] = field(default_factory=dict)
    teardown: str = "not requested"
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.outcome == "succeeded"

    @property
    def failed_node(self) -> str | None:
        return self.failed_nodes[0] if self.failed_nodes else None


def write_reports(folder: RunFolder, console: Console) -> None:
    if not (folder.path / "metrics.jsonl").exists():
        return
    records, summary = folder.read_metrics()
    history = summary.history
    try:
        if len(history):
            plot_loss(history, folder.path / "loss.png", title=folder.path.name)
        write_tensorboard(records, folder.path / "tensorboard")
    except Exception as exc:  # noqa: BLE001 - a plot must never hide the run's outcome
        console.print(f"  [yellow]could not write the loss plot / TensorBoard files: {exc}[/]")


def wrap_up(
    target: WatchTarget,
    fleet: Fleet,
    decision: StopDecision,
    records: RunRecords,
    known_hosts: Path,
    console: Console,
    watcher: Watcher | None = None,
    started_job: bool = True,
    timings: dict[str, float] | None = None,
) -> RunResult:
    decided_at = time.time()
    teardown_started_at: float | None = None
    folder = RunFolder(target.folder)
    stop_errors: dict[str, str] = {}
    pull_errors: dict[str, str] = {}
    try:
        if started_job:
            console.print(f"[bold]{decision.outcome}[/] ({decision.rule}): {decision.reason}")
            console.print("stopping anything left of the run on the nodes, then pulling artifacts")
            stop_errors = stop_all(fleet, target.run_id, console)
            pull_errors = pull(fleet, target.run_id, folder, known_hosts, console)
            if target.inventory.bucket:
                upload_to_bucket(fleet, target, console)
    finally:
        for name, err in revoke_cluster_keys(fleet).items():
            console.print(f"  {name}: could not revoke the run's cluster SSH key: {err}", markup=False)
        fleet.close()
    rank0_node = folder.collect_rank0_files() if started_job else None
    write_reports(folder, console)

    exit_codes: dict[str, int | None] = {}
    first_step = None
    last_metrics: dict[str, Any] = {}
    world = None
    if watcher is not None:
        exit_codes = {n.name: n.rc for n in watcher.nodes.values()}
        summary = watcher.metrics()
        last_metrics = dict(summary.last_metrics)
        if summary.last_step is not None:
            last_metrics["step"] = summary.last_step
        world = dict(summary.world) if summary.world else None
        if watcher.first_step_at is not None:
            first_step = watcher.first_step_at - target.started_at

    teardown = "not requested"
    if started_job or decision.rule.endswith("_failed"):
        if not should_teardown(target.teardown, decision.outcome):
            teardown = f"skipped (teardown: {target.teardown}, outcome {decision.outcome})"
        elif pull_errors or stop_errors:
            blocked = sorted({*pull_errors, *stop_errors})
            teardown = (
                f"blocked: artifacts of {', '.join(blocked)} are not safe (pull or stop failed); "
                "the fleet is kept so nothing is lost; fix and re-run 'fab watch' or tear down by hand"
            )
        else:
            teardown_started_at = time.time()
            try:
                teardown = tear_down(target.inventory, say=lambda m: console.print(f"  {m}"))
            except FleetrunError as exc:
                teardown = f"failed: {exc}"
    console.print(f"  teardown: {teardown}")

    result = RunResult(
        run_id=target.run_id,
        outcome=decision.outcome,
        rule=decision.rule,
        reason=decision.reason,
        folder=folder.path,
        exit_codes=exit_codes,
        failed_nodes=decision.nodes if decision.outcome == "failed" else (),
        first_step_after_s=first_step,
        last_metrics=last_metrics,
        world=world,
        pull_errors=pull_errors,
        stop_errors=stop_errors,
        teardown=teardown,
        timings=timings or {},
    )
    records.finish(
        target.run_id,
        state=decision.outcome,  # type: ignore[arg-type]
        stop_rule=decision.rule,
        stop_reason=decision.reason,
        exit_codes=exit_codes,
        last_metrics=last_metrics,
        artifacts=folder.artifacts(),
    )
    folder.write_json(
        "summary.json",
        {
            "run_id": target.run_id,
            "job": target.job,
            "outcome": decision.outcome,
            "rule": decision.rule,
            "reason": decision.reason,
            "failed_nodes": list(result.failed_nodes),
            "exit_codes": exit_codes,
            "first_step_after_s": first_step,
            "last_metrics": last_metrics,
            "world": world,
            "rank0_node": rank0_node,
            "pull_errors": pull_errors,
            "stop_errors": stop_errors,
            "teardown": teardown,
            "timings": result.timings,
            "nodes": [h.name for h in target.inventory.hosts],
            "decided_at": decided_at,
            "teardown_started_at": teardown_started_at,
            "ended_at": time.time(),
        },
    )
    return result
