"""TensorBoard event files of a run, read back by TensorBoard's own readers (not by our code)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from launch.reports.tensorboard import metric_scalars, record_step, write_tensorboard

pytest.importorskip("tensorboard")
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402
from tensorboard.plugins.hparams import plugin_data_pb2  # noqa: E402

T0 = 1_764_000_000.0
RECORDS: list[dict[str, Any]] = [
    {"event": "world", "time": T0, "world_size": 2, "ranks": []},
    {"step": 1, "time": T0 + 1, "elapsed": 1.0, "loss": 2.0, "lr": 0.1},
    {"step": 2.0, "time": T0 + 2, "elapsed": 2.0, "loss": 1.5, "lr": 0.1, "note": "text is skipped"},
    {"step": 3, "time": T0 + 3, "elapsed": 3.0, "loss": float("nan"), "ok": True},
    {"step": "x", "loss": 9.0},
]


def read(logdir: Path) -> EventAccumulator:
    acc = EventAccumulator(str(logdir))
    acc.Reload()
    return acc


def test_scalars_are_read_back_by_tensorboard(tmp_path: Path) -> None:
    path = write_tensorboard(RECORDS, tmp_path)
    assert path.name.startswith("events.out.tfevents.") and path.name.endswith(".fleetrun")
    acc = read(tmp_path)
    assert sorted(acc.Tags()["scalars"]) == ["loss", "lr"]  # not step/time/elapsed, bools or text
    loss = acc.Scalars("loss")
    assert [(e.step, e.wall_time) for e in loss] == [(1, T0 + 1), (2, T0 + 2), (3, T0 + 3)]
    assert loss[0].value == 2.0 and loss[1].value == 1.5 and math.isnan(loss[2].value)
    assert [e.value for e in acc.Scalars("lr")] == pytest.approx([0.1, 0.1])


def test_hyperparameters_are_an_hparams_session(tmp_path: Path) -> None:
    hps = {"learning-rate": 0.05, "batch-size": 32, "arch": "mlp", "bn": True}
    write_tensorboard(RECORDS, tmp_path, hyperparameters=hps)
    content = read(tmp_path).PluginTagToContent("hparams")
    start = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"])
    values = start.session_start_info.hparams
    assert values["learning-rate"].number_value == 0.05 and values["batch-size"].number_value == 32
    assert values["arch"].string_value == "mlp" and values["bn"].bool_value is True
    experiment = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/experiment"]).experiment
    assert sorted(h.name for h in experiment.hparam_infos) == sorted(hps)
    # the session's metrics are the run's scalars with a finite last value (loss ended NaN)
    assert [m.name.tag for m in experiment.metric_infos] == ["lr"]


def test_without_hyperparameters_there_is_no_session(tmp_path: Path) -> None:
    write_tensorboard(RECORDS, tmp_path)
    with pytest.raises(KeyError, match="hparams"):
        read(tmp_path).PluginTagToContent("hparams")


def test_export_twice_replaces_only_our_file(tmp_path: Path) -> None:
    write_tensorboard(RECORDS, tmp_path)
    (tmp_path / "events.out.tfevents.1.other").write_bytes(b"")  # a job's own file: kept
    second = write_tensorboard(RECORDS[:2], tmp_path)
    ours = list(tmp_path.glob("events.out.tfevents.*.fleetrun"))
    assert ours == [second] and (tmp_path / "events.out.tfevents.1.other").exists()
    (tmp_path / "events.out.tfevents.1.other").unlink()
    assert [e.step for e in read(tmp_path).Scalars("loss")] == [1]  # not doubled, not the old curve


def test_record_helpers() -> None:
    assert record_step({"step": 4.0}) == 4 and record_step({"step": True}) is None
    assert record_step({"event": "world", "step": 1}) is None
    assert metric_scalars({"step": 1, "loss": 1, "ok": False, "s": "x"}) == {"loss": 1.0}
