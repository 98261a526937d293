"""Watching a running job: poll every node, fold what comes back into an ``Observation``, decide.

The watcher keeps one SSH connection per node (reused across polls) and asks the node agent for
an incremental answer: process state, exit code, the metrics bytes since the last offset, the
final status record. Concurrency is bounded (``FleetPort.max_parallel``) so it holds at 64+ nodes.
Stop decisions come from ``launch.rules.stoprules``; this module only gathers facts and draws the table.

Everything needed to watch a run (``launch.run.target.WatchTarget``) is saved as ``watch.json`` in
the run folder, so a watcher that died (laptop closed, Ctrl-C) can be re-attached with ``fab watch RUN``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from rich.console import Console
from rich.live import Live

from launch.errors import HostError
from launch.nodelib.fleetrun_protocol import PollAnswer, PollRequest, PreemptionNotice, ProtocolError
from launch.planning import remote_layout as layout
from launch.reports.safe_text import safe_text
from launch.reports.views import live_table
from launch.reports.warmup import warm_up
from launch.rules.contact import poll_budget
from launch.rules.gpu_health import GpuHealth, gpu_reading
from launch.rules.metrics_stream import FinalStatus, MetricsStream, MetricsSummary, parse_status
from launch.rules.pricing import price_per_node_hour
from launch.rules.stoprules import (
    NodeObservation,
    Observation,
    RuleState,
    StopDecision,
    evaluate,
)
from launch.rules.stragglers import NodePace, parse_pace
from launch.run.clock import Clock
from launch.run.pushed_exits import PushedExits
from launch.run.recheck import EarlyChecks
from launch.run.site_lost import SiteLost
from launch.run.target import WatchTarget
from launch.transport.port import FleetPort, NodeLink

__all__ = ["AGENT", "NodeWatch", "WatchTarget", "Watcher"]

AGENT = f'python3 "$HOME/{layout.AGENT}"'
POLL_DEADLINE_S = 20.0
POLL_ANSWER_TIMEOUT_S = 15.0


class BadAnswer(HostError):
    """The node answered, but not in the protocol (garbage, wrong types, an agent error).

    Shown as its own state, ``bad answer``; for the stop rules the node is not reachable (no
    good answer since ``last_reachable_at``), so only the existing unreachable rule can fail it.
    """


@dataclass
class NodeWatch:
    """What the watcher knows about one node, updated every poll."""

    name: str
    starts_processes: bool
    state: str = "running"
    rc: int | None = None
    exited_at: float | None = None
    offset: int = 0
    last_reachable_at: float | None = None
    log_tail: str = ""
    gpu_util: float | None = None
    gpu: GpuHealth | None = None
    """The node's GPU health counters at the last poll (``gpu_fault`` compares them)."""
    pace: NodePace | None = None
    error: str = ""
    bad_answers: int = 0
    """Answers refused by the protocol (garbage, wrong types, agent errors)."""
    malformed: tuple[str, ...] = ()
    """What the node agent last reported unreadable on the node (an ``rc`` that is no number...)."""
    preempted: PreemptionNotice | None = None
    """The cloud announced this node's end (the watchdog's ``preempt.json``); kept once seen."""
    stopped: int = 0
    """The job's processes on this node stopped by a signal at the last good answer."""
    stream: MetricsStream = field(default_factory=MetricsStream)
    site_lost: str = ""
    """Why the fleet itself says this node is gone (Slurm: DOWN, DRAIN), "" while it does not."""


