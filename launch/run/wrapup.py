"""After a stop decision: stop every process, pull the artifacts, record, then (maybe) tear down.

The order is the point. Nothing is torn down before the artifacts are safe: a node whose run
directory could not be pulled blocks the teardown (it may hold the only copy), and the failure
is reported, never swallowed. Each step is guarded: an unexpected exception in one (a bug, a
full disk) is saved to ``traceback.txt`` and the wrap-up goes on, so the run is still recorded
and its fleet still handled by policy; a crashed stop or pull counts as "artifacts not safe".
"""

from __future__ import annotations

import shlex
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from launch.errors import HostError
from launch.fleets.kinds.base import UPLOAD_SOURCE, TeardownOutcome, TeardownState
from launch.fleets.teardown import tear_down
from launch.planning import remote_layout as layout
from launch.reports.plot import plot_loss
from launch.reports.safe_text import clean
from launch.reports.tensorboard import write_tensorboard
from launch.reports.warmup import REPORT_MODULES, warm_up
from launch.rules.energy import RunEnergy
from launch.rules.pricing import cost_so_far, price_per_node_hour
from launch.rules.recovery import AttemptEnd
from launch.rules.stoprules import PEER_GONE_RULES, StopDecision, Teardown
from launch.run import sweeps, warm
from launch.run.artifacts import revoke_cluster_keys, stop_all
from launch.run.clock import Clock
from launch.run.lost_nodes import LostProbe, only, without
from launch.run.records import RunRecords
from launch.run.reporter import Reporter
from launch.run.run_folder import RunFolder
from launch.run.summary import TRACEBACK_FILE, RunResult, RunSummary, TeardownAction, decide_teardown
from launch.run.target import WatchTarget
from launch.run.transfers import Transfers
from launch.run.watch import Watcher
from launch.run.watchdog_files import fetch_watchdog_files
from launch.run.watching import save_traceback
from launch.transport.port import FleetPort, NodeLink

__all__ = [
    "REPORT_MODULES",
    "RunResult",
    "RunSummary",
    "Secured",
    "end_fleet",
    "finish",
    "secure_artifacts",
    "start_reports",
    "upload_to_bucket",
    "wrap_up",
    "write_reports",
]
T = TypeVar("T")


STOP_GRACE_S = 10.0
"""SIGTERM -> SIGKILL on a normal stop: a rank using the checkpoint helper saves at its next step."""
PEER_GONE_GRACE_S = 2.0
"""The same when a node is lost or its processes vanished: the survivors sit in a collective
waiting for their lost peer and never reach a next step, so a long grace only delays the exit
(a kill mid-save leaves the previous checkpoint whole: saves are temp dir + rename)."""


def stop_grace(decision: StopDecision, lost: Collection[str]) -> float:
    """How long the stop waits between SIGTERM and SIGKILL for this decision; ``lost``: the nodes
    the watcher could not reach at its last poll (the survivors may be waiting for them)."""
    return PEER_GONE_GRACE_S if lost or decision.rule in PEER_GONE_RULES else STOP_GRACE_S


WARM_UP_WAIT_S = 60.0
"""The longest the plot waits for the background warm-up (its imports) to finish."""


def warm_up_reports() -> threading.Thread | None:
    """The report modules imported in the background (``launch.reports.warmup``): started by the
    watcher at the first step, here again for a run that never logged one (once per process)."""
    return warm_up()


