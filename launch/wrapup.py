"""After a stop decision: stop every process, pull the artifacts, record, then (maybe) tear down.

The order is the point. Nothing is torn down before the artifacts are safe: a node whose run
directory could not be pulled blocks the teardown (it may hold the only copy), and the failure
is reported, never swallowed.
"""

from __future__ import annotations

import shlex
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from launch import remote_layout as layout
from launch.errors import FleetrunError, HostError
from launch.nodelib.fleetrun_protocol import StopAnswer, UploadAnswer
from launch.records import RunRecords
from launch.report import plot_loss, write_tensorboard
from launch.run_folder import RunFolder
from launch.ssh import Fleet, NodeConnection, openssh_command
from launch.stoprules import StopDecision, should_teardown
from launch.teardown import tear_down
from launch.watch import AGENT, Watcher, WatchTarget


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


def rsync_error(stderr: str, code: int) -> str:
    """The lines of rsync's stderr that say what failed (its last line is only the generic code)."""
    lines = [line.strip() for line in stderr.strip().splitlines() if line.strip()]
    specific = [line for line in lines if "rsync error" not in line][:3]
    generic = [line for line in lines if "rsync error" in line][-1:]
    return "; ".join(specific + generic) or f"rsync exit {code}"


def stop_all(fleet: Fleet, run_id: str, console: Console, grace: float = 10.0) -> dict[str, str]:
    """Stop every process of this run on every node (found by its run id: the whole tree)."""

    def stop(conn: NodeConnection) -> dict[str, Any]:
        result = conn.run(f"{AGENT} stop {shlex.quote(run_id)} {grace}", timeout=grace + 30)
        try:
            answer: dict[str, Any] = StopAnswer.from_json(result.stdout.strip().splitlines()[-1]).to_dict()
        except (ValueError, IndexError):
            raise HostError(conn.host.name, f"stop failed: {result.stderr.strip()[-200:]}") from None
        if answer.get("remaining"):
            raise HostError(conn.host.name, f"{answer['remaining']} process(es) survived SIGKILL")
        return answer

    errors: dict[str, str] = {}
    for name, res in fleet.map(stop, deadline=grace + 40).items():
        if isinstance(res, BaseException):
            errors[name] = str(res)
            console.print(f"  [red]{name}: could not confirm the run stopped: {res}[/]")
        elif res.get("terminated"):
            console.print(f"  {name}: stopped {res['terminated']} process(es) of the run still running")
    return errors


def pull(fleet: Fleet, run_id: str, folder: RunFolder, known_hosts: Path, console: Console) -> dict[str, str]:
    """Each node's run directory into the local run folder (rsync). Returns errors per host."""
    run_dir = layout.rundir(run_id)

    def pull_one(conn: NodeConnection) -> None:
        host = conn.host
        target = folder.node_dir(host.name)
        target.mkdir(parents=True, exist_ok=True)
        argv = [
            "rsync",
            "-az",
            "-e",
            shlex.join(openssh_command(host, known_hosts)),
            f"{host.user}@{host.address}:{run_dir}/",
            f"{target}/",
        ]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=3600, check=False)
        if proc.returncode != 0:
            raise HostError(host.name, rsync_error(proc.stderr, proc.returncode))

    errors = {
        name: str(r) for name, r in fleet.map(pull_one, deadline=3700).items() if isinstance(r, BaseException)
    }
    for name, err in errors.items():
        console.print(f"  [red]pulling artifacts from {name} failed: {err}[/]")
    return errors


def upload_to_bucket(fleet: Fleet, target: WatchTarget, console: Console) -> dict[str, str]:
    """Cloud fleets: each node copies its run directory to the job bucket with its instance role.

    The local pull is the copy teardown waits for; the bucket copy is reported, not blocking.
    """

    def upload(conn: NodeConnection) -> str:
        result = conn.run(target.upload_command(conn.host.name), timeout=3600)
        return UploadAnswer.from_json(result.stdout.strip().splitlines()[-1]).upload

    messages: dict[str, str] = {}
    for name, res in fleet.map(upload, deadline=3700).items():
        messages[name] = str(res)
        console.print(f"  {name}: {res}")
    return messages


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
