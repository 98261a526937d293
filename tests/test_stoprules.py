"""Stop rules: each rule fires when it should and not before, priorities, config model.

Time is always explicit (``Observation.now``): a fake clock, no sleeps.
"""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from launch.rules import pricing
from launch.rules.metrics_stream import FinalStatus, MetricsStream, MetricsSummary
from launch.rules.stoprules import (
    RULES,
    NodeObservation,
    Observation,
    RuleState,
    StopRules,
    configuration_warnings,
    cost_so_far,
    describe_exit,
    evaluate,
    node_exit_codes,
    should_teardown,
)

T0 = 1_000_000.0


def quiet(**fields: object) -> StopRules:
    """Stall rules off, for tests of other rules over long fake durations without metrics."""
    return StopRules.model_validate({"stall_timeout_s": None, "startup_timeout_s": None, **fields})


def running(*names: str, gpu: float | None = None) -> tuple[NodeObservation, ...]:
    return tuple(NodeObservation(n, "running", gpu_util=gpu) for n in names)


def metrics_from(losses: list[float], *, start_step: int = 0, every: int = 1) -> MetricsSummary:
    stream = MetricsStream()
    body = "".join(
        json.dumps({"step": start_step + i * every, "time": T0 + i, "loss": loss}) + "\n"
        for i, loss in enumerate(losses)
    )
    stream.feed(body.encode())
    return stream.summary()


def obs(
    now: float,
    nodes: tuple[NodeObservation, ...] = running("node0", "node1"),
    metrics: MetricsSummary | None = None,
    **kw: object,
) -> Observation:
    return Observation(now=now, started_at=T0, nodes=nodes, metrics=metrics or MetricsSummary(), **kw)  # type: ignore[arg-type]


# ------------------------------------------------------------------ config model


def test_defaults_are_safe_and_documented() -> None:
    rules = StopRules()
    assert rules.nan_loss is True
    assert rules.plateau_patience is None  # plateau off by default
    assert rules.stall_timeout_s == 600 and rules.unreachable_timeout_s == 120
    assert rules.max_wall_time_s is None and rules.max_cost_usd is None and rules.gpu_idle_timeout_s is None


def test_unknown_and_invalid_fields_are_rejected() -> None:
    with pytest.raises(ValidationError, match="stall_timout_s"):
        StopRules.model_validate({"stall_timout_s": 5})
    with pytest.raises(ValidationError):
        StopRules.model_validate({"stall_timeout_s": -1})
    with pytest.raises(ValidationError):
        StopRules.model_validate({"plateau_unit": "epochs"})
    rules = StopRules.model_validate({"stall_timeout_s": None, "max_cost_usd": 50})
    assert rules.stall_timeout_s is None and rules.max_cost_usd == 50


def test_rule_names_are_unique_and_in_documented_order() -> None:
    names = [name for name, _ in RULES]
    assert names == [
        "node_down", "gpu_fault", "rank_failed", "vanished", "reported_failed", "nan_loss", "completed", "unreachable",
        "stalled", "gpu_idle", "straggler", "plateau", "wall_time", "max_cost",
    ]  # fmt: skip


def test_a_node_the_fleet_took_fails_the_run_naming_it_while_its_ranks_still_step() -> None:
    """Slurm set it DOWN: it still answers and its ranks run, so only the fleet's word shows it."""
    taken = (NodeObservation("node0", "running"), NodeObservation("node1", "running", site_lost="down"))
    decision = evaluate(quiet(), obs(T0 + 10, nodes=taken, metrics=metrics_from([1.0, 0.9])))
    assert decision is not None and (decision.outcome, decision.rule) == ("failed", "node_down")
    assert decision.nodes == ("node1",) and "node1: down" in decision.reason
    finished = (
        NodeObservation("node0", "exited", 0),
        NodeObservation("node1", "exited", 0, site_lost="down"),
    )
    assert evaluate(quiet(), obs(T0 + 10, nodes=finished)).rule == "completed"  # type: ignore[union-attr]


# ------------------------------------------------------------------ healthy run


def test_healthy_run_is_not_stopped() -> None:
    state = RuleState()
    m = metrics_from([1.0, 0.9, 0.8])
    assert evaluate(StopRules(), obs(T0 + 10, metrics=m), state) is None
    assert evaluate(StopRules(), obs(T0 + 20, metrics=metrics_from([1.0, 0.9, 0.8, 0.7])), state) is None


# ------------------------------------------------------------------ completion and failures


