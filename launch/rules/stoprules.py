"""When to stop a training run, decided from what the watcher observed: pure, no I/O.

The watcher polls the nodes (process state, exit codes, GPU utilisation), the metrics stream
and ``status.json``, packs what it saw into an :class:`Observation`, and asks
:func:`evaluate` whether to stop. The answer is a :class:`StopDecision` naming the outcome,
the rule and a sentence a human can act on, or ``None`` to keep watching. Nothing here reads
a clock: ``Observation.now`` is the time, so every rule is testable with a fake clock.

Rules are checked in this order; the first that fires wins (:data:`RULES`):

0. ``node_down``     the fleet itself took a node (Slurm DOWN/DRAIN)  -> failed
0b. ``gpu_fault``    a new critical Xid, an uncorrectable ECC count that grew, a GPU gone
                     (the node's counters against its first poll of the attempt)  -> failed
1. ``rank_failed``   a node's torchrun exited non-zero             -> failed
2. ``vanished``      a node's process is gone with no exit code    -> failed
3. ``reported_failed`` ``status.json`` says failed                 -> failed
4. ``nan_loss``      a NaN/Inf loss was logged                     -> failed
5. ``completed``     every node exited 0, or status says succeeded -> succeeded
6. ``unreachable``   a node could not be reached for too long      -> failed
7. ``stalled``       processes run but no new metrics for too long -> failed (a hang)
8. ``gpu_idle``      a running node's GPUs idle for too long       -> stopped
8b. ``straggler``    one node slower than the others for a window -> stopped (action stop) or
                     failed (action exclude: recovery goes on without it); warn: table only
9. ``plateau``       the loss stopped improving                    -> stopped
10. ``wall_time``    the run is older than the wall-time cap       -> stopped
11. ``max_cost``     the estimated cost reached the cap            -> stopped

A rank that exited non-zero while another node's ranks are stopped by a signal (SIGSTOP, a
debugger: alive, never stepping) is ``stalled``, naming the stopped node: the exit is the
stopped ranks' collective timing out, and the node that exited is their victim, not the cause.

``node_down`` comes first: the scheduler's word is positive evidence that the node is no longer
the run's, and its processes there may go on stepping (so no other rule would ever fire).
``gpu_fault`` comes next: a GPU that fell off the bus makes its rank (and then every peer) exit
non-zero, and the GPU, not the rank, is what recovery must leave out.

Why this order: evidence of a failure beats evidence of success (a NaN in a run that then
"succeeds" is still a broken run), and positive evidence (exit codes, status) beats absence
of evidence (no contact, no metrics). ``unreachable`` precedes ``stalled`` because metrics
come over SSH from the head node: when it is unreachable, silence is not a hang. The policy
limits come last; they only matter while nothing else explains the run.

Memory across polls (when did this node become unreachable, since when is that GPU idle,
when did metrics last grow, best loss so far) lives in a :class:`RuleState` the watcher keeps
and passes to every :func:`evaluate` call; ``evaluate`` updates it.
"""

from __future__ import annotations

import math
import signal
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from launch.rules.gpu_health import EnergyMeter, GpuHealth, new_faults
from launch.rules.metrics_stream import FinalStatus, MetricsSummary
from launch.rules.pricing import cost_so_far
from launch.rules.stragglers import NodePace, PaceHistory, StragglerRule, describe, slow_nodes

__all__ = [
    "RULES",
    "NodeObservation",
    "NodeState",
    "Observation",
    "Outcome",
    "PEER_GONE_RULES",
    "Rule",
    "RuleName",
    "RuleState",
    "StopDecision",
    "StopRules",
    "Teardown",
    "configuration_warnings",
    "cost_so_far",
    "describe_exit",
    "evaluate",
    "node_exit_codes",
    "should_teardown",
]


class Teardown(str, Enum):
    """The playbook's ``teardown:`` policy, next to ``stop:``: when to destroy the fleet after a run."""

    ALWAYS = "always"
    ON_SUCCESS = "on_success"
    NEVER = "never"


