"""One run id, several attempts: what the runner does after an attempt ended with a loss that the
playbook's ``recovery:`` section covers.

The decisions are pure (``launch.rules.recovery``); this module gathers the evidence and acts:

1. Evidence first. After a failed attempt every node is checked again, from a fresh TCP
   connection to its sshd (the SSH banner must come back), repeated for ``confirm_s`` for nodes
   that do not answer: one slow poll or one dropped packet never starts a recovery.
2. Survivors get SIGTERM and ``grace_s`` to write a checkpoint, then SIGKILL (the node agent's
   ``stop``), and their run directory's per-attempt files move to ``attempt-<n>/``.
3. Lost nodes are replaced through the fleet kind (``FleetKind.replace``), or left out when the
   job is elastic; the new inventory's host keys are pinned again (a new known_hosts file).
4. Only the new nodes are synced and set up; then the claim (a fresh rendezvous port) and the
   start of every node, with ``attempt`` (``FLEETRUN_ATTEMPT``) in the start bundle, so that
   every rank resumes from the latest checkpoint in ``$FLEETRUN_CHECKPOINT_DIR``.
"""

from __future__ import annotations

import dataclasses
import shlex
import shutil
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from launch.errors import HostError
from launch.fleets.kinds.registry import fleet_kind
from launch.job.inventory import Host
from launch.paths import known_hosts_file
from launch.planning import remote_layout as layout
from launch.planning.launchers import launcher_class
from launch.reports.plot import plot_loss
from launch.reports.safe_text import clean
from launch.rules.metrics_stream import LossPoint
from launch.rules.recovery import (
    EXCLUDING_LOSSES,
    LOSS_RULES,
    AttemptEnd,
    Drained,
    Loss,
    NodeEvidence,
    RecoveryPlan,
    RecoveryPolicy,
    answered_again,
    classify,
    plan_recovery,
    silent_before,
    steps_recomputed,
    without,
)
from launch.rules.stoprules import StopDecision
from launch.run.checkpoints import resume_story, spread_latest
from launch.run.doctor import read_exclusions, record_exclusion
from launch.run.drain import copied_through_laptop, drain_noticed, ssh_reader
from launch.run.peer_copies import PeerCopies, run_has_bucket
from launch.run.recheck import recheck
from launch.run.records import RunRecords
from launch.run.run_folder import RunFolder
from launch.run.summary import RunSummary
from launch.run.target import WatchTarget
from launch.run.watch import AGENT, Watcher
from launch.run.watching import build_watcher, save_traceback, watch_safely
from launch.transport.reachability import CHECK_TIMEOUT_S, sshd_answers
from launch.transport.ssh import Fleet, NodeConnection

if TYPE_CHECKING:
    from launch.run.runner import Runner

ATTEMPT_FILES = (
    "rc",
    "pid",
    "status.json",
    "metrics.jsonl",
    "node.log",
    "guard.log",
    "guard-outcome.json",
    "launch.sh",
    "metrics-elsewhere",
    "preempt.json",
    "signals",
)
"""What one attempt leaves in the run directory; moved to ``attempt-<n>/`` before the next starts."""
MAX_RECHECKS = 5
"""Times per run the watcher goes on after nodes answered a re-check; past it (a node whose sshd
answers but whose agent never does) the unreachable decision stands."""
CHECK_EVERY_S = 1.0


def gather_evidence(
    hosts: Sequence[Host],
    confirm_s: float,
    check: Callable[[Host], bool] = sshd_answers,
    preempted: frozenset[str] = frozenset(),
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, NodeEvidence]:
    """Check every node in parallel; nodes that do not answer are checked again every second
    until ``confirm_s`` has passed (at least twice), and stop being checked once they answer."""
    checks: dict[str, list[bool]] = {h.name: [] for h in hosts}
    first: dict[str, float] = {}
    last: dict[str, float] = {}
    pending = list(hosts)
    started = clock()
    with ThreadPoolExecutor(max_workers=min(32, max(1, len(hosts)))) as pool:
        while pending:
            at = clock()
            answers = list(pool.map(check, pending))
            for host, ok in zip(pending, answers, strict=True):
                checks[host.name].append(ok)
                first.setdefault(host.name, at)
                last[host.name] = at
            pending = [h for h, ok in zip(pending, answers, strict=True) if not ok]
            done = clock() - started >= confirm_s and all(len(checks[h.name]) >= 2 for h in pending)
            if not pending or done:
                break
            sleep(CHECK_EVERY_S)
    return {
        h.name: NodeEvidence(
            node=h.name,
            checks=tuple(checks[h.name]),
            span_s=last[h.name] - first[h.name],
            preempted=h.name in preempted,
        )
        for h in hosts
    }