def test_all_nodes_exit_zero_is_success() -> None:
    nodes = (NodeObservation("node0", "exited", 0), NodeObservation("node1", "exited", 0))
    d = evaluate(StopRules(), obs(T0 + 5, nodes, metrics_from([0.5])))
    assert d is not None and (d.outcome, d.rule) == ("succeeded", "completed")
    assert "all 2 nodes exited with code 0" in d.reason


def test_partial_exit_zero_is_not_yet_success() -> None:
    nodes = (NodeObservation("node0", "exited", 0), NodeObservation("node1", "running"))
    assert evaluate(StopRules(), obs(T0 + 5, nodes)) is None
    # nodes not observed at all do not count as finished
    only_one = (NodeObservation("node0", "exited", 0),)
    assert evaluate(StopRules(), obs(T0 + 5, only_one, node_count=2)) is None


def test_status_succeeded_completes_even_while_processes_wind_down() -> None:
    status = FinalStatus(status="succeeded", time=T0 + 4, step=100)
    d = evaluate(StopRules(), obs(T0 + 5, final_status=status))
    assert d is not None and d.outcome == "succeeded" and "step 100" in d.reason


def test_nonzero_exit_fails_naming_node_and_code() -> None:
    nodes = (NodeObservation("node0", "running"), NodeObservation("node1", "exited", 137))
    d = evaluate(StopRules(), obs(T0 + 5, nodes, metrics_from([0.5, 0.4])))
    assert d is not None and (d.outcome, d.rule, d.nodes) == ("failed", "rank_failed", ("node1",))
    assert "node1 exited with exit code 137 (SIGKILL, often out of memory)" in d.reason
    assert "last step 1" in d.reason


def test_failure_beats_success_status() -> None:
    nodes = (NodeObservation("node0", "exited", 0), NodeObservation("node1", "exited", 1))
    d = evaluate(StopRules(), obs(T0 + 5, nodes, final_status=FinalStatus(status="succeeded")))
    assert d is not None and d.rule == "rank_failed"


def test_vanished_process_fails() -> None:
    nodes = (NodeObservation("node0", "running"), NodeObservation("node1", "vanished"))
    d = evaluate(StopRules(), obs(T0 + 5, nodes))
    assert d is not None and (d.outcome, d.rule, d.nodes) == ("failed", "vanished", ("node1",))


def test_reported_failure() -> None:
    status = FinalStatus(status="failed", step=42, message="CUDA error: out of memory")
    d = evaluate(StopRules(), obs(T0 + 5, final_status=status))
    assert d is not None and d.rule == "reported_failed"
    assert "step 42" in d.reason and "out of memory" in d.reason


def test_describe_exit() -> None:
    assert describe_exit(1) == "exit code 1"
    assert describe_exit(-15) == "exit code -15 (SIGTERM)"
    assert describe_exit(139) == "exit code 139 (SIGSEGV)"


# ------------------------------------------------------------------ NaN


def test_nan_loss_fails_with_step_and_is_not_missed_if_loss_recovers() -> None:
    m = metrics_from([0.5, float("nan"), 0.4])
    d = evaluate(StopRules(), obs(T0 + 5, metrics=m))
    assert d is not None and (d.outcome, d.rule) == ("failed", "nan_loss")
    assert "nan at step 1" in d.reason


def test_nan_rule_can_be_switched_off() -> None:
    m = metrics_from([0.5, float("inf")])
    assert evaluate(StopRules(nan_loss=False), obs(T0 + 5, metrics=m)) is None


def test_nan_beats_completion() -> None:
    nodes = (NodeObservation("node0", "exited", 0),)
    d = evaluate(StopRules(), obs(T0 + 5, nodes, metrics_from([float("nan")])))
    assert d is not None and d.rule == "nan_loss"


# ------------------------------------------------------------------ plateau


def test_plateau_in_steps_fires_after_patience_without_improvement() -> None:
    rules = StopRules(plateau_patience=30, plateau_min_delta=0.01)
    state = RuleState()
    # steps 0,10,...: best 0.5 at step 20; later values improve by less than min_delta
    losses = [1.0, 0.8, 0.5, 0.495, 0.499, 0.492]
    assert (
        evaluate(rules, obs(T0 + 1, metrics=metrics_from(losses[:5], every=10)), state) is None
    )  # waited 20
    d = evaluate(rules, obs(T0 + 2, metrics=metrics_from(losses, every=10)), state)  # waited 30
    assert d is not None and (d.outcome, d.rule) == ("stopped", "plateau")
    assert "best 0.5 at step 20" in d.reason and "30 steps" in d.reason