Outcome = Literal["succeeded", "failed", "stopped"]
NodeState = Literal["running", "exited", "vanished", "unreachable"]
RuleName = Literal[
    "node_down",
    "gpu_fault",
    "rank_failed",
    "vanished",
    "reported_failed",
    "nan_loss",
    "completed",
    "unreachable",
    "stalled",
    "gpu_idle",
    "straggler",
    "plateau",
    "wall_time",
    "max_cost",
]
"""``StopDecision.rule`` of the rules: sets of them are typed with it (a misspelt name fails mypy).
The watcher's own ends (operator, a failed step, a crash) use other names: ``rule`` stays a str."""
PEER_GONE_RULES: frozenset[RuleName] = frozenset({"unreachable", "vanished", "rank_failed"})
"""A node or its processes are gone: survivors wait in a collective, a short stop grace will do.
``rank_failed`` too: a failed rank is a dead member of every collective, and since its failure is
known the moment it dies (``fleetrun_rankwatch``), its peers are often still blocked on it when
the stop comes (7.3 s of a 10 s grace waited out in one ``kill -9`` trial)."""


class StopRules(BaseModel):
    """The playbook's ``stop:`` section. Every field is optional; durations are seconds.

    ``None`` switches a limit off. Defaults stop hung and broken runs (stall, unreachable,
    NaN) but never a healthy one: plateau, wall time, cost and GPU-idle are opt-in, because
    only the user knows how long a good run takes and what it may cost.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    nan_loss: bool = True
    """Stop (failed) as soon as a NaN or infinite loss is logged."""
    plateau_patience: int | None = Field(default=None, ge=1)
    """Stop when the loss has not improved for this many steps/records; None = off."""
    plateau_unit: Literal["steps", "records"] = "steps"
    """What ``plateau_patience`` counts: logged ``steps`` or metric ``records``."""
    plateau_min_delta: float = Field(default=0.0, ge=0.0)
    """An improvement must lower the best loss by more than this to count."""
    stall_timeout_s: float | None = Field(default=600.0, gt=0)
    """Fail when no new metric record arrives for this long while processes run; None = off."""
    startup_timeout_s: float | None = Field(default=1800.0, gt=0)
    """Like ``stall_timeout_s`` but before the first metric record (setup, data download)."""
    unreachable_timeout_s: float | None = Field(default=120.0, gt=0)
    """Fail when a node cannot be reached over SSH for this long; None = off."""
    max_wall_time_s: float | None = Field(default=None, gt=0)
    """Stop (succeeded: the time budget is spent) after this many seconds from the start; None = off."""
    max_cost_usd: float | None = Field(default=None, gt=0)
    """Stop when the run's estimated cost (nodes x hours x price) reaches this many US dollars; None = off."""
    price_per_node_hour: float | None = Field(default=None, ge=0)
    """Overrides the built-in approximate price table (``launch.rules.pricing``)."""
    gpu_idle_percent: float = Field(default=5.0, ge=0, le=100)
    """A GPU below this utilisation (percent) counts as idle."""
    watcher_lost_after_s: float = Field(default=120.0, gt=0)
    """The on-node watchdog takes over when the laptop's watcher has been silent this long."""
    gpu_idle_timeout_s: float | None = Field(default=None, gt=0)
    """Stop when a running node's GPUs stay idle this long; None = off (needs nvidia-smi)."""
    straggler: StragglerRule | None = None
    """``{factor: 1.3, window_s: 120, action: warn|stop|exclude}``: a node whose ranks' pace is
    ``factor`` times slower than the other nodes' median (the median of its readings) for ``window_s``,
    or whose ranks stopped reporting while the others go on; None = off."""
    gpu_fault: bool = True
    """Fail as soon as a node's GPU counters show a new critical Xid, an uncorrectable ECC
    increment or a GPU gone (needs nvidia-smi; ``recovery.on: [gpu_fault]`` replaces the node)."""


