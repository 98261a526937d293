"""Incremental parsing of ``metrics.jsonl`` as the watcher fetches it, chunk by chunk.

The watcher reads the head node's ``<run dir>/metrics.jsonl`` by byte offset over SSH, so a
chunk can end in the middle of a line (the helper may be half-way through a ``write``).
:class:`MetricsStream` therefore holds the trailing bytes until their newline arrives, and
never crashes on a corrupt line: it counts it and moves on, because one bad line must not
take down the watcher of a week-long run.

Two kinds of records share the file (see the metrics helper):

* a metric record has a ``step`` (int) plus ``time``/``elapsed`` and float scalars
  (``loss``, ``lr``, ...);
* an event record has an ``event`` key and no ``step`` (``{"event": "world", ...}``).

Python's ``json`` writes ``NaN``/``Infinity`` for non-finite floats and ``json.loads`` accepts
them back; we keep that on purpose, because a NaN loss is exactly what the stop rules look for.

The summary (:class:`MetricsSummary`) is a cheap snapshot for the stop rules and the live
table: last step and loss, the loss history, steps/s over a recent window. The loss history
is stored in compact arrays (24 bytes a point) so a run of millions of steps stays small, and
the snapshot is a fixed-length view of those append-only arrays, so taking one each poll
costs nothing and it never changes after it was taken.
"""

from __future__ import annotations

import math
from array import array
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, overload

from pydantic import BaseModel, ConfigDict, ValidationError

from launch.nodelib.fleetrun_protocol import MAX_INT, ProtocolError, StatusRecord, parse_metrics_line

#: Keys of a metric record that are bookkeeping, not metrics to plot or compare.
RESERVED_KEYS = frozenset({"step", "time", "elapsed", "event"})

#: A line longer than this without a newline is treated as corrupt and dropped, so a
#: runaway writer cannot make the watcher hold an unbounded buffer.
MAX_LINE_BYTES = 1 << 20

#: The latest value of at most this many metric names is kept (names of at most MAX_METRIC_NAME
#: characters): a job logging a new name at every step must not grow every poll's snapshot.
MAX_METRIC_NAMES = 1024
MAX_METRIC_NAME = 200


@dataclass(frozen=True)
class LossPoint:
    """One point of the loss curve: the step, the loss, and the record's unix time (if any)."""

    step: int
    loss: float
    time: float | None


class LossHistory(Sequence[LossPoint]):
    """A read-only view of the first ``length`` points of the stream's append-only arrays.

    Because the arrays only ever grow, a view with a fixed length is an immutable snapshot.
    """

    def __init__(self, steps: array[int], losses: array[float], times: array[float], length: int) -> None:
        self._steps = steps
        self._losses = losses
        self._times = times
        self._length = length

    def __len__(self) -> int:
        return self._length

    @overload
    def __getitem__(self, index: int) -> LossPoint: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[LossPoint]: ...

    def __getitem__(self, index: int | slice) -> LossPoint | Sequence[LossPoint]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self._length))]
        if index < 0:
            index += self._length
        if not 0 <= index < self._length:
            raise IndexError("loss history index out of range")
        t = self._times[index]
        return LossPoint(self._steps[index], self._losses[index], None if math.isnan(t) else t)

    def __iter__(self) -> Iterator[LossPoint]:
        for i in range(self._length):
            yield self[i]


def _empty_history() -> LossHistory:
    return LossHistory(array("q"), array("d"), array("d"), 0)


@dataclass(frozen=True)
class MetricsSummary:
    """What the stop rules and the live table need to know about the metrics so far."""

    records: int = 0
    """Metric records parsed (events not included): the stall rule watches this grow."""
    events: int = 0
    bad_lines: int = 0
    last_step: int | None = None
    last_loss: float | None = None
    last_time: float | None = None
    last_metrics: Mapping[str, float] = field(default_factory=dict)
    """The latest value of every scalar seen, merged across records (eval metrics are sparse)."""
    history: Sequence[LossPoint] = field(default_factory=_empty_history)
    first_nonfinite: LossPoint | None = None
    """The first NaN/Inf loss, kept even if later losses are finite again, so no poll misses it."""
    steps_per_second: float | None = None
    world: Mapping[str, Any] | None = None
    """The last ``world`` event (world size, rank -> host map), if any."""
    saved_checkpoints: Mapping[int, str] = field(default_factory=dict)
    """Steps the checkpoint helper reported saving (``checkpoint_saved``) -> the sha256 of their
    manifest: the only steps a node's claim is believed for (``launch.run.checkpoints``)."""
    uploaded_checkpoints: Mapping[int, str] = field(default_factory=dict)
    """Steps whose bucket upload completed, pointer included (``checkpoint_uploaded``) -> the
    sha256 of the manifest uploaded: durable without any node (``durable_resume``)."""
    refused_checkpoints: tuple[str, ...] = ()
    """Checkpoints the helper refused to resume from (``checkpoint_refused``), as lines."""
    resumed_checkpoint: tuple[int | None, str] | None = None
    """(step, source) rank 0 resumed from (``checkpoint_resumed``; step None: from the beginning)."""


