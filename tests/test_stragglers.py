"""Stragglers: every rank's pace (metrics helper), the node agent's reading of it, the rule and
the live table's columns."""

from __future__ import annotations

import json
import math
import os
import random
import time
from pathlib import Path

import pytest
from pydantic import ValidationError

from launch.nodelib import fleetrun_metrics, fleetrun_node
from launch.reports.views import live_table, render_text
from launch.rules import stragglers
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


def test_the_agent_reports_the_slowest_local_rank_its_age_and_skips_earlier_launches(tmp_path: Path) -> None:
    """A rank that stopped writing keeps its last report, with its age (the watcher counts the
    node as stalled); a report from before this launch (``pid``'s time) or garbage is skipped."""
    pace = tmp_path / "pace"
    pace.mkdir()
    now = time.time()
    (tmp_path / "pid").write_text("4242")
    os.utime(tmp_path / "pid", (now - 300, now - 300))
    (pace / "0.json").write_text(json.dumps({"time": now, "probe_ms": 1.5, "steps_per_s": 4.0}))
    (pace / "1.json").write_text(json.dumps({"time": now - 40, "probe_ms": 6.0, "steps_per_s": 3.5}))
    (pace / "2.json").write_text(json.dumps({"time": now - 600, "probe_ms": 90.0}))  # an earlier launch
    (pace / "3.json").write_text("{not json")
    (pace / "4.json").write_text(json.dumps({"time": now, "probe_ms": "fast"}))
    (pace / "5.json").write_text(json.dumps({"time": True, "probe_ms": 1.0}))
    assert fleetrun_node.pace_reading(str(tmp_path), now) == {
        "probe_ms": 6.0,
        "steps_per_s": 3.5,
        "ranks": 2,
        "age_s": 40.0,
    }
    assert fleetrun_node.pace_reading(str(tmp_path / "none"), now) is None
    reading = fleetrun_node.pace_reading(str(tmp_path), now)
    assert parse_pace(reading) == NodePace(6.0, 3.5, 2, 40.0)
    # the folder is the job's: a FIFO where a report should be is skipped, never waited on (a
    # plain open() would block the agent's answer until a writer came; this test would hang)
    os.mkfifo(pace / "6.json")
    assert fleetrun_node.pace_reading(str(tmp_path), now) == reading


def test_parse_pace_refuses_what_is_not_a_pace() -> None:
    assert parse_pace({"probe_ms": 2.0, "steps_per_s": None, "ranks": 2}) == NodePace(2.0, None, 2)
    bad_ages = (
        {"probe_ms": 1, "age_s": -1},
        {"probe_ms": 1, "age_s": math.nan},
        {"probe_ms": 1, "age_s": 1e9},
    )
    for bad in (
        {"probe_ms": -1},
        {"probe_ms": True},
        {"probe_ms": 1, "steps_per_s": "x"},
        [],
        None,
        *bad_ages,
    ):
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
    """Under a CPU quota the slow node's ratio swings from poll to poll: a dip shorter than
    min(10 s, window/2) keeps its window, and the flag comes at the window's end, at a fast poll
    too (the median of the window's readings decides, not the last one)."""
    rules = StopRules(straggler=StragglerRule(factor=1.3, window_s=20, action="stop"))
    state = RuleState()
    assert _poll(rules, state, 0.0, 4.0) is None  # slow from here on
    assert _poll(rules, state, 5.0, 1.2) is None  # a dip of 6 s < 10 s (20/2)
    assert _poll(rules, state, 11.0, 4.0) is None
    assert state.pace.slow_since == {"n2": 0.0}
    decision = _poll(rules, state, 20.0, 1.0)  # over the window, fast at this poll
    assert decision is not None and decision.nodes == ("n2",)  # type: ignore[attr-defined]
    assert "n2 4.0x the median node's probe time for 20 s" in decision.reason  # type: ignore[attr-defined]


