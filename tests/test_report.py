"""Report: loss PNG and rich views (TensorBoard files: tests/test_tensorboard.py)."""

from __future__ import annotations

import io
import json
import math
import struct
from pathlib import Path
from typing import Any

import pytest

from launch.reports.plot import plot_loss
from launch.reports.views import live_table, render_text, runs_table, show_run, summary_panel
from launch.rules.metrics_stream import LossPoint, MetricsStream
from launch.rules.stoprules import NodeObservation, Observation, StopDecision
from launch.run.records import RunRecords
from tests.conftest import sample_inventory

T0 = 1_764_000_000.0
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


RECORDS: list[dict[str, Any]] = [
    {"event": "world", "time": T0, "world_size": 2, "ranks": []},
    {"step": 1, "time": T0 + 1, "elapsed": 1.0, "loss": 2.0, "lr": 0.1},
    {"step": 2, "time": T0 + 2, "elapsed": 2.0, "loss": 1.5, "lr": 0.1, "note": "text is skipped"},
    {"step": 3, "time": T0 + 3, "elapsed": 3.0, "loss": float("nan")},
]


# ------------------------------------------------------------------ loss plot


def test_plot_loss_writes_a_png(tmp_path: Path) -> None:
    history = [LossPoint(i, 1.0 / (i + 1), None) for i in range(100)] + [LossPoint(100, math.nan, None)]
    out = plot_loss(history, tmp_path / "run" / "loss.png", title="ddp")
    data = out.read_bytes()
    assert data[:8] == PNG_MAGIC
    width, height = struct.unpack(">II", data[16:24])
    assert (width, height) == (800, 450)
    assert not (tmp_path / "run" / "loss.png.tmp").exists()


def test_plot_loss_without_points(tmp_path: Path) -> None:
    assert plot_loss([], tmp_path / "empty.png").read_bytes()[:8] == PNG_MAGIC


# ------------------------------------------------------------------ rich views


def _observation() -> Observation:
    stream = MetricsStream()
    lines = "".join(json.dumps(r) + "\n" for r in RECORDS[:3]) + "not json\n"
    stream.feed(lines.encode())
    nodes = (
        NodeObservation("node0", "running", gpu_util=97.0),
        NodeObservation("node1", "exited", 137),
        NodeObservation("node2", "unreachable", last_reachable_at=T0 + 3600 - 90),
    )
    return Observation(
        now=T0 + 3600, started_at=T0, nodes=nodes, metrics=stream.summary(), price_per_node_hour=10.0
    )


def test_live_table_shows_nodes_metrics_and_cost() -> None:
    text = render_text(live_table(_observation(), title="run r1"), width=120)
    assert "run r1" in text
    assert "node0" in text and "97%" in text and "running" in text
    assert "exited 137" in text
    assert "unreachable 1:30" in text
    run_row = next(line for line in text.splitlines() if "watching" in line)
    assert "2" in run_row and "1.5" in run_row  # last step and loss
    assert "1.00" in run_row  # steps/s: steps 1 -> 2 in 1 s
    assert "$30.00" in run_row  # 3 nodes x $10/h x 1 h
    assert text.count("$10.00") == 3  # per-node cost
    assert "1 unreadable metrics line(s) skipped" in text


def test_live_table_without_price_says_so_and_shows_decision() -> None:
    obs = _observation()
    unpriced = Observation(now=obs.now, started_at=obs.started_at, nodes=obs.nodes, metrics=obs.metrics)
    decision = StopDecision("failed", "rank_failed", "node1 exited")
    text = render_text(live_table(unpriced, decision=decision), width=120)
    assert "n/a" in text and "$" not in text
    assert "failed" in text


@pytest.fixture
def finished_db(tmp_path: Path) -> RunRecords:
    db = RunRecords(tmp_path / "runs.db")
    rid = db.start(
        playbook_path="playbooks/ddp.yaml",
        playbook_name="ddp",
        git_commit="0123456789abcdef0123456789abcdef01234567-dirty",
        inventory=sample_inventory(2).to_yaml_data(),  # what a real run records (hosts n0, n1)
        launcher="torchrun",
        run_dir="runs/20251123-ddp",
        started_at=T0,
        run_id="r-failed",
    ).id
    db.finish(
        rid,
        state="failed",
        ended_at=T0 + 125,
        stop_rule="rank_failed",
        stop_reason="node1 exited with exit code 137 (SIGKILL, often out of memory)",
        exit_codes={"node0": None, "node1": 137},
        last_metrics={"step": 2, "loss": 1.5},
        cost_usd=0.69,
        artifacts=["runs/20251123-ddp/loss.png"],
    )
    db.start(playbook_name="other", started_at=T0 + 500, run_id="r-running")
    return db


