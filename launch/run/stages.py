"""The stages of one attempt, each a function of (context, state) that returns the next state.

SkyPilot's sequence with barriers between steps: nothing starts unless every node passed the
previous stage. preflight (connect, the doctor's cheap checks) -> pull (the ``container:``
image, once per node) -> sync -> setup -> claim (busy GPUs, the rendezvous port) -> start ->
watch. A stage that fails on some nodes raises
``StepFailed`` naming them; nothing after it runs. Each stage's time goes into the state's
timings (``summary.json`` says where a start spent it). A stage that works on fewer nodes (a
later attempt's new machines) takes ``ctx.port.subset(...)``: nothing is swapped and put back.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TypeVar

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from launch.errors import HostError
from launch.job.inventory import Host
from launch.nodelib.fleetrun_protocol import FileBundle, ProtocolError, StartAnswer
from launch.planning import remote_layout as layout
from launch.planning.claim import busy_gpus, parse_probe, probe_command
from launch.planning.image_pull import (
    NO_RUNTIME_EXIT,
    PULL_TIMEOUT_S,
    parse_pull_result,
    pull_command,
    pull_script,
    registry_of,
)
from launch.planning.launchers.base import ATTEMPT_FILE, RDZV_PORT_FILE, RESUME_FILE
from launch.reports.safe_text import clean
from launch.rules.image_pull import classify_pull_error
from launch.rules.preflight import errors_by_node
from launch.rules.stoprules import StopDecision
from launch.run.channels import copy_channels
from launch.run.doctor import ContainerCheck, gather
from launch.run.hooks import before_stop_files
from launch.run.pull_progress import PullProgress
from launch.run.recheck import EarlyChecks, sshd_check
from launch.run.registry_login import RegistryLogin, read_login
from launch.run.state import RunContext, RunState
from launch.run.watch import AGENT, Watcher
from launch.run.watching import build_watcher, watch_safely
from launch.transport.port import FleetPort, NodeLink, NodeResults
from launch.transport.sync import SyncResult, lib_is_current

T = TypeVar("T")


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


def fan_out(
    ctx: RunContext, state: RunState, step: str, fn: Callable[[NodeLink], T], hosts: list[Host]
) -> tuple[RunState, dict[str, T]]:
    """``fn`` on ``hosts`` with a progress bar; the state with the step's time, and the values.
    Any node's failure fails the step (``StepFailed``)."""
    started = ctx.clock.monotonic()
    with progress_bar(ctx.reporter.console) as progress:
        task = progress.add_task(f"{step:<9}", total=len(hosts))
        results = ctx.port.map(fn, hosts=hosts, on_done=lambda _n, _r: progress.advance(task))
    state = state.timed(step, ctx.clock.monotonic() - started)
    if results.failed:
        raise StepFailed(step, results.failed)
    return state, results.ok


def preflight(ctx: RunContext, state: RunState) -> RunState:
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
    port = ctx.spec.rdzv_port if isinstance(ctx.spec.rdzv_port, int) else 0
    container = ContainerCheck.of(ctx.spec)  # the cheap probe: is the runtime there
    hosts = state.hosts
    started = ctx.clock.monotonic()
    with progress_bar(ctx.reporter.console) as progress:
        task = progress.add_task(f"{'connect':<9}", total=len(hosts))
        observations = gather(
            ctx.port,
            hosts,
            "cheap",
            port,
            on_done=lambda _n, _r: progress.advance(task),
            container=container,
        )
    state = state.timed("connect", ctx.clock.monotonic() - started)
    unreachable = {o.node: HostError(o.node, o.error) for o in observations if o.error is not None}
    if unreachable:
        raise StepFailed("connect", dict(unreachable))
    current = {o.node for o in observations if o.facts is not None and lib_is_current(o.facts.lib)}
    state = replace(state, lib_current=state.lib_current | current)
    if ctx.options.skip_doctor:
        missing = {o.node: HostError(o.node, o.probe_error) for o in observations if o.probe_error}
        if missing:
            raise StepFailed("connect", dict(missing))
        return state
    extra = container.job_fields() if container is not None else {}
    findings = judge(observations, Job(head=hosts[0].name, port=port, full=False, **extra))
    if findings.failed:
        width = max(len(h.name) for h in hosts)
        for verdict in findings.errors:
            ctx.reporter.console.print(verdict_line(verdict, width), soft_wrap=True)
        ctx.reporter.say("  (fab doctor checks everything; --skip-doctor launches anyway)")
        raise StepFailed(
            "preflight", {node: HostError(node, why) for node, why in errors_by_node(findings).items()}
        )
    return state


