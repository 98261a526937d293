"""TensorBoard event files without TensorFlow: ``tensorboard --logdir <run folder>`` works.

The writer is a small hand-written encoder of the TFRecord/``Event`` protobuf
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

import os
import socket
import struct
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, BinaryIO

from launch.rules.metrics_stream import RESERVED_KEYS


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