def _timeline(
    rules: StopRules, slow: dict[int, list[float]], until: float, noise: float = 0.15, scale: float = 1.0
) -> tuple[float | None, RuleState]:
    """Polls once a second on a scripted clock, 4 nodes; ``slow[i]``: node i's ratio from t=0 on,
    a new report every 2 s (``PACE_WRITE_S``), the first one 2 s in. Every node's probe time
    has noise (seeded). Returns the time of the first flag and the rule state."""
    rng = random.Random(20)
    reports: dict[int, float] = {}
    state, flagged = RuleState(), None
    for tick in range(int(until)):
        now = float(tick)
        if tick % 2 == 0:  # every rank writes a new report
            for i in range(4):
                trace = slow.get(i)
                ratio = trace[(tick // 2 - 1) % len(trace)] if trace and tick >= 2 else 1.0
                reports[i] = scale * ratio * rng.uniform(1 - noise, 1 + noise)
        nodes = tuple(
            NodeObservation(f"n{i}", "running", pace=NodePace(reports[i], 2.0, 1, float(tick % 2)))
            for i in range(4)
        )
        evaluate(rules, Observation(now=now, started_at=0.0, nodes=nodes), state)
        if state.stragglers and flagged is None:
            flagged = now
    return flagged, state


SWINGS = [4.15, 1.5, 58.0, 2.14, 1.1, 100.0, 2.3, 1.77, 2.95, 1.6]
"""A throttled node's ratio, report after report (bench/results/gpu_health.json's straggler
rows: between 1.1x and 106x, a third of them under the factor 2)."""


@pytest.mark.parametrize("window", [8.0, 20.0, 60.0])
def test_a_throttled_node_is_flagged_within_the_window_plus_5_s_whatever_its_swings(window: float) -> None:
    rules = StopRules(straggler=StragglerRule(factor=2.0, window_s=window, action="warn"))
    flagged, state = _timeline(rules, {2: SWINGS}, window + 30)
    assert flagged is not None and window <= flagged <= window + 5, flagged
    assert [n for n, _, _ in state.stragglers] == ["n2"]
    assert state.pace.slow_since == {"n2": 2.0}, "the swings never restarted the window"


def test_a_fleet_slow_as_a_whole_or_noisy_is_not_flagged() -> None:
    """Every node equally slow (load, a slow step): ratios near 1, whatever the noise; one
    node's lucky or unlucky report (a lone 100x spike, a run of 1.6x) is no straggler either."""
    rules = StopRules(straggler=StragglerRule(factor=2.0, window_s=20, action="stop"))
    for scale in (1.0, 8.0, 300.0):
        flagged, _ = _timeline(rules, {}, 300, noise=0.4, scale=scale)
        assert flagged is None, scale
    spike = [1.0] * 20 + [100.0] + [1.0] * 20
    flagged, state = _timeline(rules, {1: spike, 3: [1.6, 1.9, 1.2]}, 300)
    assert flagged is None and state.stragglers == []


def _stall_poll(rules: StopRules, state: RuleState, now: float, ages: list[float | None]) -> object:
    nodes = tuple(
        NodeObservation(f"n{i}", "running", pace=None if age is None else NodePace(1.0, 2.0, 1, age))
        for i, age in enumerate(ages)
    )
    return evaluate(rules, Observation(now=now, started_at=0.0, nodes=nodes), state)


def test_a_stalled_node_counts_as_slow_and_a_fleet_waiting_as_a_whole_does_not() -> None:
    """A node whose ranks stopped reporting (its last report ages) while the
    others go on counts as slow, not as missing; when most nodes are silent (a checkpoint, a
    collective everyone waits in) nobody is singled out."""
    rules = StopRules(straggler=StragglerRule(factor=2.0, window_s=20, action="stop"))
    state = RuleState()
    decision = None
    for t in range(60):  # n3 stops at t=0: its report ages, the others' stay fresh
        decision = _stall_poll(rules, state, float(t), [t % 2, t % 2, t % 2, float(t)])
        if decision is not None:
            break
    assert decision is not None and decision.nodes == ("n3",)  # type: ignore[attr-defined]
    assert "n3 without a pace report" in decision.reason  # type: ignore[attr-defined]
    assert t == stragglers.STALE_MIN_S + 20
    assert pace_ratios({"a": NodePace(1.0), "b": NodePace(3.0), "c": NodePace(1.0, age_s=60.0)}) == {
        "a": 1 / 3,
        "b": 3.0,
        "c": math.inf,
    }
    # a node with no report yet in this launch (slow to import torch, or its ranks log nothing)
    # is unknown: left out, never flagged, however long it stays so
    assert pace_ratios({"a": NodePace(1.0), "b": NodePace(3.0), "c": None}) == {"a": 1 / 3, "b": 3.0}
    state = RuleState()
    for t in range(120):
        assert _stall_poll(rules, state, float(t), [t % 2, t % 2, t % 2, None]) is None
    assert state.stragglers == []
    state = RuleState()
    for t in range(120):  # the whole job waits: every report ages alike, or half the nodes are silent
        assert _stall_poll(rules, state, float(t), [float(t)] * 3 + [t % 2]) is None
        assert _stall_poll(rules, state, float(t), [None, None, 1.0, 1.0]) is None
    assert state.stragglers == []


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
    assert pace_ratios({"a": NodePace(1.0), "b": NodePace(3.0), "c": None, "d": None}) == {
        "a": 1 / 3,
        "b": 3.0,
    }
    # each node against the others: one slow node of three is 3x, not diluted by its own figure
    assert pace_ratios({"a": NodePace(1.0), "b": NodePace(1.0), "c": NodePace(3.0)}) == {
        "a": 0.5,
        "b": 0.5,
        "c": 3.0,
    }
    with pytest.raises(ValidationError):
        StopRules.model_validate({"straggler": {"factor": 0.9}})
    with pytest.raises(ValidationError):
        StopRules.model_validate({"straggler": {"action": "shout"}})


def test_the_live_table_shows_a_stalled_node() -> None:
    nodes = tuple(
        NodeObservation(f"n{i}", "running", pace=NodePace(1.0, 2.0, 1, 30.0 if i == 3 else 1.0))
        for i in range(4)
    )
    text = render_text(live_table(Observation(now=6.0, started_at=0.0, nodes=nodes)), width=140)
    assert "stalled" in text and "no pace report from n3 (its ranks stopped stepping)" in text


def test_a_slow_node_of_two_is_flagged_at_factor_2() -> None:
    """On two nodes the median of all includes the slow node itself (``a / ((a + b) / 2)`` stays
    under 2 whatever ``a``): each node is measured against the other, so a node 2.5x slower than
    its partner is flagged at factor 2, and the fast one never is."""
    rules = StopRules(straggler=StragglerRule(factor=2.0, window_s=10, action="stop"))
    state = RuleState()
    decision = None
    for t in range(40):
        nodes = (
            NodeObservation("n0", "running", pace=NodePace(1.0, 2.0, 1, 0.5)),
            NodeObservation("n1", "running", pace=NodePace(2.5, 2.0, 1, 0.5)),
        )
        decision = evaluate(rules, Observation(now=float(t), started_at=0.0, nodes=nodes), state)
        if decision is not None:
            break
    assert decision is not None and decision.nodes == ("n1",)  # type: ignore[attr-defined]
