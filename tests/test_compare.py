"""fab compare and fab runs' filters, --json and --tensorboard, on synthetic run folders and records."""

from __future__ import annotations

import json
import math
import os
import struct
from pathlib import Path
from typing import Any

import pytest

from launch.cli import experiments
from launch.errors import FleetrunError
from launch.reports.compare import (
    ComparedRun,
    compare_rows,
    compare_table,
    hyperparameter_columns,
    lower_is_better,
    metric_columns,
    parse_since,
    select_runs,
    summarize_metrics,
)
from launch.reports.compare_plot import plot_compare
from launch.reports.tensorboard import write_tensorboard
from launch.reports.views import render_text
from launch.run.records import SCHEMA_VERSION, RunRecords
from tests.conftest import quiet_console

T0 = 1_764_000_000.0
PNG = b"\x89PNG\r\n\x1a\n"


def metric_lines(lr: float, steps: int = 30, *, nan_at: int | None = None) -> list[dict[str, Any]]:
    lines: list[dict[str, Any]] = [{"event": "world", "time": T0, "world_size": 2}]
    for step in range(1, steps + 1):
        loss = float("nan") if nan_at is not None and step >= nan_at else 2.0 * math.exp(-lr * step)
        lines.append({"step": step, "time": T0 + step, "loss": loss, "acc": min(1.0, lr * step)})
    return lines


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fleetrun home with three recorded runs and their folders (metrics and TensorBoard files)."""
    monkeypatch.setenv("FLEETRUN_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("FLEETRUN_RUNS", raising=False)
    db = RunRecords(tmp_path / "home" / "runs.db")
    runs = [
        ("mlp-a", "mlp", {"lr": 0.1, "hidden": 16}, "succeeded", 0, metric_lines(0.1)),
        ("mlp-b", "mlp", {"lr": 0.01, "hidden": 16}, "failed", 3600, metric_lines(0.01, nan_at=20)),
        ("cnn-a", "cnn", {"lr": 0.1, "\x1b[31mevil": "[red]x"}, "succeeded", 7200, metric_lines(0.05)),
    ]
    for rid, book, hps, state, offset, lines in runs:
        folder = tmp_path / "runs" / rid
        folder.mkdir(parents=True)
        (folder / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
        write_tensorboard(lines, folder / "tensorboard", hyperparameters=hps)
        db.start(
            run_id=rid,
            playbook_name=book,
            playbook_path=f"/p/{book}-job.yaml",
            started_at=T0 + offset,
            run_dir=str(folder),
            hyperparameters=hps,
            watcher_pid=1,
            watcher_host="elsewhere",
        )
        db.finish(rid, state=state, ended_at=T0 + offset + 125, cost_usd=0.5)
    db.close()
    return tmp_path


# ------------------------------------------------------------------ pure parts


def test_records_keep_hyperparameters(tmp_path: Path) -> None:
    with RunRecords(tmp_path / "r.db") as db:
        db.start(run_id="r", hyperparameters={"lr": 0.1, "arch": "mlp"})
        db.start(run_id="s")
        assert db.get("r").hyperparameters == {"lr": 0.1, "arch": "mlp"}  # type: ignore[union-attr]
        assert db.get("s").hyperparameters == {}  # type: ignore[union-attr]
        assert db.schema_version == SCHEMA_VERSION == 5  # 4: overrides (--set), 5: energy


def test_a_database_from_before_hyperparameters_is_migrated(tmp_path: Path) -> None:
    import sqlite3

    from launch.run.records import MIGRATIONS

    db = sqlite3.connect(tmp_path / "old.db")
    db.executescript(MIGRATIONS[0])
    db.executescript(
        "CREATE TABLE schema_version (version INTEGER NOT NULL); INSERT INTO schema_version VALUES (1);"
        "INSERT INTO runs (id, started_at, state) VALUES ('old', 1.0, 'succeeded');"
    )
    db.commit()
    db.close()
    with RunRecords(tmp_path / "old.db") as records:
        old = records.get("old")
        assert old is not None and old.hyperparameters == {} and records.schema_version == SCHEMA_VERSION


def test_summarize_metrics_final_best_and_curve() -> None:
    metrics = summarize_metrics(metric_lines(0.01, nan_at=20))
    assert math.isnan(metrics.final["loss"]) and metrics.best["loss"] == pytest.approx(2.0 * math.exp(-0.19))
    assert metrics.best["acc"] == pytest.approx(0.3) and metrics.final["acc"] == pytest.approx(0.3)
    assert [s for s, _ in metrics.loss_curve] == list(range(1, 20)), "NaN points are not on the curve"
    assert (
        lower_is_better("val_loss") and lower_is_better("top1_error") and not lower_is_better("val_accuracy")
    )


def test_parse_since() -> None:
    assert parse_since("3d", now=T0) == T0 - 3 * 86400 and parse_since("12h", now=T0) == T0 - 12 * 3600
    assert parse_since("2025-11-24T16:00:00+00:00") == 1_764_000_000.0
    with pytest.raises(FleetrunError, match="--since 'yesterday'"):
        parse_since("yesterday")


def test_select_and_columns(home: Path) -> None:
    with RunRecords(home / "home" / "runs.db") as db:
        runs = db.list()
    assert [r.id for r in select_runs(runs, playbook="mlp")] == ["mlp-b", "mlp-a"]
    assert [r.id for r in select_runs(runs, playbook="cnn-job")] == ["cnn-a"]  # the file's name works too
    assert [r.id for r in select_runs(runs, outcome="failed")] == ["mlp-b"]
    assert [r.id for r in select_runs(runs, since=T0 + 1)] == ["cnn-a", "mlp-b"]
    compared = [
        ComparedRun(r, summarize_metrics(metric_lines(0.1))) for r in select_runs(runs, playbook="mlp")
    ]
    assert hyperparameter_columns(compared) == ["lr", "hidden"]  # the one that differs first
    assert metric_columns(compared) == ["loss", "acc"]
    rows = compare_rows(compared, now=T0)
    assert rows[0]["hyperparameters"] == {"lr": 0.01, "hidden": 16} and rows[0]["duration_s"] == 125.0


# ------------------------------------------------------------------ the commands


def test_compare_table_and_plot(home: Path) -> None:
    console, out = quiet_console()
    plot = home / "cmp.png"
    compared = experiments.compare(console, "mlp-a,mlp-b", plot=str(plot))
    assert [c.record.id for c in compared] == ["mlp-a", "mlp-b"]  # oldest first
    text = out.getvalue()
    row_a = next(line for line in text.splitlines() if "mlp-a" in line)
    row_b = next(line for line in text.splitlines() if "mlp-b" in line)
    assert "0.1" in row_a and "succeeded" in row_a and "2:05" in row_a and "$0.50" in row_a
    assert "nan / 1.654" in row_b and "failed" in row_b  # final loss NaN, best before it
    assert "same in every run: hidden=16" in text and "hidden " not in text.split("same in every run")[0]
    data = plot.read_bytes()
    assert data[:8] == PNG and struct.unpack(">II", data[16:24]) == (900, 500)


def test_compare_by_filter_and_json(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    console, _ = quiet_console()
    experiments.compare(console, "all", since="2025-11-24T16:30:00+00:00", plot="", as_json=True)
    rows = json.loads(capsys.readouterr().out)
    assert [r["id"] for r in rows] == ["mlp-b", "cnn-a"]
    assert rows[1]["best"]["acc"] == 1.0 and rows[1]["hyperparameters"]["lr"] == 0.1
    with pytest.raises(FleetrunError, match="name the runs to compare"):
        experiments.compare(console, "all")
    with pytest.raises(FleetrunError, match="no run matches"):
        experiments.compare(console, "all", playbook="nope")


def test_untrusted_names_are_printed_as_text(home: Path) -> None:
    console, out = quiet_console()
    experiments.compare(console, "cnn-a", plot="")
    text = out.getvalue()
    assert "\x1b" not in text and "?[31mevil" in text and "[red]x" in text


def test_runs_filters_and_json(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    console, out = quiet_console()
    shown = experiments.list_runs(console, playbook="mlp", outcome="succeeded")
    assert [r.id for r in shown] == ["mlp-a"] and "mlp-a" in out.getvalue() and "mlp-b" not in out.getvalue()
    experiments.list_runs(console, since="2025-11-24T17:30:00+00:00", as_json=True)
    (row,) = json.loads(capsys.readouterr().out)
    assert row["id"] == "cnn-a" and row["outcome"] == "succeeded" and row["cost_usd"] == 0.5
    assert row["started"] == "2025-11-24T18:00:00+00:00" and row["duration_s"] == 125.0
    with pytest.raises(FleetrunError, match="--outcome 'done'"):
        experiments.list_runs(console, outcome="done")


def test_runs_tensorboard_links_every_run(home: Path) -> None:
    console, out = quiet_console()
    # a job's own SummaryWriter output in a node's pulled folder is linked too
    own = home / "runs" / "mlp-a" / "nodes" / "n0" / "outputs" / "tb"
    write_tensorboard(metric_lines(0.3, steps=3), own)
    logdir = home / "tb"
    experiments.list_runs(console, tensorboard=str(logdir))
    assert "linked 4 event folder(s) of 3 run(s)" in out.getvalue()
    assert os.readlink(logdir / "mlp-a" / "tensorboard") == str(home / "runs" / "mlp-a" / "tensorboard")
    experiments.list_runs(console, tensorboard=str(logdir))  # again: links refreshed, not an error

    from tensorboard.backend.event_processing.event_multiplexer import EventMultiplexer

    mux = EventMultiplexer()
    mux.AddRunsFromDirectory(str(logdir))
    mux.Reload()
    assert sorted(mux.Runs()) == [
        "cnn-a/tensorboard",
        "mlp-a/nodes/n0/outputs/tb",
        "mlp-a/tensorboard",
        "mlp-b/tensorboard",
    ]
    assert [e.step for e in mux.Scalars("mlp-b/tensorboard", "loss")] == list(range(1, 31))
    assert "_hparams_/session_start_info" in mux.PluginRunToTagToContent("hparams")["mlp-a/tensorboard"]


def test_show_lists_the_hyperparameters(home: Path) -> None:
    from launch.reports.views import show_run

    with RunRecords(home / "home" / "runs.db") as db:
        run = db.get("mlp-b")
    assert run is not None
    assert "hyperparameters  hidden=16, lr=0.01" in render_text(show_run(run), width=200)


def test_plot_labels_are_text(tmp_path: Path, home: Path) -> None:
    """A hyperparameter value is never read as matplotlib mathtext (a bad formula fails savefig)."""
    from dataclasses import replace

    with RunRecords(home / "home" / "runs.db") as db:
        run = db.get("mlp-a")
    assert run is not None
    runs = [
        ComparedRun(replace(run, hyperparameters={"tag": "$\\frac{"}), summarize_metrics(metric_lines(0.1))),
        ComparedRun(
            replace(run, id="other", hyperparameters={"tag": "$x^$"}), summarize_metrics(metric_lines(0.2))
        ),
    ]
    assert plot_compare(runs, tmp_path / "m.png").read_bytes()[:8] == PNG


def test_plot_without_losses(tmp_path: Path, home: Path) -> None:
    with RunRecords(home / "home" / "runs.db") as db:
        run = db.get("mlp-a")
    assert run is not None
    empty = ComparedRun(run, summarize_metrics([]))
    assert plot_compare([empty], tmp_path / "e.png").read_bytes()[:8] == PNG
    assert "mlp-a" in render_text(compare_table([empty]), width=200)


def test_shared_hyperparameters_in_the_caption_are_text(home: Path) -> None:
    """The caption lists what every run shares; a name or value like ``[/bold]`` is printed as
    written, never parsed as Rich markup (a closing tag with no opening one raises MarkupError)."""
    from dataclasses import replace

    with RunRecords(home / "home" / "runs.db") as db:
        run = db.get("mlp-a")
    assert run is not None
    shared = {"[/bold]": "[red]v", "lr": 0.1}
    runs = [
        ComparedRun(replace(run, hyperparameters=shared), summarize_metrics(metric_lines(0.1))),
        ComparedRun(replace(run, id="other", hyperparameters=shared), summarize_metrics(metric_lines(0.2))),
    ]
    text = render_text(compare_table(runs), width=200)
    assert "same in every run: [/bold]=[red]v, lr=0.1" in text
