"""The unreachable clock: it runs from the last good answer, and a failing poll never delays the
verdict past the limit (``launch.rules.contact.poll_budget`` with the ``unreachable`` rule).
Pure, on injected clock readings; plus the wrap-up on a fake fleet leaving a lost node out."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from launch.errors import HostError
from launch.rules.contact import DUE_MARGIN_S, MIN_POLL_BUDGET_S, poll_budget
from launch.rules.stoprules import NodeObservation, Observation, RuleState, StopRules, evaluate
from launch.run.lost_nodes import PROBE_S
from launch.transport.ssh import CommandResult
from tests.fakefleet import FakeClock, FakeConnection, JobScript, NodeScript, run_on_fake_fleet


def test_no_limit_keeps_the_longest_poll() -> None:
    assert poll_budget(None, [100.0], now=101.0, longest_s=20.0) == 20.0


def test_poll_ends_when_the_earliest_silent_node_is_due() -> None:
    # last answers at 100 and 103, limit 10, poll starts at 101: the round may wait until 110.25
    budget = poll_budget(10.0, [100.0, 103.0], now=101.0, longest_s=20.0)
    assert budget == pytest.approx(9.0 + DUE_MARGIN_S)


def test_never_reached_or_overdue_nodes_do_not_cut_below_the_minimum() -> None:
    assert poll_budget(10.0, [None], now=101.0, longest_s=20.0) == 20.0
    assert poll_budget(10.0, [50.0], now=101.0, longest_s=20.0) == MIN_POLL_BUDGET_S


def verdict(last_contact: float, now: float, limit: float) -> str | None:
    rules = StopRules(unreachable_timeout_s=limit)
    obs = Observation(
        now=now,
        started_at=0.0,
        nodes=(
            NodeObservation("a", "running", last_reachable_at=now),
            NodeObservation("b", "unreachable", last_reachable_at=last_contact),
        ),
    )
    decision = evaluate(rules, obs, RuleState())
    return decision.rule if decision else None


def test_a_failed_poll_of_any_length_does_not_delay_the_verdict() -> None:
    """The node's link goes down just after its answer at t=100; the next poll starts at 101. The
    poll gives up at the budget, and the observation made then already carries the verdict:
    at most the limit + the margin after the last contact, whatever the answer timeout."""
    limit = 10.0
    for longest in (15.0, 20.0, 60.0):
        ends = 101.0 + poll_budget(limit, [100.0], now=101.0, longest_s=longest)
        assert ends <= 100.0 + limit + DUE_MARGIN_S
        assert verdict(100.0, ends, limit) == "unreachable"


def test_clock_starts_at_the_last_answer_not_at_the_failed_poll() -> None:
    # the failing poll began at 104 (its own deadline would end at 119): the verdict is due at 110
    assert verdict(100.0, 109.9, 10.0) is None
    assert verdict(100.0, 110.0, 10.0) == "unreachable"


def test_wrap_up_leaves_a_hung_node_out_after_one_short_probe(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A node hung since step 2: after the verdict the wrap-up spends one probe on it, not a stop,
    a pull and their timeouts; its pull still counts as failed, so the teardown is blocked."""
    clock = FakeClock()
    job = JobScript(steps=50, nodes={"n1": NodeScript(hang_from_step=2)})
    run = run_on_fake_fleet(
        tmp_path, monkeypatch, job, clock=clock, teardown="always", stop={"unreachable_timeout_s": 30}
    )
    s = run.summary
    assert (s.outcome, s.rule) == ("failed", "unreachable")
    assert "n1" in s.stop_errors and "n1" in s.pull_errors
    assert s.teardown.state.name == "BLOCKED"
    hung = run.fleet.nodes["n1"]
    assert not any(" stop " in c for c in hung.commands), hung.commands[-5:]
    assert "n1" not in run.fleet.pulled
    assert clock.now - s.decided_at <= PROBE_S + 1.0  # fake clock: only the probe was charged


def test_survivors_of_a_lost_node_get_the_short_grace_a_normal_stop_the_long_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A survivor waits in a collective for its lost peer and never reaches a next step to save
    at: its stop gets PEER_GONE_GRACE_S, not the 10 s a rank may use to checkpoint."""
    from launch.run.wrapup import PEER_GONE_GRACE_S, STOP_GRACE_S

    (tmp_path / "lost").mkdir()
    (tmp_path / "ok").mkdir()
    job = JobScript(steps=50, nodes={"n1": NodeScript(hang_from_step=2)})
    lost = run_on_fake_fleet(
        tmp_path / "lost", monkeypatch, job, clock=FakeClock(), stop={"unreachable_timeout_s": 30}
    )
    stops = [c for c in lost.fleet.nodes["n0"].commands if " stop " in c]
    assert stops and all(c.rstrip().endswith(f" {PEER_GONE_GRACE_S}") for c in stops), stops

    ok = run_on_fake_fleet(tmp_path / "ok", monkeypatch, JobScript(steps=5), clock=FakeClock())
    stops = [c for c in ok.fleet.nodes["n0"].commands if " stop " in c]
    assert stops and all(c.rstrip().endswith(f" {STOP_GRACE_S}") for c in stops), stops


def test_the_lost_node_is_probed_while_the_survivors_are_stopped_and_pulled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The probe of the lost node runs beside the survivors' stop and pull, not before them: the
    probe here only returns once the survivor's stop has been issued (it would wait in vain if
    the wrap-up probed first). The lost node still counts as not stopped and not pulled."""
    survivor_stopped = threading.Event()
    overlapped: list[bool] = []
    real_run = FakeConnection.run

    def run(self: FakeConnection, command: str, timeout: float | None = None) -> CommandResult:
        if command == "true" and self.host.name == "n1":
            overlapped.append(survivor_stopped.wait(30))
            raise HostError("n1", "no answer (fake link down)")
        result = real_run(self, command, timeout)
        if " stop " in command and self.host.name == "n0":
            survivor_stopped.set()
        return result

    monkeypatch.setattr(FakeConnection, "run", run)
    job = JobScript(steps=50, nodes={"n1": NodeScript(unreachable_from_step=2)})
    done = run_on_fake_fleet(
        tmp_path, monkeypatch, job, clock=FakeClock(), teardown="always", stop={"unreachable_timeout_s": 30}
    )
    s = done.summary
    assert (s.outcome, s.rule) == ("failed", "unreachable")
    assert overlapped == [True]
    assert "n1" in s.stop_errors and "n1" in s.pull_errors and "probe failed" in s.pull_errors["n1"]
    assert done.fleet.pulled == ["n0"] and "n0" not in s.pull_errors
    assert s.teardown.state.name == "BLOCKED"
    assert {
        "wrapup stopping the run",
        "wrapup pulling artifacts",
        "wrapup probing the nodes the watcher lost",
    } <= set(s.timings)