def test_plateau_in_records() -> None:
    rules = StopRules(plateau_patience=2, plateau_unit="records")
    assert evaluate(rules, obs(T0 + 1, metrics=metrics_from([1.0, 0.9, 0.95]))) is None
    d = evaluate(rules, obs(T0 + 1, metrics=metrics_from([1.0, 0.9, 0.95, 0.91])))
    assert d is not None and d.rule == "plateau"


def test_plateau_resets_when_loss_improves() -> None:
    rules = StopRules(plateau_patience=2, plateau_unit="records")
    assert evaluate(rules, obs(T0 + 1, metrics=metrics_from([1.0, 1.0, 0.5, 0.5]))) is None


def test_plateau_off_by_default() -> None:
    assert evaluate(StopRules(), obs(T0 + 1, metrics=metrics_from([1.0] * 1000))) is None


# ------------------------------------------------------------------ stalled


def test_stalled_fires_after_timeout_without_new_metrics() -> None:
    rules = StopRules(stall_timeout_s=600)
    state = RuleState()
    m = metrics_from([1.0, 0.9])
    assert evaluate(rules, obs(T0 + 100, metrics=m), state) is None  # progress noted at T0+100
    assert evaluate(rules, obs(T0 + 699, metrics=m), state) is None
    d = evaluate(rules, obs(T0 + 700, metrics=m), state)
    assert d is not None and (d.outcome, d.rule) == ("failed", "stalled")
    assert "after step 1" in d.reason and "no new metrics for 10 min after step 1" in d.reason


def test_a_stopped_rank_is_blamed_not_the_peer_whose_collective_then_fails() -> None:
    """node1's rank was SIGSTOPped before its first step: the startup limit is far away, and
    node0's rank exits 1 when its collective times out. The cause is node1, named as stalled;
    without stopped processes the same exit is node0's own failure."""
    rules = StopRules(stall_timeout_s=5)
    frozen = NodeObservation("node1", "running", stopped_processes=1)
    failed = NodeObservation("node0", "exited", exit_code=1)
    d = evaluate(rules, obs(T0 + 60, nodes=(failed, frozen)), RuleState())
    assert d is not None and (d.outcome, d.rule, d.nodes) == ("failed", "stalled", ("node1",)), d
    assert "node1 has 1 process(es) of the job stopped by a signal" in d.reason
    assert "node0 then exited with exit code 1" in d.reason
    alive = NodeObservation("node1", "running")
    d = evaluate(rules, obs(T0 + 60, nodes=(failed, alive)), RuleState())
    assert d is not None and (d.rule, d.nodes) == ("rank_failed", ("node0",)), d


def test_a_stall_names_the_node_whose_ranks_are_stopped() -> None:
    rules = StopRules(stall_timeout_s=5)
    state = RuleState()
    nodes = (NodeObservation("node0", "running"), NodeObservation("node1", "running", stopped_processes=2))
    m = metrics_from([1.0, 0.9])
    assert evaluate(rules, obs(T0 + 10, nodes=nodes, metrics=m), state) is None
    d = evaluate(rules, obs(T0 + 15, nodes=nodes, metrics=m), state)
    assert d is not None and (d.rule, d.nodes) == ("stalled", ("node1",)), d
    assert "node1 has 2 process(es) of the job stopped by a signal" in d.reason


def test_new_metrics_reset_the_stall_timer() -> None:
    rules = StopRules(stall_timeout_s=600)
    state = RuleState()
    assert evaluate(rules, obs(T0 + 100, metrics=metrics_from([1.0])), state) is None
    assert evaluate(rules, obs(T0 + 650, metrics=metrics_from([1.0, 0.9])), state) is None
    assert evaluate(rules, obs(T0 + 1200, metrics=metrics_from([1.0, 0.9])), state) is None
    assert evaluate(rules, obs(T0 + 1250, metrics=metrics_from([1.0, 0.9])), state) is not None


def test_startup_timeout_applies_before_the_first_metric() -> None:
    rules = StopRules(stall_timeout_s=60, startup_timeout_s=1800)
    state = RuleState()
    assert evaluate(rules, obs(T0 + 1000, metrics=MetricsSummary()), state) is None
    d = evaluate(rules, obs(T0 + 1800, metrics=MetricsSummary()), state)
    assert d is not None and d.rule == "stalled" and "no metrics at all" in d.reason


