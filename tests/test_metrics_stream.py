"""MetricsStream: partial lines, corrupt lines, NaN, events, summary snapshots."""

from __future__ import annotations

import json
import math

import pytest

from launch.rules.metrics_stream import MAX_LINE_BYTES, MetricsStream, is_event, parse_status


def line(obj: dict[str, object]) -> bytes:
    return (json.dumps(obj) + "\n").encode()


def metric(step: int, loss: float, t: float, **extra: float) -> bytes:
    return line({"step": step, "time": t, "elapsed": t - 1000.0, "loss": loss, **extra})


WORLD = {
    "event": "world",
    "time": 1000.0,
    "world_size": 2,
    "ranks": [{"rank": 0, "host": "node0", "addr": "198.18.0.10"}, {"rank": 1, "host": "node1", "addr": "x"}],
}


def test_partial_line_is_held_until_its_newline_arrives() -> None:
    data = metric(1, 0.9, 1001.0) + metric(2, 0.8, 1002.0)
    stream = MetricsStream()
    cut = len(metric(1, 0.9, 1001.0)) + 7  # inside the second line
    first = stream.feed(data[:cut])
    assert [r["step"] for r in first] == [1]
    assert stream.pending_bytes == 7
    assert stream.last_step == 1
    second = stream.feed(data[cut:])
    assert [r["step"] for r in second] == [2]
    assert stream.pending_bytes == 0
    assert stream.offset == len(data)
    assert stream.bad_lines == 0


def test_byte_by_byte_feeding_gives_the_same_records_as_one_chunk() -> None:
    data = line(WORLD) + metric(1, 0.5, 1001.0, lr=0.1) + '{"step": 2, "loss": "é"}\n'.encode()
    whole = MetricsStream().feed(data)
    stream = MetricsStream()
    pieces = [stream.feed(data[i : i + 1]) for i in range(len(data))]
    assert [r for p in pieces for r in p] == whole
    assert len(whole) == 3  # a multi-byte UTF-8 character split across chunks still decodes


def test_corrupt_lines_are_counted_and_skipped() -> None:
    data = (
        metric(1, 0.9, 1001.0)
        + b'{"step": 2, "loss": 0.8\n'  # truncated JSON
        + b"\xff\xfe garbage\n"  # not UTF-8
        + b"[1, 2, 3]\n"  # JSON but not an object
        + b'{"loss": 0.1}\n'  # neither a step nor an event
        + b'{"step": "x", "loss": 0.1}\n'  # step not an integer
        + b"\n   \n"  # blank lines are not errors
        + metric(3, 0.7, 1003.0)
    )
    stream = MetricsStream()
    records = stream.feed(data)
    assert [r["step"] for r in records] == [1, 3]
    assert stream.bad_lines == 5
    assert stream.summary().bad_lines == 5


def test_nan_and_infinity_are_parsed_and_remembered() -> None:
    stream = MetricsStream()
    stream.feed(b'{"step": 1, "time": 1.0, "loss": 0.5}\n{"step": 2, "time": 2.0, "loss": NaN}\n')
    stream.feed(b'{"step": 3, "time": 3.0, "loss": 0.4}\n{"step": 4, "time": 4.0, "loss": -Infinity}\n')
    summary = stream.summary()
    assert summary.first_nonfinite is not None
    assert summary.first_nonfinite.step == 2 and math.isnan(summary.first_nonfinite.loss)
    assert summary.last_loss == -math.inf
    assert len(summary.history) == 4


def test_events_are_separated_from_metrics() -> None:
    stream = MetricsStream()
    records = stream.feed(line(WORLD) + metric(1, 0.5, 1001.0) + line({"event": "checkpoint", "time": 1.0}))
    assert [is_event(r) for r in records] == [True, False, True]
    summary = stream.summary()
    assert summary.records == 1 and summary.events == 2
    assert summary.world is not None and summary.world["world_size"] == 2


def test_summary_tracks_last_values_and_merges_sparse_metrics() -> None:
    stream = MetricsStream()
    stream.feed(metric(1, 0.9, 1001.0, lr=0.1, accuracy=0.5) + metric(2, 0.8, 1002.0, lr=0.05))
    s = stream.summary()
    assert (s.last_step, s.last_loss, s.last_time) == (2, 0.8, 1002.0)
    assert s.last_metrics == {"loss": 0.8, "lr": 0.05, "accuracy": 0.5}
    assert [(p.step, p.loss, p.time) for p in s.history] == [(1, 0.9, 1001.0), (2, 0.8, 1002.0)]


def test_summary_is_a_snapshot_that_later_feeds_do_not_change() -> None:
    stream = MetricsStream()
    stream.feed(metric(1, 0.9, 1001.0))
    before = stream.summary()
    stream.feed(metric(2, 0.8, 1002.0))
    assert len(before.history) == 1 and before.last_step == 1
    assert len(stream.summary().history) == 2
    assert before.history[-1].step == 1
    with pytest.raises(IndexError):
        before.history[1]


def test_steps_per_second_uses_a_recent_window() -> None:
    stream = MetricsStream(rate_window=3)
    assert stream.steps_per_second is None
    # slow start: 1 step in 100 s, then 10 steps/s
    stream.feed(
        metric(0, 1.0, 1000.0) + metric(1, 1.0, 1100.0) + metric(11, 1.0, 1101.0) + metric(21, 1.0, 1102.0)
    )
    assert stream.steps_per_second == pytest.approx(10.0)


def test_records_without_time_use_elapsed_for_the_rate() -> None:
    stream = MetricsStream()
    stream.feed(b'{"step": 0, "elapsed": 0.0, "loss": 1}\n{"step": 50, "elapsed": 10.0, "loss": 1}\n')
    assert stream.steps_per_second == pytest.approx(5.0)
    assert stream.summary().history[0].time is None


def test_custom_loss_key() -> None:
    stream = MetricsStream(loss_key="train/loss")
    stream.feed(line({"step": 1, "time": 1.0, "train/loss": 2.5, "loss": 99.0}))
    assert stream.last_loss == 2.5


def test_flush_parses_a_final_line_without_newline() -> None:
    stream = MetricsStream()
    assert stream.feed(b'{"step": 7, "loss": 0.1}') == []
    assert [r["step"] for r in stream.flush()] == [7]
    assert stream.flush() == []


def test_overlong_line_is_dropped_without_unbounded_buffering() -> None:
    stream = MetricsStream()
    stream.feed(b'{"step": 1, "junk": "' + b"x" * (MAX_LINE_BYTES + 10))
    assert stream.pending_bytes == 0
    stream.feed(b"x" * 100)
    records = stream.feed(b'"}\n' + metric(2, 0.5, 1.0))
    assert [r["step"] for r in records] == [2]
    assert stream.bad_lines == 1


def test_parse_status() -> None:
    done = parse_status(b'{"status": "succeeded", "time": 5.0, "step": 100, "message": "ok"}')
    assert done is not None and done.status == "succeeded" and done.step == 100
    assert parse_status(b'{"status": "succ') is None  # half-written: ask again next poll
    assert parse_status(b"") is None
    assert parse_status(b'{"status": "maybe"}') is None
    from_dict = parse_status({"status": "failed", "step": None, "message": "boom", "extra": 1})
    assert from_dict is not None and from_dict.status == "failed" and from_dict.message == "boom"
    assert parse_status({"status": 3}) is None
    assert parse_status(None) is None