class FinalStatus(BaseModel):
    """``<run dir>/status.json`` as the metrics helper writes it when training ends."""

    model_config = ConfigDict(extra="allow")

    status: Literal["succeeded", "failed"]
    time: float | None = None
    step: int | None = None
    message: str | None = None


def parse_status(data: bytes | str | Mapping[str, Any] | None) -> FinalStatus | None:
    """Parse ``status.json`` (raw text, or the dict the node agent already decoded).

    ``None`` when it is missing, half-written or malformed: the watcher polls this file, so a
    partial one simply means "ask again at the next poll", not an error. The job writes it, so
    it goes through the node protocol's bounds first (size, nesting depth, field types).
    """
    if not data:
        return None
    try:
        if isinstance(data, Mapping):
            record = StatusRecord.from_dict(dict(data))
        else:
            record = StatusRecord.from_json(data)
        return FinalStatus.model_validate(record.to_dict())
    except (ProtocolError, ValidationError, ValueError):
        return None


def is_event(record: Mapping[str, Any]) -> bool:
    """True for an event record (``{"event": ...}``), False for a metric record."""
    return "event" in record


def _scalar(value: Any) -> float | None:
    """A metric value as a float, or None for anything that is not a plain number."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _step(value: Any) -> int | None:
    """A step number, or None; steps must fit the loss history's signed 64-bit slots."""
    if isinstance(value, bool):
        return None
    if isinstance(value, float) and value.is_integer() and abs(value) <= MAX_INT:
        value = int(value)
    if isinstance(value, int) and -MAX_INT <= value <= MAX_INT:
        return value
    return None


MAX_SAVED_CHECKPOINTS = 64
MAX_REFUSED_CHECKPOINTS = 20


def note_checkpoint_event(
    record: Mapping[str, Any],
    saved: dict[int, str],
    refused: list[str],
    uploaded: dict[int, str],
) -> None:
    """Fold a checkpoint helper event in: ``checkpoint_saved`` (a step and its manifest's sha256,
    the newest 64 kept), ``checkpoint_uploaded`` (the same, once its upload and the bucket's
    pointer are done; into ``uploaded``) or ``checkpoint_refused`` (a line naming step, file and
    place, 20 kept). Anything malformed is ignored: these come from the job."""
    step = _step(record.get("step"))
    if step is None or step < 0:
        return
    kind = record.get("event")
    if kind in ("checkpoint_saved", "checkpoint_uploaded"):
        into = saved if kind == "checkpoint_saved" else uploaded
        digest = record.get("manifest")
        if not isinstance(digest, str) or len(digest) != 64:
            return
        if all(c in "0123456789abcdef" for c in digest):
            into[step] = digest
            for old in sorted(into)[:-MAX_SAVED_CHECKPOINTS]:
                del into[old]
        return
    if len(refused) < MAX_REFUSED_CHECKPOINTS:
        parts = [str(record.get(k, ""))[:300] for k in ("file", "where", "why")]
        refused.append(f"step {step}: {parts[0]} on {parts[1]}: {parts[2]}")


