"""A run's life cycle, the one path ``fab train``, ``fab watch RUN`` and ``fab pull RUN`` take.

``start_run`` sets a run up (pinned host keys, the run's turn on the machines through its own
connection pool, run folder with the host choice and the ``on_end`` verdict, run record) and
``execute`` drives it: the stages of ``launch.run.stages`` over one ``RunState``, then ``follow``
(watch, and with a ``recovery:`` section recover and watch the next attempt,
``launch.run.attempts``), then the wrap-up (``launch.run.wrapup``: secure the artifacts, write
the reports, tear down or keep warm, finish), the machines' release, and the run's close
(``launch.run.closing``: the report, the ``on_end`` hooks). ``launch.run.opening`` is the front
door before it (playbook, host choice, plan). ``reattach``
rebuilds the state of a run whose watcher went away from the run's own records (``watch.json``,
the attempts recorded so far, the playbook it started with, its hash checked) and follows it
the same way, recovery included, and closes it the same way. ``pull_again`` is the wrap-up's
pull and teardown for a run that already ended, then its ``on_end`` hooks if none ran yet.

Every way out of ``execute`` after the fleet was touched goes through the wrap-up, an unexpected
exception included (a ``failed`` run with ``traceback.txt``). The life cycle never prompts: what
to do on Ctrl-C is asked through ``RunContext.ask_keep_running``.
"""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from launch.errors import FleetrunError
from launch.fleets.kinds.registry import fleet_kind
from launch.fleets.teardown import TeardownOutcome
from launch.job.inventory import Inventory
from launch.job.spec import JobSpec, load_job_spec
from launch.paths import known_hosts_file
from launch.planning.launchers import launcher_class
from launch.planning.plan import LaunchPlan
from launch.reports.safe_text import clean
from launch.rules.recovery import AttemptEnd
from launch.rules.stoprules import StopDecision
from launch.run import attempts, closing, stages, warm
from launch.run.clock import Clock
from launch.run.doctor import HostChoice
from launch.run.hooks import LocalHooks, save_on_end
from launch.run.next_attempt import ready_next_attempt
from launch.run.peer_copies import PEER_STAGING, PeerCopies
from launch.run.provenance import file_sha256, git_commit_of
from launch.run.queue_turn import take_machines
from launch.run.records import FINAL_STATES, RunRecord, RunRecords, pid_alive
from launch.run.reporter import Reporter
from launch.run.run_folder import RunFolder
from launch.run.stages import StepFailed
from launch.run.state import AskKeepRunning, RunContext, RunOptions, RunState
from launch.run.summary import RunSummary, TeardownAction, decide_teardown
from launch.run.target import WatchTarget
from launch.run.transfers import Transfers
from launch.run.waiting import waiting
from launch.run.watch import Watcher
from launch.run.watchdog_files import fetch_watchdog_files
from launch.run.watching import build_watcher, crash_decision, watch_safely
from launch.run.wrapup import end_fleet, wrap_up, write_reports
from launch.transport.port import FleetPort
from launch.transport.ssh import SshPool

__all__ = [
    "Progress",
    "PulledAgain",
    "execute",
    "follow",
    "pull_again",
    "reattach",
    "start_run",
    "state_for",
]


@dataclass
class Progress:
    """Where a run got to: the latest context, state and watcher.

    The one mutable thing of the life cycle, held by ``execute`` alone: when an unexpected
    exception ends the run between two stages, the wrap-up must stop, pull and record the nodes
    the run had reached then (a later attempt's, after a recovery), not those it started with.
    """

    ctx: RunContext
    state: RunState
    watcher: Watcher | None = None


def state_for(
    spec: JobSpec,
    plan: LaunchPlan,
    inventory: Inventory,
    known_hosts: Path,
    folder: Path,
    now: float | None = None,
    sweep_id: str | None = None,
) -> RunState:
    """The state of a run about to start (attempt 1, nothing done yet); ``sweep_id``: the
    ``fab sweep`` it is a variant of."""
    target = WatchTarget(
        run_id=plan.run_id,
        job=spec.name,
        inventory=inventory,
        starters=tuple(n.host.name for n in plan.nodes if n.starts_processes),
        rules=spec.stop,
        teardown=spec.teardown,
        started_at=time.time() if now is None else now,
        folder=folder,
        instance_type=inventory.head.instance_type,
        keep_warm_s=spec.keep_warm_s if warm.applies(inventory, spec.keep_warm_s) else None,
        sweep_id=sweep_id,
    )
    return RunState(plan=plan, inventory=inventory, known_hosts=known_hosts, target=target)


