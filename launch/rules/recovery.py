"""Whether a run that just stopped is tried again, and how: pure decisions, no I/O.

A stop decision (``launch.rules.stoprules``) ends an *attempt*. With a ``recovery:`` section in
the playbook some of those ends are not the end of the run: a node that is gone (powered off, a
reclaimed spot instance) or a preempted one is replaced, or left out when the job is elastic, and
every rank starts again from the latest checkpoint. A rank that fails by itself is a bug and is
not retried unless the playbook lists ``rank_failed``: SkyPilot's and Kubeflow's restart-on-any-
failure loops burn hours re-running a deterministic crash.

What counts as evidence is decided here too. A node is *lost* only when a check made after the
stop decision, repeated over a short window, still finds it gone (sshd refusing or silent, the
cloud saying the instance is gone, its watchdog silent past its limit): one slow poll never
starts a recovery (skypilot#10155: 24 false recoveries in 19 h from flaky status checks).

A *preempted* node is drained before it is replaced (``drain_verdict``): a notice is time the
cloud gives (EC2 120 s, GCE 30 s), and the checkpoint the notice asked for is still being written
and uploaded on that node. Replacing it at once (killing its processes, wiping its disk) lost that
checkpoint; so the node keeps its processes and its watchdog until the checkpoint made after the
notice is durable elsewhere, or the node has nothing left to save, or the notice runs out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from launch.rules.stoprules import RuleName, StopDecision

__all__ = [
    "LOSS_KINDS",
    "AttemptEnd",
    "DrainEnd",
    "DrainVerdict",
    "Drained",
    "NoticeState",
    "Loss",
    "LossKind",
    "NodeEvidence",
    "answered_again",
    "RecoveryPlan",
    "RecoveryPolicy",
    "classify",
    "confirmed_lost",
    "describe_policy",
    "drain_verdict",
    "plan_recovery",
    "silent_before",
    "steps_recomputed",
]

LossKind = Literal["node_lost", "preempted", "rank_failed", "gpu_fault", "straggler"]
LOSS_KINDS: tuple[LossKind, ...] = ("node_lost", "preempted", "rank_failed", "gpu_fault", "straggler")
EXCLUDING_LOSSES: frozenset[LossKind] = frozenset({"gpu_fault", "straggler"})
"""Losses whose node still answers but must not be used again in this run: a spare replaces it."""
DEFAULT_ON: tuple[LossKind, ...] = ("node_lost", "preempted")

FAILURE_RULES: frozenset[RuleName] = frozenset({"rank_failed", "vanished", "reported_failed"})
"""Stop rules that a lost node also explains: its peers' collectives fail, their torchrun exits
non-zero, the lost node's own process is gone without an exit code."""
LOSS_RULES: frozenset[RuleName] = FAILURE_RULES | {"unreachable", "gpu_fault", "straggler", "node_down"}
"""Stop rules after which the laptop looks for a lost node before calling the attempt failed."""
RANK_FAILED_RULES: frozenset[RuleName] = frozenset({"rank_failed", "vanished"})
"""Stop rules that, without a confirmed lost node, are a rank's own failure (a ``rank_failed`` loss)."""