def write_reports(
    folder: RunFolder, reporter: Reporter, hyperparameters: dict[str, Any] | None = None
) -> None:
    """The loss plot and the TensorBoard event file (scalars, and the run's hyperparameters).

    A run stopped before its first logged step (a wall-time limit during start-up, a crash in
    the imports) still gets its plot, saying that no loss was logged: the person looking for it
    learns that from the plot instead of from its absence."""
    warming = warm_up()  # the background imports and throwaway figure: done before drawing here,
    if warming is not None:  # matplotlib's font cache and pyplot state are not thread-safe
        warming.join(timeout=WARM_UP_WAIT_S)
    logged = (folder.path / "metrics.jsonl").exists()
    records, summary = folder.read_metrics() if logged else ([], None)
    history = summary.history if summary is not None else []
    try:
        plot_loss(history, folder.path / "loss.png", title=folder.path.name, records=records)
        if logged:
            write_tensorboard(records, folder.path / "tensorboard", hyperparameters=hyperparameters)
    except Exception as exc:  # noqa: BLE001 - a plot must never hide the run's outcome
        reporter.say(
            ("  could not write the loss plot / TensorBoard files: ", "yellow"), (str(exc), "yellow")
        )


def recorded_hyperparameters(records: RunRecords, run_id: str) -> dict[str, Any] | None:
    """The hyperparameters the run was started with (for the TensorBoard HParams session)."""
    record = records.get(run_id)
    return record.hyperparameters if record is not None else None


def upload_to_bucket(fleet: FleetPort, target: WatchTarget, reporter: Reporter) -> dict[str, str]:
    """Fleets with a bucket: each node copies its run directory there with its own role, running
    the command its fleet kind gives. The local pull is the copy teardown waits for; the bucket
    copy is reported, not blocking."""
    run_dir = layout.rundir(target.run_id)
    if all(target.upload_argv(h.name) is None for h in fleet.hosts):
        return {}  # the fleet kind has no bucket (local fleet, lab machines): nothing to say
    env = target.upload_env()

    def upload(conn: NodeLink) -> str:
        argv = target.upload_argv(conn.host.name)
        if argv is None:
            return "no bucket"
        command = 'cd "$HOME" && ' + shlex.join([run_dir if a == UPLOAD_SOURCE else a for a in argv])
        if env:  # on stdin, a variable a line: a command line is in every node user's ``ps``
            command = f'while IFS= read -r kv; do export "$kv"; done && {command}'
            lines = "".join(f"{k}={v}\n" for k, v in sorted(env.items()))
            result = conn.run_with_input(command, lines.encode(), timeout=3600)
        else:
            result = conn.run(command, timeout=3600)
        if not result.ok:
            tail = (result.stderr or result.stdout).strip()[-300:]
            raise HostError(conn.host.name, f"upload failed (exit {result.exit_code}): {tail}")
        return f"uploaded to {argv[-1]}"

    messages: dict[str, str] = {}
    for name, res in fleet.map(upload, deadline=3700).items():  # both halves: each node's line
        messages[name] = str(res)
        reporter.say(f"  {name}: {res}")
    return messages


@dataclass
class WatchFacts:
    """What the watcher learnt that the summary keeps."""

    exit_codes: dict[str, int | None] = field(default_factory=dict)
    last_metrics: dict[str, Any] = field(default_factory=dict)
    world: dict[str, Any] | None = None
    first_step_after_s: float | None = None
    energy_kwh: float | None = None
    """The watched attempt's GPU energy (None: no readings)."""
    attempt: int | None = None
    """The attempt the watcher watched: its own, which the run's state may have moved past."""
    watch: dict[str, Any] = field(default_factory=dict)
    """Its poll rounds and the exits pushed to it (``RunSummary.watch``)."""


def watch_facts(watcher: Watcher | None, started_at: float) -> WatchFacts:
    if watcher is None:
        return WatchFacts()
    summary = watcher.metrics()
    last_metrics = dict(summary.last_metrics)
    if summary.last_step is not None:
        last_metrics["step"] = summary.last_step
    return WatchFacts(
        exit_codes={n.name: n.rc for n in watcher.nodes.values()},
        last_metrics=last_metrics,
        world=dict(summary.world) if summary.world else None,
        first_step_after_s=None if watcher.first_step_at is None else watcher.first_step_at - started_at,
        energy_kwh=watcher.rule_state.energy.kwh,
        attempt=watcher.target.attempt,
        watch={
            "polls": watcher.polls,
            "woken_by_push": watcher.woken,
            "pushed": [
                {"node": p.node, "state": p.state, "rc": p.rc}
                for p in (watcher.pushed.pushed if watcher.pushed is not None else [])
            ],
        },
    )


