"""What a run leaves behind and what the user sees: loss plot, TensorBoard file, rich views.

Everything here is pure with respect to the fleet: functions take data (metric records, an
:class:`~launch.rules.stoprules.Observation`, :class:`~launch.run.records.RunRecord` rows) and return
rich renderables or strings, or write a file into the local run folder. The tasks decide when
to print or write.

The TensorBoard writer is a small hand-written encoder of the TFRecord/``Event`` protobuf
format, so ``tensorboard --logdir <run folder>`` works without adding TensorFlow, tensorboard
or protobuf as a runtime dependency. The format, in full:

* a file named ``events.out.tfevents.<unix time>.<host>...`` holding records of
  ``uint64 length | uint32 masked_crc32c(length) | data | uint32 masked_crc32c(data)``,
  little-endian, where ``masked(c) = ((c >> 15 | c << 17) + 0xa282ead8) mod 2**32``;
* each ``data`` is an ``Event`` message: ``wall_time`` (field 1, double), ``step`` (2, int64),
  and either ``file_version`` (3, string; the first event says ``brain.Event:2``) or
  ``summary`` (5) holding repeated ``value`` (1) messages of ``tag`` (1, string) and
  ``simple_value`` (2, float).
"""

from __future__ import annotations

import math
import os
import socket
import struct
import time
from collections.abc import Iterable, Mapping, Sequence
from io import StringIO
from pathlib import Path
from typing import Any, BinaryIO

from rich.console import Console, Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from launch.rules.metrics_stream import RESERVED_KEYS, LossPoint
from launch.rules.pricing import cost_so_far
from launch.rules.stoprules import NodeObservation, Observation, StopDecision
from launch.run.records import RunRecord

# ---------------------------------------------------------------- loss plot


def plot_loss(history: Sequence[LossPoint], path: str | Path, *, title: str | None = None) -> Path:
    """Write a loss-vs-step PNG to ``path`` (atomically) and return the path.

    Uses matplotlib's object API with the Agg canvas, never pyplot, so it needs no display
    and leaves no global figure state behind in the long-lived watcher. Non-finite losses
    cannot be drawn; the first one is marked with a red line so the blow-up is visible.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    path = Path(path)
    finite = [p for p in history if math.isfinite(p.loss)]
    bad = next((p for p in history if not math.isfinite(p.loss)), None)
    fig = Figure(figsize=(8, 4.5), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    if finite:
        ax.plot([p.step for p in finite], [p.loss for p in finite], linewidth=1.2, color="tab:blue")
        low, high = min(p.loss for p in finite), max(p.loss for p in finite)
        if low > 0 and high / low > 100:
            ax.set_yscale("log")
    else:
        ax.text(0.5, 0.5, "no finite loss logged", ha="center", va="center", transform=ax.transAxes)
    if bad is not None:
        ax.axvline(bad.step, color="tab:red", linestyle="--", label=f"loss {bad.loss} at step {bad.step}")
        ax.legend(loc="upper right")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title(title or "training loss")
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fig.savefig(tmp, format="png")
    os.replace(tmp, path)
    return path


# ---------------------------------------------------------------- TensorBoard


def _crc32c_table() -> tuple[int, ...]:
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return tuple(table)


_CRC_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli), the checksum TFRecord uses; pure Python, fine for small records."""
    crc = 0xFFFFFFFF
    table = _CRC_TABLE
    for byte in data:
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _varint(n: int) -> bytes:
    n &= 0xFFFFFFFFFFFFFFFF  # int64 two's complement, as protobuf encodes negatives
    out = bytearray()
    while True:
        bits = n & 0x7F
        n >>= 7
        if n:
            out.append(bits | 0x80)
        else:
            out.append(bits)
            return bytes(out)