def test_no_stall_when_nothing_runs_or_rule_disabled() -> None:
    exited = (NodeObservation("node0", "exited", 0), NodeObservation("node1", "running"))
    rules = StopRules(stall_timeout_s=None, startup_timeout_s=None)
    assert evaluate(rules, obs(T0 + 10_000, exited)) is None


# ------------------------------------------------------------------ unreachable


def test_unreachable_uses_last_reachable_time() -> None:
    nodes = (
        NodeObservation("node0", "running"),
        NodeObservation("node1", "unreachable", last_reachable_at=T0 + 50),
    )
    assert evaluate(StopRules(), obs(T0 + 169, nodes)) is None
    d = evaluate(StopRules(), obs(T0 + 170, nodes))
    assert d is not None and (d.outcome, d.rule, d.nodes) == ("failed", "unreachable", ("node1",))
    assert "node1 for 2 min (limit 2 min)" in d.reason


def test_unreachable_without_timestamp_is_timed_by_the_rule_state() -> None:
    state = RuleState()
    down = (NodeObservation("node0", "unreachable"),)
    up = (NodeObservation("node0", "running"),)
    assert evaluate(StopRules(), obs(T0 + 10, down), state) is None
    assert evaluate(StopRules(), obs(T0 + 100, up), state) is None  # back: timer resets
    assert evaluate(StopRules(), obs(T0 + 200, down), state) is None
    d = evaluate(StopRules(), obs(T0 + 320, down), state)
    assert d is not None and d.rule == "unreachable"


def test_unreachable_head_is_not_reported_as_a_stall() -> None:
    state = RuleState()
    m = metrics_from([1.0])
    rules = StopRules(stall_timeout_s=60, unreachable_timeout_s=600)
    assert evaluate(rules, obs(T0, metrics=m), state) is None
    nodes = (
        NodeObservation("node0", "unreachable", last_reachable_at=T0),
        NodeObservation("node1", "running"),
    )
    assert evaluate(rules, obs(T0 + 300, nodes, m), state) is None


# ------------------------------------------------------------------ GPU idle


def test_gpu_idle_fires_only_after_the_idle_period() -> None:
    rules = quiet(gpu_idle_timeout_s=300, gpu_idle_percent=10)
    state = RuleState()
    busy = (
        NodeObservation("node0", "running", gpu_util=95.0),
        NodeObservation("node1", "running", gpu_util=90.0),
    )
    idle = (
        NodeObservation("node0", "running", gpu_util=95.0),
        NodeObservation("node1", "running", gpu_util=2.0),
    )
    m = metrics_from([1.0])
    assert evaluate(rules, obs(T0, busy, m), state) is None
    assert evaluate(rules, obs(T0 + 100, idle, m), state) is None
    assert evaluate(rules, obs(T0 + 200, busy, m), state) is None  # busy again: timer resets
    assert evaluate(rules, obs(T0 + 300, idle, m), state) is None
    d = evaluate(rules, obs(T0 + 600, idle, m), state)
    assert d is not None and (d.outcome, d.rule, d.nodes) == ("stopped", "gpu_idle", ("node1",))
    assert "node1 at 2%" in d.reason


def test_gpu_idle_ignores_unknown_utilisation() -> None:
    rules = quiet(gpu_idle_timeout_s=10)
    state = RuleState()
    nodes = running("node0", gpu=None)
    assert evaluate(rules, obs(T0, nodes), state) is None
    assert evaluate(rules, obs(T0 + 1000, nodes), state) is None


# ------------------------------------------------------------------ wall time and cost


def test_wall_time() -> None:
    rules = StopRules(max_wall_time_s=3600)
    m = metrics_from([1.0])
    assert evaluate(rules, obs(T0 + 3599, metrics=m)) is None
    d = evaluate(rules, obs(T0 + 3600, metrics=m))
    assert d is not None and (d.outcome, d.rule) == ("stopped", "wall_time")


def test_cost_so_far() -> None:
    assert cost_so_far(4, 32.0, 1800) == pytest.approx(64.0)
    assert cost_so_far(4, 0.0, 1800) == 0.0
    assert cost_so_far(0, 32.0, 1800) == 0.0