def test_a_lost_node_that_answers_the_probe_is_stopped_and_pulled_like_the_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The watcher lost n1 (its polls failed for the whole limit) but the cut healed by the
    wrap-up: the probe gets an answer, so n1's run is stopped and its directory pulled, and
    with every pull safe the teardown goes ahead."""

    def ask(self: FakeConnection, command: str, request: str, timeout: float) -> str:
        if self.host.name == "n1" and self.node.fleet.step >= 2:
            raise HostError("n1", "no answer (fake link down)")
        return real_ask(self, command, request, timeout)

    real_ask = FakeConnection.ask
    monkeypatch.setattr(FakeConnection, "ask", ask)
    job = JobScript(steps=50)
    done = run_on_fake_fleet(
        tmp_path, monkeypatch, job, clock=FakeClock(), teardown="always", stop={"unreachable_timeout_s": 30}
    )
    s = done.summary
    assert (s.outcome, s.rule) == ("failed", "unreachable")
    assert not s.stop_errors and not s.pull_errors
    healed = done.fleet.nodes["n1"].commands
    assert "true" in healed and any(" stop " in c for c in healed[healed.index("true") :])
    assert sorted(done.fleet.pulled) == ["n0", "n1"]
    assert s.teardown.state.name != "BLOCKED"


def test_a_crashed_probe_leaves_no_node_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A bug in the probe must not make the wrap-up skip a node: every suspect is then stopped and
    pulled with its full timeouts (here it is really gone, so its stop and pull fail), the crash
    is saved to traceback.txt, and the run is still recorded with its outcome."""
    import launch.run.lost_nodes

    def broken(*_a: object, **_k: object) -> dict[str, str]:
        raise RuntimeError("probe bug")

    monkeypatch.setattr(launch.run.lost_nodes, "confirm_lost", broken)
    job = JobScript(steps=50, nodes={"n1": NodeScript(unreachable_from_step=2)})
    done = run_on_fake_fleet(
        tmp_path, monkeypatch, job, clock=FakeClock(), teardown="always", stop={"unreachable_timeout_s": 30}
    )
    s = done.summary
    assert (s.outcome, s.rule) == ("failed", "unreachable")
    assert any(" stop " in c for c in done.fleet.nodes["n1"].commands)
    assert "n1" in s.stop_errors and "n1" in s.pull_errors and s.teardown.state.name == "BLOCKED"
    assert "probe bug" in (done.folder / "traceback.txt").read_text()
    assert done.records.get("fake-run-1").state == "failed"


def test_the_reports_are_drawn_while_the_fleet_is_torn_down(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The loss plot is drawn from the pulled files while the teardown runs (not after it): the
    teardown here only returns once the plot has started. Both still finish before the record."""
    import launch.run.wrapup as wrapup
    from launch.fleets.kinds.base import TeardownOutcome, TeardownState

    drawing = threading.Event()
    overlapped: list[bool] = []
    real_write = wrapup.write_reports

    def write_reports(*args: object, **kwargs: object) -> None:
        drawing.set()
        real_write(*args, **kwargs)  # type: ignore[arg-type]

    def tear_down(*_a: object, **_k: object) -> TeardownOutcome:
        overlapped.append(drawing.wait(30))
        return TeardownOutcome(TeardownState.DONE, "fake fleet removed")

    monkeypatch.setattr(wrapup, "write_reports", write_reports)
    monkeypatch.setattr(wrapup, "tear_down", tear_down)
    done = run_on_fake_fleet(tmp_path, monkeypatch, JobScript(steps=5), clock=FakeClock(), teardown="always")
    assert overlapped == [True]
    assert done.summary.teardown.state is TeardownState.DONE
    assert (done.folder / "loss.png").exists() and not (done.folder / "traceback.txt").exists()


def test_the_report_imports_warmed_during_the_stop_are_the_ones_the_reports_use() -> None:
    """``warm_up_reports`` imports what ``write_reports`` needs, so the plot does not pay for it
    after the stop: every name in ``REPORT_MODULES`` exists and is loaded once the warm-up ends."""
    import sys

    from launch.run.wrapup import REPORT_MODULES, warm_up_reports

    warm_up_reports().join(120)
    assert all(name in sys.modules for name in REPORT_MODULES)