def start_run(
    spec: JobSpec,
    plan: LaunchPlan,
    inventory: Inventory,
    playbook: Path,
    records: RunRecords,
    reporter: Reporter,
    options: RunOptions,
    ask_keep_running: AskKeepRunning | None = None,
    *,
    folder: RunFolder | None = None,
    known_hosts: Path | None = None,
    overrides: Mapping[str, Any] | None = None,
    sweep_id: str | None = None,
    wait: bool = False,
    choice: HostChoice | None = None,
    local_hooks: LocalHooks | None = None,
) -> RunSummary:
    """A run after its plan: pin the host keys (unless ``known_hosts`` holds them), take the
    run's turn on the machines through the run's connection pool (refused, or with ``wait``
    queued, when another run holds them: ``launch.run.queue_turn``; before anything is recorded),
    make the run folder (``hosts.json``: the host ``choice``; ``on-end.json``: the hooks and their
    ``local_hooks`` verdict, so whichever command ends the run runs them) and the run record
    (which playbook, its hash, the code's commit, the ``--set`` overrides, the sweep), then
    ``execute``. The turn is released after the teardown, whatever ended the run."""
    if known_hosts is None:  # pinned here unless the caller pinned them for the run already
        known_hosts = inventory.write_known_hosts(known_hosts_file(inventory.fingerprint()))
    warm.claim(inventory, plan.run_id, lambda line: reporter.say(line))  # a warm fleet's cloud lifetime
    port = SshPool([n.host for n in plan.nodes], known_hosts, max_parallel=options.max_parallel)
    try:
        with waiting(reporter, f"run {plan.run_id}: its turn on the machines") as say:
            hold = take_machines(inventory, port, plan.run_id, wait, options.allow_busy_gpus, say)
    except BaseException:  # ended before the start: what a scheduler granted goes back
        port.close()
        fleet_kind(inventory.fleet).release(lambda line: reporter.say(line))
        raise
    try:
        ctx = _new_run(
            spec, plan, inventory, playbook, records, reporter, options, ask_keep_running, port,
            folder=folder, overrides=overrides, sweep_id=sweep_id, choice=choice, local_hooks=local_hooks,
        )  # fmt: skip
        return execute(
            replace(ctx, hold=hold),
            state_for(spec, plan, inventory, known_hosts, ctx.folder.path, sweep_id=sweep_id),
        )
    finally:
        hold.release()  # after the teardown; already done unless the run left before its wrap-up


def _new_run(
    spec: JobSpec,
    plan: LaunchPlan,
    inventory: Inventory,
    playbook: Path,
    records: RunRecords,
    reporter: Reporter,
    options: RunOptions,
    ask_keep_running: AskKeepRunning | None,
    port: FleetPort,
    *,
    folder: RunFolder | None,
    overrides: Mapping[str, Any] | None,
    sweep_id: str | None,
    choice: HostChoice | None,
    local_hooks: LocalHooks | None,
) -> RunContext:
    """The run folder and record of a run about to start, and its context."""
    folder = folder or RunFolder.create(plan.run_id)
    if choice is not None:  # which hosts the job got, which were skipped and why, the spares
        folder.write_json("hosts.json", choice.record())
    if local_hooks is not None:
        save_on_end(folder.path, spec, local_hooks)
    records.start(
        run_id=plan.run_id,
        playbook_path=str(Path(playbook).resolve()),
        playbook_name=spec.name,
        playbook_hash=file_sha256(playbook),
        git_commit=git_commit_of(spec.workdir),
        inventory=inventory.to_yaml_data(),
        launcher=spec.launcher,
        run_dir=str(folder.path),
        hyperparameters=spec.hyperparameters,
        overrides=overrides,
        sweep_id=sweep_id,
    )
    reporter.say(
        ("fleetrun", "bold"),
        f" run {plan.run_id}: job {spec.name} on {len(plan.nodes)} node(s) "
        f"of {inventory.source} with {spec.launcher}; run folder {folder.path}",
    )
    return RunContext(
        spec=spec,
        port=port,
        folder=folder,
        records=records,
        reporter=reporter,
        options=options,
        ask_keep_running=ask_keep_running,
        peers=PeerCopies(plan.run_id, folder.path / PEER_STAGING, reporter.say),
    )


