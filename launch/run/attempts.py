"""One run id, several attempts: what the life cycle (``launch.run.lifecycle.follow``) does after
an attempt ended with a loss that the playbook's ``recovery:`` section covers. Each step is a
function of the run context and state that returns the new state; nothing here holds a runner.

The decisions are pure (``launch.rules.recovery``); this module gathers the evidence and acts:

1. Evidence first. After a failed attempt every node is checked again, from a fresh TCP
   connection to its sshd (the SSH banner must come back), repeated for ``confirm_s`` for nodes
   that do not answer: one slow poll or one dropped packet never starts a recovery.
2. Survivors get SIGTERM and ``grace_s`` to write a checkpoint, then SIGKILL (the node agent's
   ``stop``), and their run directory's per-attempt files move to ``attempt-<n>/``. A survivor
   none of whose ranks still steps (blocked in a collective with the lost node) is killed at
   once: it could not use the grace (``launch.nodelib.fleetrun_stepping``).
3. Lost nodes are replaced through the fleet kind (``FleetKind.replace``), or left out when the
   job is elastic; a node left out after a ``gpu_fault`` or a straggler gets a spare of the
   inventory, else a new machine from its kind (``FleetKind.renew``), else the same fallback
   (``take_spare``). Every new machine is checked before it is taken (``candidate_trouble``: SSH and GPUs):
   a bad one is excluded and the next candidate tried. The new inventory's host keys are pinned
   again (a new known_hosts file).
4. Only the new nodes are synced and set up; then the claim (a fresh rendezvous port) and the
   start of every node, with ``attempt`` (``FLEETRUN_ATTEMPT``) in the start bundle, so that
   every rank resumes from the latest checkpoint in ``$FLEETRUN_CHECKPOINT_DIR``.
"""

from __future__ import annotations

import shlex
import shutil
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace

from launch.errors import HostError
from launch.fleets.kinds.registry import fleet_kind
from launch.job.fleet_refs import FleetRef
from launch.job.inventory import Host
from launch.nodelib.fleetrun_protocol import ProtocolError, StopAnswer
from launch.paths import known_hosts_file
from launch.planning import remote_layout as layout
from launch.planning.launchers import launcher_class
from launch.reports.plot import plot_loss
from launch.reports.safe_text import clean
from launch.rules.energy import kwh_figure
from launch.rules.metrics_stream import MetricsStream
from launch.rules.preflight import Job, judge
from launch.rules.recovery import (
    EXCLUDING_LOSSES,
    LOSS_KINDS,
    LOSS_RULES,
    AttemptEnd,
    Loss,
    RecoveryPlan,
    Renewal,
    answered_again,
    classify,
    plan_recovery,
    silent_before,
    steps_recomputed,
    without,
)
from launch.rules.stoprules import StopDecision
from launch.run import stages
from launch.run.checkpoints import Spread, drained_from_bucket, resume_story
from launch.run.doctor import gather, read_exclusions, record_exclusion, record_renewal
from launch.run.drain import copied_through_laptop, drain_noticed, ssh_reader
from launch.run.recheck import recheck, sshd_check
from launch.run.replacements import Replacements
from launch.run.stages import Watched
from launch.run.state import RunContext, RunState
from launch.run.summary import RunSummary
from launch.run.target import run_prefix
from launch.run.watch import AGENT, Watcher
from launch.run.watching import save_traceback
from launch.transport.port import FleetPort, NodeLink