class _Steps:
    """Runs wrap-up steps so that one step's unexpected failure never skips the next ones."""

    def __init__(self, folder: RunFolder, reporter: Reporter, clock: Clock = time) -> None:
        self.folder = folder
        self.reporter = reporter
        self.clock = clock
        self.crashed: list[str] = []
        self.timings: dict[str, float] = {}
        """Seconds per step (``wrapup <where>``), kept in the summary: where a slow exit went."""

    def timed(self, where: str, step: Callable[[], T]) -> T:
        started = self.clock.monotonic()
        try:
            return step()
        finally:
            key = f"wrapup {where}"
            self.timings[key] = self.timings.get(key, 0.0) + self.clock.monotonic() - started

    def run(self, where: str, step: Callable[[], T], fallback: Callable[[str], T]) -> T:
        try:
            return self.timed(where, step)
        except Exception as exc:  # noqa: BLE001 - saved to traceback.txt and reported
            save_traceback(self.folder.path, exc, where)
            self.crashed.append(where)
            message = f"{where} failed unexpectedly: {type(exc).__name__}: {exc}"
            self.reporter.say(("  " + message, "red"), f" (see {TRACEBACK_FILE})")
            return fallback(message)


class _Revoke:
    """The run's cluster key revoked on the stopped nodes while their artifacts are pulled (one
    round trip less after the pull: 0.15 s of a failed run's exit on a loaded 2-core machine),
    then on the nodes it could not cover (those that answered the lost nodes' probe). A failed
    revoke is reported, never raised: the key expires anyway and the wrap-up goes on."""

    def __init__(self, steps: _Steps) -> None:
        self.steps = steps
        self.errors: dict[str, str] = {}
        self.covered: set[str] = set()
        self.thread: threading.Thread | None = None

    def _revoke(self, fleet: FleetPort) -> None:
        try:
            self.errors |= self.steps.timed("revoke", lambda: revoke_cluster_keys(fleet))
        except Exception as exc:  # noqa: BLE001
            self.errors["*"] = f"{type(exc).__name__}: {exc}"

    def start(self, fleet: FleetPort) -> None:
        self.covered = {h.name for h in fleet.hosts}
        self.thread = threading.Thread(target=self._revoke, args=(fleet,), name="fleetrun-revoke")
        try:
            self.thread.start()
        except RuntimeError:  # no thread to be had: revoked at the end, as before
            self.thread, self.covered = None, set()

    def finish(self, fleet: FleetPort) -> dict[str, str]:
        """Every node of ``fleet`` revoked (waiting for the early revoke); errors per node."""
        if self.thread is not None:
            self.thread.join()
        rest = without(fleet, self.covered) if self.covered else fleet
        if rest.hosts:
            self._revoke(rest)
        return self.errors


@dataclass
class Secured:
    """What securing the artifacts left: per-node stop and pull errors, the bucket copies."""

    stop_errors: dict[str, str] = field(default_factory=dict)
    pull_errors: dict[str, str] = field(default_factory=dict)
    uploads: dict[str, str] = field(default_factory=dict)