def execute(ctx: RunContext, state: RunState) -> RunSummary:
    """Preflight, pull (the container image), sync, setup, claim, start, follow, wrap up. Every path out of here after a
    start stops the job and pulls what exists first."""
    ctx.folder.write_text("plan.txt", state.plan.render())
    run = Progress(ctx, state)
    teardown_applies = True
    try:
        run.state = stages.preflight(ctx, run.state)
        run.state = stages.pull_image(ctx, run.state)
        run.state = stages.sync(ctx, run.state)
        run.state = stages.setup(ctx, run.state)
        run.state = replace(run.state, target=replace(run.state.target, started_at=ctx.clock.time()))
        run.state.target.save()  # the launch, after setup: what a re-attached watcher starts from
        run.state = stages.claim(ctx, run.state)
        if run.state.rdzv_port is not None:
            ctx.reporter.say(f"  rendezvous port {run.state.rdzv_port} on {run.state.plan.head.host.name}")
        run.state = replace(run.state, started_job=True)
        run.state = stages.start(ctx, run.state)
        decision = follow(run)
    except StepFailed as exc:
        decision = StopDecision("failed", f"{exc.step}_failed", str(exc), tuple(exc.errors))
    except KeyboardInterrupt:
        if run.state.started_job and ctx.ask_keep_running is not None and _keep_running(ctx, run.state):
            run.ctx.port.close()
            raise
        decision = StopDecision("stopped", "operator", "interrupted by the operator (Ctrl-C)")
        teardown_applies = run.state.started_job
    except Exception as exc:  # noqa: BLE001 - still stop, pull, record and tear down by policy
        step = "starting the run" if run.state.started_job else "preparing the fleet"
        decision = crash_decision(ctx.folder.path, exc, step)
    return wrap_up_run(run, decision, teardown_applies)


def follow(run: Progress, watcher: Watcher | None = None) -> StopDecision:
    """Watch the attempt; after a loss the playbook's ``recovery:`` covers, recover and watch
    the next one, until an attempt ends without a recoverable loss or recovery gives up.
    ``run`` is kept up to date after every step; returns the last attempt's decision."""
    watched = stages.watch(run.ctx, run.state, watcher)
    run.watcher = watched.watcher
    while True:
        outcome = attempts.recover(run.ctx, run.state, watched)
        run.state = outcome.state
        if outcome.watch_on:
            watched = stages.watch(run.ctx, run.state, watched.watcher)
            continue
        if outcome.next_attempt is None:
            return outcome.decision
        attempts.save_attempts(run.ctx, run.state)
        run.ctx, run.state = attempts.adopt(run.ctx, run.state, outcome)
        run.state = ready_next_attempt(run.ctx, run.state, attempts.fresh_names(outcome))
        run.state = attempts.start_next(run.ctx, run.state)
        watched = stages.watch(run.ctx, run.state)
        run.watcher = watched.watcher


def wrap_up_run(run: Progress, decision: StopDecision, teardown_applies: bool) -> RunSummary:
    """The wrap-up of the attempt the run reached (``launch.run.wrapup``), then its attempts;
    then the machines are released and the run closed (``launch.run.closing``: report, hooks)."""
    ctx, state = run.ctx, run.state
    if ctx.peers is not None:  # no more peer copies: the one in flight gets a moment to finish
        ctx.peers.stop()
    summary = wrap_up(
        state.target,
        ctx.port,
        decision,
        ctx.records,
        state.known_hosts,
        ctx.reporter,
        watcher=run.watcher,
        started_job=state.started_job,
        timings=state.timings,
        teardown_applies=teardown_applies,
        transfers=ctx.transfers,
        clock=ctx.clock,
        ended=state.ended,
    )
    if state.ended and (state.plan.recovery.enabled or len(state.ended) > 1):
        attempts.record_attempts(ctx, state, summary)
    if ctx.hold is not None:
        ctx.hold.release()
    return closing.close_run(summary, ctx.reporter, ctx.records, ctx.spec)