class RecoveryPolicy(BaseModel):
    """The playbook's ``recovery:`` section.

    Fields:
        max_restarts: attempts after the first one; 0 (the default) keeps today's behaviour:
            the first loss ends the run.
        on: which losses start a new attempt: ``node_lost`` (the machine is gone), ``preempted``
            (its cloud took it back, with or without a notice), ``rank_failed`` (a rank exited
            non-zero by itself; off by default, since a deterministic bug fails again),
            ``gpu_fault`` and ``straggler`` (the node is left out for the rest of the run and a
            spare of the inventory takes its place; see docs/gpu-health.md).
        replace_lost_nodes: replace a lost node through the fleet kind (local fleet: a fresh node;
            stack: the missing instance recreated; lab: wait for the host to answer again). When
            false (or the replacement fails) an elastic job goes on with the survivors.
        grace_s: seconds the survivors get between SIGTERM and SIGKILL, to write a checkpoint.
        confirm_s: how long a node must stay gone, checked again and again, before it is declared
            lost; a node that answers within this window is not lost.
        replace_timeout_s: the longest a replacement may take (a lab host to come back, a cloud to
            provision an instance).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_restarts: int = Field(default=0, ge=0, le=100)
    on: list[LossKind] = Field(default_factory=lambda: list(DEFAULT_ON), max_length=5)
    replace_lost_nodes: bool = True
    grace_s: float = Field(default=30.0, ge=0.0, le=3600.0)
    confirm_s: float = Field(default=5.0, ge=0.0, le=600.0)
    replace_timeout_s: float = Field(default=900.0, gt=0.0, le=24 * 3600.0)

    @model_validator(mode="before")
    @classmethod
    def _yaml_on(cls, data: object) -> object:
        """YAML 1.1 (PyYAML) reads an unquoted ``on:`` key as the boolean true: take it as ``on``."""
        if isinstance(data, dict) and True in data:
            if "on" in data:
                raise ValueError("'on' is given twice (once unquoted, read by YAML as true)")
            data = {("on" if k is True else k): v for k, v in data.items()}
        return data

    @field_validator("on")
    @classmethod
    def _unique(cls, value: list[LossKind]) -> list[LossKind]:
        if len(set(value)) != len(value):
            raise ValueError("lists a loss kind twice")
        return value

    @property
    def enabled(self) -> bool:
        return self.max_restarts > 0


def describe_policy(policy: RecoveryPolicy, min_nodes: int | None, nodes: int) -> str:
    """One line for the dry-run plan and ``plan.txt``."""
    if not policy.enabled:
        return "none (max_restarts: 0): the first lost node or failed rank ends the run"
    elastic = (
        f"; elastic {min_nodes}:{nodes} nodes (survivors go on with at least {min_nodes})"
        if min_nodes is not None and min_nodes < nodes
        else ""
    )
    return (
        f"up to {policy.max_restarts} restart(s) on {', '.join(policy.on)}; "
        f"lost nodes {'replaced' if policy.replace_lost_nodes else 'not replaced'}; "
        f"survivors get {policy.grace_s:g} s to checkpoint; a node is lost after {policy.confirm_s:g} s "
        f"of confirmed silence{elastic}"
    )


@dataclass(frozen=True)
class NodeEvidence:
    """What the re-checks after a stop decision found about one node.

    ``checks`` answers in the order they were made: True the node answered (sshd took an SSH
    connection, or the node's watchdog spoke), False it did not (refused, timed out, reset).
    ``cloud_gone``: the fleet kind says the machine no longer exists, or that it took the machine
    from the run (a scheduler marked it DOWN or DRAIN: it may still answer). ``preempted``: the node (its
    watchdog) reported a preemption notice before it went.
    """

    node: str
    checks: tuple[bool, ...] = ()
    span_s: float = 0.0
    """Seconds between the first and the last check."""
    cloud_gone: bool = False
    preempted: bool = False
    silent_before_s: float = 0.0
    """How long the watcher had already found the node silent, poll after poll, before the stop
    decision (the ``unreachable`` rule's limit for the nodes it named; see ``silent_before``)."""


def confirmed_lost(evidence: NodeEvidence, confirm_s: float) -> bool:
    """Lost only when every check failed, there were at least two, spread over ``confirm_s``
    together with the silence the watcher saw before (or the cloud says the machine is gone).
    Any answer at all means: not lost."""
    if evidence.cloud_gone:
        return True
    if any(evidence.checks):
        return False
    return len(evidence.checks) >= 2 and evidence.span_s + evidence.silent_before_s >= confirm_s


def silent_before(decision: StopDecision, unreachable_timeout_s: float | None) -> dict[str, float]:
    """The nodes the ``unreachable`` rule gave up on were silent for its whole limit, poll after
    poll: evidence already, which the re-checks need not gather again (item 8 of issue 19)."""
    if decision.rule != "unreachable" or unreachable_timeout_s is None:
        return {}
    return {node: unreachable_timeout_s for node in decision.nodes}


@dataclass(frozen=True)
class Loss:
    """Why an attempt ended, when it may be recoverable."""

    kind: LossKind
    nodes: tuple[str, ...]
    reason: str
    answering: tuple[str, ...] = ()
    """Lost nodes that still answer (the fleet took them, they did not go): their processes of
    the run are stopped too, so none goes on where the run no longer is."""


def classify(decision: StopDecision, evidence: Mapping[str, NodeEvidence], confirm_s: float) -> Loss | None:
    """The loss behind a failed attempt, or None when the decision is final as it is.

    A confirmed lost node explains the other nodes' failures (their collectives broke), so it is
    looked for first; a preempted node is a preemption, not a failure. Without a confirmed loss,
    ``unreachable`` stays a failure (the node might still be running: never start a second copy
    of a rank), and only a rank's own non-zero exit is a ``rank_failed`` loss. When every node
    looks gone, the likely cause is this machine's own network: no recovery.
    """
    if decision.outcome != "failed" or decision.rule not in LOSS_RULES:
        return None
    if decision.rule in ("gpu_fault", "straggler"):  # the node answers, but its own reports say it is bad
        return Loss(
            "gpu_fault" if decision.rule == "gpu_fault" else "straggler", decision.nodes, decision.reason
        )
    preempted = tuple(sorted(n for n, e in evidence.items() if e.preempted))
    lost = tuple(sorted(n for n, e in evidence.items() if confirmed_lost(e, confirm_s) and not e.preempted))
    if len(evidence) > 1 and len(lost) == len(evidence):
        return None  # every node silent: this machine's network, not the fleet; nothing to replace
    if preempted:
        return Loss("preempted", preempted + lost, f"{', '.join(preempted)} preempted")
    if lost:
        why = []
        for node in lost:
            e = evidence[node]
            why.append(
                f"{node} (the fleet says the machine is gone or taken)"
                if e.cloud_gone
                else f"{node} (no answer to {len(e.checks)} checks over {e.span_s:.0f} s)"
            )
        answering = tuple(n for n in lost if evidence[n].cloud_gone and any(evidence[n].checks))
        return Loss("node_lost", lost, "lost " + ", ".join(why), answering)
    if decision.rule in RANK_FAILED_RULES:
        return Loss("rank_failed", decision.nodes, decision.reason)
    return None


def answered_again(decision: StopDecision, evidence: Mapping[str, NodeEvidence]) -> tuple[str, ...]:
    """Nodes the ``unreachable`` rule gave up on that answered a re-check: a slow poll or a short
    network blip, not a lost node. Empty unless every node the decision names answered: then the
    attempt goes on being watched instead of ending (never a false recovery, nor a false failure)."""
    if decision.rule != "unreachable" or not decision.nodes:
        return ()
    if all(n in evidence and any(evidence[n].checks) for n in decision.nodes):
        return decision.nodes
    return ()


@dataclass(frozen=True)
class RecoveryPlan:
    """What the next attempt runs on, or why there is none.

    ``replace``: lost nodes to replace through the fleet kind; ``drop``: lost nodes the next
    attempt goes on without (elastic); ``stop``: the reason the run ends here instead.
    """

    replace: tuple[str, ...] = ()
    drop: tuple[str, ...] = ()
    stop: str | None = None


def plan_recovery(
    policy: RecoveryPolicy,
    loss: Loss | None,
    attempt: int,
    nodes: Sequence[str],
    min_nodes: int | None,
) -> RecoveryPlan:
    """Decide after attempt ``attempt`` (1-based) ended with ``loss`` on ``nodes``."""
    if loss is None:
        return RecoveryPlan(stop="not a recoverable loss")
    if not policy.enabled:
        return RecoveryPlan(stop="no recovery configured (recovery.max_restarts is 0)")
    if loss.kind not in policy.on:
        hint = " (a rank failing by itself is a bug; list rank_failed under recovery.on to retry it)"
        return RecoveryPlan(
            stop=f"{loss.kind} is not in recovery.on ({', '.join(policy.on)})"
            + (hint if loss.kind == "rank_failed" else "")
        )
    if attempt > policy.max_restarts:
        return RecoveryPlan(
            stop=f"gave up after {attempt} attempts: recovery.max_restarts ({policy.max_restarts}) reached; "
            f"the last attempt ended with {loss.kind}: {loss.reason}"
        )
    if loss.kind == "rank_failed":
        return RecoveryPlan()  # the same nodes again, from the latest checkpoint
    lost = tuple(n for n in nodes if n in loss.nodes)
    if policy.replace_lost_nodes:
        return RecoveryPlan(replace=lost)
    return without(lost, nodes, min_nodes)


def without(lost: Sequence[str], nodes: Sequence[str], min_nodes: int | None) -> RecoveryPlan:
    """Go on with the survivors when the job is elastic and enough of them are left."""
    left = len([n for n in nodes if n not in lost])
    if min_nodes is None:
        return RecoveryPlan(
            stop=f"{', '.join(lost)} lost and not replaced, and the job is not elastic "
            "(nodes: MIN:MAX lets the survivors go on)"
        )
    if left < min_nodes:
        return RecoveryPlan(stop=f"{left} node(s) left, fewer than the elastic minimum {min_nodes}")
    return RecoveryPlan(drop=tuple(lost))


DrainEnd = Literal["durable", "nothing_held", "deadline", "gone", "no_notice"]
"""Why the drain of a noticed node ended: its post-notice checkpoint is durable (bucket or peer
copy); the node holds no checkpoint made after the notice and its watchdog is done (rank 0 runs
elsewhere); the notice ran out; the node stopped answering (the cloud took it, or it powered
itself off); no readable notice record on it (nothing to wait for)."""
DRAIN_MARGIN_S = 2.0
"""The drain ends this long before the notice's deadline: the replacement may start, the cloud is
about to take the node anyway (its watchdog gave up waiting 5 s before)."""


@dataclass(frozen=True)
class NoticeState:
    """One read of a noticed node during the drain (its ``preempt.json``), times on the node's
    clock (``node_now`` read in the same command, so a skewed laptop clock cannot matter)."""

    noticed_at: float
    deadline_at: float | None
    node_now: float
    durable_step: int | None = None
    saved_step: int | None = None
    settled: bool = False
    durable_made_after: bool = True
    """``durable_step`` was made after the notice (False: an older step the watchdog fell back to)."""


@dataclass(frozen=True)
class DrainVerdict:
    """``why`` None: keep waiting; else the drain of this node is over, ``step`` the checkpoint it
    made durable (when known)."""

    why: DrainEnd | None
    step: int | None = None

    @property
    def done(self) -> bool:
        return self.why is not None


def drain_verdict(
    state: NoticeState | None,
    reachable: bool,
    peer_durable: bool = False,
    margin_s: float = DRAIN_MARGIN_S,
    window_s: float = 120.0,
) -> DrainVerdict:
    """Whether a noticed node may be replaced now.

    Not before its post-notice checkpoint is safe: the bucket confirmed a step made after the
    notice (the watchdog's ``durable_step``; an older step it fell back to at its deadline does
    not count), or ``peer_durable`` (the caller's hook: the step it
    saved, ``saved_step``, has a copy on another node). A node that holds no post-notice checkpoint
    and whose watchdog is done has nothing to lose. Past ``deadline - margin`` (the notice's own
    time, or the notice plus ``window_s`` when the record has none) waiting gains nothing: the
    cloud takes the node. A node that does not answer, or has no notice record, is not waited for.
    """
    if not reachable:
        return DrainVerdict("gone")
    if state is None:
        return DrainVerdict("no_notice")
    newest = state.durable_made_after or (
        state.saved_step is not None and state.durable_step == state.saved_step
    )
    if state.durable_step is not None and newest:
        return DrainVerdict("durable", state.durable_step)
    if state.saved_step is not None and peer_durable:
        return DrainVerdict("durable", state.saved_step)
    if state.settled and state.saved_step is None:
        return DrainVerdict("nothing_held")
    deadline = state.deadline_at if state.deadline_at is not None else state.noticed_at + window_s
    if state.node_now >= deadline - margin_s:
        return DrainVerdict("deadline", state.saved_step)
    return DrainVerdict(None)


@dataclass(frozen=True)
class Drained:
    """One noticed node's drain as the record keeps it: how much of the notice it used."""

    node: str
    ended: DrainEnd
    notice_s: float | None
    """The notice's length: deadline minus notice (None when the node gave no record)."""
    used_s: float | None
    """From the notice to the end of the drain, on the node's clock (None: no record)."""
    step: int | None = None
    """The post-notice checkpoint the drain waited for, when known."""

    def to_json(self) -> dict[str, object]:
        return {
            "node": self.node,
            "ended": self.ended,
            "notice_s": None if self.notice_s is None else round(self.notice_s, 2),
            "used_s": None if self.used_s is None else round(self.used_s, 2),
            "step": self.step,
        }


@dataclass(frozen=True)
class Renewal:
    """A node that still answered but was left out (a GPU fault, a straggler), given a new
    machine by its fleet kind (``FleetKind.renew``) under the same name: the record says which
    machine went and which came."""

    node: str
    reason: str
    old_address: str
    new_address: str
    host_key_changed: bool

    def to_json(self) -> dict[str, object]:
        return {
            "node": self.node,
            "reason": self.reason,
            "old_address": self.old_address,
            "new_address": self.new_address,
            "host_key_changed": self.host_key_changed,
        }


@dataclass(frozen=True)
class AttemptEnd:
    """One attempt as the record keeps it."""

    attempt: int
    nodes: tuple[str, ...]
    started_at: float
    ended_at: float
    outcome: str
    rule: str
    reason: str
    loss: LossKind | None = None
    first_step: int | None = None
    last_step: int | None = None
    steps_recomputed: int | None = None
    replaced: tuple[str, ...] = ()
    dropped: tuple[str, ...] = ()
    recovery_s: tuple[tuple[str, float], ...] = ()
    """For attempts after the first: seconds each step of the recovery that started it took
    (re-checks, stopping the survivors, replacement, sync and setup, checkpoint copy, start)."""
    drained: tuple[Drained, ...] = ()
    """For a preempted attempt: each noticed node's drain before it was replaced."""
    resumed_from: str | None = None
    """For attempts after the first: where it resumed from and why (a node's save, a peer copy,
    the bucket, or the beginning with its cause)."""
    renewed: tuple[Renewal, ...] = ()
    """Nodes of this attempt left out after it (``gpu_fault``, ``straggler``) that the next one
    runs on a new machine of the same name (no spare was left)."""
    not_taken: tuple[tuple[str, str], ...] = ()
    """Machines the recovery after this attempt checked and did not take in a left-out node's
    place (a spare, or a new machine, whose GPU check failed): each machine and why."""
    grace_cut: tuple[str, ...] = ()
    """Survivors whose ranks were killed at once when the attempt was stopped: none was stepping
    (blocked in a collective with the lost node), so the grace could not buy a checkpoint."""
    energy_kwh: float | None = None
    """The attempt's GPU energy (power over time, ``launch.rules.energy``); None without readings."""

    def to_json(self) -> dict[str, object]:
        return {
            "attempt": self.attempt,
            "nodes": list(self.nodes),
            "started_at": self.started_at,
            "ended_at": self.ended_at,
            "outcome": self.outcome,
            "rule": self.rule,
            "reason": self.reason,
            "loss": self.loss,
            "first_step": self.first_step,
            "last_step": self.last_step,
            "steps_recomputed": self.steps_recomputed,
            "replaced": list(self.replaced),
            "dropped": list(self.dropped),
            "recovery_s": {name: round(seconds, 2) for name, seconds in self.recovery_s},
            "drained": [d.to_json() for d in self.drained],
            "resumed_from": self.resumed_from,
            "renewed": [r.to_json() for r in self.renewed],
            "not_taken": {machine: why for machine, why in self.not_taken},
            "grace_cut": list(self.grace_cut),
            "energy_kwh": self.energy_kwh,
        }


def steps_recomputed(previous_last_step: int | None, resumed_first_step: int | None) -> int | None:
    """Steps the resumed attempt did again: the previous attempt reached ``previous_last_step``;
    the new one logged ``resumed_first_step`` first, so it resumed from the step before it."""
    if previous_last_step is None or resumed_first_step is None:
        return None
    return max(0, previous_last_step - (resumed_first_step - 1))
