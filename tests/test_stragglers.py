"""Stragglers: every rank's pace (metrics helper), the node agent's reading of it, the rule and
the live table's columns."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from pydantic import ValidationError

from launch.nodelib import fleetrun_metrics, fleetrun_node
from launch.reports.views import live_table, render_text
from launch.rules.gpu_health import GpuFacts, GpuHealth
from launch.rules.recovery import classify
from launch.rules.stoprules import NodeObservation, Observation, RuleState, StopRules, evaluate
from launch.rules.stragglers import NodePace, StragglerRule, pace_ratios, parse_pace


def test_every_rank_writes_its_pace_rate_limited(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEETRUN_RUN_DIR", str(tmp_path))
    metrics = fleetrun_metrics.Metrics(rank=3)  # not rank 0: no metrics file, but a pace
    assert metrics._pace is not None
    for step in range(5):
        metrics._pace.tick(step, now=100.0 + step)
    assert not (tmp_path / "pace" / "3.json").exists(), "nothing before PACE_WRITE_S"
    metrics._pace.last_write = 90.0
    metrics._pace.tick(10, now=105.0)
    record = json.loads((tmp_path / "pace" / "3.json").read_text())
    assert record["rank"] == 3 and record["step"] == 10 and record["steps_per_s"] == 2.0
    assert 0 < record["probe_ms"] < 1000
    assert not (tmp_path / "metrics.jsonl").exists()


def test_the_agent_reports_the_slowest_local_rank_and_skips_stale_or_garbage(tmp_path: Path) -> None:
    pace = tmp_path / "pace"
    pace.mkdir()
    now = time.time()
    (pace / "0.json").write_text(json.dumps({"time": now, "probe_ms": 1.5, "steps_per_s": 4.0}))
    (pace / "1.json").write_text(json.dumps({"time": now, "probe_ms": 6.0, "steps_per_s": 3.5}))
    (pace / "2.json").write_text(json.dumps({"time": now - 600, "probe_ms": 90.0}))
    (pace / "3.json").write_text("{not json")
    (pace / "4.json").write_text(json.dumps({"time": now, "probe_ms": "fast"}))
    assert fleetrun_node.pace_reading(str(tmp_path), now) == {"probe_ms": 6.0, "steps_per_s": 3.5, "ranks": 2}
    assert fleetrun_node.pace_reading(str(tmp_path / "none"), now) is None


def test_parse_pace_refuses_what_is_not_a_pace() -> None:
    assert parse_pace({"probe_ms": 2.0, "steps_per_s": None, "ranks": 2}) == NodePace(2.0, None, 2)
    for bad in ({"probe_ms": -1}, {"probe_ms": True}, {"probe_ms": 1, "steps_per_s": "x"}, [], None):
        assert parse_pace(bad) is None


def _poll(rules: StopRules, state: RuleState, now: float, slow: float) -> object:
    nodes = tuple(
        NodeObservation(f"n{i}", "running", pace=NodePace(slow if i == 2 else 1.0, 2.0)) for i in range(4)
    )
    return evaluate(rules, Observation(now=now, started_at=0.0, nodes=nodes), state)


@pytest.mark.parametrize("action", ["stop", "exclude"])
def test_the_rule_names_the_slow_node_after_the_window(action: str) -> None:
    rules = StopRules(straggler=StragglerRule(factor=1.3, window_s=10, action=action))  # type: ignore[arg-type]
    state = RuleState()
    assert _poll(rules, state, 0.0, 1.0) is None
    assert _poll(rules, state, 1.0, 2.5) is None  # slow from here on
    assert _poll(rules, state, 6.0, 2.5) is None
    assert _poll(rules, state, 8.0, 1.1) is None  # back under the factor for longer than
    assert _poll(rules, state, 13.5, 1.1) is None  # the dip allowance (window/2): starts over
    assert _poll(rules, state, 14.0, 2.5) is None
    assert _poll(rules, state, 23.0, 2.5) is None
    decision = _poll(rules, state, 24.0, 2.5)
    assert decision is not None and decision.rule == "straggler" and decision.nodes == ("n2",)  # type: ignore[attr-defined]
    assert "n2 2.5x the median node's probe time for 10 s" in decision.reason  # type: ignore[attr-defined]
    assert decision.outcome == ("failed" if action == "exclude" else "stopped")  # type: ignore[attr-defined]
    loss = classify(decision, {}, 5.0)  # type: ignore[arg-type]
    if action == "exclude":
        assert loss is not None and (loss.kind, loss.nodes) == ("straggler", ("n2",))


def test_a_short_dip_under_the_factor_does_not_restart_the_window() -> None:
    """Under a CPU quota the slow node's ratio swings from poll to poll: one lucky sample (a dip
    shorter than min(10 s, window/2)) keeps its window; it is flagged at a slow poll only."""
    rules = StopRules(straggler=StragglerRule(factor=1.3, window_s=20, action="stop"))
    state = RuleState()
    assert _poll(rules, state, 0.0, 4.0) is None  # slow from here on
    assert _poll(rules, state, 5.0, 1.2) is None  # a dip of 9 s < 10 s (20/2)
    assert _poll(rules, state, 14.0, 1.2) is None
    assert _poll(rules, state, 14.5, 4.0) is None
    assert _poll(rules, state, 20.0, 1.0) is None  # over the window, but fast at this poll
    decision = _poll(rules, state, 21.0, 4.0)
    assert decision is not None and decision.nodes == ("n2",)  # type: ignore[attr-defined]
    assert "for 21 s" in decision.reason  # type: ignore[attr-defined]


def test_warn_only_flags_in_the_live_table() -> None:
    rules = StopRules(straggler=StragglerRule(factor=1.3, window_s=5, action="warn"))
    state = RuleState()
    for now in (0.0, 3.0, 6.0):
        assert _poll(rules, state, now, 3.0) is None
    assert [n for n, _, _ in state.stragglers] == ["n2"]
    gpu = GpuHealth(
        smi=True,
        queried=True,
        gpus=(GpuFacts(0, "u", "b", mem_used_mib=40960, mem_total_mib=81920, temp_c=71, power_w=412.4),),
    )
    nodes = tuple(
        NodeObservation(
            f"n{i}", "running", gpu_util=87.0, pace=NodePace(3.0 if i == 2 else 1.0, 2.0), gpu_health=gpu
        )
        for i in range(4)
    )
    text = render_text(
        live_table(Observation(now=6.0, started_at=0.0, nodes=nodes), rule_state=state), width=140
    )
    assert "2.00 (3.0x)" in text and "87% 40/80G 71C 412W" in text
    assert "slowest/median pace 3.0x (n2)" in text


def test_ratios_need_two_nodes_and_the_config_is_checked() -> None:
    assert pace_ratios({"a": NodePace(1.0)}) == {}
    assert pace_ratios({"a": NodePace(1.0), "b": NodePace(3.0), "c": None}) == {"a": 0.5, "b": 1.5}
    with pytest.raises(ValidationError):
        StopRules.model_validate({"straggler": {"factor": 0.9}})
    with pytest.raises(ValidationError):
        StopRules.model_validate({"straggler": {"action": "shout"}})
