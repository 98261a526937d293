"""Playbook settings that cannot take effect together, found across sections.

Each field alone validates in its own model (``StopRules``, ``RecoveryPolicy``), so a playbook
could ask for recovery that can never start (``recovery.on: [gpu_fault]`` with the
``stop.gpu_fault`` rule switched off) or tune a rule that is off (``stop.plateau_min_delta``
without ``stop.plateau_patience``) and hear nothing until the run behaved otherwise. Here each
such pair is one line naming both fields; ``JobSpec`` refuses the playbook with it.

Only settings the user wrote are judged (pydantic's ``model_fields_set``): a default that
happens to sit beside another setting is not a contradiction the user made.
"""

from __future__ import annotations

from launch.rules.recovery import RecoveryPolicy
from launch.rules.stoprules import StopRules, Teardown


def contradictions(
    stop: StopRules,
    recovery: RecoveryPolicy,
    *,
    teardown: Teardown = Teardown.ALWAYS,
    keep_warm_s: float | None = None,
) -> list[tuple[str, str]]:
    """``(field, problem)`` for each pair that cannot take effect together; the problem names
    the other field and what to change. ``teardown``, ``keep_warm_s``: the playbook's own."""
    found: list[tuple[str, str]] = []
    on = set(recovery.on)
    if keep_warm_s is not None and Teardown(teardown) is Teardown.NEVER:
        found.append(
            (
                "keep_warm_s",
                "keeps the fleet warm instead of tearing it down, but field 'teardown' is never, so the "
                "fleet is never torn down and nothing ends it after the run: set teardown: always (or "
                "on_success) or remove keep_warm_s",
            )
        )
    if on and "on" in recovery.model_fields_set and "max_restarts" not in recovery.model_fields_set:
        found.append(
            (
                "recovery.on",
                f"lists {', '.join(recovery.on)}, but field 'recovery.max_restarts' is not set (0), so no "
                "loss ever starts a new attempt: set recovery.max_restarts (attempts after the first)",
            )
        )
    if "gpu_fault" in on and not stop.gpu_fault:
        found.append(
            (
                "recovery.on",
                "lists gpu_fault, but field 'stop.gpu_fault' is false, so no GPU fault is ever detected "
                "and this recovery never starts: set stop.gpu_fault: true or take gpu_fault out of recovery.on",
            )
        )
    if "straggler" in on and (stop.straggler is None or stop.straggler.action != "exclude"):
        now = "is not set" if stop.straggler is None else f"has action {stop.straggler.action}"
        found.append(
            (
                "recovery.on",
                f"lists straggler, but field 'stop.straggler' {now}; only a straggler rule with "
                "action: exclude starts a new attempt without the slow node: set "
                "stop.straggler: {action: exclude} or take straggler out of recovery.on",
            )
        )
    if recovery.max_restarts > 0 and not on:
        found.append(
            (
                "recovery.max_restarts",
                f"is {recovery.max_restarts}, but field 'recovery.on' is empty, so no loss ever starts "
                "a new attempt: list the losses to recover from (node_lost, preempted, ...)",
            )
        )
    written = stop.model_fields_set
    if stop.plateau_patience is None:
        for tuning in sorted({"plateau_min_delta", "plateau_unit"} & written):
            found.append(
                (
                    f"stop.{tuning}",
                    "tunes the plateau rule, but field 'stop.plateau_patience' is not set, so the rule "
                    "is off: set stop.plateau_patience or remove this field",
                )
            )
    if "gpu_idle_percent" in written and stop.gpu_idle_timeout_s is None:
        found.append(
            (
                "stop.gpu_idle_percent",
                "tunes the GPU-idle rule, but field 'stop.gpu_idle_timeout_s' is not set, so the rule "
                "is off: set stop.gpu_idle_timeout_s or remove this field",
            )
        )
    if stop.max_cost_usd is not None and stop.price_per_node_hour == 0:
        found.append(
            (
                "stop.max_cost_usd",
                "can never be reached: field 'stop.price_per_node_hour' is 0, so the run costs nothing: "
                "give the real price or remove max_cost_usd",
            )
        )
    return found