class Watcher:
    """Polls a run until a stop rule decides; the decision is returned, nothing is stopped here."""

    def __init__(
        self,
        target: WatchTarget,
        fleet: FleetPort,
        console: Console,
        poll_interval: float = 1.0,
        completion_grace_s: float = 30.0,
        on_poll: Callable[[Observation], object] | None = None,
        clock: Clock = time,
        push_exits: bool = False,
        site_lost: SiteLost | None = None,
    ) -> None:
        self.clock = clock
        """Wall time and sleeping: the ``time`` module, or the run context's (a test's fake clock)."""
        self.target = target
        self.fleet = fleet
        self.console = console
        self.poll_interval = poll_interval
        self.completion_grace_s = completion_grace_s
        self.on_poll = on_poll
        self.nodes = {h.name: NodeWatch(h.name, h.name in target.starters) for h in target.inventory.hosts}
        self.final_status: FinalStatus | None = None
        self.rule_state = RuleState()
        self.price = price_per_node_hour(target.instance_type or "", target.rules.price_per_node_hour)
        self.first_step_at: float | None = None
        self.serve_command = f'exec {AGENT} serve "$HOME/{layout.rundir(target.run_id)}"'
        self.polls = 0
        """Poll rounds so far (the summary's ``watch`` facts)."""
        self.woken = 0
        """Pauses between polls that a pushed exit cut short."""
        self.pushed: PushedExits | None = None
        """With ``push_exits``: each running node's event channel (``launch.run.pushed_exits``),
        so a rank's exit ends the pause between polls at once. Waited on in real time, so only
        with the real clock: a stand-in clock sleeps as before."""
        self.site_lost = site_lost
        """The fleet's own word on which nodes it took (``launch.run.site_lost``), or None."""
        if push_exits:
            events = f'exec {AGENT} events "$HOME/{layout.rundir(target.run_id)}"'
            self.pushed = PushedExits(fleet, events)
        self.early_checks: EarlyChecks | None = None
        """With recovery: the checks of silent nodes started before the unreachable limit
        (``launch.run.recheck.EarlyChecks``), whose failures the re-check after it counts."""

    # -- one poll --------------------------------------------------------------------------------
    def _poll_node(self, conn: NodeLink, timeout: float = POLL_ANSWER_TIMEOUT_S) -> PollAnswer:
        """Ask the node's agent over its persistent poll channel (``NodeConnection.ask``).

        The answer is parsed through the node protocol; anything else is a ``BadAnswer``.
        """
        name = conn.host.name
        offset = self.nodes[name].offset
        line = conn.ask(self.serve_command, PollRequest(offset).to_json(), timeout=timeout)
        try:
            answer = PollAnswer.from_json(line)
        except ProtocolError as exc:
            conn.close_sessions()  # out of step with the protocol: the next poll starts a fresh agent
            raise BadAnswer(name, f"bad answer: {exc}") from None
        if answer.error:
            raise BadAnswer(name, f"bad answer: the node agent said: {answer.error}")
        if answer.offset != offset + len(answer.metrics):
            conn.close_sessions()
            raise BadAnswer(
                name,
                f"bad answer: metrics offset {answer.offset} does not follow "
                f"{offset} + {len(answer.metrics)} bytes",
            )
        return answer

    def close(self) -> None:
        """Close the poll and event channels; each node's agent exits on end of input."""
        if self.pushed is not None:
            self.pushed.close()
        if self.site_lost is not None:
            self.site_lost.close()
        if self.early_checks is not None:
            self.early_checks.stop()
        for conn in self.fleet.connections.values():
            conn.close_sessions()

    def _timed_poll(self, conn: NodeLink, timeout: float) -> tuple[PollAnswer, float]:
        """The answer and when it arrived: that moment is the node's last contact, not the end
        of the poll round (which waits for the slowest node)."""
        answer = self._poll_node(conn, timeout)
        return answer, self.clock.time()

    def _absorb(
        self, node: NodeWatch, answer: PollAnswer | BaseException, now: float, arrived_at: float | None = None
    ) -> None:
        """Fold one node's answer (or failure) in; ``arrived_at`` is when a good answer came."""
        if isinstance(answer, BaseException):
            node.error = str(answer)
            if isinstance(answer, BadAnswer):
                node.bad_answers += 1
            if node.state not in ("exited", "vanished"):
                node.state = "bad answer" if isinstance(answer, BadAnswer) else "unreachable"
            return
        node.error = ""
        node.last_reachable_at = now if arrived_at is None else min(arrived_at, now)
        node.log_tail = answer.log_tail
        node.gpu_util = answer.gpu_util
        node.gpu = gpu_reading(answer.gpu)
        node.pace = parse_pace(answer.pace)  # a silent node's old pace, with its age: counted as stalled
        node.state = "vanished" if answer.state == "absent" else answer.state
        node.rc = answer.rc
        node.exited_at = answer.exited_at
        if answer.metrics:
            node.stream.feed(answer.metrics)
        node.offset = answer.offset
        node.malformed = answer.malformed
        node.stopped = answer.stopped
        if answer.preempted is not None:
            node.preempted = answer.preempted
        if answer.status is not None:
            status = parse_status(answer.status.to_dict())
            if status is not None:
                self.final_status = status

    def metrics(self) -> MetricsSummary:
        """Rank 0's metrics: the one node whose metrics file has records (rank 0 lands anywhere)."""
        streams = sorted(self.nodes.values(), key=lambda n: n.stream.records + n.stream.events, reverse=True)
        return streams[0].stream.summary() if streams else MetricsSummary()

    def observation(self, now: float) -> Observation:
        """Nodes whose processes the head's launcher started follow the head's state.

        Exited-with-failure nodes come first, earliest exit first: the node that failed first is
        usually the cause, the others fail because their peers went away.
        """
        starters = [n for n in self.nodes.values() if n.starts_processes]
        head = starters[0] if starters else None
        observed: list[NodeObservation] = []
        for node in self.nodes.values():
            state, rc = node.state, node.rc
            if state == "bad answer":
                state = "unreachable"  # no good answer since last_reachable_at; see BadAnswer
            if not node.starts_processes and state != "unreachable":
                # a rank that failed on a head-started node records its own exit code (horovod's rank.sh)
                own_failure = state == "exited" and rc not in (0, None)
                if not own_failure:
                    state, rc = (
                        (head.state, head.rc) if head and head.state == "exited" else ("running", None)
                    )
            observed.append(
                NodeObservation(
                    node=node.name,
                    state=state,  # type: ignore[arg-type]
                    exit_code=rc if state == "exited" else None,
                    last_reachable_at=node.last_reachable_at,
                    gpu_util=node.gpu_util,
                    preempted=node.preempted is not None,
                    last_step=node.stream.last_step,
                    last_loss=node.stream.last_loss,
                    gpu_health=node.gpu,
                    pace=node.pace,
                    stopped_processes=node.stopped,
                    site_lost=node.site_lost,
                )
            )
        exits = {
            n.name: n.exited_at if n.exited_at is not None else float("inf") for n in self.nodes.values()
        }
        observed.sort(key=lambda o: (0, exits[o.node]) if o.state == "exited" and o.exit_code else (1, 0.0))
        return Observation(
            now=now,
            started_at=self.target.started_at,
            nodes=tuple(observed),
            metrics=self.metrics(),
            final_status=self.final_status,
            node_count=len(self.target.inventory.hosts),
            price_per_node_hour=self.price,
        )

    def poll_once(self) -> Observation:
        # The round ends when the earliest silent node is due (``poll_budget``): a poll waiting on
        # a node that went away must not push the unreachable verdict past its limit.
        budget = poll_budget(
            self.target.rules.unreachable_timeout_s,
            [n.last_reachable_at for n in self.nodes.values() if n.state not in ("exited", "vanished")],
            self.clock.time(),
            POLL_DEADLINE_S,
        )
        timeout = min(POLL_ANSWER_TIMEOUT_S, budget)
        self.polls += 1
        if self.pushed is not None:
            self.pushed.arm()  # a push from here on wakes the pause after this round
        answers = self.fleet.map(lambda c: self._timed_poll(c, timeout), deadline=budget)
        now = self.clock.time()
        for name, result in answers.items():
            node = self.nodes[name]
            before, malformed_before = node.state, node.malformed
            if isinstance(result, BaseException):
                self._absorb(node, result, now)
            else:
                self._absorb(node, result[0], now, arrived_at=result[1])
            shown = ("unreachable", "exited", "bad answer")
            if node.state != before and (node.starts_processes or node.state in shown):
                rc = f" (exit {node.rc})" if node.rc is not None else ""
                why = f": {node.error}" if node.error else ""
                self.console.print(safe_text(f"  {name}: {before} -> {node.state}{rc}{why}"))
            if node.malformed and node.malformed != malformed_before:
                self.console.print(
                    safe_text(f"  {name}: unreadable on the node: {'; '.join(node.malformed)}")
                )
        self._refresh_site_lost()
        obs = self.observation(now)
        if self.first_step_at is None and obs.metrics.records:
            first = obs.metrics.history[0].time if len(obs.metrics.history) else None
            self.first_step_at = first or now
            warm_up()  # the wrap-up's plot: imported and drawn once while the job steps
            self.console.print(
                f"  first step logged {self.first_step_at - self.target.started_at:.1f} s after launch"
            )
        return obs

    def _refresh_site_lost(self) -> None:
        """The fleet's last answer folded in (asked in the background, never waited for)."""
        if self.site_lost is None:
            return
        line = self.site_lost.refresh([n.name for n in self.nodes.values() if n.state != "exited"])
        if line:
            self.console.print(safe_text(line))
        for node in self.nodes.values():
            why = self.site_lost.lost.get(node.name, "")
            if why and not node.site_lost:
                self.console.print(safe_text(f"  {node.name}: the fleet took it: {why}"))
            node.site_lost = why

    # -- the loop --------------------------------------------------------------------------------
    def title(self) -> str:
        return f"run {self.target.run_id}"

    def run(self) -> StopDecision:
        """Poll until a rule fires. A success reported before every process exited gets a grace
        period, so processes finishing their teardown are not killed into a non-zero exit."""
        try:
            return self._run()
        finally:
            self.close()

    def _run(self) -> StopDecision:
        grace_until: float | None = None
        with Live(console=self.console, refresh_per_second=4, transient=False) as live:
            while True:
                obs = self.poll_once()
                decision = evaluate(self.target.rules, obs, self.rule_state)
                live.update(
                    live_table(obs, title=self.title(), decision=decision, rule_state=self.rule_state)
                )
                if self.on_poll is not None:
                    self.on_poll(obs)
                if decision is not None:
                    still_running = [n for n in obs.nodes if n.state == "running"]
                    if decision.outcome == "succeeded" and still_running:
                        grace_until = grace_until or obs.now + self.completion_grace_s
                        if obs.now < grace_until:
                            self.pause()
                            continue
                    return decision
                self.pause()

    def pause(self) -> None:
        """The wait between two polls: ``poll_interval``, cut short the moment a running node's
        agent pushes its job's exit on the event channel (``launch.run.pushed_exits``)."""
        if self.pushed is not None:
            self.pushed.listen(n.name for n in self.nodes.values() if n.state == "running")
            if self.pushed.listening:
                if self.pushed.wait(self.poll_interval):
                    self.woken += 1
                return
        self.clock.sleep(self.poll_interval)