def _field_bytes(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def encode_event(wall_time: float, step: int, *, scalars: Mapping[str, float] | None = None) -> bytes:
    """An ``Event`` protobuf; with no scalars it is the ``file_version`` header event."""
    out = b"\x09" + struct.pack("<d", wall_time) + b"\x10" + _varint(step)
    if scalars is None:
        return out + _field_bytes(3, b"brain.Event:2")
    values = b"".join(
        _field_bytes(1, _field_bytes(1, tag.encode("utf-8")) + b"\x15" + struct.pack("<f", value))
        for tag, value in scalars.items()
    )
    return out + _field_bytes(5, values)


def tfrecord(data: bytes) -> bytes:
    """Frame one record: length, its masked CRC, the data, the data's masked CRC."""
    header = struct.pack("<Q", len(data))
    return header + struct.pack("<I", masked_crc32c(header)) + data + struct.pack("<I", masked_crc32c(data))


FILE_SUFFIX = ".fleetrun"


def metric_scalars(record: Mapping[str, Any]) -> dict[str, float]:
    """The plottable scalars of a metric record (not step/time/elapsed, not bools or text)."""
    out: dict[str, float] = {}
    for key, value in record.items():
        if key in RESERVED_KEYS or isinstance(value, bool) or not isinstance(value, int | float):
            continue
        out[key] = float(value)
    return out


class TensorBoardWriter:
    """Append scalar events to one TensorBoard event file in ``logdir``.

    Meant to be fed metric records as the watcher receives them (:meth:`add_record`), then
    closed. Every record is flushed at once unless ``flush_every`` says otherwise, so a
    TensorBoard already pointed at the run folder sees progress live.
    """

    def __init__(self, logdir: str | Path, *, wall_time: float | None = None, flush_every: int = 1) -> None:
        self.logdir = Path(logdir)
        self.logdir.mkdir(parents=True, exist_ok=True)
        start = time.time() if wall_time is None else wall_time
        host = socket.gethostname().replace("/", "_") or "localhost"
        self.path = self.logdir / f"events.out.tfevents.{int(start):010d}.{host}.{os.getpid()}{FILE_SUFFIX}"
        self._file: BinaryIO = open(self.path, "ab")  # noqa: SIM115 (closed in close())
        self._flush_every = max(1, flush_every)
        self._pending = 0
        self._write(encode_event(start, 0))

    def _write(self, event: bytes) -> None:
        self._file.write(tfrecord(event))
        self._pending += 1
        if self._pending >= self._flush_every:
            self.flush()

    def add_scalars(self, step: int, scalars: Mapping[str, float], *, wall_time: float | None = None) -> None:
        if scalars:
            self._write(encode_event(time.time() if wall_time is None else wall_time, step, scalars=scalars))

    def add_record(self, record: Mapping[str, Any]) -> int:
        """Write a metric record's scalars at its step; events and step-less lines are skipped.

        Returns the number of scalars written.
        """
        step = record.get("step")
        if isinstance(step, float) and step.is_integer():
            step = int(step)  # the metrics stream accepts 12.0 as step 12; so do we
        if "event" in record or isinstance(step, bool) or not isinstance(step, int):
            return 0
        scalars = metric_scalars(record)
        wall = record.get("time")
        wall_time = float(wall) if isinstance(wall, int | float) and not isinstance(wall, bool) else None
        self.add_scalars(step, scalars, wall_time=wall_time)
        return len(scalars)

    def flush(self) -> None:
        self._file.flush()
        self._pending = 0

    def close(self) -> None:
        if not self._file.closed:
            self.flush()
            self._file.close()

    def __enter__(self) -> TensorBoardWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def write_tensorboard(
    records: Iterable[Mapping[str, Any]], logdir: str | Path, *, replace: bool = True
) -> Path:
    """One-shot export of all metric records to a fresh event file in ``logdir``.

    With ``replace`` (the default) earlier files written by fleetrun (``*.fleetrun``) in
    ``logdir`` are removed first, so exporting twice does not double every curve.
    """
    logdir = Path(logdir)
    if replace and logdir.is_dir():
        for old in logdir.glob(f"events.out.tfevents.*{FILE_SUFFIX}"):
            old.unlink()
    records = list(records)
    first = next((r.get("time") for r in records if isinstance(r.get("time"), int | float)), None)
    with TensorBoardWriter(logdir, wall_time=first, flush_every=1000) as writer:
        for record in records:
            writer.add_record(record)
    return writer.path


# ---------------------------------------------------------------- formatting


def fmt_duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(max(0.0, seconds))
    if s < 3600:
        return f"{s // 60}:{s % 60:02d}"
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def fmt_cost(usd: float | None) -> str:
    return "n/a" if usd is None else f"${usd:,.2f}"


def fmt_number(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "-" if value is None else str(value)
    if isinstance(value, int):
        return str(value)
    return f"{value:.4g}" if math.isfinite(value) else str(value)


def fmt_time(unix: float | None) -> str:
    return "-" if unix is None else time.strftime("%Y-%m-%d %H:%M", time.localtime(unix))


def _add_row(table: Table, *cells: RenderableType) -> None:
    """Add a row with plain strings taken literally: a reason like ``[rank_failed]`` or a
    node name must never be read as rich markup."""
    table.add_row(*(Text(c) if isinstance(c, str) else c for c in cells))


_STATE_STYLE = {
    "running": "green",
    "succeeded": "bold green",
    "failed": "bold red",
    "stopped": "yellow",
    "interrupted": "magenta",
    "vanished": "red",
    "unreachable": "yellow",
}


def _node_state(node: NodeObservation, now: float) -> Text:
    if node.state == "exited":
        code = node.exit_code
        return Text(f"exited {code}", style="blue" if code == 0 else "bold red")
    label: str = node.state
    if node.state == "unreachable" and node.last_reachable_at is not None:
        label += f" {fmt_duration(now - node.last_reachable_at)}"
    return Text(label, style=_STATE_STYLE.get(node.state, ""))


def render_text(renderable: RenderableType, *, width: int = 100) -> str:
    """Render to plain text (no colour codes): for logs, tests and non-terminal output."""
    buffer = StringIO()
    Console(file=buffer, width=width, color_system=None, force_terminal=False).print(renderable)
    return buffer.getvalue()


# ---------------------------------------------------------------- live view


def live_table(obs: Observation, *, title: str | None = None, decision: StopDecision | None = None) -> Table:
    """The table the watcher redraws each poll: one row per node and a bold ``run`` row.

    Metrics come from global rank 0 only, so step, loss and steps/s belong to the run, not
    to a node. Cost is per node at the observation's price (``n/a`` when unknown).
    """
    elapsed = obs.elapsed_s
    price = obs.price_per_node_hour
    table = Table(title=title, title_justify="left", expand=False)
    for name, justify in (
        ("node", "left"),
        ("state", "left"),
        ("step", "right"),
        ("loss", "right"),
        ("steps/s", "right"),
        ("GPU", "right"),
        ("elapsed", "right"),
        ("cost", "right"),
    ):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    node_cost = fmt_cost(cost_so_far(1, price, elapsed)) if price > 0 else "n/a"
    for node in obs.nodes:
        gpu = "-" if node.gpu_util is None else f"{node.gpu_util:.0f}%"
        _add_row(
            table, node.node, _node_state(node, obs.now), "", "", "", gpu, fmt_duration(elapsed), node_cost
        )
    m = obs.metrics
    rate = "-" if m.steps_per_second is None else f"{m.steps_per_second:.2f}"
    total = fmt_cost(cost_so_far(obs.fleet_size, price, elapsed)) if price > 0 else "n/a"
    state = Text(decision.outcome, style=_STATE_STYLE[decision.outcome]) if decision else Text("watching")
    table.add_section()
    _add_row(
        table,
        Text("run", style="bold"),
        state,
        fmt_number(m.last_step),
        fmt_number(m.last_loss),
        rate,
        "",
        fmt_duration(elapsed),
        total,
    )
    if m.bad_lines:
        table.caption = f"{m.bad_lines} unreadable metrics line(s) skipped"
    return table


# ---------------------------------------------------------------- records views


def _exit_codes_table(codes: Mapping[str, int | None]) -> Table:
    table = Table(show_header=True, box=None, pad_edge=False)
    table.add_column("node")
    table.add_column("exit code", justify="right")
    for node, code in codes.items():
        style = "" if code is None else "green" if code == 0 else "bold red"
        _add_row(table, node, Text("-" if code is None else str(code), style=style))
    return table


def _metrics_line(metrics: Mapping[str, Any]) -> str:
    return "  ".join(f"{k}={fmt_number(v)}" for k, v in metrics.items()) or "-"


def summary_panel(record: RunRecord) -> Panel:
    """The end-of-run summary: outcome and reason first, then what to look at next."""
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    _add_row(grid, "outcome", Text(record.state, style=_STATE_STYLE.get(record.state, "")))
    if record.stop_reason:
        _add_row(
            grid,
            "reason",
            f"{record.stop_reason} [{record.stop_rule}]" if record.stop_rule else record.stop_reason,
        )
    _add_row(grid, "duration", fmt_duration(record.duration_s()))
    _add_row(grid, "cost (approx.)", fmt_cost(record.cost_usd))
    _add_row(grid, "last metrics", _metrics_line(record.last_metrics))
    if record.exit_codes:
        _add_row(grid, "exit codes", _exit_codes_table(record.exit_codes))
    _add_row(grid, "run folder", record.run_dir or "-")
    for artifact in record.artifacts:
        _add_row(grid, "", artifact)
    border = _STATE_STYLE.get(record.state, "").replace("bold ", "") or "white"
    return Panel(grid, title=f"run {record.id}", title_align="left", border_style=border, expand=False)


def runs_table(records: Sequence[RunRecord], *, now: float | None = None) -> Table:
    """``fab runs``: one line per run, newest first (as ``RunRecords.list`` returns them)."""
    table = Table(title="runs", title_justify="left")
    for name in ("id", "playbook", "state", "rule", "started", "duration", "cost", "commit"):
        table.add_column(name, no_wrap=name in ("id", "started", "commit", "duration", "cost"))
    for r in records:
        _add_row(
            table,
            r.id,
            r.playbook_name or r.playbook_path or "-",
            Text(r.state, style=_STATE_STYLE.get(r.state, "")),
            r.stop_rule or "-",
            fmt_time(r.started_at),
            fmt_duration(r.duration_s(now)),
            fmt_cost(r.cost_usd),
            (r.git_commit or "-")[:12] + ("-dirty" if (r.git_commit or "").endswith("-dirty") else ""),
        )
    if not records:
        table.caption = "no runs recorded yet"
    return table


def show_run(record: RunRecord, *, now: float | None = None) -> Group:
    """``fab show <id>``: every field of one run, then the end-of-run summary."""
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column(overflow="fold")
    rows: list[tuple[str, str]] = [
        ("playbook", f"{record.playbook_name or '-'} ({record.playbook_path or '-'})"),
        ("playbook sha256", record.playbook_hash or "-"),
        ("git commit", record.git_commit or "- (not a git repository)"),
        ("launcher", record.launcher or "-"),
        ("started", fmt_time(record.started_at)),
        ("ended", fmt_time(record.ended_at)),
        ("state", record.state),
        (
            "watcher",
            f"pid {record.watcher_pid} on {record.watcher_host}, heartbeat {fmt_time(record.heartbeat_at)}",
        ),
    ]
    for key, value in rows:
        _add_row(grid, key, value)
    nodes = record.inventory.get("nodes") if isinstance(record.inventory, dict) else None
    if isinstance(nodes, list):
        names = [str(n.get("name", "?")) if isinstance(n, dict) else str(n) for n in nodes]
        _add_row(grid, "nodes", f"{len(names)}: {', '.join(names)}")
    return Group(grid, summary_panel(record))