def test_max_cost_uses_the_observed_price() -> None:
    rules = quiet(max_cost_usd=100)
    price = pricing.price_per_node_hour("p4d.24xlarge")
    assert price > 0
    hours_to_cap = 100 / (2 * price)
    below = obs(T0 + hours_to_cap * 3600 - 60, price_per_node_hour=price)
    assert evaluate(rules, below) is None
    d = evaluate(rules, obs(T0 + hours_to_cap * 3600 + 1, price_per_node_hour=price))
    assert d is not None and (d.outcome, d.rule) == ("stopped", "max_cost")
    assert "2 nodes" in d.reason and "$100.00" in d.reason


def test_playbook_price_overrides_the_table() -> None:
    rules = quiet(max_cost_usd=10, price_per_node_hour=10.0)
    d = evaluate(rules, obs(T0 + 1800, price_per_node_hour=1000.0))  # 2 nodes x $10/h x 0.5 h
    assert d is not None and d.rule == "max_cost"
    assert evaluate(rules, obs(T0 + 1700, price_per_node_hour=1000.0)) is None


def test_unknown_price_cannot_fire_and_is_warned_about() -> None:
    rules = quiet(max_cost_usd=1)
    assert evaluate(rules, obs(T0 + 10 * 86400, price_per_node_hour=0.0)) is None
    warnings = configuration_warnings(rules, pricing.price_per_node_hour("local"))
    assert len(warnings) == 1 and "cannot fire" in warnings[0]
    assert configuration_warnings(rules, 3.0) == []
    assert configuration_warnings(StopRules(), 0.0) == []


def test_price_table_lookup() -> None:
    assert pricing.price_per_node_hour("P5.48XLARGE") == pricing.PRICES["p5.48xlarge"]
    assert pricing.price_per_node_hour("no-such-type") == 0.0
    assert pricing.price_per_node_hour(None) == 0.0
    assert pricing.price_per_node_hour("no-such-type", override=2.5) == 2.5
    assert all(p > 0 for p in pricing.PRICES.values())


# ------------------------------------------------------------------ priorities and helpers


def test_failure_rules_beat_policy_limits() -> None:
    rules = StopRules(max_wall_time_s=1)
    nodes = (NodeObservation("node0", "exited", 2), NodeObservation("node1", "running"))
    d = evaluate(rules, obs(T0 + 10_000, nodes))
    assert d is not None and d.rule == "rank_failed"


def test_completion_beats_limits_reached_at_the_same_poll() -> None:
    nodes = (NodeObservation("node0", "exited", 0), NodeObservation("node1", "exited", 0))
    d = evaluate(StopRules(max_wall_time_s=1), obs(T0 + 10_000, nodes))
    assert d is not None and d.rule == "completed"


@pytest.mark.parametrize(
    ("teardown", "outcome", "expected"),
    [
        ("always", "failed", True),
        ("always", None, False),
        ("on_success", "succeeded", True),
        ("on_success", "failed", False),
        ("on_success", "stopped", False),
        ("never", "succeeded", False),
    ],
)
def test_should_teardown(teardown: str, outcome: str | None, expected: bool) -> None:
    assert should_teardown(teardown, outcome) is expected  # type: ignore[arg-type]


def test_node_exit_codes() -> None:
    nodes = (NodeObservation("node0", "exited", 0), NodeObservation("node1", "running"))
    assert node_exit_codes(nodes) == {"node0": 0, "node1": None}


def test_every_priced_machine_type_is_in_a_cloud_catalog() -> None:
    """One machine table: prices name only types the clouds' catalogs know (GPUs live there)."""
    from infra.clouds.aws_catalog import INSTANCE_TYPES
    from infra.clouds.gcp_catalog import GPU_MACHINE_TYPES

    unknown = sorted(set(pricing.PRICES) - set(INSTANCE_TYPES) - set(GPU_MACHINE_TYPES))
    assert not unknown, f"priced but not in any catalog: {unknown}"


def test_rule_names_match_the_rules_and_the_sets_name_only_rules() -> None:
    """RuleName lists exactly the rules evaluate() runs, so a set typed with it (the short stop
    grace, the recovery's loss rules) cannot name a rule that never fires."""
    from typing import get_args

    from launch.rules.recovery import FAILURE_RULES, LOSS_RULES, RANK_FAILED_RULES
    from launch.rules.stoprules import PEER_GONE_RULES, RULES, RuleName

    names = {name for name, _rule in RULES}
    assert set(get_args(RuleName)) == names
    for subset in (PEER_GONE_RULES, FAILURE_RULES, LOSS_RULES, RANK_FAILED_RULES):
        assert subset <= names
    assert {"unreachable", "vanished", "rank_failed"} == PEER_GONE_RULES