def secure_artifacts(
    target: WatchTarget,
    fleet: FleetPort,
    decision: StopDecision,
    known_hosts: Path,
    reporter: Reporter,
    steps: _Steps,
    watcher: Watcher | None = None,
    started_job: bool = True,
    transfers: Transfers | None = None,
) -> Secured:
    """Stop every process of the run, pull every node's run directory, copy it to the bucket,
    revoke the run's cluster key, close the connections. Never raises for a step.

    Nodes the watcher lost are probed once, briefly, while the others are stopped and pulled
    (see ``launch.run.lost_nodes``); the ones still silent are left out of stop, pull and upload
    and count as failed pulls, so they still block the teardown."""
    transfers = transfers or Transfers()
    folder = RunFolder(target.folder)
    hosts = [h.name for h in target.inventory.hosts]
    secured = Secured()
    reach = fleet
    revoking = _Revoke(steps)
    try:
        if started_job:
            # the outcome and reason are the summary's first line (app.report), not said twice
            reporter.say(
                f"run ending ({decision.rule}): stopping what is left on the nodes, pulling artifacts"
            )
            warm_up_reports()
            probe = steps.run(
                "probing the nodes the watcher lost",
                lambda: LostProbe.start(fleet, watcher),
                lambda _m: LostProbe(fleet, ()),  # none left out: every node stopped and pulled
            )
            reach = without(fleet, probe.suspects)
            grace = stop_grace(decision, probe.suspects)
            stop_errors = steps.run(
                "stopping the run",
                lambda: stop_all(reach, target.run_id, reporter.console, grace=grace),
                lambda msg: dict.fromkeys(hosts, msg),
            )
            revoking.start(reach)  # the pulls use the operator's key, not the run's: revoked meanwhile
            pull_errors = steps.run(
                "pulling artifacts",
                lambda: transfers.pull(reach, target.run_id, folder, known_hosts, reporter.console),
                lambda msg: dict.fromkeys(hosts, msg),
            )
            lost: dict[str, str] = steps.run(
                "probing the nodes the watcher lost", probe.result, lambda _m: {}
            )
            for name, why in lost.items():
                reporter.say((f"  {name}: not stopped, not pulled: {why}", "red"))
            back = only(fleet, probe.answered(lost))
            if back.hosts:  # the cut healed: these are stopped and pulled like the others
                stop_errors |= steps.run(
                    "stopping the run on the nodes that answered the probe",
                    lambda: stop_all(back, target.run_id, reporter.console, grace=grace),
                    lambda msg: dict.fromkeys((h.name for h in back.hosts), msg),
                )
                pull_errors |= steps.run(
                    "pulling artifacts from the nodes that answered the probe",
                    lambda: transfers.pull(back, target.run_id, folder, known_hosts, reporter.console),
                    lambda msg: dict.fromkeys((h.name for h in back.hosts), msg),
                )
            secured.stop_errors = stop_errors | lost
            secured.pull_errors = pull_errors | lost
            if secured.pull_errors:  # a node its watchdog powered off: its last words are in the bucket
                steps.run(
                    "fetching the watchdog's files from the bucket",
                    lambda: fetch_watchdog_files(
                        target.inventory, target.run_id, folder, sorted(secured.pull_errors), reporter.say
                    ),
                    lambda _m: {},
                )
            reach = without(fleet, lost)
            secured.uploads = steps.run(
                "uploading to the bucket",
                lambda: upload_to_bucket(reach, target, reporter),
                lambda msg: {"*": msg},
            )
    finally:
        revoke_errors = revoking.finish(reach)
        for name, err in revoke_errors.items():
            reporter.say((f"  {name}: could not revoke the run's cluster SSH key: {err}", "yellow"))
        steps.timed("close", fleet.close)
    return secured


def start_reports(
    folder: RunFolder, records: RunRecords, run_id: str, reporter: Reporter, steps: _Steps, started_job: bool
) -> threading.Thread:
    """The loss plot and the TensorBoard file, drawn from the pulled files in a thread while the
    fleet is torn down (the teardown only needs the pulls to be done): a local fleet's removal
    takes about as long as drawing them, and a run's exit should not wait for both in turn.
    The run records are SQLite, used from the caller's thread only: read before the thread starts.
    The caller joins the thread (``finish``)."""
    hyperparameters = (
        steps.run(
            "reading the run's hyperparameters",
            lambda: recorded_hyperparameters(records, run_id),
            lambda _m: None,
        )
        if started_job
        else None
    )
    reports = threading.Thread(
        target=lambda: steps.run(
            "writing the loss plot",
            lambda: write_reports(folder, reporter, hyperparameters),
            lambda _m: None,
        ),
        name="fleetrun-reports",
    )
    if started_job:
        try:
            reports.start()
        except RuntimeError:  # no thread to be had: drawn here, before the teardown
            reports.run()
    return reports


