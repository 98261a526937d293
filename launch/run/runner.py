"""Run a launch plan on a fleet: preflight, sync, setup, start, watch, then wrap up.

SkyPilot's sequence with barriers between steps (nothing starts unless every node passed the
previous step) and its failure semantics: the first non-zero exit (or a vanished process) on any
node stops the others and fails the run, naming the node. Watching and stop rules live in
``launch.run.watch`` / ``launch.rules.stoprules``; stopping, pulling and teardown in ``launch.run.wrapup``.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from launch.errors import HostError
from launch.job.inventory import Host, Inventory
from launch.job.spec import JobSpec
from launch.planning import remote_layout as layout
from launch.planning.plan import LaunchPlan, NodePlan
from launch.rules.stoprules import StopDecision
from launch.run.records import RunRecords
from launch.run.run_folder import RunFolder
from launch.run.watch import AGENT, Watcher, WatchTarget
from launch.run.wrapup import RunResult, wrap_up
from launch.settings import DEFAULT_FANOUT
from launch.transport.ssh import Fleet, NodeConnection
from launch.transport.sync import LIB_VERSION, SyncResult, lib_is_current
from launch.transport.sync_relay import sync_fleet


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


def progress_bar(console: Console) -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    )


@dataclass
class RunOptions:
    poll_interval: float = 1.0
    max_parallel: int = DEFAULT_FANOUT
    completion_grace_s: float = 30.0
    ask_on_interrupt: bool = True


class Runner:
    """Executes one ``LaunchPlan``. I/O lives here; decisions live in the plan and the rules."""

    def __init__(
        self,
        spec: JobSpec,
        plan: LaunchPlan,
        inventory: Inventory,
        known_hosts: Path,
        folder: RunFolder,
        records: RunRecords,
        console: Console | None = None,
        options: RunOptions | None = None,
    ) -> None:
        self.spec = spec
        self.plan = plan
        self.inventory = inventory
        self.known_hosts = known_hosts
        self.folder = folder
        self.records = records
        self.console = console or Console()
        self.options = options or RunOptions()
        self.hosts: list[Host] = [n.host for n in plan.nodes]
        self.nodes: dict[str, NodePlan] = {n.host.name: n for n in plan.nodes}
        self.fleet = Fleet(self.hosts, known_hosts, max_parallel=self.options.max_parallel)
        self.timings: dict[str, float] = {}
        self.lib_current: set[str] = set()

    # -- steps -----------------------------------------------------------------------------------
    def _fan_out(
        self, step: str, fn: Callable[[NodeConnection], Any], hosts: list[Host] | None = None
    ) -> dict[str, Any]:
        started = time.monotonic()
        targets = self.hosts if hosts is None else hosts
        with progress_bar(self.console) as progress:
            task = progress.add_task(f"{step:<9}", total=len(targets))
            results = self.fleet.map(fn, hosts=targets, on_done=lambda _n, _r: progress.advance(task))
        self.timings[step] = time.monotonic() - started
        errors = {name: r for name, r in results.items() if isinstance(r, BaseException)}
        if errors:
            raise StepFailed(step, errors)
        return results

    def preflight(self) -> None:
        """Connect to every node (pinned host keys) before anything is changed anywhere.

        Also reads which version of fleetrun's node library each node holds, so the sync skips
        it where it is current.
        """

        def check(conn: NodeConnection) -> str:
            result = conn.run(
                "command -v rsync >/dev/null && command -v python3 >/dev/null && echo ok && "
                f'cat "$HOME/{LIB_VERSION}" 2>/dev/null; true',
                timeout=30,
            )
            lines = result.stdout.splitlines()
            if not result.ok or not lines or lines[0].strip() != "ok":
                raise HostError(conn.host.name, "rsync and python3 must be installed on the node")
            if len(lines) > 1 and lib_is_current(lines[1]):
                self.lib_current.add(conn.host.name)
            return result.stdout

        self._fan_out("connect", check)

    def sync(self) -> None:
        started = time.monotonic()
        with progress_bar(self.console) as progress:
            task = progress.add_task(f"{'sync':<9}", total=len(self.hosts))
            results = sync_fleet(
                self.fleet,
                self.spec.workdir,
                self.spec.name,
                self.known_hosts,
                relay_above=self.spec.relay_sync_above,
                on_done=lambda _n, _r: progress.advance(task),
                lib_current=self.lib_current,
                parallel=self.options.max_parallel,
            )
        self.timings["sync"] = time.monotonic() - started
        errors = {n: r for n, r in results.items() if isinstance(r, BaseException)}
        if errors:
            raise StepFailed("sync", errors)
        synced = [r for r in results.values() if isinstance(r, SyncResult)]
        if len(synced) <= 8:
            for res in synced:
                via = "" if res.via == "laptop" else f" (from {res.via})"
                self.console.print(
                    f"  {res.host}: sync sent {res.files_sent} file(s), {res.bytes_sent} bytes{via}"
                )
        else:
            relayed = sum(1 for r in synced if r.via != "laptop")
            self.console.print(
                f"  sync: {len(synced)} nodes, {sum(r.files_sent for r in synced)} file(s) and "
                f"{sum(r.bytes_sent for r in synced)} bytes sent in all; "
                f"{relayed} node(s) from the head, {len(synced) - relayed} from this machine"
            )

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

    def start(self, target: WatchTarget) -> None:
        """One round trip per node: write launch.sh and guard.json, start both detached.

        Nodes whose ranks the head's launcher starts get only the watchdog.
        """
        run_dir = layout.rundir(self.plan.run_id)
        delimiter = f"FLEETRUN_EOF_{self.plan.run_id.replace('-', '_')}"

        def heredoc(name: str, text: str) -> str:
            return f"cat > \"$HOME/{run_dir}/{name}\" <<'{delimiter}'\n{text.rstrip()}\n{delimiter}\n"

        def start_node(conn: NodeConnection) -> None:
            node = self.nodes[conn.host.name]
            guard = json.dumps(target.guard_config(node.host.name), indent=1)
            command = f'mkdir -p "$HOME/{run_dir}" && ' + heredoc("guard.json", guard)
            if node.launch_script is not None:
                command += heredoc("launch.sh", node.launch_script) + f'{AGENT} start "$HOME/{run_dir}"'
            else:
                command += f'{AGENT} guard "$HOME/{run_dir}"'
            result = conn.run(command, timeout=60)
            if not result.ok:
                raise HostError(conn.host.name, f"could not start: {result.stderr.strip()[-300:]}")

        others = [n.host for n in self.plan.nodes if not n.starts_processes]
        if others:
            self._fan_out("prepare", start_node, hosts=others)
        self._fan_out("start", start_node, hosts=[n.host for n in self.plan.nodes if n.starts_processes])

    # -- the whole run ----------------------------------------------------------------------------
    def _ask_keep_running(self) -> bool:
        """Ctrl-C while watching: keep the job (the on-node watchdog guards it) or stop it?"""
        if not self.options.ask_on_interrupt or not sys.stdin.isatty():
            return False
        self.console.print(
            "\n[bold]Interrupted.[/] [k]eep the job running (re-attach with "
            f"'fab watch {self.plan.run_id}'; the on-node watchdog keeps enforcing the stop rules) "
            "or [s]top it and wrap up? [s] ",
            end="",
        )
        try:
            answer = input().strip().lower()
        except (EOFError, KeyboardInterrupt):
            return False
        return answer.startswith("k")

    def _watch_target(self, started_at: float) -> WatchTarget:
        return WatchTarget(
            run_id=self.plan.run_id,
            job=self.spec.name,
            inventory=self.inventory,
            starters=tuple(n.host.name for n in self.plan.nodes if n.starts_processes),
            rules=self.spec.stop,
            teardown=self.spec.teardown,
            started_at=started_at,
            folder=self.folder.path,
            instance_type=self.inventory.head.instance_type,
            cloud=self.inventory.cloud,
        )

    def execute(self) -> RunResult:
        """Every path out of here after a start stops the job and pulls what exists first."""
        self.folder.write_text("plan.txt", self.plan.render())
        target = self._watch_target(time.time())
        started_job = False
        watcher: Watcher | None = None
        try:
            self.preflight()
            self.sync()
            self.setup()
            target = dataclasses.replace(target, started_at=time.time())  # the launch, after setup
            target.save()
            started_job = True
            self.start(target)
            watcher = Watcher(
                target,
                self.fleet,
                self.console,
                poll_interval=self.options.poll_interval,
                completion_grace_s=self.options.completion_grace_s,
                on_poll=lambda obs: self.records.heartbeat(
                    target.run_id, obs.now, last_metrics=dict(obs.metrics.last_metrics)
                ),
            )
            decision = watcher.run()
        except StepFailed as exc:
            first = next(iter(exc.errors))
            decision = StopDecision("failed", f"{exc.step}_failed", str(exc), tuple(exc.errors) or (first,))
        except KeyboardInterrupt:
            if started_job and self._ask_keep_running():
                self.fleet.close()
                raise
            decision = StopDecision("stopped", "operator", "interrupted by the operator (Ctrl-C)")
        return wrap_up(
            target,
            self.fleet,
            decision,
            self.records,
            self.known_hosts,
            self.console,
            watcher=watcher,
            started_job=started_job,
            timings=self.timings,
        )
