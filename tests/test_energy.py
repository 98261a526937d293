"""A run's GPU energy over all its attempts: summed once per attempt, carried over a re-attached
watcher, kept in the run records (old ones still readable) and shown by ``fab runs``/``fab show``.

The life cycle runs on the fake fleet (``tests/fakefleet.py``), whose nodes report one GPU each
drawing ``JobScript.gpu_power_w``; what the energy should be is computed here from when the nodes
answered with a reading, not from the meter under test."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from launch.reports.views import render_text, runs_table, show_run
from launch.rules.energy import RunEnergy, fmt_kwh, kwh_figure, resume_meter
from launch.rules.gpu_health import EnergyMeter, GpuFacts, GpuHealth
from launch.run.records import MIGRATIONS, SCHEMA_VERSION, RunRecords
from tests.fakefleet import FakeClock, JobScript, run_on_fake_fleet
from tests.test_run_lifecycle import LOST_AFTER, RECOVERY, lost_in_attempt_1, reattach, sshd  # noqa: F401

WATTS = 1000.0


def expected_kwh(times: Sequence[float], cut: float | None = None) -> float:
    """One node at ``WATTS`` read at ``times``: the time between consecutive readings, except
    across ``cut`` (a watcher that went away at ``cut`` and the one that followed)."""
    seconds = 0.0
    for before, after in zip(times, times[1:], strict=False):
        if cut is not None and before <= cut < after:
            continue
        seconds += after - before
    return seconds * WATTS / 3.6e6


# -- pure -----------------------------------------------------------------------------------------
def test_each_attempt_counts_once_and_unknown_is_not_zero() -> None:
    energy = RunEnergy.of([(1, 0.5), (2, None), (1, 0.75), (3, 0.25)])
    assert energy.by_attempt == {1: 0.75, 3: 0.25}, "a later figure of an attempt replaces it"
    assert energy.total_kwh == 1.0 and energy.attempts == 2
    assert RunEnergy.of([(1, None)]).total_kwh is None and RunEnergy().attempts == 0
    assert energy.with_attempt(3, None) == energy and energy.with_attempt(3, 1.0).total_kwh == 1.75
    assert RunEnergy.from_json(energy.to_json()) == energy


def test_stored_figures_are_untrusted() -> None:
    junk = {"1": 0.5, "x": 1.0, "0": 2.0, "2": "lots", "3": -1, "4": float("nan"), "5": True, "6": 1e12}
    assert RunEnergy.from_json(junk).by_attempt == {1: 0.5}
    assert RunEnergy.from_json(["1", 0.5]).total_kwh is None and RunEnergy.from_json(None).attempts == 0
    assert [kwh_figure(v) for v in (0.0, 3, "3", None, float("inf"), False)] == [
        0.0,
        3.0,
        None,
        None,
        None,
        None,
    ]


def test_the_wrap_up_takes_each_attempts_freshest_figure() -> None:
    from launch.rules.recovery import AttemptEnd
    from launch.run.wrapup import WatchFacts, run_energy

    def ended(attempt: int, kwh: float | None) -> AttemptEnd:
        return AttemptEnd(attempt, ("n0",), 0.0, 1.0, "failed", "unreachable", "", energy_kwh=kwh)

    heartbeats = RunEnergy({1: 0.1, 2: 0.2, 3: 0.05})  # 3: its watcher went away, never watched again
    energy = run_energy(heartbeats, [ended(1, 0.15), ended(2, 0.3)], WatchFacts(energy_kwh=0.35, attempt=2))
    assert energy.by_attempt == {1: 0.15, 2: 0.35, 3: 0.05}
    assert run_energy(RunEnergy(), [], WatchFacts()).total_kwh is None


def test_kwh_cells() -> None:
    assert [fmt_kwh(v) for v in (None, 0.0, 0.0004, 0.4123, 12.34, 12345.6)] == [
        "",
        "0",
        "<0.001",
        "0.412",
        "12.3",
        "12,346",
    ]


def test_a_resumed_meter_goes_on_from_the_figure_and_skips_the_gap() -> None:
    def at(watts: float) -> GpuHealth:
        return GpuHealth(smi=True, queried=True, gpus=(GpuFacts(0, "u0", "b0", power_w=watts),))

    meter = EnergyMeter()
    resume_meter(meter, 0.5)
    assert meter.kwh == 0.5, "the figure so far, before any reading of its own"
    meter.add("a", 100.0, at(3600.0))  # the first reading of this watcher: nothing to join it to
    assert meter.kwh == 0.5
    meter.add("a", 110.0, at(3600.0))  # 10 s at 3.6 kW: 0.01 kWh
    assert meter.kwh == pytest.approx(0.51)
    fresh = EnergyMeter()
    resume_meter(fresh, None)
    assert fresh.kwh is None, "no figure before: still unknown"


# -- the life cycle on the fake fleet ---------------------------------------------------------------
def test_one_attempt_energy_in_summary_record_and_runs_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = run_on_fake_fleet(tmp_path, monkeypatch, JobScript(steps=6, gpu_power_w=WATTS))
    expected = sum(expected_kwh(n.gpu_readings) for n in run.fleet.nodes.values())
    assert expected > 0
    assert run.summary.energy_kwh == pytest.approx(expected)
    summary = json.loads((run.folder / "summary.json").read_text())
    assert summary["energy_kwh"] == pytest.approx(expected) and summary["energy_attempts"] == 1
    assert summary["energy_kwh_by_attempt"] == {"1": pytest.approx(expected)}
    record = run.records.get(run.summary.run_id)
    assert record.energy_kwh == pytest.approx(expected) and list(record.energy_by_attempt) == ["1"]
    table = render_text(runs_table([record]), width=200)
    assert "kWh" in table and fmt_kwh(expected) in table
    assert f"{fmt_kwh(expected)} kWh" in render_text(show_run(record), width=200)


def test_without_gpu_readings_the_energy_is_blank_not_zero(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = run_on_fake_fleet(tmp_path, monkeypatch, JobScript(steps=3))
    summary = json.loads((run.folder / "summary.json").read_text())
    assert summary["energy_kwh"] is None and summary["energy_attempts"] == 0
    record = run.records.get(run.summary.run_id)
    assert record.energy_kwh is None
    lines = render_text(runs_table([record]), width=200).splitlines()
    header = next(line for line in lines if "kWh" in line)
    row = next(line for line in lines if "succeeded" in line)
    cell = row[header.index("kWh") - 1 : header.index("kWh") + 4]
    assert cell.strip() == "", f"an unknown energy is blank: {cell!r}"
    assert "- (no GPU power readings)" in render_text(show_run(record), width=200)


def test_recovered_run_sums_its_attempts(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    sshd: set[str],  # noqa: F811
) -> None:
    sshd.add("n1")
    job = lost_in_attempt_1(comes_back=True)
    job.gpu_power_w, job.steps = WATTS, 20  # attempt 2: steps 11 to 20
    run = run_on_fake_fleet(tmp_path, monkeypatch, job, recovery=RECOVERY, stop=LOST_AFTER)
    assert run.summary.outcome == "succeeded", run.summary.reason
    attempts = json.loads((run.folder / "attempts.json").read_text())["attempts"]
    figures = [a["energy_kwh"] for a in attempts]
    assert len(figures) == 2 and all(f and f > 0 for f in figures), figures
    assert run.summary.energy_kwh == pytest.approx(sum(figures))
    summary = json.loads((run.folder / "summary.json").read_text())
    assert summary["energy_attempts"] == 2
    record = run.records.get(run.summary.run_id)
    assert record.energy_kwh == pytest.approx(sum(figures))
    shown = render_text(show_run(record), width=250)
    assert "over 2 attempts" in shown
    assert all(fmt_kwh(f) in shown for f in figures), shown


def detach(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, job: JobScript, **kwargs: Any
) -> tuple[FakeClock, Any]:
    """A run whose watcher went away (Ctrl-C, 'keep the job running') 22 s in; its fake fleet."""
    fleets: list[Any] = []
    import tests.fakefleet as fakefleet

    real = fakefleet.FakeFleet

    def keep(*args: Any, **kw: Any) -> Any:
        fleets.append(real(*args, **kw))
        return fleets[-1]

    monkeypatch.setattr(fakefleet, "FakeFleet", keep)
    clock = FakeClock()
    clock.interrupt_at = clock.now + 22
    with pytest.raises(KeyboardInterrupt):
        run_on_fake_fleet(tmp_path, monkeypatch, job, clock=clock, ask_keep_running=lambda _r: True, **kwargs)
    return clock, fleets[0]


def test_a_reattached_watcher_neither_loses_nor_double_counts_the_attempt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock, fleet = detach(tmp_path, monkeypatch, JobScript(steps=12, gpu_power_w=WATTS))
    cut = clock.now - 1e-6  # the first watcher's last poll was before the interrupt
    with RunRecords(tmp_path / "runs.db") as records:
        before = records.get("fake-run-1")
    so_far = sum(expected_kwh([t for t in n.gpu_readings if t <= cut]) for n in fleet.nodes.values())
    assert before.energy_kwh == pytest.approx(so_far) and so_far > 0, "the heartbeat kept it"
    summary, records, _reporter = reattach(tmp_path, clock, fleet)
    assert summary.outcome == "succeeded", summary.reason
    whole = sum(expected_kwh(n.gpu_readings, cut) for n in fleet.nodes.values())
    assert whole > so_far
    # lost: only the new watcher's readings; double counted: the first part twice, or the gap
    assert summary.energy_kwh == pytest.approx(whole)
    assert summary.energy.attempts == 1
    assert records.get("fake-run-1").energy_kwh == pytest.approx(whole)


def test_a_reattached_watcher_through_a_recovery_keeps_every_attempt(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    sshd: set[str],  # noqa: F811
) -> None:
    sshd.add("n1")
    job = lost_in_attempt_1(comes_back=True)
    job.gpu_power_w, job.steps = WATTS, 20  # attempt 2: steps 11 to 20
    clock, fleet = detach(tmp_path, monkeypatch, job, recovery=RECOVERY, stop=LOST_AFTER)
    with RunRecords(tmp_path / "runs.db") as records:
        so_far = records.get("fake-run-1").energy_kwh
    assert so_far and so_far > 0
    summary, records, _reporter = reattach(tmp_path, clock, fleet)
    assert summary.outcome == "succeeded", summary.reason
    attempts = records.get("fake-run-1").attempts
    first, second = (a["energy_kwh"] for a in attempts)
    assert first > so_far, "attempt 1's figure goes on from what the first watcher measured"
    assert summary.energy_kwh == pytest.approx(first + second) and summary.energy.attempts == 2


# -- records ------------------------------------------------------------------------------------------
def test_a_database_from_before_energy_is_migrated_and_reads_blank(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    db = sqlite3.connect(path)
    for step in MIGRATIONS[:4]:
        db.executescript(step)
    db.executescript(
        "CREATE TABLE schema_version (version INTEGER NOT NULL); INSERT INTO schema_version VALUES (4);"
        "INSERT INTO runs (id, started_at, ended_at, state, cost_usd) VALUES ('old', 1.0, 61.0, 'succeeded', 0.5);"
    )
    db.commit()
    db.close()
    with RunRecords(path) as records:
        assert records.schema_version == SCHEMA_VERSION == 5  # 5: energy
        old = records.get("old")
        assert old is not None and old.energy_kwh is None and old.energy_by_attempt == {}
        table = render_text(runs_table([old]), width=200)
        assert "$0.50" in table and "kWh" in table
        records.update("old", energy_kwh=1.5, energy_by_attempt={"1": 1.5})
        assert records.get("old").energy_kwh == 1.5  # type: ignore[union-attr]