def run_energy(recorded: RunEnergy, ended: Sequence[AttemptEnd], facts: WatchFacts) -> RunEnergy:
    """Every attempt's energy, each once, the freshest figure of each: what the heartbeats left
    in the run record (an attempt whose watcher went away and was never watched again), replaced
    by the ended attempts' figures, then by the watched attempt's from its watcher."""
    figures = [*recorded.by_attempt.items(), *((a.attempt, a.energy_kwh) for a in ended)]
    if facts.attempt is not None:
        figures.append((facts.attempt, facts.energy_kwh))
    return RunEnergy.of(figures)


def recorded_energy(records: RunRecords, run_id: str) -> RunEnergy:
    record = records.get(run_id)
    return RunEnergy.from_json(record.energy_by_attempt if record is not None else None)


def end_fleet(
    target: WatchTarget, fleet: FleetPort, say: Callable[[str], None], records: RunRecords | None = None
) -> TeardownOutcome:
    """The teardown action once the policy says the fleet goes: kept for the run's sweep while
    other variants of it still need the fleet (``launch.run.sweeps``), kept while another run
    this laptop recorded still runs on it (``records``; that run's end decides), else kept warm
    until a deadline (``launch.run.warm``) when the run asks for it, else torn down now. A fleet
    kept for others gets idle timers on this run's nodes (``keep_warm_s``, else the time the
    watchdog gives a lost laptop), so no node is left billing if the laptop goes away."""
    idle_s = target.keep_warm_s or max(target.rules.watcher_lost_after_s, warm.HOLD_MIN_S)
    # nodes another live run still uses are never armed; without the records none is (unknown)
    busy = warm.busy_hosts(target.inventory, target.run_id, records) if records is not None else None
    held = sweeps.leave(target.sweep_id, target.run_id)
    if held is not None:
        timers = warm.hold_for_others(fleet, target.inventory, idle_s, say, busy) if busy is not None else ""
        return TeardownOutcome(TeardownState.SKIPPED, held + timers)
    other = warm.run_still_on(target.inventory, target.run_id, records) if records is not None else None
    if other is not None:
        return TeardownOutcome(
            TeardownState.SKIPPED,
            f"kept: run {clean(other, 100)} still runs on this fleet (teardown: {Teardown(target.teardown).value}); "
            "its own end decides" + warm.hold_for_others(fleet, target.inventory, idle_s, say, busy or set()),
        )
    if target.keep_warm_s:
        return warm.keep_warm(
            fleet, target.inventory, target.run_id, target.folder, target.teardown, target.keep_warm_s, say
        )
    return tear_down(target.inventory, say=lambda m: say(f"  {m}"))