def pull_image(ctx: RunContext, state: RunState, hosts: list[Host] | None = None) -> RunState:
    """The playbook's ``container.image`` onto every node of ``hosts`` (the run's by default),
    all at once, before anything is synced or started: a node that has it already answers at
    once (``podman image exists``), the others pull it. A node whose pull fails fails the
    ``pull`` step with one line naming it, the kind (auth, not found, no space, network) and
    what to do; nothing starts anywhere. Without ``container:`` there is nothing to do.

    Credentials named by ``container.credentials`` are read here, on this machine, and reach
    each node on the pull script's stdin only (``launch.run.registry_login``)."""
    container = ctx.spec.container
    if container is None:
        return state
    login: RegistryLogin | None = None
    if container.credentials:
        login = read_login(container.credentials, registry_of(container.image))
    script = pull_script(container.image, container.runtime, state.plan.run_id, login=login is not None)
    command = pull_command(script)
    data = login.auth_file() if login is not None else b""

    def private(text: str) -> str:
        return login.redact(text) if login is not None else text

    hosts = state.hosts if hosts is None else hosts
    board = PullProgress(ctx.reporter.console, [h.name for h in hosts])

    def pull_one(conn: NodeLink) -> str:
        started = ctx.clock.monotonic()
        feed = board.on_output(conn.host.name)
        result = conn.run_with_input(command, data, timeout=PULL_TIMEOUT_S, on_stdout=feed)
        output = private((result.stderr or result.stdout)[-65536:])
        if result.exit_code == NO_RUNTIME_EXIT:
            why = clean(output.strip().splitlines()[-1] if output.strip() else "no runtime", 300)
            raise HostError(
                conn.host.name, f"{why} (container.runtime: {container.runtime}; fab doctor says more)"
            )
        if not result.ok:
            raise HostError(conn.host.name, classify_pull_error(output).line(container.image))
        answer = parse_pull_result(result.stdout)
        if answer is None:
            tail = clean(private(result.stdout.strip()[-200:]), 200)
            raise HostError(conn.host.name, f"the image pull gave no answer ({tail!r})")
        what, runtime = answer
        if what == "present":
            return f"image present ({runtime})"
        return f"image pulled ({runtime}) in {ctx.clock.monotonic() - started:.1f} s"

    def finished(node: str, value: str | BaseException) -> None:
        if isinstance(value, BaseException):
            board.done(node, "failed")
        else:
            board.done(node, "present" if value.startswith("image present") else "pulled")

    started = ctx.clock.monotonic()
    with board:
        results = ctx.port.map(pull_one, hosts=hosts, on_done=finished)
    state = state.timed("pull", ctx.clock.monotonic() - started)
    if results.failed:
        raise StepFailed("pull", results.failed)
    done = results.ok
    if len(done) <= 8:
        for name, what in done.items():
            ctx.reporter.say(f"  {name}: {what}")
    else:
        pulled = sum(1 for what in done.values() if what.startswith("image pulled"))
        ctx.reporter.say(
            f"  pull: {len(done)} nodes, {pulled} pulled {clean(container.image, 200)}, "
            f"{len(done) - pulled} had it"
        )
    return state


def sync(ctx: RunContext, state: RunState, port: FleetPort | None = None) -> RunState:
    """The workdir (and the node library where it is not current) to every node of ``port``
    (the run's by default), then the playbook's data channels."""
    port = port or ctx.port
    started = ctx.clock.monotonic()
    with progress_bar(ctx.reporter.console) as progress:
        task = progress.add_task(f"{'sync':<9}", total=len(port.hosts))
        results = NodeResults[SyncResult](
            ctx.transfers.sync(
                port,
                ctx.spec.workdir,
                ctx.spec.name,
                state.known_hosts,
                relay_above=ctx.spec.relay_sync_above,
                on_done=lambda _n, _r: progress.advance(task),
                lib_current=set(state.lib_current),
                parallel=ctx.options.max_parallel,
            )
        )
    state = state.timed("sync", ctx.clock.monotonic() - started)
    if results.failed:
        raise StepFailed("sync", results.failed)
    synced = [r for r in results.ok.values() if isinstance(r, SyncResult)]
    if len(synced) <= 8:
        for res in synced:
            via = "" if res.via == "laptop" else f" (from {res.via})"
            ctx.reporter.say(f"  {res.host}: sync sent {res.files_sent} file(s), {res.bytes_sent} bytes{via}")
    else:
        relayed = sum(1 for r in synced if r.via != "laptop")
        ctx.reporter.say(
            f"  sync: {len(synced)} nodes, {sum(r.files_sent for r in synced)} file(s) and "
            f"{sum(r.bytes_sent for r in synced)} bytes sent in all; "
            f"{relayed} node(s) from the head, {len(synced) - relayed} from this machine"
        )
    errors = copy_channels(
        ctx.spec,
        state.inventory,
        port,
        state.known_hosts,
        ctx.transfers,
        ctx.options.max_parallel,
        ctx.reporter,
    )
    if errors:
        raise StepFailed("sync", errors)
    return state


