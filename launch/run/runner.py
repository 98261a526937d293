"""Run a launch plan on a fleet: preflight, sync, setup, claim (busy GPUs, the rendezvous port),
start, watch, then wrap up.

SkyPilot's sequence with barriers between steps (nothing starts unless every node passed the
previous step) and its failure semantics: the first non-zero exit (or a vanished process) on any
node stops the others and fails the run, naming the node. Watching and stop rules live in
``launch.run.watch`` / ``launch.rules.stoprules``; stopping, pulling and teardown in ``launch.run.wrapup``.

With a ``recovery:`` section, a loss ends an attempt, not the run: ``launch.run.attempts`` checks
the evidence, replaces or drops lost nodes and starts the next attempt (same run id) through this
runner's steps (``adopt``, ``prepare_only``, ``claim``, ``start``).

Every way out of ``execute`` after the fleet was touched goes through the wrap-up, an unexpected
exception included (it becomes a ``failed`` run with ``traceback.txt``). The runner never prompts:
what to do on Ctrl-C is asked through the ``ask_keep_running`` callback the CLI passes in.
"""

from __future__ import annotations

import dataclasses
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
from launch.nodelib.fleetrun_protocol import FileBundle, ProtocolError, StartAnswer
from launch.planning import remote_layout as layout
from launch.planning.claim import busy_gpus, parse_probe, probe_command
from launch.planning.launchers.base import ATTEMPT_FILE, RDZV_PORT_FILE, RESUME_FILE
from launch.planning.plan import LaunchPlan, NodePlan
from launch.reports.safe_text import clean
from launch.rules.preflight import errors_by_node
from launch.rules.stoprules import StopDecision
from launch.run.attempts import Attempts, record_attempts
from launch.run.channels import copy_channels
from launch.run.doctor import gather
from launch.run.hooks import before_stop_files
from launch.run.records import RunRecords
from launch.run.reporter import Reporter, RichReporter
from launch.run.run_folder import RunFolder
from launch.run.summary import RunSummary
from launch.run.target import WatchTarget
from launch.run.transfers import Transfers
from launch.run.watch import AGENT, Watcher
from launch.run.watching import build_watcher, crash_decision, watch_safely
from launch.run.wrapup import wrap_up
from launch.settings import DEFAULT_FANOUT
from launch.transport.ssh import Fleet, NodeConnection
from launch.transport.sync import SyncResult, lib_is_current