ATTEMPT_FILES = (
    "rc",
    "rank-rc",
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


def preempted_nodes(watcher: Watcher | None) -> frozenset[str]:
    """Nodes whose watchdog reported a preemption notice (the node protocol's ``preempted``)."""
    if watcher is None:
        return frozenset()
    return frozenset(n.name for n in watcher.nodes.values() if n.preempted)


@dataclass(frozen=True)
class Stopped:
    """What ``stop_survivors`` did: each node's error, and each stopped node's agent answer (the
    ranks it found stepping or blocked, and whether it cut their grace short)."""

    errors: dict[str, str] = field(default_factory=dict)
    answers: dict[str, StopAnswer] = field(default_factory=dict)

    def without_grace(self) -> list[str]:
        """The nodes whose ranks were killed at once: none of them was still stepping."""
        return sorted(name for name, answer in self.answers.items() if answer.grace_cut)


def stop_survivors(
    fleet: FleetPort, hosts: Sequence[Host], run_id: str, grace_s: float, attempt: int
) -> Stopped:
    """SIGTERM every process of the run on ``hosts`` and move the attempt's files to
    ``attempt-<n>/`` of the run directory. Ranks still stepping get ``grace_s`` to checkpoint,
    then SIGKILL; on a node where none steps (blocked in a collective with a lost peer: no new
    pace record for a while) the agent kills them at once (``--only-if-stepping``), since they
    could not reach the step where they would save."""
    run_dir = layout.rundir(run_id)
    keep = f"attempt-{attempt}"
    moves = " ".join(shlex.quote(f) for f in ATTEMPT_FILES)
    # the wrapper (``pid``) writes ``rc`` once its killed child is gone; moved before it lands,
    # that ``rc`` would be read as the next attempt's exit: wait for the wrapper, 10 s at most
    wait = (
        'p=$(cat pid 2>/dev/null); case "$p" in ""|*[!0-9]*) p=;; esac; n=0; '
        'while [ -n "$p" ] && kill -0 "$p" 2>/dev/null && [ "$n" -lt 100 ]; do sleep 0.1; n=$((n+1)); done; '
    )
    command = (
        f"answer=$({AGENT} stop {shlex.quote(run_id)} {grace_s:g} --only-if-stepping 2>/dev/null); "
        f'cd "$HOME/{run_dir}" && {wait}mkdir -p {keep} && '
        f'for f in {moves}; do [ -e "$f" ] && mv -f "$f" {keep}/; done; printf "%s\n" "$answer"; true'
    )

    def stop(conn: NodeLink) -> StopAnswer | None:
        result = conn.run(command, timeout=grace_s + 60)
        if not result.ok:
            raise HostError(conn.host.name, f"could not stop the attempt: {clean(result.stderr[-300:])}")
        lines = result.stdout.strip().splitlines()
        try:  # the node's answer is untrusted: one that does not parse only loses the figures
            return StopAnswer.from_json(lines[-1]) if lines else None
        except ProtocolError:
            return None

    results = fleet.map(stop, hosts=list(hosts), deadline=grace_s + 90)
    answers = {n: a for n, a in results.items() if isinstance(a, StopAnswer)}
    return Stopped(results.errors(), answers)


@dataclass(frozen=True)
class Recovery:
    """What recovery made of the end of an attempt (``recover``).

    ``watch_on``: nodes the stop decision named answered a re-check; the attempt is not over.
    ``next_attempt``: the nodes replaced (``new_hosts``) and dropped for the next attempt; None
    when the run ends with ``decision`` (no loss, recovery off, or recovery gave up: the reason
    then joins the decision's)."""

    state: RunState
    decision: StopDecision
    watch_on: tuple[str, ...] = ()
    next_attempt: RecoveryPlan | None = None
    new_hosts: Mapping[str, Host] = field(default_factory=dict)


def say(ctx: RunContext, text: str) -> None:
    ctx.reporter.say(text)


def loss_of(
    ctx: RunContext, state: RunState, watched: Watched
) -> tuple[RunState, Loss | tuple[str, ...] | None]:
    """The loss behind the attempt's decision, or the nodes that answered again (a tuple: the
    attempt is not over, keep watching)."""
    decision = watched.decision
    if decision.outcome != "failed" or decision.rule not in LOSS_RULES:
        return state, None
    policy = state.plan.recovery
    say(ctx, f"  attempt {state.attempt}: {decision.rule}; checking which nodes are really gone")
    started = ctx.clock.monotonic()
    early = watched.watcher.early_checks if watched.watcher is not None else None
    credit = silent_before(decision, ctx.spec.stop.unreachable_timeout_s)
    evidence = recheck(  # overlapping checks, the watcher's silence counted (launch.run.recheck)
        state.hosts,
        policy.confirm_s,
        check=sshd_check(ctx.port.jumps),  # through the bastion where a host has one
        preempted=preempted_nodes(watched.watcher),
        silent_before=credit,
        failed_early=early.failed(credit) if early is not None else None,
    )  # on the real clock: the checks run in threads, which a test's fake clock does not wait for
    gone = set(fleet_said_gone(ctx, state))
    if decision.rule == "node_down":  # the fleet's word the watcher saw stands, even if since taken back
        gone |= set(decision.nodes)
    evidence = {n: replace(e, cloud_gone=True) if n in gone else e for n, e in evidence.items()}
    state = replace(state, recovery_timings={"recheck": ctx.clock.monotonic() - started})
    back = answered_again(decision, evidence)
    if back and state.false_alarms < MAX_RECHECKS:
        return replace(state, false_alarms=state.false_alarms + 1), back
    return state, classify(decision, evidence, policy.confirm_s)


def fleet_said_gone(ctx: RunContext, state: RunState) -> dict[str, str]:
    """The run's nodes the fleet itself says are gone or taken (``FleetKind.lost_nodes``: Slurm's
    DOWN/DRAIN); a question that fails is said and counts as none (the SSH checks decide)."""
    try:
        gone = fleet_kind(state.inventory.fleet).lost_nodes([h.name for h in state.hosts])
    except Exception as exc:  # noqa: BLE001 - the checks' evidence stands without the fleet's word
        say(
            ctx,
            f"  could not ask the fleet which nodes it took: {clean(f'{type(exc).__name__}: {exc}', 300)}",
        )
        return {}
    for name, why in sorted(gone.items()):
        say(ctx, f"  {clean(name, 100)}: the fleet says {clean(why, 200)}")
    return gone


def record(
    ctx: RunContext, state: RunState, watched: Watched, loss: Loss | None, plan: RecoveryPlan
) -> RunState:
    """The state with the attempt that just ended added to ``ended`` (and its loss history)."""
    decision, watcher = watched.decision, watched.watcher
    summary = watcher.metrics() if watcher is not None else None
    history = tuple(summary.history) if summary is not None else ()
    first = history[0].step if history else None
    last = summary.last_step if summary is not None else None
    recomputed = None
    if state.ended and first is not None:
        recomputed = steps_recomputed(state.ended[-1].last_step, first)
    end = AttemptEnd(
        attempt=state.attempt,
        nodes=tuple(h.name for h in state.hosts),
        started_at=state.target.started_at,
        ended_at=ctx.clock.time(),
        outcome="preempted" if loss is not None and loss.kind == "preempted" else decision.outcome,
        rule=decision.rule,
        reason=decision.reason,
        loss=loss.kind if loss is not None else None,
        first_step=first,
        last_step=last,
        steps_recomputed=recomputed,
        replaced=plan.replace,
        dropped=plan.drop,
        recovery_s=tuple(state.started_by.items()),
        drained=state.drained,
        resumed_from=resume_story(state.resume_record, summary) if state.ended else None,
        renewed=state.renewed,
        not_taken=state.not_taken,
        grace_cut=state.grace_cut,
        energy_kwh=watcher.rule_state.energy.kwh if watcher is not None else None,
    )
    return replace(
        state,
        ended=(*state.ended, end),
        histories=(*state.histories, (state.attempt, history)),
        drained=(),
        renewed=(),
        not_taken=(),
        grace_cut=(),
    )


def recover(ctx: RunContext, state: RunState, watched: Watched) -> Recovery:
    """After an attempt's stop decision: check the evidence, then either keep watching (the
    nodes answered again), end the run, or stop the survivors and replace the lost nodes for
    the next attempt (``relaunch`` starts it). The ended attempt is recorded in the state."""
    policy = state.plan.recovery
    decision = watched.decision
    loss: Loss | tuple[str, ...] | None = None
    if policy.enabled:
        state, loss = loss_of(ctx, state, watched)
    if isinstance(loss, tuple) and watched.watcher is not None:
        say(ctx, f"  {', '.join(loss)}: answered again; not lost, watching on")
        for name in loss:
            ctx.port.connections[name].close()  # the next poll reconnects
        return Recovery(state, decision, watch_on=loss)
    if isinstance(loss, tuple):
        loss = None
    names = [h.name for h in state.hosts]
    plan = plan_recovery(policy, loss, state.attempt, names, state.plan.min_nodes)
    new_hosts: dict[str, Host] = {}
    if plan.stop is None:
        assert loss is not None
        state, plan, new_hosts = replace_lost(ctx, state, loss, plan)
    state = record(ctx, state, watched, loss, plan)
    if plan.stop is not None:
        if loss is not None and policy.enabled:
            decision = replace(decision, reason=f"{decision.reason} Not recovered: {plan.stop.rstrip('.')}.")
        return Recovery(state, decision)
    say(
        ctx,
        f"  attempt {state.attempt} ended with {loss.kind if loss else '?'}: {loss.reason if loss else ''}",
    )
    return Recovery(state, decision, next_attempt=plan, new_hosts=new_hosts)


def replace_lost(
    ctx: RunContext, state: RunState, loss: Loss, plan: RecoveryPlan
) -> tuple[RunState, RecoveryPlan, dict[str, Host]]:
    """Drain preempted nodes, stop the survivors, then replace the lost nodes; a replacement
    that fails turns into going on without the node (elastic) or the end of the run."""
    policy = state.plan.recovery
    # a rank's own failure and a GPU fault leave the node answering: its processes are stopped too
    lost = set(loss.nodes) if loss.kind != "rank_failed" and loss.kind not in EXCLUDING_LOSSES else set()
    survivors = [h for h in state.hosts if h.name not in lost]
    # drained first: the notice's checkpoint may still be uploading from a survivor (rank 0's node)
    if loss.kind == "preempted":  # kept until the notice's checkpoint is durable (launch.run.drain)
        state = drain(ctx, state, [h for h in state.hosts if h.name in lost])
    kind = fleet_kind(state.inventory.fleet)
    # a lost machine is replaced while the survivors are stopped: neither waits for the other
    # (a new local node or cloud instance shares nothing with the old attempt's processes)
    # (not a node still answering: its processes are stopped below, on the old machine, first)
    early = Replacements(
        ctx,
        state,
        kind,
        [] if loss.kind in EXCLUDING_LOSSES else [n for n in plan.replace if n not in loss.answering],
    )
    say(ctx, f"  stopping the attempt on {len(survivors)} node(s), {policy.grace_s:g} s to checkpoint")
    started = ctx.clock.monotonic()
    # an interrupted stop does not wait for the replacement (a cloud's can take minutes): the
    # thread is a daemon, and what it made is the fleet's, torn down with it
    stopped = stop_survivors(ctx.port, survivors, state.plan.run_id, policy.grace_s, state.attempt)
    state = state.recovery_timed("stop_survivors", ctx.clock.monotonic() - started)
    early.join()
    errors = stopped.errors
    cut = stopped.without_grace()
    if cut:
        say(ctx, f"  no rank stepping on {', '.join(cut)} (blocked since the loss): killed without the grace")
        state = replace(state, grace_cut=tuple(cut))
    started = ctx.clock.monotonic()
    if errors:
        why = f"could not stop the attempt on {', '.join(errors)}: {'; '.join(errors.values())}"
        if early.names:  # what the kind made meanwhile (a new allocation) is in the run's record
            state = note_fleet_held(ctx, state, kind.holding())
        return state, RecoveryPlan(stop=why), {}
    late_saves(ctx, state, {h.name for h in survivors})
    if loss.answering:  # taken by the fleet, still up: none of the run's processes goes on there
        left = stop_survivors(
            ctx.port,
            [h for h in state.hosts if h.name in loss.answering],
            state.plan.run_id,
            0,
            state.attempt,
        ).errors
        for name, why in sorted(left.items()):
            say(ctx, f"  {name}: the run's processes there not stopped: {clean(why, 300)}")
    for name in lost:
        ctx.port.connections[name].close()
    replaced: dict[str, Host] = {}
    failed: list[str] = []
    why_not: dict[str, str] = {}
    for name in plan.replace:
        host = next(h for h in state.hosts if h.name == name)
        new: Host | None
        if loss.kind in EXCLUDING_LOSSES:
            taken = take_spare(ctx, state, host, loss.reason, {h.name for h in replaced.values()})
            new = taken.host
            renewed = (*state.renewed, taken.renewal) if taken.renewal is not None else state.renewed
            state = replace(state, renewed=renewed, not_taken=(*state.not_taken, *taken.not_taken))
            if taken.not_taken:
                why_not[name] = "; ".join(f"{m}: {why}" for m, why in taken.not_taken)
        else:
            new = early.found[name] if name in early.found else early.one(name)
            trouble = candidate_trouble(ctx, state, new, reach=False) if new is not None else None
            if new is not None and trouble is not None:
                say(ctx, f"  {name}: the new machine not taken: {trouble}")
                state = replace(state, not_taken=(*state.not_taken, (f"{name} at {new.address}", trouble)))
                why_not[name] = f"the new machine: {trouble}"
                new = None
        if new is None:
            failed.append(name)
        else:
            replaced[name] = new
    state = state.recovery_timed("replace", early.took_s + ctx.clock.monotonic() - started)
    state = note_fleet_held(ctx, state, kind.holding())
    if failed:
        fallback = without(failed, [h.name for h in state.hosts], state.plan.min_nodes)
        if fallback.stop is not None:
            named = ", ".join(f"{n} ({clean(why_not[n], 1500)})" if n in why_not else n for n in failed)
            return state, RecoveryPlan(stop=f"could not replace {named}; {fallback.stop}"), replaced
        return state, RecoveryPlan(replace=tuple(replaced), drop=plan.drop + fallback.drop), replaced
    return state, RecoveryPlan(replace=tuple(replaced), drop=plan.drop), replaced


def note_fleet_held(ctx: RunContext, state: RunState, held: FleetRef) -> RunState:
    """The fleet's reference after the kind made machines for this recovery (a scheduler's new
    allocations, ``FleetKind.holding``) in the run's inventory and in its record: the next
    attempt's plan (the watchdogs' hook, ``srun``'s allocation), ``fab runs`` and ``fab show``
    then name every allocation the run held, not only the first. The record keeps the hosts
    the run started on; only its fleet changes. A failed write is said, never the run's end."""
    if held == state.inventory.fleet:
        return state
    inventory = state.inventory.model_copy(update={"fleet": held})
    target = replace(state.target, inventory=state.target.inventory.model_copy(update={"fleet": held}))
    try:
        record = ctx.records.get(state.plan.run_id)
        if record is not None:
            fleet = inventory.to_yaml_data()["fleet"]
            ctx.records.update(state.plan.run_id, inventory={**record.inventory, "fleet": fleet})
    except Exception as exc:  # noqa: BLE001 - the record is the run's memo, not its course
        save_traceback(ctx.folder.path, exc, "recording the fleet's new allocations")
        say(ctx, f"  could not record {clean(fleet_kind(held).describe(), 200)}: {clean(exc, 300)}")
    return replace(state, inventory=inventory, target=target)


LATE_METRICS_BYTES = 256 * 1024
"""How much of the end of rank 0's metrics is read after a stop: its saves during the grace."""


def late_saves(ctx: RunContext, state: RunState, survivors: Collection[str]) -> None:
    """The saves rank 0 made during the stop's grace, which is what the grace is for: the watcher
    had stopped reading its metrics, so they were never recorded and the next attempt refused
    them as unknown ("never recorded as saved by rank 0") and resumed from an older step. Read
    from the end of rank 0's metrics of the ended attempt (moved to ``attempt-<n>/`` by the stop),
    on its node when it survived, through the same parser and the same trust as the watcher's:
    rank 0's own stream. Best effort: a node that does not answer leaves the record as it was."""
    peers = ctx.peers
    holder = peers.holder if peers is not None else None
    if peers is None or holder is None or holder not in survivors or holder not in ctx.port.connections:
        return
    path = f"$HOME/{layout.rundir(state.plan.run_id)}/attempt-{state.attempt}/metrics.jsonl"
    try:
        result = ctx.port.connections[holder].run(f'tail -c {LATE_METRICS_BYTES} "{path}"', timeout=20)
    except HostError:
        return
    if not result.ok:
        return
    stream = MetricsStream()
    stream.feed(result.stdout.encode(errors="replace")[-LATE_METRICS_BYTES:])
    stream.flush()
    late = {s: d for s, d in stream.saved_checkpoints.items() if s not in peers.recorded}
    if late:
        peers.note_saves(late)
        say(ctx, f"  rank 0 saved step {max(late)} during the stop's grace: recorded")


def drain(ctx: RunContext, state: RunState, noticed: Sequence[Host]) -> RunState:
    """Keep the preempted nodes until the checkpoint made after the notice is durable
    (``launch.run.drain``); a copy through the laptop (the checkpoint spread) counts as durable.
    The drains go into the attempt's record (``drained``), the time into the recovery's."""
    started = ctx.clock.monotonic()
    current = state

    def spread() -> str | None:  # the laptop's peer copy: off the noticed node before it goes
        nonlocal current
        current = spread_checkpoint(ctx, current)
        return current.resume_from

    drained = drain_noticed(
        noticed,
        ssh_reader(ctx.port, state.plan.run_id),
        lambda text: say(ctx, text),
        peer_durable=copied_through_laptop(spread),
    )
    return replace(current, drained=drained).recovery_timed("drain", ctx.clock.monotonic() - started)


@dataclass(frozen=True)
class Taken:
    """What ``take_spare`` found for one left-out node: the machine in its place (None: none),
    the renewal made for it, and each machine checked and not taken, with why."""

    host: Host | None
    renewal: Renewal | None = None
    not_taken: tuple[tuple[str, str], ...] = ()


def take_spare(
    ctx: RunContext, state: RunState, host: Host, reason: str, taken: Collection[str] = ()
) -> Taken:
    """After a ``gpu_fault`` (or a straggler ``exclude``): the machine behind ``host`` is left out
    for the rest of the run, and in its place, in this order, the first candidate that answers
    over SSH and passes its GPU check (``candidate_trouble``: the pre-launch check's SSH and GPU
    verdicts, before anything lands on it):

    1. each spare of the inventory not in use, not ``taken`` by another node of this recovery and
       not excluded (``RunOptions.spares``); ``host``'s name is then excluded (the run folder's
       ``hosts.json``). A spare found bad is excluded too, with its reason, and the next is tried;
    2. else a new machine from the fleet kind (``FleetKind.renew``: a new instance on a stack, a
       fresh node on the local fleet; never for lab machines), under the same name: recorded as
       a ``Renewal`` in ``hosts.json`` (``renewed``) and in ``attempts.json``. Asked once: a new
       machine bad again is not taken (the kind ends it with the fleet), and ``host``'s name is
       excluded;
    3. else no machine: the caller goes on without the node when the job is elastic, or ends the
       run saying why, naming every machine not taken (``without``). The name is excluded.

    Each candidate is tried at most once. Each machine not taken and the outcome are said in one
    line each (the kind's own progress lines before them)."""
    name = host.name
    in_use = {h.name for h in state.hosts} | set(taken)
    not_taken: list[tuple[str, str]] = []
    for spare in ctx.options.spares:
        if spare.name in in_use or spare.name in read_exclusions(ctx.folder.path) or spare.name == name:
            continue
        trouble = candidate_trouble(ctx, state, spare)
        if trouble is not None:
            record_exclusion(ctx.folder.path, spare.name, f"spare not taken in {name}'s place: {trouble}")
            say(ctx, f"  spare {spare.name}: not taken, {trouble}; trying the next")
            not_taken.append((spare.name, trouble))
            continue
        held = spare_held(ctx, state, spare)
        if held is not None:  # another run's turn on it: not bad, not excluded, just not free
            say(ctx, f"  spare {spare.name}: not taken, {held}; trying the next")
            not_taken.append((spare.name, held))
            continue
        record_exclusion(ctx.folder.path, name, reason)
        say(ctx, f"  {name}: excluded for the rest of the run; spare {spare.name} takes its place")
        return Taken(spare, None, tuple(not_taken))
    kind = fleet_kind(state.inventory.fleet)
    try:
        new = kind.renew(
            host,
            lambda m: say(ctx, f"  {clean(m)}"),
            state.plan.recovery.replace_timeout_s,
            probe=ctx.port.answers,
        )
    except Exception as exc:  # noqa: BLE001 - a failed renewal is an answer, not a crash
        say(ctx, f"  {name}: no new machine: {clean(f'{type(exc).__name__}: {exc}', 300)}")
        new = None
    renewal = None
    if new is not None:
        renewal = Renewal(
            node=name,
            reason=reason[:600],
            old_address=host.address,
            new_address=new.address,
            host_key_changed=new.host_key != host.host_key,
        )
        record_renewal(ctx.folder.path, renewal)  # made, taken or not: the record says it exists
        ctx.port.connections[name].close()  # the old machine's connection; the next use reconnects
        trouble = candidate_trouble(ctx, state, new)
        if trouble is None:
            key = "new host key" if renewal.host_key_changed else "same host key"
            say(
                ctx,
                f"  {name}: excluded for the rest of the run; no spare left, renewed by "
                f"{clean(kind.describe(), 120)}: {clean(host.address, 100)} -> {clean(new.address, 100)} ({key})",
            )
            return Taken(new, renewal, tuple(not_taken))
        machine = f"{name} at {clean(new.address, 100)}"
        say(ctx, f"  {name}: the new machine {clean(new.address, 100)} not taken, {trouble}")
        not_taken.append((machine, trouble))
    record_exclusion(ctx.folder.path, name, reason)
    say(ctx, f"  {name}: excluded for the rest of the run; no spare host left and no new machine")
    return Taken(None, renewal, tuple(not_taken))


def fresh_names(recovery: Recovery) -> frozenset[str]:
    """The names of the next attempt's new machines: a spare (another name) takes the place of
    the host it replaces; a replaced machine keeps its name."""
    plan = recovery.next_attempt
    assert plan is not None
    return frozenset(recovery.new_hosts[n].name if n in recovery.new_hosts else n for n in plan.replace)


def adopt(ctx: RunContext, state: RunState, recovery: Recovery) -> tuple[RunContext, RunState]:
    """The next attempt's inventory (replaced hosts, dropped ones gone), its pinned host keys,
    its plan and its connections (survivors keep theirs): the context and state it runs with."""
    plan = recovery.next_attempt
    assert plan is not None
    # a spare (another name) takes the place of the host it replaces, head position included
    new_hosts = [recovery.new_hosts.get(h.name, h) for h in state.hosts if h.name not in plan.drop]
    for name in plan.replace:  # a replaced jump host (a lab's head) is re-pinned on the hosts behind it
        if name in recovery.new_hosts and recovery.new_hosts[name].name == name:
            new_hosts = [h.repinned(recovery.new_hosts[name]) for h in new_hosts]
    inventory = state.inventory.model_copy(update={"hosts": new_hosts})
    known_hosts = inventory.write_known_hosts(known_hosts_file(inventory.fingerprint()))
    spec = ctx.spec.model_copy(update={"nodes": len(new_hosts)})
    launcher = launcher_class(spec.launcher).for_inventory(inventory)
    hook = fleet_kind(inventory.fleet).poweroff_hook()
    new_plan = launcher.plan(spec, inventory, state.plan.run_id, poweroff_hook=hook)
    port = ctx.port.reconnect([n.host for n in new_plan.nodes], known_hosts)
    if ctx.hold is not None:  # the run holds what it uses: a new machine held, a left one let go
        ctx.hold.follow([n.host for n in new_plan.nodes], known_hosts)
    fresh = fresh_names(recovery)
    state = replace(
        state,
        plan=new_plan,
        inventory=inventory,
        known_hosts=known_hosts,
        attempt=state.attempt + 1,
        lib_current=state.lib_current - fresh,  # a new machine: its disk holds nothing of ours
        target=replace(
            state.target,
            inventory=inventory,
            starters=tuple(n.host.name for n in new_plan.nodes if n.starts_processes),
            attempt=state.attempt + 1,
        ),
        rdzv_port=None,
    )
    return ctx.with_port(port), state


def spare_held(ctx: RunContext, state: RunState, spare: Host) -> str | None:
    """Hold ``spare`` for the run before it is taken (``QueueHold.refused``), or who holds it: a
    spare is a shared machine like the run's others, held from its first use to the run's end."""
    if ctx.hold is None:
        return None
    inventory = state.inventory.model_copy(update={"hosts": [spare]})
    return ctx.hold.refused(spare, inventory.write_known_hosts(known_hosts_file(inventory.fingerprint())))


def candidate_trouble(ctx: RunContext, state: RunState, host: Host, reach: bool = True) -> str | None:
    """Why ``host`` (a spare, a new or replaced machine, not the run's yet) must not be taken: it
    does not answer over SSH with its pinned host key, or its first GPU verdict of ERROR in the
    pre-launch check (one probe round trip, over a port of its own: ``FleetPort.outside``); None
    when neither. ``gpu_fault`` compares each attempt with its own first reading, so a machine bad
    from its first boot (an Xid already in its kernel log, a GPU missing) would otherwise be
    trained on unnoticed; a spare that is down (or whose host key changed) would fail the sync and
    end the recovery, where the next candidate could have taken its place. ``reach=False`` for a
    machine from ``FleetKind.replace``, which waited for its answer itself (a lab host that came
    back, a new instance whose sshd answered): only its GPUs are judged. Other checks (rsync,
    python) are the sync's and setup's to report."""
    inventory = state.inventory.model_copy(update={"hosts": [host]})
    known_hosts = inventory.write_known_hosts(known_hosts_file(inventory.fingerprint()))
    port = ctx.port.outside([host], known_hosts)
    try:
        observations = gather(port, [host], "cheap", 0)
    finally:
        port.close()
    findings = judge(observations, Job(head=host.name, port=0, full=False))
    unreachable = [v for v in findings.errors if v.check == "ssh"] if reach else []
    if unreachable:
        return f"not reachable: {clean(unreachable[0].message, 400)}"
    bad = [v for v in findings.errors if v.check.startswith("gpu")]
    return f"GPU check: {clean(bad[0].check, 40)}: {clean(bad[0].message, 400)}" if bad else None


def spread_checkpoint(ctx: RunContext, state: RunState) -> RunState:
    """The newest complete checkpoint onto every node that lacks it (no bucket needed)."""
    started = ctx.clock.monotonic()
    staging = ctx.folder.path / ".recovery"
    peers = ctx.peers
    if peers is not None:
        peers.stop()
    commands = fleet_kind(state.inventory.fleet).bucket_commands(run_prefix(state.plan.run_id))
    try:
        spread: Spread = ctx.transfers.spread_checkpoint(
            ctx.port,
            state.hosts,
            state.plan.run_id,
            state.known_hosts,
            staging,
            recorded=peers.recorded if peers is not None else None,
            bucket=commands is not None,
            peers=peers.copied if peers is not None else None,
            uploaded=peers.uploaded if peers is not None else None,
            bucket_url=commands.url if commands is not None else None,
        )
        # a drain that saw the notice's checkpoint reach the bucket outranks older steps on disks
        drained = state.ended[-1].drained if state.ended else ()
        spread = drained_from_bucket(spread, drained, commands.url if commands is not None else None)
        resume_from, resume_record = spread.resume_from, spread.record
        say(ctx, f"  {spread.said}")
    except HostError as exc:
        resume_from = None
        resume_record = f"what each node holds: the copy failed ({clean(exc, 200)})"
        say(
            ctx,
            f"  could not spread the latest checkpoint ({clean(exc, 300)}); each node resumes from what it holds",
        )
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    state = replace(state, resume_from=resume_from, resume_record=resume_record)
    return state.timed("checkpoint_copy", ctx.clock.monotonic() - started)


def start_next(ctx: RunContext, state: RunState) -> RunState:
    """The claim (a fresh rendezvous port) and the start of every node of the next attempt."""
    started = ctx.clock.monotonic()
    state = stages.claim(ctx, state)
    state = replace(state, target=replace(state.target, started_at=ctx.clock.time()))
    state.target.save()
    say(ctx, f"  attempt {state.attempt}: starting on {', '.join(h.name for h in state.hosts)}")
    state = stages.start(ctx, state).timed("claim_start", ctx.clock.monotonic() - started)
    # the recovery's timings go with the attempt it started (``AttemptEnd.recovery_s``)
    return replace(state, started_by=state.recovery_timings, recovery_timings={})


def attempt_end_from_json(data: object) -> AttemptEnd | None:
    """One ended attempt back from the run record (untrusted JSON); None when it is not one."""
    if not isinstance(data, dict):
        return None

    def text(key: str) -> str:
        value = data.get(key)
        return value[:2000] if isinstance(value, str) else ""

    def number(key: str) -> int | None:
        value = data.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    def seconds(key: str) -> float:
        value = data.get(key)
        return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0

    def names(key: str) -> tuple[str, ...]:
        value = data.get(key)
        return tuple(v for v in value[:10_000] if isinstance(v, str)) if isinstance(value, list) else ()

    attempt = number("attempt")
    loss = data.get("loss")
    timings = data.get("recovery_s")
    not_taken = data.get("not_taken")
    if attempt is None or attempt < 1:
        return None
    return AttemptEnd(
        attempt=attempt,
        nodes=names("nodes"),
        started_at=seconds("started_at"),
        ended_at=seconds("ended_at"),
        outcome=text("outcome"),
        rule=text("rule"),
        reason=text("reason"),
        loss=next((k for k in LOSS_KINDS if k == loss), None),
        first_step=number("first_step"),
        last_step=number("last_step"),
        steps_recomputed=number("steps_recomputed"),
        replaced=names("replaced"),
        dropped=names("dropped"),
        resumed_from=text("resumed_from") or None,
        renewed=renewals(data.get("renewed")),
        not_taken=tuple(
            (str(k)[:200], str(v)[:1000])
            for k, v in list(not_taken.items() if isinstance(not_taken, dict) else ())[:1000]
            if isinstance(v, str)
        ),
        recovery_s=tuple(
            (str(k)[:100], float(v))
            for k, v in (timings.items() if isinstance(timings, dict) else ())
            if isinstance(v, int | float) and not isinstance(v, bool)
        ),
        grace_cut=names("grace_cut"),
        energy_kwh=kwh_figure(data.get("energy_kwh")),
    )


def renewals(value: object) -> tuple[Renewal, ...]:
    """The ``renewed`` entries of an attempt back from the record (untrusted JSON): each one with
    every field of the right type, at most 1,000; the others are left out."""
    found: list[Renewal] = []
    for item in value[:1000] if isinstance(value, list) else ():
        if not isinstance(item, dict):
            continue
        texts = [item.get(k) for k in ("node", "reason", "old_address", "new_address")]
        changed = item.get("host_key_changed")
        if all(isinstance(t, str) for t in texts) and isinstance(changed, bool):
            node, reason, old, new = (str(t)[:600] for t in texts)
            found.append(Renewal(node, reason, old, new, changed))
    return tuple(found)


def save_attempts(ctx: RunContext, state: RunState) -> None:
    """The attempts that ended so far into ``attempts.json`` and the run record, as soon as a
    recovery starts the next one: a watcher re-attached later goes on from them."""
    data = attempts_json(state)
    try:
        ctx.folder.write_json("attempts.json", {"run_id": state.plan.run_id, "attempts": data})
        ctx.records.update(state.plan.run_id, attempts=data)
    except Exception as exc:  # noqa: BLE001 - saved, reported; the run goes on
        save_traceback(ctx.folder.path, exc, "recording the attempts")
        say(ctx, f"  could not record the attempts: {type(exc).__name__}: {clean(exc, 300)}")


def attempts_json(state: RunState) -> list[dict[str, object]]:
    return [a.to_json() for a in state.ended]


def record_attempts(ctx: RunContext, state: RunState, summary: RunSummary) -> None:
    """Each attempt in the run record, in ``attempts.json``, and in the loss plot (every attempt's
    losses, a line where each later attempt resumed). Never raises: the run is already recorded."""
    folder = ctx.folder
    data = attempts_json(state)
    try:
        folder.write_json("attempts.json", {"run_id": summary.run_id, "attempts": data})
        ctx.records.update(summary.run_id, attempts=data)
        history = [p for _attempt, points in state.histories for p in points]
        resumes = [(n, points[0].step) for n, points in state.histories[1:] if points]
        if history and len(state.histories) > 1:
            plot_loss(history, folder.path / "loss.png", title=folder.path.name, resumes=resumes)
    except Exception as exc:  # noqa: BLE001 - saved, reported; the outcome stands
        save_traceback(folder.path, exc, "recording the attempts")
        say(ctx, f"  could not record the attempts: {type(exc).__name__}: {clean(exc, 300)}")