@dataclass(frozen=True)
class NodeObservation:
    """One node at one poll, as the watcher saw it."""

    node: str
    state: NodeState
    exit_code: int | None = None
    """Set when ``state == "exited"``."""
    last_reachable_at: float | None = None
    """When ``state == "unreachable"``: the last time SSH to it worked, if ever."""
    gpu_util: float | None = None
    """Mean GPU utilisation percent on the node; None when unknown or no GPU."""
    preempted: bool = False
    """The cloud announced this node's end (a preemption notice seen by its watchdog): an attempt
    that ends here was preempted, not failed."""
    last_step: int | None = None
    last_loss: float | None = None
    """What this node's ranks logged last (rank 0's node: the run's step and loss); kept once the
    node exited, so its row in the live table still says how far it got."""
    gpu_health: GpuHealth | None = None
    """The node's GPU health counters at this poll; None without nvidia-smi or a reading."""
    pace: NodePace | None = None
    """The node's slowest rank's pace (``launch.rules.stragglers``); None before any report."""
    stopped_processes: int = 0
    """The job's processes on this node stopped by a signal (SIGSTOP, a debugger): alive, never
    stepping, holding every collective they take part in."""
    site_lost: str = ""
    """Why the fleet itself took this node from the run (a scheduler marked it DOWN or DRAIN),
    though it may still answer; "" while it has not."""


@dataclass(frozen=True)
class Observation:
    """Everything one poll saw. Times are unix seconds on the watcher's clock."""

    now: float
    started_at: float
    nodes: tuple[NodeObservation, ...]
    metrics: MetricsSummary = field(default_factory=MetricsSummary)
    final_status: FinalStatus | None = None
    node_count: int | None = None
    """Nodes in the fleet (billed), when more than the nodes observed; default len(nodes)."""
    price_per_node_hour: float = 0.0
    """From ``launch.rules.pricing``; ``StopRules.price_per_node_hour`` overrides it; 0 = unknown."""

    @property
    def fleet_size(self) -> int:
        return self.node_count if self.node_count is not None else len(self.nodes)

    @property
    def elapsed_s(self) -> float:
        return max(0.0, self.now - self.started_at)


@dataclass(frozen=True)
class StopDecision:
    """Why the watcher stops: the outcome, the rule's machine name, and a human sentence."""

    outcome: Outcome
    rule: str
    reason: str
    nodes: tuple[str, ...] = ()
    """The nodes the reason is about, if any (the failed rank, the idle node)."""