AskKeepRunning = Callable[[str], bool]
"""Asked on Ctrl-C while watching (with the run id): True keeps the job running on its nodes."""


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
    allow_busy_gpus: bool = False
    """Start even where other users' processes hold the GPUs this run would use."""
    skip_doctor: bool = False
    """Launch without the pre-launch doctor checks (connect and the node library check still run)."""
    spares: tuple[Host, ...] = ()
    """Healthy hosts of the inventory the job did not take: a host left out after a ``gpu_fault``
    is replaced by the first one still unused."""


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
        reporter: Reporter | None = None,
        options: RunOptions | None = None,
        *,
        fleet: Fleet | None = None,
        transfers: Transfers | None = None,
        ask_keep_running: AskKeepRunning | None = None,
    ) -> None:
        self.spec = spec
        self.plan = plan
        self.inventory = inventory
        self.known_hosts = known_hosts
        self.folder = folder
        self.records = records
        self.reporter: Reporter = reporter or RichReporter()
        self.console: Console = self.reporter.console
        self.options = options or RunOptions()
        self.transfers = transfers or Transfers()
        self.ask_keep_running = ask_keep_running
        self.hosts: list[Host] = [n.host for n in plan.nodes]
        self.nodes: dict[str, NodePlan] = {n.host.name: n for n in plan.nodes}
        self.fleet = fleet or Fleet(self.hosts, known_hosts, max_parallel=self.options.max_parallel)
        self.timings: dict[str, float] = {}
        self.lib_current: set[str] = set()
        self.rdzv_port: int | None = None
        self.attempts = Attempts(self)
        self.attempt = 1
        """Sent to every node as ``attempt`` with ``launch.sh`` (``FLEETRUN_ATTEMPT``)."""
        self.resume_from: str | None = None
        """For a later attempt: the checkpoint every node resumes from (``FLEETRUN_RESUME_FROM``)."""

    def adopt(self, plan: LaunchPlan, inventory: Inventory, known_hosts: Path, *, attempt: int) -> None:
        """The next attempt's plan and fleet (replaced hosts pinned in ``known_hosts``)."""
        self.plan, self.inventory, self.known_hosts, self.attempt = plan, inventory, known_hosts, attempt
        self.hosts = [n.host for n in plan.nodes]
        self.nodes = {n.host.name: n for n in plan.nodes}
        old, self.fleet = self.fleet, Fleet(self.hosts, known_hosts, max_parallel=self.options.max_parallel)
        for host in self.hosts:  # survivors keep their connection (same host, same pinned key)
            conn = old.connections.pop(host.name, None)
            if conn is not None and conn.host == host:
                self.fleet.connections[host.name] = conn
            elif conn is not None:
                conn.close()
        old.close()

    def prepare_only(self, hosts: list[Host]) -> None:
        """Sync and set up only ``hosts`` (new nodes of a later attempt); the others have both."""
        everyone, fleet = self.hosts, self.fleet
        self.lib_current -= {h.name for h in hosts}  # a new machine: its disk holds nothing of ours
        self.hosts = hosts
        self.fleet = Fleet(hosts, self.known_hosts, max_parallel=self.options.max_parallel)
        self.fleet.connections = {h.name: fleet.connections[h.name] for h in hosts}  # shared, kept open
        try:
            self.sync()
            self.setup()
        finally:
            self.hosts, self.fleet = everyone, fleet

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
        """Connect to every node (pinned host keys) and run the doctor's cheap checks, before
        anything is changed anywhere: one round trip per node (the probe on stdin).

        A node that cannot be reached fails the ``connect`` step; a node that would break or hang
        the job (no rsync, no such Python, its hostname on loopback, the rendezvous port already
        held on the head) fails the ``preflight`` step with ``fab doctor``'s own verdict lines.
        The probe also reports which version of the node library each node holds, so the sync
        skips it where it is current. ``RunOptions.skip_doctor`` keeps only the connect.
        """
        from launch.reports.doctor_view import verdict_line
        from launch.rules.preflight import Job, judge

        # with ``rdzv_port: auto`` the port is chosen free on the head just before the start
        # (``claim``), so there is no fixed port to find in use here
        port = self.spec.rdzv_port if isinstance(self.spec.rdzv_port, int) else 0

        started = time.monotonic()
        with progress_bar(self.console) as progress:
            task = progress.add_task(f"{'connect':<9}", total=len(self.hosts))
            observations = gather(
                self.fleet,
                self.hosts,
                "cheap",
                port,
                on_done=lambda _n, _r: progress.advance(task),
            )
        self.timings["connect"] = time.monotonic() - started
        unreachable = {o.node: HostError(o.node, o.error) for o in observations if o.error is not None}
        if unreachable:
            raise StepFailed("connect", dict(unreachable))
        for obs in observations:
            if obs.facts is not None and lib_is_current(obs.facts.lib):
                self.lib_current.add(obs.node)
        if self.options.skip_doctor:
            missing = {o.node: HostError(o.node, o.probe_error) for o in observations if o.probe_error}
            if missing:
                raise StepFailed("connect", dict(missing))
            return
        findings = judge(observations, Job(head=self.hosts[0].name, port=port, full=False))
        if findings.failed:
            width = max(len(h.name) for h in self.hosts)
            for verdict in findings.errors:
                self.console.print(verdict_line(verdict, width), soft_wrap=True)
            self.reporter.say("  (fab doctor checks everything; --skip-doctor launches anyway)")
            raise StepFailed(
                "preflight", {node: HostError(node, why) for node, why in errors_by_node(findings).items()}
            )

    def sync(self) -> None:
        started = time.monotonic()
        with progress_bar(self.console) as progress:
            task = progress.add_task(f"{'sync':<9}", total=len(self.hosts))
            results = self.transfers.sync(
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
                self.reporter.say(
                    f"  {res.host}: sync sent {res.files_sent} file(s), {res.bytes_sent} bytes{via}"
                )
        else:
            relayed = sum(1 for r in synced if r.via != "laptop")
            self.reporter.say(
                f"  sync: {len(synced)} nodes, {sum(r.files_sent for r in synced)} file(s) and "
                f"{sum(r.bytes_sent for r in synced)} bytes sent in all; "
                f"{relayed} node(s) from the head, {len(synced) - relayed} from this machine"
            )
        self.sync_channels()

    def sync_channels(self) -> None:
        """The playbook's ``local`` and ``bucket`` data channels (``SM_CHANNEL_<NAME>``) to every node."""
        errors = copy_channels(
            self.spec,
            self.inventory,
            self.fleet,
            self.known_hosts,
            self.transfers,
            self.options.max_parallel,
            self.reporter,
        )
        if errors:
            raise StepFailed("sync", errors)

    def setup(self) -> dict[str, str]:
        """Per-node environment + setup commands; skipped (with the reason) when unchanged."""

        run_dir = layout.rundir(self.plan.run_id)

        def run_setup(conn: NodeConnection) -> str:
            node = self.nodes[conn.host.name]
            for remote_file in node.files:
                conn.put_file(remote_file.path, remote_file.content, remote_file.mode)
            # the script travels on stdin into a 0600 file of the 0700 run dir, never in argv
            # (every user of a lab machine sees command lines in ps), and runs from there
            bundle = FileBundle({"setup.sh": node.setup_script}).to_json().encode()
            command = f'{AGENT} receive "$HOME/{run_dir}" && sh "$HOME/{run_dir}/setup.sh" </dev/null'
            result = conn.run_with_input(command, bundle, timeout=3600)
            old = ""
            for line in result.stdout.splitlines():
                if line.startswith("FLEETRUN_OLD_HASH="):
                    old = line.split("=", 1)[1].strip()
            if not result.ok:
                tail = (result.stderr or result.stdout).strip()[-2000:].splitlines()[-5:]
                raise HostError(conn.host.name, f"setup exited {result.exit_code}: {' / '.join(tail)}")
            if "FLEETRUN_SETUP=skipped" in result.stdout:
                return f"setup skipped: unchanged (hash {node.setup_hash})"
            if not old:
                return f"setup ran: first setup of job {self.spec.name} on this node (hash {node.setup_hash})"
            return f"setup ran: setup commands or requirements changed (hash {old} -> {node.setup_hash})"

        results = self._fan_out("setup", run_setup)
        for name, reason in results.items():
            self.reporter.say(f"  {name}: {reason}")
        return results

    def claim(self) -> int | None:
        """Just before the start, one cheap command per node: refuse GPUs held by other users'
        processes (unless ``allow_busy_gpus``) and, with ``rdzv_port: auto``, take a port free on
        the head's private address (see ``launch.planning.claim`` for the race and why it is small).
        Returns the port, or None when the plan fixed one or needs none."""
        want_port = self.plan.rdzv_port == "auto"
        check_gpus = not self.options.allow_busy_gpus
        head = self.plan.head.host
        targets = self.hosts if check_gpus else ([head] if want_port else [])
        if not targets:
            return None

        def probe(conn: NodeConnection) -> str:
            host = conn.host
            command = probe_command(
                self.spec.python or host.python,
                host.private_address,
                want_port=want_port and host.name == head.name,
                want_gpus=check_gpus,
            )
            result = conn.run(command, timeout=60)
            answer = parse_probe(result.stdout[-262144:])
            if check_gpus:
                problems = busy_gpus(answer, host.gpu_indices)
                if problems:
                    shown = "; ".join(problems[:8]) + (
                        f"; and {len(problems) - 8} more" if len(problems) > 8 else ""
                    )
                    raise HostError(host.name, f"{shown} (fab train --allow-busy-gpus to start anyway)")
            if want_port and host.name == head.name:
                if answer.port is None:
                    tail = clean((result.stderr or result.stdout).strip()[-300:], 300)
                    raise HostError(
                        host.name, f"could not find a free rendezvous port on {host.private_address}: {tail}"
                    )
                return str(answer.port)
            return ""

        results = self._fan_out("claim", probe, hosts=targets)
        return int(results[head.name]) if want_port else None

    def start(self, target: WatchTarget) -> None:
        """One round trip per node: send launch.sh and guard.json, start both detached.

        The files travel on the agent's stdin (a ``FileBundle``) and are written 0600 in the
        0700 run directory: ``launch.sh`` holds the job's environment values, which a command
        line would show to every user of the machine. Nodes whose ranks the head's launcher
        starts get only the watchdog.
        """
        run_dir = layout.rundir(self.plan.run_id)

        def start_node(conn: NodeConnection) -> None:
            node = self.nodes[conn.host.name]
            files = {"guard.json": target.guard_config(node.host.name).to_json()}
            files.update(before_stop_files(self.spec))  # the watchdog runs it (launch.run.hooks)
            if node.launch_script is not None:
                files["launch.sh"] = node.launch_script
                files[ATTEMPT_FILE] = str(self.attempt)
                if self.resume_from is not None:
                    files[RESUME_FILE] = self.resume_from
                if self.rdzv_port is not None:
                    files[RDZV_PORT_FILE] = str(self.rdzv_port)
                command = f'{AGENT} start "$HOME/{run_dir}" --stdin'
            else:
                command = f'{AGENT} guard "$HOME/{run_dir}" --stdin'
            result = conn.run_with_input(command, FileBundle(files).to_json().encode(), timeout=60)
            if not result.ok:
                raise HostError(conn.host.name, f"could not start: {result.stderr.strip()[-300:]}")
            try:
                answer = StartAnswer.from_json(result.stdout.strip().splitlines()[-1])
            except (ProtocolError, IndexError):
                raise HostError(
                    conn.host.name, f"could not start: no answer ({result.stdout[-200:]!r})"
                ) from None
            if answer.guard is None:
                raise HostError(
                    conn.host.name, f"the watchdog did not start: {answer.guard_error or 'no guard.json'}"
                )

        others = [n.host for n in self.plan.nodes if not n.starts_processes]
        if others:
            self._fan_out("prepare", start_node, hosts=others)
        self._fan_out("start", start_node, hosts=[n.host for n in self.plan.nodes if n.starts_processes])

    # -- the whole run ----------------------------------------------------------------------------
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
        )

    def execute(self) -> RunSummary:
        """Every path out of here after a start stops the job and pulls what exists first."""
        self.folder.write_text("plan.txt", self.plan.render())
        target = self._watch_target(time.time())
        started_job = False
        watcher: Watcher | None = None
        teardown_applies = True
        try:
            self.preflight()
            self.sync()
            self.setup()
            target = dataclasses.replace(target, started_at=time.time())  # the launch, after setup
            target.save()
            self.rdzv_port = self.claim()
            if self.rdzv_port is not None:
                self.reporter.say(f"  rendezvous port {self.rdzv_port} on {self.plan.head.host.name}")
            started_job = True
            self.start(target)
            watcher = build_watcher(
                target,
                self.fleet,
                self.console,
                self.records,
                poll_interval=self.options.poll_interval,
                completion_grace_s=self.options.completion_grace_s,
            )
            self.attempts.follow(watcher)
            decision = watch_safely(watcher, self.folder.path)
            decision, target, watcher = self.attempts.run(target, watcher, decision)
        except StepFailed as exc:
            decision = StopDecision("failed", f"{exc.step}_failed", str(exc), tuple(exc.errors))
        except KeyboardInterrupt:
            if started_job and self.ask_keep_running is not None and self._keep_running():
                self.fleet.close()
                raise
            decision = StopDecision("stopped", "operator", "interrupted by the operator (Ctrl-C)")
            teardown_applies = started_job
        except Exception as exc:  # noqa: BLE001 - still stop, pull, record and tear down by policy
            step = "starting the run" if started_job else "preparing the fleet"
            decision = crash_decision(self.folder.path, exc, step)
        self.attempts.peers.stop()
        if self.attempts.target is not None:  # an error between attempts: wrap the latest one up
            target, watcher = self.attempts.target, self.attempts.watcher or watcher
        summary = wrap_up(
            target,
            self.fleet,
            decision,
            self.records,
            self.known_hosts,
            self.reporter,
            watcher=watcher,
            started_job=started_job,
            timings=self.timings,
            teardown_applies=teardown_applies,
            transfers=self.transfers,
        )
        if self.attempts.ended and (self.plan.recovery.enabled or len(self.attempts.ended) > 1):
            record_attempts(self.folder, self.records, summary, self.attempts)
        return summary

    def _keep_running(self) -> bool:
        assert self.ask_keep_running is not None
        try:
            return self.ask_keep_running(self.plan.run_id)
        except (EOFError, KeyboardInterrupt):
            return False
