"""Progress and ETA: the metrics helper logs ``progress`` when the job states its total steps
(``Metrics(total_steps=N)`` or the playbook's ``total_steps:``, exported as FLEETRUN_TOTAL_STEPS);
the live table and ``fab runs`` show it as a percentage with an ETA."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from rich.console import Console

from launch.nodelib.fleetrun_metrics import Metrics
from launch.reports.views import eta_s, fmt_progress, live_progress, live_table, progress_of, runs_table
from launch.rules.metrics_stream import MetricsStream
from launch.rules.stoprules import NodeObservation, Observation
from launch.run.records import RunRecords


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_the_helper_logs_progress_against_its_total(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FLEETRUN_TOTAL_STEPS", raising=False)
    m = Metrics(run_dir=str(tmp_path / "a"), rank=0, total_steps=40)
    m.log(step=10, loss=1.0)
    m.log(step=50, loss=0.5)
    assert [r["progress"] for r in _lines(tmp_path / "a" / "metrics.jsonl")] == [0.25, 1.0]
    monkeypatch.setenv("FLEETRUN_TOTAL_STEPS", "200")
    m = Metrics(run_dir=str(tmp_path / "b"), rank=0)
    m.log(step=50, loss=1.0)
    assert _lines(tmp_path / "b" / "metrics.jsonl")[0]["progress"] == 0.25, "the playbook's total_steps"
    for bad in ("", "zero", "-5", "0"):
        monkeypatch.setenv("FLEETRUN_TOTAL_STEPS", bad)
        m = Metrics(run_dir=str(tmp_path / f"c{bad}"), rank=0)
        m.log(step=5, loss=1.0)
        assert "progress" not in _lines(tmp_path / f"c{bad}" / "metrics.jsonl")[0]


def test_progress_and_eta_text() -> None:
    assert progress_of({"progress": 0.5}) == 0.5 and progress_of({}) is None
    assert progress_of({"progress": float("nan")}) is None and progress_of({"progress": 7}) == 1.0
    assert eta_s(0.25, 100.0) == 300.0 and eta_s(0.0, 100.0) is None and eta_s(None, 1.0) is None
    assert fmt_progress(0.25, 300.0) == "25% ETA 5:00" and fmt_progress(1.0, 0.0) == "100%"
    assert fmt_progress(None) == "-"
    # step 100 is a quarter: 300 steps left at 2 steps/s
    assert live_progress({"progress": 0.25}, 100, 2.0) == "25% ETA 2:30"
    assert live_progress({"progress": 0.25}, 100, None) == "25%"


def test_the_live_table_shows_progress_from_the_stream() -> None:
    stream = MetricsStream()
    now = time.time()
    lines = [{"step": s, "time": now - 10 + s, "loss": 1.0, "progress": s / 100} for s in range(1, 11)]
    stream.feed(("\n".join(json.dumps(x) for x in lines) + "\n").encode())
    obs = Observation(
        now=now,
        started_at=now - 20,
        nodes=(NodeObservation(node="n0", state="running"),),
        metrics=stream.summary(),
    )
    console = Console(width=200, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    console.print(live_table(obs))
    text = console.export_text()
    assert "progress" in text and "10% ETA 1:30" in text, text


def test_fab_runs_shows_progress_and_an_eta_for_a_running_run(tmp_path: Path) -> None:
    now = time.time()
    with RunRecords(tmp_path / "r.db") as db:
        db.start(run_id="running", started_at=now - 100)
        db.heartbeat("running", now, last_metrics={"loss": 1.0, "progress": 0.25})
        db.start(run_id="done", started_at=now - 50)
        db.finish("done", state="succeeded", ended_at=now, last_metrics={"progress": 1.0})
        db.start(run_id="plain", started_at=now - 50)
        records = db.list()
    console = Console(width=250, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    console.print(runs_table(records, now=now))
    text = console.export_text().splitlines()
    lines = [line for line in text if line.startswith("│ ")]
    header = next(line for line in text if line.startswith("┃"))
    id_column = [c.strip() for c in header.split("┃")].index("id")
    rows = {[c.strip() for c in line.split("│")][id_column]: line for line in lines}
    assert "25% ETA 5:00" in rows["running"], rows
    assert "100%" in rows["done"] and "ETA" not in rows["done"]
    assert "%" not in rows["plain"]