@dataclass
class RuleState:
    """What the rules remember between polls. Keep one per watched run; not thread-safe.

    It starts empty; the first :func:`evaluate` anchors it. A re-attached watcher starts a
    fresh one, which is conservative: the timers restart instead of firing at once.
    """

    progress_records: int | None = None
    progress_at: float | None = None
    unreachable_since: dict[str, float] = field(default_factory=dict)
    idle_since: dict[str, float] = field(default_factory=dict)
    plateau_seen: int = 0
    plateau_best: float = math.inf
    plateau_best_step: int | None = None
    plateau_best_index: int | None = None
    pace: PaceHistory = field(default_factory=PaceHistory)
    """The straggler rule's memory: since when each node has been slow, its recent readings."""
    stragglers: list[tuple[str, float, float]] = field(default_factory=list)
    """The nodes the straggler rule flags at this poll (shown in the live table, whatever the action)."""
    gpu_baseline: dict[str, GpuHealth] = field(default_factory=dict)
    """Each node's first GPU reading of the attempt: what ``gpu_fault`` compares against."""
    energy: EnergyMeter = field(default_factory=EnergyMeter)
    """GPU energy so far (power over time), for the summary; not a rule, but polled with them."""

    def update(self, rules: StopRules, obs: Observation) -> None:
        """Fold one observation into the memory; :func:`evaluate` calls this first."""
        records = obs.metrics.records
        if self.progress_records is None:
            # First poll: before any metric the startup clock runs from the launch; once
            # metrics exist we cannot know when they last grew, so we start counting now.
            self.progress_at = obs.started_at if records == 0 else obs.now
            self.progress_records = records
        elif records != self.progress_records:
            self.progress_records = records
            self.progress_at = obs.now
        for n in obs.nodes:
            if n.state == "unreachable":
                self.unreachable_since.setdefault(n.node, obs.now)
            else:
                self.unreachable_since.pop(n.node, None)
            idle = n.state == "running" and n.gpu_util is not None and n.gpu_util < rules.gpu_idle_percent
            if idle:
                self.idle_since.setdefault(n.node, obs.now)
            else:
                self.idle_since.pop(n.node, None)
            if n.gpu_health is not None and n.gpu_health.queried:
                self.gpu_baseline.setdefault(n.node, n.gpu_health)
                self.energy.add(n.node, obs.now, n.gpu_health)
        self._update_plateau(rules, obs.metrics)
        if rules.straggler is not None:
            running = {n.node: n.pace for n in obs.nodes if n.state == "running"}
            self.stragglers = slow_nodes(rules.straggler, running, obs.now, self.pace)

    def _update_plateau(self, rules: StopRules, metrics: MetricsSummary) -> None:
        history = metrics.history
        if len(history) < self.plateau_seen:  # a new stream (re-read from the start)
            self.plateau_seen, self.plateau_best = 0, math.inf
            self.plateau_best_step = self.plateau_best_index = None
        for i in range(self.plateau_seen, len(history)):
            point = history[i]
            if math.isfinite(point.loss) and point.loss < self.plateau_best - rules.plateau_min_delta:
                self.plateau_best = point.loss
                self.plateau_best_step = point.step
                self.plateau_best_index = i
        self.plateau_seen = len(history)


class Rule(Protocol):
    """One stop rule: look at the rules, the observation and the memory; decide or pass."""

    def __call__(self, rules: StopRules, obs: Observation, state: RuleState) -> StopDecision | None: ...


def describe_exit(code: int) -> str:
    """``exit code 137 (SIGKILL, often out of memory)``: make a signal death recognisable."""
    signum = -code if code < 0 else code - 128 if 128 < code < 160 else None
    if signum is None:
        return f"exit code {code}"
    try:
        name = signal.Signals(signum).name
    except ValueError:
        return f"exit code {code}"
    hint = ", often out of memory" if signum == signal.SIGKILL else ""
    return f"exit code {code} ({name}{hint})"