def setup(ctx: RunContext, state: RunState, hosts: list[Host] | None = None) -> RunState:
    """Per-node environment + setup commands (on ``hosts``, every node by default); skipped
    (with the reason) when unchanged."""
    run_dir = layout.rundir(state.plan.run_id)
    nodes = state.nodes

    def run_setup(conn: NodeLink) -> str:
        node = nodes[conn.host.name]
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
            return f"setup ran: first setup of job {ctx.spec.name} on this node (hash {node.setup_hash})"
        return f"setup ran: setup commands or requirements changed (hash {old} -> {node.setup_hash})"

    state, reasons = fan_out(ctx, state, "setup", run_setup, state.hosts if hosts is None else hosts)
    for name, reason in reasons.items():
        ctx.reporter.say(f"  {name}: {reason}")
    return state


def claim(ctx: RunContext, state: RunState) -> RunState:
    """Just before the start, one cheap command per node: refuse GPUs held by other users'
    processes (unless ``allow_busy_gpus``) and, with ``rdzv_port: auto``, take a port free on
    the head's private address (see ``launch.planning.claim`` for the race and why it is small).
    The state gets the port, or None when the plan fixed one or needs none."""
    want_port = state.plan.rdzv_port == "auto"
    check_gpus = not ctx.options.allow_busy_gpus
    head = state.plan.head.host
    targets = state.hosts if check_gpus else ([head] if want_port else [])
    if not targets:
        return replace(state, rdzv_port=None)

    def probe(conn: NodeLink) -> str:
        host = conn.host
        command = probe_command(
            ctx.spec.python or host.python,
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

    state, values = fan_out(ctx, state, "claim", probe, targets)
    return replace(state, rdzv_port=int(values[head.name]) if want_port else None)


def start(ctx: RunContext, state: RunState) -> RunState:
    """One round trip per node: send launch.sh and guard.json, start both detached.

    The files travel on the agent's stdin (a ``FileBundle``) and are written 0600 in the
    0700 run directory: ``launch.sh`` holds the job's environment values, which a command
    line would show to every user of the machine. Nodes whose ranks the head's launcher
    starts get only the watchdog.
    """
    run_dir = layout.rundir(state.plan.run_id)
    nodes, target = state.nodes, state.target

    def start_node(conn: NodeLink) -> None:
        node = nodes[conn.host.name]
        files = {"guard.json": target.guard_config(node.host.name).to_json()}
        files.update(before_stop_files(ctx.spec))  # the watchdog runs it (launch.run.hooks)
        if node.launch_script is not None:
            files["launch.sh"] = node.launch_script
            files[ATTEMPT_FILE] = str(state.attempt)
            if state.resume_from is not None:
                files[RESUME_FILE] = state.resume_from
            if state.rdzv_port is not None:
                files[RDZV_PORT_FILE] = str(state.rdzv_port)
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

    state = replace(state, started_job=True)
    others = [n.host for n in state.plan.nodes if not n.starts_processes]
    if others:
        state, _ = fan_out(ctx, state, "prepare", start_node, others)
    state, _ = fan_out(
        ctx, state, "start", start_node, [n.host for n in state.plan.nodes if n.starts_processes]
    )
    return state


@dataclass(frozen=True)
class Watched:
    """How an attempt's watch ended: the stop decision, and the watcher (its facts, its nodes)."""

    decision: StopDecision
    watcher: Watcher | None


def watch(ctx: RunContext, state: RunState, watcher: Watcher | None = None) -> Watched:
    """Poll the attempt until a stop rule decides (``watcher`` goes on where it stopped)."""
    if watcher is None:
        watcher = build_watcher(
            state.target,
            ctx.port,
            ctx.reporter.console,
            ctx.records,
            poll_interval=ctx.options.poll_interval,
            completion_grace_s=ctx.options.completion_grace_s,
            clock=ctx.clock,
        )
        if ctx.peers is not None:  # the saves it sees are recorded and copied to a peer node,
            # with a bucket too: whichever of the upload and the copy ends first is the second copy
            ctx.peers.follow(watcher, state.hosts, state.known_hosts, state.plan.recovery.enabled)
        limit = state.target.rules.unreachable_timeout_s
        if state.plan.recovery.enabled and limit is not None:  # a silent node's re-check starts early
            watcher.early_checks = EarlyChecks(
                state.hosts, limit, sshd_check(ctx.port.jumps), wall=ctx.clock.time, clock=time.monotonic
            )
    if watcher.early_checks is not None:  # again when the watch goes on after a false alarm
        watcher.early_checks.follow(watcher)
    return Watched(watch_safely(watcher, ctx.folder.path), watcher)