def _keep_running(ctx: RunContext, state: RunState) -> bool:
    assert ctx.ask_keep_running is not None
    try:
        return ctx.ask_keep_running(state.plan.run_id)
    except (EOFError, KeyboardInterrupt):
        return False


# -- re-attaching ---------------------------------------------------------------------------------
def check_reattach(record: RunRecord) -> None:
    """A run can be re-attached when it is still running with no live watcher."""
    if record.state == "running" and record.watcher_pid and pid_alive(record.watcher_pid):
        raise FleetrunError(f"run {record.id} is already watched by pid {record.watcher_pid}")
    if record.state not in ("running", "interrupted"):
        raise FleetrunError(
            f"run {record.id} already ended ({record.state}): see 'fab show {shlex.quote(record.id)}'"
        )


def recorded_spec(record: RunRecord, reporter: Reporter) -> JobSpec | None:
    """The playbook the run started with, when it is still there unchanged (its recorded hash);
    None (said why) when it is not: the run is then followed without recovery, which would
    plan a next attempt from it."""
    path = record.playbook_path
    if not path or not record.playbook_hash:
        return None
    try:
        if file_sha256(path) != record.playbook_hash:
            reporter.say(
                (f"  {clean(path)} changed since the run started: following it without recovery", "yellow")
            )
            return None
        return load_job_spec(path)
    except (OSError, FleetrunError) as exc:
        reporter.say(
            (f"  cannot read the run's playbook ({clean(exc, 300)}): following it without recovery", "yellow")
        )
        return None


def rebuilt_state(record: RunRecord, spec: JobSpec, target: WatchTarget, known_hosts: Path) -> RunState:
    """The state of a running attempt, rebuilt from the run's records: the latest attempt's
    inventory (``watch.json``), its plan from the recorded playbook, the attempts that ended."""
    inventory = target.inventory
    spec = spec.model_copy(update={"nodes": len(inventory.hosts)})
    launcher = launcher_class(spec.launcher).for_inventory(inventory)
    plan = launcher.plan(
        spec, inventory, record.id, poweroff_hook=fleet_kind(inventory.fleet).poweroff_hook()
    )
    return RunState(
        plan=plan,
        inventory=inventory,
        known_hosts=known_hosts,
        target=target,
        attempt=target.attempt,
        started_job=True,
        ended=recorded_attempts(record),
    )


def recorded_attempts(record: RunRecord) -> tuple[AttemptEnd, ...]:
    """The attempts the run record says ended (``attempts.json``'s entries)."""
    return tuple(a for a in map(attempts.attempt_end_from_json, record.attempts) if a is not None)


