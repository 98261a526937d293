"""Run a launch plan on a fleet: preflight, sync, setup, start, follow, stop, pull.

SkyPilot's sequence with barriers between steps (nothing starts unless every node passed the
previous step) and its failure semantics: the first non-zero exit (or a vanished process) on any
node stops the others and fails the run, naming the node. Artifacts are pulled before anything
is declared finished; a pull failure is reported, never swallowed.
"""

from __future__ import annotations

import contextlib
import json
import shlex
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from launch import remote_layout as layout
from launch.errors import HostError
from launch.inventory import Host
from launch.plan import LaunchPlan, NodePlan
from launch.run_folder import RunFolder
from launch.spec import JobSpec
from launch.ssh import Fleet, NodeConnection, openssh_command
from launch.sync import SyncResult, sync_all

AGENT = f'python3 "$HOME/{layout.AGENT}"'


@dataclass
class NodeStatus:
    """What the laptop knows about one node's process, updated every poll."""

    name: str
    state: str = "pending"
    rc: int | None = None
    exited_at: float | None = None
    offset: int = 0
    last_seen: float = field(default_factory=time.monotonic)
    log_tail: str = ""


@dataclass
class RunResult:
    run_id: str
    outcome: str  # succeeded | failed | stopped
    reason: str
    folder: Path
    exit_codes: dict[str, int | None]
    failed_node: str | None = None
    first_step_after_s: float | None = None
    last_metrics: dict[str, Any] = field(default_factory=dict)
    world: dict[str, Any] | None = None
    pull_errors: dict[str, str] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.outcome == "succeeded"


class StepFailed(Exception):
    """A pre-launch step failed on some hosts; nothing was started."""

    def __init__(self, step: str, errors: dict[str, BaseException]) -> None:
        self.step = step
        self.errors = errors
        detail = "; ".join(f"{name}: {_msg(exc)}" for name, exc in errors.items())
        super().__init__(f"{step} failed on {', '.join(errors)}: {detail}")


def _msg(exc: BaseException) -> str:
    text = str(exc)
    if isinstance(exc, HostError) and text.startswith(f"{exc.host}: "):
        return text[len(exc.host) + 2 :]
    return text or type(exc).__name__


