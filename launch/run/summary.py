"""How a run ended, as data: the teardown decision and the ``RunSummary``. Pure: no I/O.

``decide_teardown`` is the one place that turns the playbook's policy, the outcome and the safety
of the artifacts into "tear down", "skip", "block" or "not requested"; the wrap-up, ``fab pull``
and the tests all use it. ``RunSummary`` is what ``summary.json`` holds, what the run record is
written from, and what ``fab train`` returns.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from launch.fleets.kinds.base import TeardownOutcome, TeardownState
from launch.rules.energy import RunEnergy
from launch.rules.stoprules import Outcome, Teardown, should_teardown

TRACEBACK_FILE = "traceback.txt"
"""Written in the run folder when fleetrun itself failed during a run (watcher, runner, wrap-up)."""


class TeardownAction(str, Enum):
    TEAR_DOWN = "tear_down"
    SKIP = "skip"
    BLOCK = "block"
    NOT_REQUESTED = "not_requested"


@dataclass(frozen=True)
class TeardownDecision:
    action: TeardownAction
    reason: str

    def outcome(self) -> TeardownOutcome:
        """The outcome of a decision that does not tear down (``TEAR_DOWN`` has to run first)."""
        state = {
            TeardownAction.SKIP: TeardownState.SKIPPED,
            TeardownAction.BLOCK: TeardownState.BLOCKED,
            TeardownAction.NOT_REQUESTED: TeardownState.NOT_REQUESTED,
        }.get(self.action)
        if state is None:
            raise ValueError("a TEAR_DOWN decision has no outcome before the teardown ran")
        return TeardownOutcome(state, self.reason)


def decide_teardown(
    policy: Teardown | str,
    outcome: Outcome | str | None,
    pull_errors: Mapping[str, str],
    stop_errors: Mapping[str, str],
    *,
    applies: bool = True,
) -> TeardownDecision:
    """Whether to tear the fleet down after a run that ended with ``outcome``.

    ``applies`` is False when nothing of the run touched the fleet worth deciding about (the
    operator interrupted before the launch). Artifacts first: a node that could not be stopped or
    pulled may hold the only copy of its results, so its fleet is kept whatever the policy.
    """
    policy = Teardown(policy)
    if not applies:
        return TeardownDecision(TeardownAction.NOT_REQUESTED, "not requested: nothing was launched")
    if not should_teardown(policy, outcome):  # type: ignore[arg-type]
        return TeardownDecision(
            TeardownAction.SKIP, f"skipped (teardown: {policy.value}, outcome {outcome or 'none'})"
        )
    unsafe = sorted({*pull_errors, *stop_errors})
    if unsafe:
        return TeardownDecision(
            TeardownAction.BLOCK,
            f"blocked: artifacts of {', '.join(unsafe)} are not safe (pull or stop failed); the fleet is "
            "kept so nothing is lost; fix and run 'fab pull RUN', or tear down by hand",
        )
    return TeardownDecision(TeardownAction.TEAR_DOWN, f"teardown: {policy.value}, outcome {outcome}")


@dataclass
class RunSummary:
    """One finished run: ``summary.json``, the run record's final fields, ``fab train``'s result."""

    run_id: str
    job: str
    outcome: Outcome
    rule: str
    reason: str
    folder: Path
    exit_codes: dict[str, int | None] = field(default_factory=dict)
    failed_nodes: tuple[str, ...] = ()
    first_step_after_s: float | None = None
    last_metrics: dict[str, Any] = field(default_factory=dict)
    world: dict[str, Any] | None = None
    rank0_node: str | None = None
    pull_errors: dict[str, str] = field(default_factory=dict)
    stop_errors: dict[str, str] = field(default_factory=dict)
    uploads: dict[str, str] = field(default_factory=dict)
    teardown: TeardownOutcome = field(
        default_factory=lambda: TeardownOutcome(TeardownState.NOT_REQUESTED, "not requested")
    )
    timings: dict[str, float] = field(default_factory=dict)
    nodes: list[str] = field(default_factory=list)
    cost_usd: float | None = None
    """Estimated USD (``launch.rules.pricing``) from the launch to the end; None when the price is unknown."""
    energy: RunEnergy = field(default_factory=RunEnergy)
    """GPU energy from the polled power draw, per attempt (``launch.rules.energy``): the run's
    is the sum over its attempts; none without GPU readings."""
    traceback: str | None = None
    """``traceback.txt`` when fleetrun itself failed during the run."""
    decided_at: float | None = None
    teardown_started_at: float | None = None
    ended_at: float | None = None
    watch: dict[str, Any] = field(default_factory=dict)
    """How the watcher learnt the end: its poll rounds and the changes the nodes pushed on their
    event channels (``launch.run.pushed_exits``) in the order heard."""
    hooks: tuple[dict[str, Any], ...] = ()
    """What the playbook's ``on_end`` commands did (``launch.run.closing``), once they ran: each
    one's command, ``ok``, exit code, or why it was skipped; ``hooks.json`` in the run folder."""

    @property
    def ok(self) -> bool:
        return self.outcome == "succeeded"

    @property
    def energy_kwh(self) -> float | None:
        """The run's GPU energy over all its attempts; None without GPU readings (never 0)."""
        return self.energy.total_kwh

    @property
    def failed_node(self) -> str | None:
        return self.failed_nodes[0] if self.failed_nodes else None

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "job": self.job,
            "outcome": self.outcome,
            "rule": self.rule,
            "reason": self.reason,
            "failed_nodes": list(self.failed_nodes),
            "exit_codes": self.exit_codes,
            "first_step_after_s": self.first_step_after_s,
            "last_metrics": self.last_metrics,
            "world": self.world,
            "rank0_node": self.rank0_node,
            "pull_errors": self.pull_errors,
            "stop_errors": self.stop_errors,
            "uploads": self.uploads,
            "teardown": self.teardown.to_json(),
            "timings": self.timings,
            "nodes": self.nodes,
            "cost_usd": self.cost_usd,
            "energy_kwh": self.energy_kwh,
            "energy_attempts": self.energy.attempts,
            "energy_kwh_by_attempt": self.energy.to_json(),
            "traceback": self.traceback,
            "decided_at": self.decided_at,
            "teardown_started_at": self.teardown_started_at,
            "ended_at": self.ended_at,
            "watch": self.watch,
        }

    def record_fields(self) -> dict[str, Any]:
        """What ``RunRecords.finish`` stores of this run (artifacts are listed by the caller)."""
        return {
            "state": self.outcome,
            "ended_at": self.ended_at,
            "stop_rule": self.rule,
            "stop_reason": self.reason,
            "exit_codes": self.exit_codes,
            "last_metrics": self.last_metrics,
            "cost_usd": self.cost_usd,
            "energy_kwh": self.energy_kwh,
            "energy_by_attempt": self.energy.to_json(),
        }


RunResult = RunSummary
"""The name callers used before the summary type existed."""