def reattach(
    records: RunRecords,
    record: RunRecord,
    reporter: Reporter,
    poll_interval: float = 1.0,
    *,
    port: FleetPort | None = None,
    transfers: Transfers | None = None,
    clock: Clock | None = None,
) -> RunSummary:
    """``fab watch RUN``: follow a run whose watcher went away, every attempt and recovery
    included, then wrap it up, as ``fab train`` would have. ``port``/``transfers``/``clock``:
    stand-ins for the unit tests (the SSH pool, rsync and the ``time`` module otherwise)."""
    check_reattach(record)
    folder = RunFolder(Path(record.run_dir or ""))
    target = WatchTarget.load(folder.path)
    records.reattach(record.id, now=time.time())
    known_hosts = target.inventory.write_known_hosts(known_hosts_file(target.inventory.fingerprint()))
    port = port or SshPool(target.inventory.hosts, known_hosts)
    reporter.say(("fleetrun", "bold"), f" re-attached to run {record.id}")
    state: RunState | None = None
    spec = recorded_spec(record, reporter)
    if spec is not None:
        try:
            state = rebuilt_state(record, spec, target, known_hosts)
        except Exception as exc:  # noqa: BLE001 - the run is still followed, without recovery
            say = f"  cannot plan a next attempt ({type(exc).__name__}: {clean(exc, 300)}): following it without recovery"
            reporter.say((say, "yellow"))
    if spec is None or state is None:  # the current attempt only, as before there was recovery
        watcher = build_watcher(
            target, port, reporter.console, records, poll_interval=poll_interval, clock=clock or time
        )
        decision = watch_safely(watcher, target.folder)
        summary = wrap_up(
            target,
            port,
            decision,
            records,
            known_hosts,
            reporter,
            watcher=watcher,
            clock=clock or time,
            ended=recorded_attempts(record),  # their energy counts too
        )
        return closing.close_run(summary, reporter, records, None)
    options = RunOptions(poll_interval=poll_interval)
    peers = PeerCopies(record.id, folder.path / PEER_STAGING, reporter.say)
    ctx = RunContext(
        spec=spec, port=port, folder=folder, records=records, reporter=reporter, options=options, peers=peers
    )
    if transfers is not None:
        ctx = replace(ctx, transfers=transfers)
    if clock is not None:
        ctx = replace(ctx, clock=clock)
    run = Progress(ctx, state)
    if run.state.attempt > 1:
        reporter.say(f"  attempt {run.state.attempt} ({len(run.state.ended)} ended before it)")
    try:
        decision = follow(run)
    except Exception as exc:  # noqa: BLE001 - still stop, pull, record and tear down by policy
        decision = crash_decision(folder.path, exc, "following the run")
    return wrap_up_run(run, decision, teardown_applies=True)


# -- pulling again --------------------------------------------------------------------------------
@dataclass(frozen=True)
class PulledAgain:
    """What ``fab pull RUN`` did: each node's pull error (none: every run directory is here) and
    the teardown. ``ok`` only when both went through (its exit code, 0 or 1)."""

    pull_errors: dict[str, str]
    teardown: TeardownOutcome
    hooks: tuple[dict[str, Any], ...] = ()
    """What the ``on_end`` hooks did, when this pull ran them (none had run: the command that
    ended the run left before its close); empty when they had run already or there are none."""

    @property
    def ok(self) -> bool:
        return not self.pull_errors and not self.teardown.blocked


def pull_again(
    records: RunRecords,
    record: RunRecord,
    reporter: Reporter,
    *,
    port: FleetPort | None = None,
    transfers: Transfers | None = None,
) -> PulledAgain:
    """``fab pull RUN``: the wrap-up's pull, reports and teardown for a run that ended (after a
    failed pull blocked its teardown); the teardown runs when every node's run directory is now
    safe."""
    if record.state not in FINAL_STATES:
        raise FleetrunError(f"run {record.id} is {record.state}: use 'fab watch {record.id}' first")
    folder = RunFolder(Path(record.run_dir or ""))
    target = WatchTarget.load(folder.path)
    known_hosts = target.inventory.write_known_hosts(known_hosts_file(target.inventory.fingerprint()))
    transfers = transfers or Transfers()
    port = port or SshPool(target.inventory.hosts, known_hosts)
    try:
        errors = transfers.pull(port, target.run_id, folder, known_hosts, reporter.console)
        if errors:  # a node its watchdog powered off: what it wrote before going is in the bucket
            fetch_watchdog_files(target.inventory, target.run_id, folder, sorted(errors), reporter.say)
        folder.collect_rank0_files()
        write_reports(folder, reporter, record.hyperparameters)
        decided = decide_teardown(target.teardown, record.state, errors, {})
        if decided.action is TeardownAction.TEAR_DOWN:
            teardown = end_fleet(target, port, reporter.say, records)
        else:
            teardown = decided.outcome()
    finally:
        port.close()
    summary_path = folder.path / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    summary.update({"pull_errors": errors, "teardown": teardown.to_json()})
    folder.write_json("summary.json", summary)
    records.update(record.id, artifacts=folder.artifacts())
    reporter.say(f"  teardown: {teardown}")
    hooks = closing.end_hooks(folder.path, reporter) or []
    if hooks:
        records.update(record.id, artifacts=folder.artifacts())
    return PulledAgain(dict(errors), teardown, tuple(hooks))