class MetricsStream:
    """Feed it raw bytes of ``metrics.jsonl`` in order; it yields parsed records.

    ``offset`` is the number of bytes consumed so far (complete lines plus the held partial
    line), i.e. where the next read should start. ``rate_window`` is the number of recent
    metric records over which steps/s is measured (a window, so a slow start does not drag
    the number down for the whole run).
    """

    def __init__(self, *, loss_key: str = "loss", rate_window: int = 50) -> None:
        if rate_window < 2:
            raise ValueError("rate_window must be at least 2 records")
        self.loss_key = loss_key
        self.offset = 0
        self.records = 0
        self.events = 0
        self.bad_lines = 0
        self.last_step: int | None = None
        self.last_loss: float | None = None
        self.last_time: float | None = None
        self.last_metrics: dict[str, float] = {}
        self.first_nonfinite: LossPoint | None = None
        self.world: dict[str, Any] | None = None
        self.saved_checkpoints: dict[int, str] = {}
        self.uploaded_checkpoints: dict[int, str] = {}
        self.refused_checkpoints: list[str] = []
        self.resumed_checkpoint: tuple[int | None, str] | None = None
        self._buffer = b""
        self._discarding = False  # inside an over-long line: drop bytes until its newline
        self._steps: array[int] = array("q")
        self._losses: array[float] = array("d")
        self._times: array[float] = array("d")
        self._rate: deque[tuple[int, float]] = deque(maxlen=rate_window)

    @property
    def pending_bytes(self) -> int:
        """Bytes of an incomplete trailing line held until its newline arrives."""
        return len(self._buffer)

    def feed(self, chunk: bytes) -> list[dict[str, Any]]:
        """Consume ``chunk``; return the records (metrics and events) completed by it, in order."""
        self.offset += len(chunk)
        data = self._buffer + chunk
        lines = data.split(b"\n")
        self._buffer = lines.pop()
        out: list[dict[str, Any]] = []
        for line in lines:
            if self._discarding:
                self._discarding = False  # the newline ends the over-long line
                continue
            record = self._parse_line(line)
            if record is not None:
                out.append(record)
        if len(self._buffer) > MAX_LINE_BYTES:
            self.bad_lines += 0 if self._discarding else 1
            self._discarding = True
            self._buffer = b""
        return out

    def flush(self) -> list[dict[str, Any]]:
        """Parse a final line that never got its newline (call once the run is over)."""
        line, self._buffer = self._buffer, b""
        if self._discarding:
            self._discarding = False
            return []
        record = self._parse_line(line)
        return [] if record is None else [record]

    def _parse_line(self, raw: bytes) -> dict[str, Any] | None:
        line = raw.strip()
        if not line:
            return None
        try:
            # bounded: a nesting bomb or a huge integer is a bad line, not a crashed watcher
            record = parse_metrics_line(line)
        except ProtocolError:
            self.bad_lines += 1
            return None
        if is_event(record):
            self._on_event(record)
            return record
        step = _step(record.get("step"))
        if step is None:
            self.bad_lines += 1
            return None
        self._on_metric(step, record)
        return record

    def _on_event(self, record: dict[str, Any]) -> None:
        self.events += 1
        if record.get("event") == "world":
            self.world = record
        elif record.get("event") == "checkpoint_resumed":
            step, source = _step(record.get("step")), record.get("source")
            self.resumed_checkpoint = (step, source[:40] if isinstance(source, str) else "?")
        elif record.get("event") in ("checkpoint_saved", "checkpoint_uploaded", "checkpoint_refused"):
            note_checkpoint_event(
                record, self.saved_checkpoints, self.refused_checkpoints, self.uploaded_checkpoints
            )

    def _on_metric(self, step: int, record: dict[str, Any]) -> None:
        self.records += 1
        self.last_step = step
        t = _scalar(record.get("time"))
        if t is None:
            t = _scalar(record.get("elapsed"))  # same clock for every record of one run
        self.last_time = _scalar(record.get("time"))
        for key, value in record.items():
            number = _scalar(value)
            if key in RESERVED_KEYS or number is None or len(key) > MAX_METRIC_NAME:
                continue
            if key in self.last_metrics or len(self.last_metrics) < MAX_METRIC_NAMES:
                self.last_metrics[key] = number
        loss = _scalar(record.get(self.loss_key))
        if loss is not None:
            self.last_loss = loss
            point_time = self.last_time
            self._steps.append(step)
            self._losses.append(loss)
            self._times.append(math.nan if point_time is None else point_time)
            if self.first_nonfinite is None and not math.isfinite(loss):
                self.first_nonfinite = LossPoint(step, loss, point_time)
        if t is not None:
            self._rate.append((step, t))

    @property
    def steps_per_second(self) -> float | None:
        """Steps per second over the last ``rate_window`` metric records; None until known."""
        if len(self._rate) < 2:
            return None
        (s0, t0), (s1, t1) = self._rate[0], self._rate[-1]
        if t1 <= t0 or s1 < s0:
            return None
        return (s1 - s0) / (t1 - t0)

    @property
    def history(self) -> LossHistory:
        """The loss curve so far, as an immutable view."""
        return LossHistory(self._steps, self._losses, self._times, len(self._steps))

    def summary(self) -> MetricsSummary:
        """A snapshot for the stop rules and the live table; later feeds do not change it."""
        return MetricsSummary(
            records=self.records,
            events=self.events,
            bad_lines=self.bad_lines,
            last_step=self.last_step,
            last_loss=self.last_loss,
            last_time=self.last_time,
            last_metrics=dict(self.last_metrics),
            history=self.history,
            first_nonfinite=self.first_nonfinite,
            steps_per_second=self.steps_per_second,
            world=None if self.world is None else dict(self.world),
            saved_checkpoints=dict(self.saved_checkpoints),
            uploaded_checkpoints=dict(self.uploaded_checkpoints),
            refused_checkpoints=tuple(self.refused_checkpoints),
            resumed_checkpoint=self.resumed_checkpoint,
        )