class Runner:
    """Executes one ``LaunchPlan``. I/O lives here; decisions live in the plan and the spec."""

    def __init__(
        self,
        spec: JobSpec,
        plan: LaunchPlan,
        known_hosts: Path,
        folder: RunFolder,
        console: Console | None = None,
        poll_interval: float = 1.0,
        unreachable_after: float = 60.0,
        max_parallel: int = 32,
    ) -> None:
        self.spec = spec
        self.plan = plan
        self.known_hosts = known_hosts
        self.folder = folder
        self.console = console or Console()
        self.poll_interval = poll_interval
        self.unreachable_after = unreachable_after
        self.hosts: list[Host] = [n.host for n in plan.nodes]
        self.nodes: dict[str, NodePlan] = {n.host.name: n for n in plan.nodes}
        self.status: dict[str, NodeStatus] = {h.name: NodeStatus(h.name) for h in self.hosts}
        self.fleet = Fleet(self.hosts, known_hosts, max_parallel=max_parallel)
        self.metrics: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self.final_status: dict[str, Any] | None = None
        self._partial: dict[str, str] = {}
        self.timings: dict[str, float] = {}

    # -- steps -----------------------------------------------------------------------------------
    def _progress(self) -> Progress:
        return Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=self.console,
            transient=False,
        )

    def _fan_out(
        self, step: str, fn: Callable[[NodeConnection], Any], hosts: list[Host] | None = None
    ) -> dict[str, Any]:
        started = time.monotonic()
        targets = self.hosts if hosts is None else hosts
        with self._progress() as progress:
            task = progress.add_task(f"{step:<9}", total=len(targets))
            results = self.fleet.map(fn, hosts=targets, on_done=lambda _n, _r: progress.advance(task))
        self.timings[step] = time.monotonic() - started
        errors = {name: r for name, r in results.items() if isinstance(r, BaseException)}
        if errors:
            raise StepFailed(step, errors)
        return results

    def preflight(self) -> None:
        """Connect to every node (pinned host keys) before anything is changed anywhere."""

        def check(conn: NodeConnection) -> str:
            result = conn.run(
                "command -v rsync >/dev/null && command -v python3 >/dev/null && echo ok", timeout=30
            )
            if not result.ok or "ok" not in result.stdout:
                raise HostError(conn.host.name, "rsync and python3 must be installed on the node")
            return result.stdout

        self._fan_out("connect", check)

    def sync(self) -> dict[str, SyncResult]:
        started = time.monotonic()
        with self._progress() as progress:
            task = progress.add_task(f"{'sync':<9}", total=len(self.hosts))
            results = sync_all(
                self.hosts,
                self.spec.workdir,
                self.spec.name,
                self.known_hosts,
                on_done=lambda _n, _r: progress.advance(task),
            )
        self.timings["sync"] = time.monotonic() - started
        errors = {n: r for n, r in results.items() if isinstance(r, BaseException)}
        if errors:
            raise StepFailed("sync", errors)
        for name, res in results.items():
            assert isinstance(res, SyncResult)
            self.console.print(f"  {name}: sync sent {res.files_sent} file(s), {res.bytes_sent} bytes")
        return {n: r for n, r in results.items() if isinstance(r, SyncResult)}

    def setup(self) -> dict[str, str]:
        """Per-node environment + setup commands; skipped (with the reason) when unchanged."""

        def run_setup(conn: NodeConnection) -> str:
            node = self.nodes[conn.host.name]
            for remote_file in node.files:
                conn.put_file(remote_file.path, remote_file.content, remote_file.mode)
            result = conn.run(f"sh -c {shlex.quote(node.setup_script)}", timeout=3600)
            old = ""
            for line in result.stdout.splitlines():
                if line.startswith("FLEETRUN_OLD_HASH="):
                    old = line.split("=", 1)[1].strip()
            if not result.ok:
                tail = (result.stderr or result.stdout).strip().splitlines()[-5:]
                raise HostError(conn.host.name, f"setup exited {result.exit_code}: {' / '.join(tail)}")
            if "FLEETRUN_SETUP=skipped" in result.stdout:
                return f"setup skipped: unchanged (hash {node.setup_hash})"
            if not old:
                return f"setup ran: first setup of job {self.spec.name} on this node (hash {node.setup_hash})"
            return f"setup ran: setup commands or requirements changed (hash {old} -> {node.setup_hash})"

        results = self._fan_out("setup", run_setup)
        for name, reason in results.items():
            self.console.print(f"  {name}: {reason}")
        return results

    def start(self) -> None:
        run_dir = layout.rundir(self.plan.run_id)

        def start_node(conn: NodeConnection) -> None:
            node = self.nodes[conn.host.name]
            assert node.launch_script is not None
            delimiter = f"FLEETRUN_EOF_{self.plan.run_id.replace('-', '_')}"
            command = (
                f'mkdir -p "$HOME/{run_dir}" && cat > "$HOME/{run_dir}/launch.sh" <<\'{delimiter}\'\n'
                f"{node.launch_script}{delimiter}\n"
                f'{AGENT} start "$HOME/{run_dir}"'
            )
            result = conn.run(command, timeout=60)
            if not result.ok:
                raise HostError(conn.host.name, f"could not start: {result.stderr.strip()[-300:]}")
            self.status[conn.host.name].state = "running"

        starters = [n.host for n in self.plan.nodes if n.starts_processes]
        for node in self.plan.nodes:
            if not node.starts_processes:
                self.status[node.host.name].state = "managed"
        self._fan_out("start", start_node, hosts=starters)

    # -- following ---------------------------------------------------------------------------------
    def _poll_node(self, conn: NodeConnection) -> dict[str, Any]:
        status = self.status[conn.host.name]
        run_dir = layout.rundir(self.plan.run_id)
        result = conn.run(f'{AGENT} poll "$HOME/{run_dir}" {status.offset}', timeout=30)
        if not result.ok:
            raise HostError(conn.host.name, f"poll failed: {result.stderr.strip()[-200:]}")
        answer: dict[str, Any] = json.loads(result.stdout)
        return answer

    def _absorb(self, name: str, answer: dict[str, Any] | BaseException, now: float) -> None:
        status = self.status[name]
        if isinstance(answer, BaseException):
            if status.state not in ("exited", "vanished"):
                status.state = "unreachable"
            return
        status.last_seen = now
        status.log_tail = answer.get("log_tail") or ""
        state = answer.get("state", "absent")
        if not self.nodes[name].starts_processes:
            state = "managed"  # started by the head's launcher: reachability and metrics only
        status.state = "vanished" if state == "absent" else state
        status.rc = answer.get("rc")
        status.exited_at = answer.get("exited_at")
        chunk = self._partial.pop(name, "") + (answer.get("metrics") or "")
        status.offset = int(answer.get("offset", status.offset))
        lines = chunk.split("\n")
        if lines and lines[-1]:
            self._partial[name] = lines[-1]
        for line in lines[:-1]:
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if "event" in record:
                self.events.append(record)
            elif "step" in record:
                self.metrics.append(record)
        if answer.get("status"):
            self.final_status = answer["status"]

    def _decide(self, now: float) -> tuple[str, str, str | None] | None:
        """(outcome, reason, node) once the run is over; None while it goes on.

        When several nodes have failed by the time we look, the one that exited first is named:
        the others usually fail because of it (their peers' connections closed).
        """
        failed = [
            (st.exited_at or 0.0, name, st)
            for name, st in self.status.items()
            if st.state == "exited" and st.rc not in (0, None)
        ]
        if failed:
            _, name, st = min(failed, key=lambda item: item[0])
            others = [n for _, n, _ in failed if n != name]
            also = f" (then {', '.join(others)} failed too)" if others else ""
            return "failed", f"{name}: training process exited with code {st.rc}{also}", name
        for name, st in self.status.items():
            if st.state == "vanished":
                return "failed", f"{name}: training process vanished (killed, no exit code recorded)", name
            if st.state == "unreachable" and now - st.last_seen > self.unreachable_after:
                return "failed", f"{name}: unreachable for {now - st.last_seen:.0f} s", name
        if all(st.state == "exited" and st.rc == 0 for st in self.status.values() if st.state != "managed"):
            return "succeeded", "every node's processes exited 0", None
        return None

    def _table(self, started: float) -> Table:
        last = next((m for m in reversed(self.metrics) if "loss" in m), None)
        title = f"run {self.plan.run_id}  elapsed {time.monotonic() - started:.0f} s"
        if last is not None:
            title += f"  step {last['step']}  loss {last['loss']:.4f}"
        table = Table(title=title, expand=False)
        for column in ("node", "rank", "address", "state", "exit", "last log line"):
            table.add_column(column)
        for node in self.plan.nodes:
            st = self.status[node.host.name]
            tail = st.log_tail.strip().splitlines()[-1][:60] if st.log_tail.strip() else ""
            color = {
                "running": "green",
                "exited": "cyan" if st.rc == 0 else "red",
                "vanished": "red",
                "unreachable": "yellow",
            }
            table.add_row(
                node.host.name,
                str(node.node_rank),
                node.host.private_address,
                f"[{color.get(st.state, 'white')}]{st.state}[/]",
                "" if st.rc is None else str(st.rc),
                tail,
            )
        return table

    def follow(self, launched_at: float) -> tuple[str, str, str | None, float | None]:
        first_step: float | None = None
        started = time.monotonic()
        with Live(self._table(started), console=self.console, refresh_per_second=4, transient=False) as live:
            while True:
                answers = self.fleet.map(self._poll_node)
                now = time.monotonic()
                for name, answer in answers.items():
                    before = self.status[name].state
                    self._absorb(name, answer, now)
                    after = self.status[name]
                    if after.state != before:
                        rc = f" (exit {after.rc})" if after.rc is not None else ""
                        live.console.print(f"  {name}: {before} -> {after.state}{rc}")
                if first_step is None and self.metrics:
                    first_step = self.metrics[0]["time"] - launched_at
                    live.console.print(f"  first step logged {first_step:.1f} s after launch")
                live.update(self._table(started))
                decision = self._decide(now)
                if decision is not None:
                    return (*decision, first_step)
                time.sleep(self.poll_interval)

    # -- wrapping up -------------------------------------------------------------------------------
    def stop_all(self, grace: float = 10.0) -> dict[str, Any]:
        """Stop every process of this run on every node (found by its run id, whole tree)."""

        def stop(conn: NodeConnection) -> dict[str, Any]:
            result = conn.run(f"{AGENT} stop {shlex.quote(self.plan.run_id)} {grace}", timeout=grace + 30)
            try:
                answer: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
            except (ValueError, IndexError):
                raise HostError(conn.host.name, f"stop failed: {result.stderr.strip()[-200:]}") from None
            if answer.get("remaining"):
                raise HostError(conn.host.name, f"{answer['remaining']} process(es) survived SIGKILL")
            return answer

        results = self.fleet.map(stop)
        for name, res in results.items():
            if isinstance(res, BaseException):
                self.console.print(f"  [red]{name}: could not confirm the run stopped: {_msg(res)}[/]")
            elif res.get("terminated") or res.get("killed"):
                self.console.print(f"  {name}: stopped {res['terminated']} process(es) still running")
        return results

    def pull(self) -> dict[str, str]:
        """Each node's run directory into the local run folder. Returns errors per host."""
        errors: dict[str, str] = {}
        run_dir = layout.rundir(self.plan.run_id)
        with self._progress() as progress:
            task = progress.add_task(f"{'pull':<9}", total=len(self.hosts))
            for host in self.hosts:
                target = self.folder.node_dir(host.name)
                target.mkdir(parents=True, exist_ok=True)
                argv = [
                    "rsync",
                    "-az",
                    "-e",
                    shlex.join(openssh_command(host, self.known_hosts)),
                    f"{host.user}@{host.address}:{run_dir}/",
                    f"{target}/",
                ]
                proc = subprocess.run(argv, capture_output=True, text=True, timeout=1800, check=False)
                if proc.returncode != 0:
                    errors[host.name] = (
                        proc.stderr.strip().splitlines()[-1]
                        if proc.stderr.strip()
                        else f"rsync {proc.returncode}"
                    )
                progress.advance(task)
        for name, err in errors.items():
            self.console.print(f"  [red]{name}: pulling artifacts failed: {err}[/]")
        return errors

    def execute(self) -> RunResult:
        """The whole run. Every path out of here stops the job and pulls what exists."""
        self.folder.write_text("plan.txt", self.plan.render())
        exit_codes: dict[str, int | None] = {}
        started_job = False
        outcome, reason, failed_node, first_step = "failed", "", None, None
        try:
            try:
                self.preflight()
                self.sync()
                self.setup()
                launched_at = time.time()
                started_job = True
                self.start()
                outcome, reason, failed_node, first_step = self.follow(launched_at)
            except StepFailed as exc:
                outcome, reason = "failed", str(exc)
                failed_node = next(iter(exc.errors))
            except KeyboardInterrupt:
                outcome, reason = "stopped", "interrupted by the operator (Ctrl-C)"
        finally:
            if started_job:
                self.console.print("stopping anything left of the run on the nodes")
                self.stop_all()
                pull_errors = self.pull()
            else:
                pull_errors = {}
            self.fleet.close()
        exit_codes = {name: st.rc for name, st in self.status.items()}
        rank0_node = self.folder.collect_rank0_files() if started_job else None
        world = next((e for e in self.events if e.get("event") == "world"), None)
        last_metrics: dict[str, Any] = next((m for m in reversed(self.metrics) if "loss" in m), {})
        if pull_errors and outcome == "succeeded":
            reason += f"; but artifacts could not be pulled from {', '.join(pull_errors)}"
        result = RunResult(
            run_id=self.plan.run_id,
            outcome=outcome,
            reason=reason,
            folder=self.folder.path,
            exit_codes=exit_codes,
            failed_node=failed_node,
            first_step_after_s=first_step,
            last_metrics=last_metrics,
            world=world,
            pull_errors=pull_errors,
            timings=self.timings,
        )
        self.folder.write_json(
            "summary.json",
            {
                "run_id": result.run_id,
                "job": self.spec.name,
                "outcome": outcome,
                "reason": reason,
                "failed_node": failed_node,
                "exit_codes": exit_codes,
                "first_step_after_s": first_step,
                "last_metrics": last_metrics,
                "world": world,
                "rank0_node": rank0_node,
                "final_status": self.final_status,
                "pull_errors": pull_errors,
                "timings": self.timings,
                "nodes": [n.host.name for n in self.plan.nodes],
            },
        )
        with contextlib.suppress(Exception):
            from launch.plots import plot_loss

            plot_loss(self.folder.path / "metrics.jsonl", self.folder.path / "loss.png")
        return result