def preempted_nodes(watcher: Watcher | None) -> frozenset[str]:
    """Nodes whose watchdog reported a preemption notice (the node protocol's ``preempted``)."""
    if watcher is None:
        return frozenset()
    return frozenset(n.name for n in watcher.nodes.values() if n.preempted)


def stop_survivors(
    fleet: Fleet, hosts: Sequence[Host], run_id: str, grace_s: float, attempt: int
) -> dict[str, str]:
    """SIGTERM every process of the run on ``hosts`` (``grace_s`` to checkpoint, then SIGKILL) and
    move the attempt's files to ``attempt-<n>/`` of the run directory. Errors by node name."""
    run_dir = layout.rundir(run_id)
    keep = f"attempt-{attempt}"
    moves = " ".join(shlex.quote(f) for f in ATTEMPT_FILES)
    command = (
        f"{AGENT} stop {shlex.quote(run_id)} {grace_s:g} >/dev/null; "
        f'cd "$HOME/{run_dir}" && mkdir -p {keep} && '
        f'for f in {moves}; do [ -e "$f" ] && mv -f "$f" {keep}/; done; true'
    )

    def stop(conn: NodeConnection) -> str:
        result = conn.run(command, timeout=grace_s + 60)
        if not result.ok:
            raise HostError(conn.host.name, f"could not stop the attempt: {clean(result.stderr[-300:])}")
        return "stopped"

    results = fleet.map(stop, hosts=list(hosts), deadline=grace_s + 90)
    return {n: str(r) for n, r in results.items() if isinstance(r, BaseException)}