def finish(
    target: WatchTarget,
    fleet: FleetPort,
    decision: StopDecision,
    secured: Secured,
    records: RunRecords,
    reporter: Reporter,
    steps: _Steps,
    reports: threading.Thread,
    *,
    watcher: Watcher | None,
    rank0_node: str | None,
    decided_at: float,
    started_job: bool,
    teardown_applies: bool,
    timings: Mapping[str, float],
    clock: Clock = time,
    ended: Sequence[AttemptEnd] = (),
) -> RunSummary:
    """Decide and run the teardown (while the reports are drawn), then record the run and write
    ``summary.json``. Never raises for a step. ``ended``: the run's attempts that ended (their
    energy is summed with the watched attempt's)."""
    folder = RunFolder(target.folder)
    hosts = [h.name for h in target.inventory.hosts]
    facts = steps.run(
        "reading the watcher's facts",
        lambda: watch_facts(watcher, target.started_at),
        lambda _m: WatchFacts(),
    )
    recorded = steps.run(
        "reading the recorded energy", lambda: recorded_energy(records, target.run_id), lambda _m: RunEnergy()
    )
    teardown_started_at: float | None = None
    decided = decide_teardown(
        target.teardown, decision.outcome, secured.pull_errors, secured.stop_errors, applies=teardown_applies
    )
    try:
        if decided.action is TeardownAction.TEAR_DOWN:
            teardown_started_at = clock.time()
            teardown = steps.run(
                "keeping the fleet warm" if target.keep_warm_s else "tearing the fleet down",
                lambda: end_fleet(target, fleet, reporter.say, records),
                lambda msg: TeardownOutcome(TeardownState.FAILED, msg),
            )
        else:
            teardown = decided.outcome()
            steps.run(
                "leaving the sweep", lambda: sweeps.leave(target.sweep_id, target.run_id), lambda _m: None
            )
    finally:
        if reports.is_alive():
            reports.join()

    ended_at = clock.time()
    price = price_per_node_hour(target.instance_type, target.rules.price_per_node_hour)
    launched = started_job and price > 0
    summary = RunSummary(
        run_id=target.run_id,
        job=target.job,
        outcome=decision.outcome,
        rule=decision.rule,
        reason=decision.reason,
        folder=folder.path,
        exit_codes=facts.exit_codes,
        failed_nodes=decision.nodes if decision.outcome == "failed" else (),
        first_step_after_s=facts.first_step_after_s,
        last_metrics=facts.last_metrics,
        world=facts.world,
        rank0_node=rank0_node,
        pull_errors=secured.pull_errors,
        stop_errors=secured.stop_errors,
        uploads=secured.uploads,
        teardown=teardown,
        timings={**timings, **steps.timings},
        nodes=hosts,
        cost_usd=cost_so_far(len(hosts), price, ended_at - target.started_at) if launched else None,
        energy=run_energy(recorded, ended, facts),
        traceback=TRACEBACK_FILE if (folder.path / TRACEBACK_FILE).exists() else None,
        decided_at=decided_at,
        teardown_started_at=teardown_started_at,
        ended_at=ended_at,
        watch=facts.watch,
    )
    steps.run(
        "recording the run",
        lambda: records.finish(target.run_id, artifacts=folder.artifacts(), **summary.record_fields()),
        lambda _m: None,
    )
    steps.run(
        "writing summary.json", lambda: folder.write_json("summary.json", summary.to_json()), lambda _m: None
    )
    return summary


def wrap_up(
    target: WatchTarget,
    fleet: FleetPort,
    decision: StopDecision,
    records: RunRecords,
    known_hosts: Path,
    reporter: Reporter,
    watcher: Watcher | None = None,
    started_job: bool = True,
    timings: Mapping[str, float] | None = None,
    teardown_applies: bool | None = None,
    transfers: Transfers | None = None,
    clock: Clock = time,
    ended: Sequence[AttemptEnd] = (),
) -> RunSummary:
    """Secure the artifacts (stop, pull, upload, revoke), write the reports, finish (teardown
    by policy, record, ``summary.json``). Never raises for a step.

    ``teardown_applies`` defaults to ``started_job``: a run interrupted before its launch leaves
    nothing to tear down; the life cycle passes True for a failed preflight/sync/setup.
    """
    decided_at = clock.time()
    folder = RunFolder(target.folder)
    steps = _Steps(folder, reporter, clock)
    secured = secure_artifacts(
        target, fleet, decision, known_hosts, reporter, steps, watcher, started_job, transfers
    )
    rank0_node = steps.run("collecting rank 0's files", folder.collect_rank0_files, lambda _m: None)
    reports = start_reports(folder, records, target.run_id, reporter, steps, started_job)
    return finish(
        target,
        fleet,
        decision,
        secured,
        records,
        reporter,
        steps,
        reports,
        watcher=watcher,
        rank0_node=rank0_node,
        decided_at=decided_at,
        started_job=started_job,
        teardown_applies=started_job if teardown_applies is None else teardown_applies,
        timings=timings or {},
        clock=clock,
        ended=ended,
    )