def test_summary_panel(finished_db: RunRecords) -> None:
    rec = finished_db.get("r-failed")
    assert rec is not None
    text = render_text(summary_panel(rec), width=120)
    for expected in (
        "run r-failed",
        "failed",
        "SIGKILL, often out of memory",
        "[rank_failed]",
        "2:05",
        "$0.69",
        "loss=1.5",
        "runs/20251123-ddp",
        "loss.png",
        "137",
    ):
        assert expected in text, expected


def test_runs_table_and_show(finished_db: RunRecords) -> None:
    text = render_text(runs_table(finished_db.list(), now=T0 + 600), width=160)
    lines = text.splitlines()
    running = next(i for i, line in enumerate(lines) if "r-running" in line)
    failed = next(i for i, line in enumerate(lines) if "r-failed" in line)
    assert running < failed  # newest first
    assert "0123456789ab-dirty" in lines[failed] and "rank_failed" in lines[failed]
    assert "1:40" in lines[running]  # still running: duration up to now
    assert "no runs recorded yet" in render_text(runs_table([]))

    rec = finished_db.get("r-failed")
    assert rec is not None
    shown = render_text(show_run(rec), width=160)
    assert "playbooks/ddp.yaml" in shown and "2: n0, n1" in shown and "torchrun" in shown


def test_a_run_that_logged_nothing_still_gets_its_loss_plot(tmp_path: Path) -> None:
    """A wall-time stop during torch start-up: no metrics.jsonl, yet a plot saying so, and no
    TensorBoard folder invented for it."""
    from rich.console import Console

    from launch.run.reporter import RichReporter
    from launch.run.run_folder import RunFolder
    from launch.run.wrapup import write_reports

    folder = RunFolder.create("r-empty", base=tmp_path)
    write_reports(folder, RichReporter(Console(file=None, width=120)))
    png = folder.path / "loss.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not (folder.path / "tensorboard").exists()


def test_loss_plots_share_the_log_scale_rule(tmp_path: Path) -> None:
    """Both loss plots (the run's and fab compare's) go through save_loss_plot: a loss spanning
    more than 100x is drawn on a log scale, a narrower or non-positive one on a linear scale."""
    from launch.reports.plot import loss_axes, save_loss_plot

    for losses, scale in (([1000.0, 1.0], "log"), ([10.0, 1.0], "linear"), ([0.0, 100.0], "linear")):
        fig, ax = loss_axes((4, 3))
        ax.plot(range(len(losses)), losses)
        path = save_loss_plot(fig, ax, tmp_path / f"{scale}.png", "t", losses)
        assert ax.get_yscale() == scale, losses
        assert path.read_bytes()[:4] == b"\x89PNG"
        assert not path.with_name(path.name + ".tmp").exists()


def test_attempts_table_takes_odd_entries_as_data() -> None:
    """A run record written by another fleetrun (or edited) may hold anything in an attempt's
    fields: a number where a list of nodes belongs is shown as nothing, never raised."""
    from launch.reports.views import attempts_table, render_text

    odd: list[Any] = [
        {"attempt": 1, "nodes": 3, "replaced": 5, "dropped": "abc", "outcome": "[red]x"},
        "junk",
    ]
    text = render_text(attempts_table(odd), width=200)
    assert "[red]x" in text and "+a" not in text and "-a" not in text


STATES = [
    ("succeeded", "job_finished"),
    ("failed", "rank_failed"),
    ("interrupted", "watcher_lost"),
    ("stopped", "max_wall_time"),
]


@pytest.fixture
def many_runs(tmp_path: Path) -> RunRecords:
    """Runs with the ids, commits and rules fleetrun really writes (long ids, dirty commits)."""
    db = RunRecords(tmp_path / "runs.db")
    for i, (state, rule) in enumerate(STATES):
        rid = f"digits-ddp-20261125-15360{i}-36db5{i}"
        db.start(
            run_id=rid, playbook_name="digits-ddp", started_at=T0 + i, git_commit="0123456789abcdef-dirty"
        )
        db.finish(rid, state=state, stop_rule=rule, ended_at=T0 + i + 3725, cost_usd=12.5)
    return db


@pytest.mark.parametrize("width", [80, 100])
def test_runs_table_on_a_narrow_terminal_keeps_the_outcome_whole_and_first(
    many_runs: RunRecords, width: int
) -> None:
    """At 80 or 100 columns the state and rule were squeezed to ``┃┃┃`` / ``…`` while the id and
    the commit kept their full width."""
    from rich.console import Console

    console = Console(width=width, record=True, color_system=None, file=io.StringIO())
    console.print(runs_table(many_runs.list(), width=width))
    text = console.export_text()
    assert "…" not in text and max(len(line) for line in text.splitlines()) <= width
    header = next(line for line in text.splitlines() if "state" in line)
    assert header.index("state") < header.index("id"), "the outcome comes first"
    for i, (state, rule) in enumerate(STATES):
        row = next(line for line in text.splitlines() if f"36db5{i}" in line)
        assert f" {state} " in row and f" {rule} " in row, row
        assert "digits-ddp-20261125" not in row, "ids are shortened to their random part"
    assert "too narrow for" in text and "commit" in text.split("too narrow for")[1]