class Attempts:
    """Drives attempts 2.. of a run for a ``Runner`` (its fleet, plan and steps)."""

    def __init__(self, runner: Runner) -> None:
        self.runner = runner
        self.ended: list[AttemptEnd] = []
        self.attempt = 1
        self.histories: list[tuple[int, list[LossPoint]]] = []
        self.timings: dict[str, float] = {}
        """Seconds per step of the recovery now under way (recorded with the attempt it starts)."""
        self.started_by: dict[str, float] = {}
        """The same for the recovery that started the current attempt."""
        self.false_alarms = 0
        """Times the unreachable rule fired and every node it named answered a re-check."""
        self.target: WatchTarget | None = None
        self.watcher: Watcher | None = None
        """The latest attempt's, for a wrap-up after an unexpected error between attempts."""
        self.new_hosts: dict[str, Host] = {}
        """The replacement ``Host`` of each node replaced for the coming attempt."""
        self.drained: tuple[Drained, ...] = ()
        """Each preempted node's drain before its replacement (``launch.run.drain``)."""
        self.peers = PeerCopies(runner.plan.run_id, runner.folder.path / ".peer-copies", self.say)
        self.resumed_from: str | None = None
        """Where the coming attempt resumes from and why (the record's ``resumed_from``)."""

    def follow(self, watcher: Watcher) -> None:
        """Record the saves ``watcher`` sees and copy each to a peer node (``PeerCopies``)."""
        runner = self.runner
        copy = self.policy.enabled and not run_has_bucket(runner.inventory, runner.plan.run_id)
        self.peers.follow(watcher, runner.hosts, runner.known_hosts, copy)

    @property
    def policy(self) -> RecoveryPolicy:
        return self.runner.plan.recovery

    def say(self, text: str) -> None:
        self.runner.reporter.say(text)

    def loss_of(self, decision: StopDecision, watcher: Watcher | None) -> Loss | tuple[str, ...] | None:
        """The loss behind ``decision``, or the nodes that answered again (a tuple: the attempt
        is not over, keep watching)."""
        if decision.outcome != "failed" or decision.rule not in LOSS_RULES:
            return None
        self.say(f"  attempt {self.attempt}: {decision.rule}; checking which nodes are really gone")
        started = time.monotonic()
        jumps = self.runner.fleet.jumps  # hosts behind a bastion are checked through it
        evidence = recheck(  # overlapping checks, the watcher's silence counted (launch.run.recheck)
            self.runner.hosts,
            self.policy.confirm_s,
            check=lambda host: sshd_answers(host, CHECK_TIMEOUT_S, jumps),
            preempted=preempted_nodes(watcher),
            silent_before=silent_before(decision, self.runner.spec.stop.unreachable_timeout_s),
        )
        self.timings = {"recheck": time.monotonic() - started}
        back = answered_again(decision, evidence)
        if back and self.false_alarms < MAX_RECHECKS:
            self.false_alarms += 1
            return back
        return classify(decision, evidence, self.policy.confirm_s)

    def record(
        self,
        decision: StopDecision,
        watcher: Watcher | None,
        started_at: float,
        loss: Loss | None,
        plan: RecoveryPlan,
    ) -> None:
        summary = watcher.metrics() if watcher is not None else None
        history = list(summary.history) if summary is not None else []
        first = history[0].step if history else None
        last = summary.last_step if summary is not None else None
        recomputed = None
        if self.ended and first is not None:
            recomputed = steps_recomputed(self.ended[-1].last_step, first)
        self.histories.append((self.attempt, history))
        self.ended.append(
            AttemptEnd(
                attempt=self.attempt,
                nodes=tuple(h.name for h in self.runner.hosts),
                started_at=started_at,
                ended_at=time.time(),
                outcome="preempted" if loss is not None and loss.kind == "preempted" else decision.outcome,
                rule=decision.rule,
                reason=decision.reason,
                loss=loss.kind if loss is not None else None,
                first_step=first,
                last_step=last,
                steps_recomputed=recomputed,
                replaced=plan.replace,
                dropped=plan.drop,
                recovery_s=tuple(self.started_by.items()),
                drained=self.drained,
                resumed_from=resume_story(self.resumed_from, summary) if self.ended else None,
            )
        )
        self.drained = ()

    def run(
        self, target: WatchTarget, watcher: Watcher | None, decision: StopDecision
    ) -> tuple[StopDecision, WatchTarget, Watcher | None]:
        """Attempts until one ends without a recoverable loss, or recovery gives up (the reason
        joins the decision's). Returns the last decision, target and watcher for the wrap-up."""
        while True:
            loss = self.loss_of(decision, watcher) if self.policy.enabled else None
            if isinstance(loss, tuple) and watcher is not None:
                self.say(f"  {', '.join(loss)}: answered again; not lost, watching on")
                for name in loss:
                    self.runner.fleet.connections[name].close()  # the next poll reconnects
                decision = watch_safely(watcher, self.runner.folder.path)
                continue
            if isinstance(loss, tuple):
                loss = None
            names = [h.name for h in self.runner.hosts]
            plan = plan_recovery(self.policy, loss, self.attempt, names, self.runner.plan.min_nodes)
            if plan.stop is None:
                assert loss is not None
                plan = self.replace(loss, plan)
            self.record(decision, watcher, target.started_at, loss, plan)
            if plan.stop is not None:
                if loss is not None and self.policy.enabled:
                    decision = dataclasses.replace(
                        decision, reason=f"{decision.reason} Not recovered: {plan.stop.rstrip('.')}."
                    )
                return decision, target, watcher
            self.say(
                f"  attempt {self.attempt} ended with {loss.kind if loss else '?'}: {loss.reason if loss else ''}"
            )
            self.attempt += 1
            target = self.target = self.relaunch(target, plan)
            self.started_by, self.timings = self.timings, {}
            watcher = self.watcher = build_watcher(
                target,
                self.runner.fleet,
                self.runner.console,
                self.runner.records,
                poll_interval=self.runner.options.poll_interval,
                completion_grace_s=self.runner.options.completion_grace_s,
            )
            self.follow(watcher)
            decision = watch_safely(watcher, self.runner.folder.path)

    def replace(self, loss: Loss, plan: RecoveryPlan) -> RecoveryPlan:
        """Drain preempted nodes, stop the survivors, then replace the lost nodes; a replacement
        that fails turns into going on without the node (elastic) or the end of the run."""
        runner = self.runner
        # a rank's own failure and a GPU fault leave the node answering: its processes are stopped too
        lost = set(loss.nodes) if loss.kind != "rank_failed" and loss.kind not in EXCLUDING_LOSSES else set()
        survivors = [h for h in runner.hosts if h.name not in lost]
        started = time.monotonic()
        # drained first: the notice's checkpoint may still be uploading from a survivor (rank 0's node)
        if loss.kind == "preempted":  # kept until the notice's checkpoint is durable (launch.run.drain)
            noticed = [h for h in runner.hosts if h.name in lost]
            reader = ssh_reader(runner.fleet, runner.plan.run_id)

            def spread() -> str | None:  # the laptop's peer copy: off the noticed node before it goes
                self.spread_checkpoint()
                return runner.resume_from

            copy = copied_through_laptop(spread)
            self.drained = drain_noticed(noticed, reader, self.say, peer_durable=copy)
            self.timings["drain"] = time.monotonic() - started
            started = time.monotonic()
        self.say(
            f"  stopping the attempt on {len(survivors)} node(s), {self.policy.grace_s:g} s to checkpoint"
        )
        errors = stop_survivors(
            runner.fleet, survivors, runner.plan.run_id, self.policy.grace_s, self.attempt
        )
        self.timings["stop_survivors"] = time.monotonic() - started
        started = time.monotonic()
        if errors:
            return RecoveryPlan(
                stop=f"could not stop the attempt on {', '.join(errors)}: {'; '.join(errors.values())}"
            )
        for name in lost:
            runner.fleet.connections[name].close()
        kind = fleet_kind(runner.inventory.fleet)
        replaced: dict[str, Host] = {}
        failed: list[str] = []
        for name in plan.replace:
            host = next(h for h in runner.hosts if h.name == name)
            if loss.kind in EXCLUDING_LOSSES:
                new = self.take_spare(name, loss.reason)
            else:
                try:
                    new = kind.replace(
                        host,
                        lambda m: self.say(f"  {clean(m)}"),
                        self.policy.replace_timeout_s,
                        probe=runner.fleet.answers,
                    )
                except Exception as exc:  # noqa: BLE001 - a failed replacement is an answer, not a crash
                    self.say(f"  {name}: replacement failed: {clean(f'{type(exc).__name__}: {exc}', 300)}")
                    new = None
            if new is None:
                failed.append(name)
            else:
                replaced[name] = new
        self.new_hosts = replaced
        self.timings["replace"] = time.monotonic() - started
        if failed:
            fallback = without(failed, [h.name for h in runner.hosts], runner.plan.min_nodes)
            if fallback.stop is not None:
                return RecoveryPlan(stop=f"could not replace {', '.join(failed)}; {fallback.stop}")
            return RecoveryPlan(replace=tuple(replaced), drop=plan.drop + fallback.drop)
        return RecoveryPlan(replace=tuple(replaced), drop=plan.drop)

    def take_spare(self, name: str, reason: str) -> Host | None:
        """After a ``gpu_fault``: ``name`` is left out for the rest of the run (recorded in the run
        folder's ``hosts.json``) and the first healthy spare not yet in use takes its place."""
        runner = self.runner
        record_exclusion(runner.folder.path, name, reason)
        in_use = {h.name for h in runner.hosts}
        excluded = set(read_exclusions(runner.folder.path))
        for spare in runner.options.spares:
            if spare.name not in in_use and spare.name not in excluded:
                self.say(f"  {name}: excluded for the rest of the run; spare {spare.name} takes its place")
                return spare
        self.say(f"  {name}: excluded for the rest of the run; no spare host left")
        return None

    def relaunch(self, target: WatchTarget, plan: RecoveryPlan) -> WatchTarget:
        """The next attempt: new inventory (replaced hosts, dropped ones gone), re-planned, only
        the new nodes synced and set up, a fresh port claimed, every node started."""
        runner = self.runner
        # a spare (another name) takes the place of the host it replaces, head position included
        fresh = {self.new_hosts[n].name if n in self.new_hosts else n for n in plan.replace}
        new_hosts = [self.new_hosts.get(h.name, h) for h in runner.hosts if h.name not in plan.drop]
        for name in fresh:  # a replaced jump host (a lab's head) is re-pinned on the hosts behind it
            if name in self.new_hosts:
                new_hosts = [h.repinned(self.new_hosts[name]) for h in new_hosts]
        inventory = runner.inventory.model_copy(update={"hosts": new_hosts})
        known_hosts = inventory.write_known_hosts(known_hosts_file(inventory.fingerprint()))
        spec = runner.spec.model_copy(update={"nodes": len(new_hosts)})
        launcher = launcher_class(spec.launcher).for_inventory(inventory)
        hook = fleet_kind(inventory.fleet).poweroff_hook()
        new_plan = launcher.plan(spec, inventory, runner.plan.run_id, poweroff_hook=hook)
        runner.adopt(new_plan, inventory, known_hosts, attempt=self.attempt)
        started = time.monotonic()
        if fresh:
            self.say(f"  attempt {self.attempt}: syncing and setting up {', '.join(sorted(fresh))} only")
            runner.prepare_only([h for h in new_hosts if h.name in fresh])
            # a lab host that answered again may still run the lost attempt (a partition healed):
            # stopped like the survivors were; a fresh machine has nothing to stop
            errors = stop_survivors(
                runner.fleet,
                [h for h in new_hosts if h.name in fresh],
                runner.plan.run_id,
                5.0,
                self.attempt - 1,
            )
            if errors:
                raise HostError(
                    next(iter(errors)), f"could not stop the lost attempt there: {'; '.join(errors.values())}"
                )
        self.timings["sync_setup"] = time.monotonic() - started
        started = time.monotonic()
        self.spread_checkpoint()
        self.timings["checkpoint_copy"] = time.monotonic() - started
        started = time.monotonic()
        runner.rdzv_port = runner.claim()
        target = dataclasses.replace(
            target,
            inventory=inventory,
            starters=tuple(n.host.name for n in new_plan.nodes if n.starts_processes),
            started_at=time.time(),
        )
        target.save()
        self.say(f"  attempt {self.attempt}: starting on {', '.join(h.name for h in new_hosts)}")
        runner.start(target)
        self.timings["claim_start"] = time.monotonic() - started
        return target

    def spread_checkpoint(self) -> None:
        """The newest complete checkpoint onto every node that lacks it (no bucket needed)."""
        runner = self.runner
        staging = runner.folder.path / ".recovery"
        self.peers.stop()
        try:
            spread = spread_latest(
                runner.fleet,
                runner.hosts,
                runner.plan.run_id,
                runner.known_hosts,
                staging,
                recorded=self.peers.recorded,
                bucket=run_has_bucket(runner.inventory, runner.plan.run_id),
                peers=self.peers.copied,
            )
            runner.resume_from, self.resumed_from = spread.resume_from, spread.record
            self.say(f"  {spread.said}")
        except HostError as exc:
            runner.resume_from = None
            self.resumed_from = f"what each node holds: the copy failed ({clean(exc, 200)})"
            self.say(
                f"  could not spread the latest checkpoint ({clean(exc, 300)}); each node resumes from what it holds"
            )
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def attempts_json(self) -> list[dict[str, object]]:
        return [a.to_json() for a in self.ended]


def record_attempts(folder: RunFolder, records: RunRecords, summary: RunSummary, attempts: Attempts) -> None:
    """Each attempt in the run record, in ``attempts.json``, and in the loss plot (every attempt's
    losses, a line where each later attempt resumed). Never raises: the run is already recorded."""
    data = attempts.attempts_json()
    try:
        folder.write_json("attempts.json", {"run_id": summary.run_id, "attempts": data})
        records.update(summary.run_id, attempts=data)
        history = [p for _attempt, points in attempts.histories for p in points]
        resumes = [(n, points[0].step) for n, points in attempts.histories[1:] if points]
        if history and len(attempts.histories) > 1:
            plot_loss(history, folder.path / "loss.png", title=folder.path.name, resumes=resumes)
    except Exception as exc:  # noqa: BLE001 - saved, reported; the outcome stands
        save_traceback(folder.path, exc, "recording the attempts")
        attempts.say(f"  could not record the attempts: {type(exc).__name__}: {clean(exc, 300)}")