def _fmt_s(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min" + (f" {seconds % 60} s" if seconds % 60 else "")
    return f"{seconds // 3600} h {seconds % 3600 // 60} min"


def _at_step(metrics: MetricsSummary) -> str:
    return f" (last step {metrics.last_step})" if metrics.last_step is not None else ""


def node_down(rules: StopRules, obs: Observation, state: RuleState) -> StopDecision | None:
    """A node the fleet itself took (Slurm: DOWN, DRAIN): the run cannot go on there, whatever
    its processes still do (always on: the node is no longer the run's)."""
    taken = [n for n in obs.nodes if n.site_lost and n.state != "exited"]
    if not taken:
        return None
    what = "; ".join(f"{n.node}: {n.site_lost}" for n in taken[:8])
    return StopDecision(
        "failed",
        "node_down",
        f"the fleet took node(s) from the run ({what}){_at_step(obs.metrics)}.",
        tuple(n.node for n in taken),
    )


def gpu_fault(rules: StopRules, obs: Observation, state: RuleState) -> StopDecision | None:
    """Node, GPU and code of every GPU fault since the node's first reading of the attempt."""
    if not rules.gpu_fault:
        return None
    found: list[tuple[str, str, str]] = []
    for n in obs.nodes:
        baseline = state.gpu_baseline.get(n.node)
        if baseline is None or n.gpu_health is None:
            continue
        found.extend((n.node, gpu, why) for gpu, why in new_faults(baseline, n.gpu_health))
    if not found:
        return None
    nodes = tuple(dict.fromkeys(node for node, _, _ in found))
    what = "; ".join(f"{node} {gpu}: {why}" for node, gpu, why in found[:8])
    return StopDecision(
        "failed", "gpu_fault", f"GPU fault: {what}{_at_step(obs.metrics)}; stopping the run.", nodes
    )


def _stopped_nodes(obs: Observation) -> list[NodeObservation]:
    """Running nodes with processes of the job stopped by a signal."""
    return [n for n in obs.nodes if n.state == "running" and n.stopped_processes > 0]


def _stopped_what(stopped: Sequence[NodeObservation]) -> str:
    return "; ".join(
        f"{n.node} has {n.stopped_processes} process(es) of the job stopped by a signal (SIGSTOP or a debugger)"
        for n in stopped
    )


def rank_failed(rules: StopRules, obs: Observation, state: RuleState) -> StopDecision | None:
    bad = [n for n in obs.nodes if n.state == "exited" and n.exit_code not in (0, None)]
    if not bad:
        return None
    stopped = _stopped_nodes(obs)
    if stopped:
        # a rank that stopped stepping holds every collective: the ranks that then fail (their
        # collective timed out) are its victims, and blaming them would replace the wrong node
        exits = "; ".join(f"{n.node} then exited with {describe_exit(n.exit_code or 0)}" for n in bad)
        return StopDecision(
            "failed",
            "stalled",
            f"{_stopped_what(stopped)}, so its ranks stopped stepping{_at_step(obs.metrics)}; {exits} "
            "(a collective with the stopped ranks failing); stopping the run.",
            tuple(n.node for n in stopped),
        )
    what = "; ".join(f"{n.node} exited with {describe_exit(n.exit_code or 0)}" for n in bad)
    return StopDecision(
        "failed",
        "rank_failed",
        f"{what}{_at_step(obs.metrics)}; stopping the other nodes.",
        tuple(n.node for n in bad),
    )


def vanished(rules: StopRules, obs: Observation, state: RuleState) -> StopDecision | None:
    gone = [n.node for n in obs.nodes if n.state == "vanished"]
    if not gone:
        return None
    return StopDecision(
        "failed",
        "vanished",
        f"the training process on {', '.join(gone)} is gone without an exit code (killed, or the "
        f"machine rebooted){_at_step(obs.metrics)}; stopping the other nodes.",
        tuple(gone),
    )


def reported_failed(rules: StopRules, obs: Observation, state: RuleState) -> StopDecision | None:
    status = obs.final_status
    if status is None or status.status != "failed":
        return None
    step = f" at step {status.step}" if status.step is not None else ""
    message = f": {status.message}" if status.message else ""
    return StopDecision("failed", "reported_failed", f"the training script reported failure{step}{message}.")


def nan_loss(rules: StopRules, obs: Observation, state: RuleState) -> StopDecision | None:
    point = obs.metrics.first_nonfinite
    if not rules.nan_loss or point is None:
        return None
    return StopDecision("failed", "nan_loss", f"loss became {point.loss} at step {point.step}.")


def completed(rules: StopRules, obs: Observation, state: RuleState) -> StopDecision | None:
    status = obs.final_status
    if status is not None and status.status == "succeeded":
        step = f" at step {status.step}" if status.step is not None else ""
        return StopDecision("succeeded", "completed", f"the training script reported success{step}.")
    done = bool(obs.nodes) and len(obs.nodes) >= obs.fleet_size
    if done and all(n.state == "exited" and n.exit_code == 0 for n in obs.nodes):
        return StopDecision(
            "succeeded", "completed", f"all {len(obs.nodes)} nodes exited with code 0{_at_step(obs.metrics)}."
        )
    return None


def unreachable(rules: StopRules, obs: Observation, state: RuleState) -> StopDecision | None:
    limit = rules.unreachable_timeout_s
    if limit is None:
        return None
    late: list[tuple[str, float]] = []
    for n in obs.nodes:
        if n.state != "unreachable":
            continue
        since = n.last_reachable_at if n.last_reachable_at is not None else state.unreachable_since[n.node]
        if obs.now - since >= limit:
            late.append((n.node, obs.now - since))
    if not late:
        return None
    what = ", ".join(f"{node} for {_fmt_s(dt)}" for node, dt in late)
    return StopDecision(
        "failed",
        "unreachable",
        f"cannot reach {what} (limit {_fmt_s(limit)}); the machine may be down or the network cut.",
        tuple(node for node, _ in late),
    )


def stalled(rules: StopRules, obs: Observation, state: RuleState) -> StopDecision | None:
    if not any(n.state == "running" for n in obs.nodes):
        return None
    if any(n.state == "unreachable" for n in obs.nodes):
        return None  # silence is explained by lost contact, not a hang; see ``unreachable``
    first = obs.metrics.records == 0
    limit = rules.startup_timeout_s if first else rules.stall_timeout_s
    if limit is None or state.progress_at is None:
        return None
    quiet = obs.now - state.progress_at
    if quiet < limit:
        return None
    if first:
        reason = f"no metrics at all {_fmt_s(quiet)} after launch (startup limit {_fmt_s(limit)})"
    else:
        reason = (
            f"no new metrics for {_fmt_s(quiet)} after step {obs.metrics.last_step} (limit {_fmt_s(limit)})"
        )
    stopped = _stopped_nodes(obs)
    if stopped:
        return StopDecision(
            "failed", "stalled", f"{reason}: {_stopped_what(stopped)}.", tuple(n.node for n in stopped)
        )
    return StopDecision("failed", "stalled", f"{reason} while processes still run: probably a hang.")


def gpu_idle(rules: StopRules, obs: Observation, state: RuleState) -> StopDecision | None:
    limit = rules.gpu_idle_timeout_s
    if limit is None:
        return None
    idle = [(n, obs.now - state.idle_since[n.node]) for n in obs.nodes if n.node in state.idle_since]
    idle = [(n, dt) for n, dt in idle if dt >= limit]
    if not idle:
        return None
    what = ", ".join(f"{n.node} at {n.gpu_util:.0f}% for {_fmt_s(dt)}" for n, dt in idle)
    return StopDecision(
        "stopped",
        "gpu_idle",
        f"GPU utilisation below {rules.gpu_idle_percent:g}% on {what} (limit {_fmt_s(limit)}).",
        tuple(n.node for n, _ in idle),
    )


def straggler(rules: StopRules, obs: Observation, state: RuleState) -> StopDecision | None:
    rule = rules.straggler
    if rule is None or rule.action == "warn" or not state.stragglers:
        return None
    nodes = tuple(node for node, _, _ in state.stragglers)
    outcome: Outcome = "failed" if rule.action == "exclude" else "stopped"
    return StopDecision(outcome, "straggler", describe(state.stragglers, rule) + ".", nodes)


def plateau(rules: StopRules, obs: Observation, state: RuleState) -> StopDecision | None:
    patience = rules.plateau_patience
    m = obs.metrics
    if patience is None or state.plateau_best_step is None or state.plateau_best_index is None:
        return None
    if rules.plateau_unit == "steps":
        if m.last_step is None:
            return None
        waited = m.last_step - state.plateau_best_step
    else:
        waited = len(m.history) - 1 - state.plateau_best_index
    if waited < patience:
        return None
    now = f"{m.last_loss:.6g}" if m.last_loss is not None else "n/a"
    delta = f" by more than {rules.plateau_min_delta:g}" if rules.plateau_min_delta else ""
    return StopDecision(
        "stopped",
        "plateau",
        f"loss has not improved{delta} for {waited} {rules.plateau_unit} (patience {patience}): best "
        f"{state.plateau_best:.6g} at step {state.plateau_best_step}, now {now} at step {m.last_step}.",
    )


def wall_time(rules: StopRules, obs: Observation, state: RuleState) -> StopDecision | None:
    limit = rules.max_wall_time_s
    if limit is None or obs.elapsed_s < limit:
        return None
    return StopDecision(
        "stopped",
        "wall_time",
        f"wall-time limit reached: running for {_fmt_s(obs.elapsed_s)} (limit {_fmt_s(limit)}){_at_step(obs.metrics)}.",
    )


def _price(rules: StopRules, obs: Observation) -> float:
    return rules.price_per_node_hour if rules.price_per_node_hour is not None else obs.price_per_node_hour


def max_cost(rules: StopRules, obs: Observation, state: RuleState) -> StopDecision | None:
    cap, price = rules.max_cost_usd, _price(rules, obs)
    if cap is None or price <= 0:
        return None  # unknown price: cannot enforce; ``configuration_warnings`` tells the user
    spent = cost_so_far(obs.fleet_size, price, obs.elapsed_s)
    if spent < cap:
        return None
    return StopDecision(
        "stopped",
        "max_cost",
        f"estimated cost ${spent:,.2f} reached the cap ${cap:,.2f} ({obs.fleet_size} nodes x "
        f"${price:,.2f}/h x {_fmt_s(obs.elapsed_s)}; approximate list price).",
    )


#: The rules in priority order (see the module docstring for why this order).
RULES: tuple[tuple[RuleName, Rule], ...] = (
    ("node_down", node_down),
    ("gpu_fault", gpu_fault),
    ("rank_failed", rank_failed),
    ("vanished", vanished),
    ("reported_failed", reported_failed),
    ("nan_loss", nan_loss),
    ("completed", completed),
    ("unreachable", unreachable),
    ("stalled", stalled),
    ("gpu_idle", gpu_idle),
    ("straggler", straggler),
    ("plateau", plateau),
    ("wall_time", wall_time),
    ("max_cost", max_cost),
)


def evaluate(rules: StopRules, obs: Observation, state: RuleState | None = None) -> StopDecision | None:
    """Update ``state`` with ``obs`` and return the first rule that fires, or None.

    Pass the same ``state`` at every poll of a run: without it, timers start at this very
    observation and the time-based rules (stall, unreachable without ``last_reachable_at``,
    GPU idle) cannot fire.
    """
    if state is None:
        state = RuleState()
    state.update(rules, obs)
    for _name, rule in RULES:
        decision = rule(rules, obs, state)
        if decision is not None:
            return decision
    return None


def configuration_warnings(rules: StopRules, price_per_node_hour: float) -> list[str]:
    """Sentences to print at launch when a configured rule cannot work on this fleet."""
    out: list[str] = []
    price = rules.price_per_node_hour if rules.price_per_node_hour is not None else price_per_node_hour
    if rules.max_cost_usd is not None and price <= 0:
        out.append(
            f"max_cost_usd={rules.max_cost_usd:g} is set but the price per node-hour is unknown "
            "(local fleet or machine type not in the price table), so the cost cap cannot fire; "
            "set stop.price_per_node_hour to enforce it."
        )
    return out


def should_teardown(teardown: Teardown, outcome: Outcome | None) -> bool:
    """Whether to destroy the fleet after a run ended with ``outcome``.

    ``on_success`` keeps a failed fleet up on purpose, so the user can log in and debug it.
    ``None`` means the watcher was interrupted or detached without a decision: the training
    may still be running, so nothing is torn down whatever the setting.
    """
    if outcome is None:
        return False
    policy = Teardown(teardown)
    return policy is Teardown.ALWAYS or (policy is Teardown.ON_SUCCESS and outcome == "succeeded")


def node_exit_codes(nodes: Sequence[NodeObservation]) -> dict[str, int | None]:
    """Per-node exit codes (None when not exited) for the run record and the summary."""
    return {n.node: n.exit_code if n.state == "exited" else None for n in nodes}