def test_runs_table_with_room_shows_every_column_and_full_ids(many_runs: RunRecords) -> None:
    text = render_text(runs_table(many_runs.list(), width=200), width=200)
    assert "digits-ddp-20261125-153600-36db50" in text and "0123456789ab-dirty" in text
    assert "too narrow" not in text


def test_the_short_id_finds_its_run(many_runs: RunRecords) -> None:
    from launch.cli.runs import find_run

    assert find_run(many_runs, "36db52").id == "digits-ddp-20261125-153602-36db52"
    assert find_run(many_runs, "digits-ddp-20261125-153603").id.endswith("36db53")


RUN_FOLDER_FILES = [
    "loss.png",
    "metrics.jsonl",
    "plan.txt",
    "status.json",
    "summary.json",
    "watch.json",
    "tensorboard/events.out.tfevents.1795621286.vm.fleetrun",
    "nodes/n0/heartbeat",
    "nodes/n0/launch.sh",
    "nodes/n0/node.log",
    "nodes/n0/outputs/model.pt",
    "nodes/n0/pid",
    "nodes/n0/rc",
    "nodes/n0/rdzv_port",
    "nodes/n0/profile/trace-rank0.json",
    "nodes/n1/node.log",
    "nodes/n1/pid",
    "nodes/n1/rc",
]


def test_show_lists_plots_logs_and_outputs_not_fleetruns_own_files(tmp_path: Path) -> None:
    db = RunRecords(tmp_path / "runs.db")
    db.start(run_id="r1", playbook_name="ddp", started_at=T0, run_dir="/runs/r1")
    db.finish("r1", state="succeeded", ended_at=T0 + 60, artifacts=RUN_FOLDER_FILES)
    record = db.get("r1")
    assert record is not None
    text = render_text(summary_panel(record), width=160)
    for wanted in (
        "loss.png",
        "nodes/n0/node.log",
        "nodes/n1/node.log",
        "nodes/n0/outputs/model.pt",
        "tensorboard/",
    ):
        assert wanted in text, wanted
    for internal in (
        "n0/heartbeat",
        "launch.sh",
        "n0/pid",
        "n1/rc",
        "rdzv_port",
        "watch.json",
        "status.json",
    ):
        assert internal not in text, internal
    assert "and 12 file(s) of fleetrun's own" in text
    lines = text.splitlines()
    assert any(line.split("│")[1].strip().startswith("plots") for line in lines if "│" in line)


def test_the_loss_plot_draws_the_validation_loss_the_job_logged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from launch.reports import plot

    records: list[dict[str, Any]] = [{"step": s, "loss": 2.0 / (s + 1)} for s in range(10)]
    records += [{"step": 4, "val_loss": 0.9, "val_accuracy": 0.7}, {"step": 9, "val_loss": 0.5}]
    records += [{"step": 9, "eval_loss": float("nan")}, {"step": True, "val_loss": 1.0}, {"event": "x"}]
    assert plot.other_losses(records) == {"val_loss": [(4, 0.9), (9, 0.5)]}
    drawn: dict[str, Any] = {}
    save = plot.save_loss_plot

    def spy(fig: Any, ax: Any, path: Path, title: str, losses: Any) -> Path:
        drawn["lines"] = {line.get_label(): list(line.get_xdata()) for line in ax.get_lines()}
        drawn["legend"] = ax.get_legend() is not None
        return save(fig, ax, path, title, losses)

    monkeypatch.setattr(plot, "save_loss_plot", spy)
    history = [LossPoint(step=r["step"], loss=r["loss"], time=float(r["step"])) for r in records[:10]]
    out = plot.plot_loss(history, tmp_path / "loss.png", records=records)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert drawn["lines"]["val_loss"] == [4, 9] and len(drawn["lines"]["loss"]) == 10 and drawn["legend"]


def test_the_runs_own_loss_plot_gets_the_validation_loss(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rich.console import Console

    from launch.reports import plot
    from launch.run import wrapup
    from launch.run.reporter import RichReporter
    from launch.run.run_folder import RunFolder

    folder = RunFolder.create("r-val", base=tmp_path)
    lines = [{"step": s, "loss": 1.0 / (s + 1)} for s in range(5)] + [{"step": 4, "val_loss": 0.4}]
    (folder.path / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    seen: list[dict[str, Any]] = []

    def spy(history: Any, path: Any, **kwargs: Any) -> Path:
        seen.append(plot.other_losses(kwargs.get("records", ())))
        return plot.plot_loss(history, path, **kwargs)

    monkeypatch.setattr(wrapup, "plot_loss", spy)
    wrapup.write_reports(folder, RichReporter(Console(file=io.StringIO(), width=120)))
    assert seen == [{"val_loss": [(4, 0.4)]}]
