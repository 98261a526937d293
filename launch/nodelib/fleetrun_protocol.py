"""The node protocol: every message between the laptop and a node, as typed, validated records.

Why one module: the laptop's watcher, the node agent, the on-node watchdog, the sync relay and
the metrics helper used to read each other's JSON with ``json.loads`` and ``dict[...]`` on both
ends. The two ends drifted (the watchdog read a key nothing wrote), and every reader trusted the
shape of what came in, so one odd line written by a training job (a 200 KB run of ``[``, which
makes ``json.loads`` raise ``RecursionError``) killed the watcher and the watchdog alike.

Here each message has one writer (``to_json``) and one reader (``from_json``) shared by both ends:
the laptop imports this file as ``launch.nodelib.fleetrun_protocol``, nodes as
``fleetrun_protocol`` from ``~/.fleetrun/lib`` next to the agent. (The ``fleetrun_`` prefix,
like the other shipped modules': ``~/.fleetrun/lib`` is first on the job's ``PYTHONPATH``, so a
plain ``protocol`` would shadow any module of that name the job imports.) Everything that comes from a node, a job or a file on a node
is untrusted, so ``from_json``:

* bounds the input before parsing it (bytes, JSON nesting depth found by a cheap scan *before*
  ``json.loads`` recurses, digits of an integer: Python 3.8 parses long digit runs in quadratic
  time), and bounds every string, list and number after;
* checks every field's type and range (a boolean is not a number, NaN is not a time);
* raises nothing but :class:`ProtocolError`, which callers count and report: a malformed message
  is never fatal to the process reading it.

Unknown keys are ignored (a newer laptop may add some); missing required keys are errors.
Free text (a status message, a log tail, an error) is truncated to its bound, not refused,
because losing a whole "failed" status over a long message would hide the failure itself.

Standard library only, and Python 3.8 at run time (nodes run whatever ``python3`` they have):
no ``X | Y`` outside annotations, no ``match``.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

VERSION = 1

KiB = 1024
MiB = 1024 * KiB

MAX_DEPTH = 32
"""JSON nesting deeper than this is refused before parsing (no message of ours nests beyond 4)."""
MAX_INT_DIGITS = 40
"""Integers longer than this are refused while parsing: no count, offset or step comes close."""
MAX_INT = 2**63 - 1
"""Integers must fit a signed 64-bit slot (the loss history stores steps in an ``array('q')``)."""

MAX_NAME = 255
MAX_TEXT = 4000
MAX_ERROR = 1000
MAX_NOTES = 16
MAX_NOTE = 300
MAX_PEERS = 4096
MAX_ARGV = 64
MAX_ARG = 4096
MAX_TIMESTAMP = 1e11
"""Unix seconds; year ~5138. Anything later is not a clock reading."""
MAX_DURATION_S = 1e9
MAX_OFFSET = 2**53
MAX_COUNT = 10**9

MAX_GUARD_CONFIG_BYTES = 2 * MiB
MAX_REQUEST_BYTES = 4 * KiB
MAX_CHUNK = 1 * MiB
"""Metrics bytes carried by one poll answer."""
MAX_LOG_TAIL = 4000
MAX_POLL_ANSWER_BYTES = 4 * MiB
"""Base64 of ``MAX_CHUNK`` plus the rest, with room; ``LineSession`` refuses longer answer lines."""
MAX_STATUS_BYTES = 64 * KiB
MAX_STATUS_FIELDS = 64
MAX_METRICS_LINE_BYTES = 1 * MiB
MAX_METRICS_KEYS = 1024
MAX_SMALL_ANSWER_BYTES = 16 * KiB
MAX_BUNDLE_BYTES = 8 * MiB
MAX_BUNDLE_FILES = 8
MAX_BUNDLE_FILE_BYTES = 2 * MiB
MAX_RELAY_CONFIG_BYTES = 8 * MiB
MAX_RELAY_TARGETS = 4096
MAX_RELAY_TRANSFERS = 8
MAX_FILTERS = 1024

STATES = ("absent", "running", "exited", "vanished")
"""A run's state on one node, as the agent sees it: no run dir; its process alive; its exit code
written; its process gone without an exit code."""

_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,254}")
_ADDRESS_RE = re.compile(r"[A-Za-z0-9.:%_-]{1,255}")
_FILE_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_STATUS_WORD_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")
_TOKEN_RE = re.compile(r'[\[\]{}"]')
_STRING_REST_RE = re.compile(r'[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)


class ProtocolError(ValueError):
    """A message that is not what the protocol says: the only error ``from_json`` raises."""


# -- parsing -------------------------------------------------------------------------------------


def _within_depth(text: str, limit: int) -> bool:
    """Whether JSON ``text`` nests at most ``limit`` arrays/objects deep, without parsing it.

    Brackets inside strings do not count. Linear: strings are skipped with one anchored regex
    match each, and the scan stops at the first level past the limit. Texts with fewer opening
    brackets than the limit (nearly all) are not scanned at all.
    """
    if text.count("[") + text.count("{") <= limit:
        return True
    depth = 0
    pos = 0
    while True:
        token = _TOKEN_RE.search(text, pos)
        if token is None:
            return True
        char = token.group()
        if char == '"':
            rest = _STRING_REST_RE.match(text, token.end())
            if rest is None:
                return True  # an unterminated string: json.loads refuses it
            pos = rest.end()
            continue
        if char in "[{":
            depth += 1
            if depth > limit:
                return False
        else:
            depth -= 1
        pos = token.end()


def _bounded_int(digits: str) -> int:
    if len(digits) > MAX_INT_DIGITS:
        raise ValueError(f"an integer of {len(digits)} digits")
    return int(digits)


def decode(data: bytes | bytearray | str, limit: int, what: str) -> Any:
    """``data`` as JSON, within ``limit`` bytes and ``MAX_DEPTH`` levels, or a ``ProtocolError``."""
    if isinstance(data, (bytes, bytearray)):
        if len(data) > limit:
            raise ProtocolError(f"{what}: {len(data)} bytes, over the limit of {limit}")
        try:
            text = bytes(data).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ProtocolError(f"{what}: not UTF-8 (bad byte at offset {exc.start})") from None
    elif isinstance(data, str):
        if len(data) > limit:
            raise ProtocolError(f"{what}: {len(data)} characters, over the limit of {limit}")
        text = data
    else:
        raise ProtocolError(f"{what}: expected JSON text, got {type(data).__name__}")
    if not _within_depth(text, MAX_DEPTH):
        raise ProtocolError(f"{what}: nested deeper than {MAX_DEPTH} levels")
    try:
        return json.loads(text, parse_int=_bounded_int)
    except (ValueError, RecursionError, MemoryError, OverflowError) as exc:
        raise ProtocolError(
            f"{what}: not valid JSON ({_clip(str(exc) or type(exc).__name__, 120)})"
        ) from None


def encode(data: Mapping[str, Any], allow_nan: bool = False) -> str:
    """One line of JSON (no newline inside: the line protocols split on it)."""
    return json.dumps(data, allow_nan=allow_nan, separators=(",", ":"))


def _clip(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, saying so; lone surrogates made printable."""
    if len(text) > limit:
        text = text[: max(0, limit - 15)] + " ...(truncated)"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "replace").decode("utf-8")
    return text


def _clip_tail(text: str, limit: int) -> str:
    if len(text) > limit:
        text = text[-limit:]
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "replace").decode("utf-8")
    return text


# -- field readers: each names the message and the field in its error ----------------------------


class _Fields:
    """Typed access to one decoded JSON object, every error naming ``what`` and the field."""

    def __init__(self, data: object, what: str) -> None:
        if not isinstance(data, dict):
            raise ProtocolError(f"{what}: expected a JSON object, got {_kind(data)}")
        self.data = data
        self.what = what

    def _fail(self, key: str, expected: str, value: object) -> ProtocolError:
        return ProtocolError(f"{self.what}: field {key!r}: expected {expected}, got {_shown(value)}")

    def _get(self, key: str, required: bool) -> object:
        if key not in self.data:
            if required:
                raise ProtocolError(f"{self.what}: field {key!r} is missing")
            return None
        return self.data[key]

    def name(self, key: str, required: bool = True, default: str = "") -> str:
        value = self._get(key, required)
        if value is None and not required:
            return default
        if not isinstance(value, str) or not _NAME_RE.fullmatch(value):
            raise self._fail(key, "a name (letters, digits, '.', '_', '-'; at most 255)", value)
        return value

    def address(self, value: object, key: str) -> str:
        if not isinstance(value, str) or not _ADDRESS_RE.fullmatch(value):
            raise self._fail(key, "a host address", value)
        return value

    def text(self, key: str, limit: int, default: str = "", tail: bool = False) -> str:
        """Free text: any string (or null), truncated to ``limit`` rather than refused."""
        value = self._get(key, False)
        if value is None:
            return default
        if not isinstance(value, str):
            raise self._fail(key, "a string", value)
        return _clip_tail(value, limit) if tail else _clip(value, limit)

    def path(self, key: str) -> str:
        value = self._get(key, True)
        if not isinstance(value, str) or not value or len(value) > MAX_ARG or "\0" in value:
            raise self._fail(key, f"a path (1 to {MAX_ARG} characters, no NUL)", value)
        return value

    def boolean(self, key: str, default: bool) -> bool:
        value = self._get(key, False)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self._fail(key, "true or false", value)
        return value

    def integer(
        self, key: str, low: int, high: int, required: bool = True, default: int | None = None
    ) -> int:
        value = self.optional_integer(key, low, high, required)
        if value is None:
            if default is None:
                raise ProtocolError(f"{self.what}: field {key!r} is missing")
            return default
        return value

    def optional_integer(self, key: str, low: int, high: int, required: bool = False) -> int | None:
        value = self._get(key, required)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise self._fail(key, f"an integer from {low} to {high}", value)
        return value

    def number(self, key: str, low: float, high: float, required: bool = False) -> float | None:
        """A finite number in ``[low, high]`` (ints accepted), or None when absent or null."""
        value = self._get(key, required)
        if value is None:
            if required:
                raise ProtocolError(f"{self.what}: field {key!r} is missing")
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self._fail(key, "a number", value)
        number = float(value)
        if not math.isfinite(number) or not low <= number <= high:
            raise self._fail(key, f"a finite number from {low:g} to {high:g}", value)
        return number

    def positive(self, key: str, high: float = MAX_DURATION_S) -> float | None:
        """An optional limit in seconds: absent/null means off; zero and negatives are refused."""
        value = self.number(key, 0.0, high)
        if value is not None and value <= 0:
            raise self._fail(key, "a positive number of seconds, or null", value)
        return value

    def strings(self, key: str, max_items: int, item: Any) -> tuple[str, ...]:
        value = self._get(key, False)
        if value is None:
            return ()
        if not isinstance(value, list):
            raise self._fail(key, "a list", value)
        if len(value) > max_items:
            raise ProtocolError(
                f"{self.what}: field {key!r}: {len(value)} items, over the limit of {max_items}"
            )
        return tuple(item(v, key) for v in value)

    def objects(self, key: str, max_items: int) -> list[object]:
        value = self._get(key, True)
        if not isinstance(value, list):
            raise self._fail(key, "a list", value)
        if len(value) > max_items:
            raise ProtocolError(
                f"{self.what}: field {key!r}: {len(value)} items, over the limit of {max_items}"
            )
        return value


def _kind(value: object) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}.get(
        type(value), "null" if value is None else "a number"
    )


def _shown(value: object) -> str:
    return _clip(repr(value), 60)


def _arg(value: object, key: str) -> str:
    if not isinstance(value, str) or len(value) > MAX_ARG or "\0" in value:
        raise ProtocolError(f"field {key!r}: expected a command-line argument, got {_shown(value)}")
    return value


def _note(value: object, key: str) -> str:
    if not isinstance(value, str):
        raise ProtocolError(f"field {key!r}: expected a string, got {_shown(value)}")
    return _clip(value, MAX_NOTE)


def _json_object(data: bytes | bytearray | str, limit: int, what: str) -> _Fields:
    return _Fields(decode(data, limit, what), what)


# -- small values read from files ---------------------------------------------------------------


def parse_exit_code(text: str | bytes | None) -> int | None:
    """The integer in an ``rc`` file, or None when it holds anything else (a job may overwrite it)."""
    if text is None:
        return None
    if isinstance(text, bytes):
        text = text.decode("ascii", "replace")
    text = text.strip()
    if not text or len(text) > 12 or not re.fullmatch(r"-?[0-9]+", text):
        return None
    value = int(text)
    return value if -(2**31) <= value < 2**31 else None


def parse_pid(text: str | bytes | None) -> int | None:
    """The process id in a ``pid`` file, or None when it is not one."""
    if text is None:
        return None
    if isinstance(text, bytes):
        text = text.decode("ascii", "replace")
    text = text.strip()
    if not text or len(text) > 10 or not text.isdigit():
        return None
    value = int(text)
    return value if 0 < value < 2**31 else None


def parse_metrics_line(raw: bytes | bytearray | str) -> dict[str, Any]:
    """One line of ``metrics.jsonl`` (written by the job): a bounded JSON object.

    Metric records are free-form by design (any scalar name a job logs), so only the envelope
    is checked here: size, encoding, depth, an object with at most ``MAX_METRICS_KEYS`` keys.
    NaN and Infinity are kept: a NaN loss is what the stop rules look for.
    """
    fields = _json_object(raw, MAX_METRICS_LINE_BYTES, "metrics line")
    if len(fields.data) > MAX_METRICS_KEYS:
        raise ProtocolError(f"metrics line: {len(fields.data)} keys, over the limit of {MAX_METRICS_KEYS}")
    return fields.data


# -- messages -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GuardConfig:
    """``<run dir>/guard.json``: what the on-node watchdog (``fleetrun_guard.py``) enforces.

    Written by the laptop (``WatchTarget.guard_config``), read by the node agent (to start the
    watchdog with the run id) and the watchdog. Limits in seconds; None switches a rule off.
    ``expects_metrics``: this node should see the job's metrics appear (the startup-timeout
    rule); ``upload_argv``: the command that copies the run directory to the bucket, with
    ``{src}`` for the directory (empty: no bucket). The cloud-specific part of an upload is
    decided on the laptop, so nodes need no per-cloud logic.
    """

    run_id: str
    node: str
    started_at: float
    peers: tuple[str, ...] = ()
    peer_port: int = 22
    starts_processes: bool = True
    expects_metrics: bool = True
    watcher_lost_after_s: float = 120.0
    nan_loss: bool = True
    stall_timeout_s: float | None = None
    startup_timeout_s: float | None = None
    max_wall_time_s: float | None = None
    unreachable_timeout_s: float | None = None
    upload_argv: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": VERSION,
            "run_id": self.run_id,
            "node": self.node,
            "started_at": self.started_at,
            "peers": list(self.peers),
            "peer_port": self.peer_port,
            "starts_processes": self.starts_processes,
            "expects_metrics": self.expects_metrics,
            "watcher_lost_after_s": self.watcher_lost_after_s,
            "nan_loss": self.nan_loss,
            "stall_timeout_s": self.stall_timeout_s,
            "startup_timeout_s": self.startup_timeout_s,
            "max_wall_time_s": self.max_wall_time_s,
            "unreachable_timeout_s": self.unreachable_timeout_s,
            "upload_argv": list(self.upload_argv),
        }

    def to_json(self) -> str:
        return encode(self.to_dict())

    @classmethod
    def from_json(cls, data: bytes | bytearray | str) -> GuardConfig:
        f = _json_object(data, MAX_GUARD_CONFIG_BYTES, "guard.json")
        upload_argv = f.strings("upload_argv", MAX_ARGV, _arg)
        if upload_argv and not any("{src}" in arg for arg in upload_argv):
            raise ProtocolError(
                "guard.json: field 'upload_argv': no '{src}' placeholder for the run directory"
            )
        lost = f.positive("watcher_lost_after_s")
        started = f.number("started_at", 0.0, MAX_TIMESTAMP, required=True)
        assert started is not None
        return cls(
            run_id=f.name("run_id"),
            node=f.name("node"),
            started_at=started,
            peers=f.strings("peers", MAX_PEERS, f.address),
            peer_port=f.integer("peer_port", 1, 65535, required=False, default=22),
            starts_processes=f.boolean("starts_processes", True),
            expects_metrics=f.boolean("expects_metrics", True),
            watcher_lost_after_s=120.0 if lost is None else lost,
            nan_loss=f.boolean("nan_loss", True),
            stall_timeout_s=f.positive("stall_timeout_s"),
            startup_timeout_s=f.positive("startup_timeout_s"),
            max_wall_time_s=f.positive("max_wall_time_s"),
            unreachable_timeout_s=f.positive("unreachable_timeout_s"),
            upload_argv=upload_argv,
        )


@dataclass(frozen=True)
class PollRequest:
    """One request on the watcher's poll channel: metrics from ``offset`` on; refresh the heartbeat?"""

    offset: int = 0
    heartbeat: bool = True

    def to_json(self) -> str:
        return encode({"op": "poll", "offset": self.offset, "heartbeat": self.heartbeat})

    @classmethod
    def from_json(cls, data: bytes | bytearray | str) -> PollRequest:
        f = _json_object(data, MAX_REQUEST_BYTES, "poll request")
        if f.data.get("op") != "poll":
            raise ProtocolError(f"poll request: field 'op': expected 'poll', got {_shown(f.data.get('op'))}")
        return cls(offset=f.integer("offset", 0, MAX_OFFSET), heartbeat=f.boolean("heartbeat", True))


@dataclass(frozen=True)
class StatusRecord:
    """``<run dir>/status.json``: the final record the metrics helper writes (``Metrics.finish``).

    ``status`` is a short word ("succeeded", "failed"); ``fields`` keeps the job's extra
    scalar fields (non-scalars are dropped; at most ``MAX_STATUS_FIELDS``).
    """

    status: str
    time: float | None = None
    step: int | None = None
    message: str = ""
    fields: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.fields,
            "status": self.status,
            "time": self.time,
            "step": self.step,
            "message": self.message,
        }

    def to_json(self) -> str:
        return encode(self.to_dict(), allow_nan=True)

    @classmethod
    def from_json(cls, data: bytes | bytearray | str) -> StatusRecord:
        return cls.from_dict(decode(data, MAX_STATUS_BYTES, "status.json"))

    @classmethod
    def from_dict(cls, data: object) -> StatusRecord:
        f = _Fields(data, "status.json")
        status = f.data.get("status")
        if not isinstance(status, str) or not _STATUS_WORD_RE.fullmatch(status):
            raise f._fail("status", "a short word such as 'succeeded' or 'failed'", status)
        extra: dict[str, Any] = {}
        for key, value in f.data.items():
            if key in ("status", "time", "step", "message") or len(extra) >= MAX_STATUS_FIELDS:
                continue
            if not isinstance(key, str) or len(key) > 128:
                continue
            if isinstance(value, str):
                extra[key] = _clip(value, MAX_ERROR)
            elif isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_INT:
                continue
            elif value is None or isinstance(value, (bool, int, float)):
                extra[key] = value
        return cls(
            status=status,
            time=f.number("time", 0.0, MAX_TIMESTAMP),
            step=f.optional_integer("step", -MAX_INT, MAX_INT),
            message=f.text("message", MAX_TEXT),
            fields=extra,
        )


@dataclass(frozen=True)
class PollAnswer:
    """The node agent's answer to one poll.

    ``metrics`` are the raw bytes of ``metrics.jsonl`` from the requested offset (base64 on the
    wire; a chunk may end inside a line), and ``offset`` is where the next poll starts.
    ``malformed`` names what the agent found unreadable on the node this time (an ``rc`` that is
    not a number, a ``status.json`` nested too deep): reported, never fatal. ``error`` is set
    when the agent could not answer the request at all.
    """

    state: str = "absent"
    rc: int | None = None
    offset: int = 0
    metrics: bytes = b""
    status: StatusRecord | None = None
    exited_at: float | None = None
    log_tail: str = ""
    gpu_util: float | None = None
    malformed: tuple[str, ...] = ()
    error: str = ""

    def to_json(self) -> str:
        return encode(
            {
                "state": self.state,
                "rc": self.rc,
                "offset": self.offset,
                "metrics_b64": base64.b64encode(self.metrics).decode("ascii"),
                "status": None if self.status is None else self.status.to_dict(),
                "exited_at": self.exited_at,
                "log_tail": self.log_tail,
                "gpu_util": self.gpu_util,
                "malformed": list(self.malformed),
                "error": self.error,
            },
            allow_nan=True,  # a status field may be NaN (finish(loss=nan)); Python reads it back
        )

    @classmethod
    def from_json(cls, data: bytes | bytearray | str) -> PollAnswer:
        f = _json_object(data, MAX_POLL_ANSWER_BYTES, "poll answer")
        error = f.text("error", MAX_ERROR)
        if error:
            return cls(error=error)
        state = f.data.get("state")
        if state not in STATES:
            raise f._fail("state", " / ".join(STATES), state)
        encoded = f.data.get("metrics_b64", "")
        if encoded is None:
            encoded = ""
        if not isinstance(encoded, str) or len(encoded) > 4 * (MAX_CHUNK // 3 + 1):
            raise f._fail("metrics_b64", f"base64 of at most {MAX_CHUNK} bytes", encoded)
        try:
            metrics = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            raise f._fail("metrics_b64", "base64", encoded) from None
        status = f.data.get("status")
        return cls(
            state=str(state),
            rc=f.optional_integer("rc", -(2**31), 2**31 - 1),
            offset=f.integer("offset", 0, MAX_OFFSET),
            metrics=metrics,
            status=None if status is None else StatusRecord.from_dict(status),
            exited_at=f.number("exited_at", 0.0, MAX_TIMESTAMP),
            log_tail=f.text("log_tail", MAX_LOG_TAIL, tail=True),
            gpu_util=f.number("gpu_util", 0.0, 100.0),
            malformed=f.strings("malformed", MAX_NOTES, _note),
        )


@dataclass(frozen=True)
class StartAnswer:
    """``fleetrun_node.py start|guard``: the job's wrapper pid (None for ``guard``), the watchdog's."""

    pid: int | None = None
    guard: int | None = None
    guard_error: str = ""

    def to_json(self) -> str:
        return encode({"pid": self.pid, "guard": self.guard, "guard_error": self.guard_error})

    @classmethod
    def from_json(cls, data: bytes | bytearray | str) -> StartAnswer:
        f = _json_object(data, MAX_SMALL_ANSWER_BYTES, "start answer")
        return cls(
            pid=f.optional_integer("pid", 1, 2**31 - 1),
            guard=f.optional_integer("guard", 1, 2**31 - 1),
            guard_error=f.text("guard_error", MAX_ERROR),
        )


@dataclass(frozen=True)
class StopAnswer:
    """``fleetrun_node.py stop``: processes of the run terminated, watchdogs among them, killed, left."""

    terminated: int = 0
    watchdogs: int = 0
    killed: int = 0
    remaining: int = 0

    def to_dict(self) -> dict[str, int]:
        return {
            "terminated": self.terminated,
            "watchdogs": self.watchdogs,
            "killed": self.killed,
            "remaining": self.remaining,
        }

    def to_json(self) -> str:
        return encode(self.to_dict())

    @classmethod
    def from_json(cls, data: bytes | bytearray | str) -> StopAnswer:
        return cls.from_dict(decode(data, MAX_SMALL_ANSWER_BYTES, "stop answer"), "stop answer")

    @classmethod
    def from_dict(cls, data: object, what: str) -> StopAnswer:
        f = _Fields(data, what)
        return cls(
            terminated=f.integer("terminated", 0, MAX_COUNT),
            watchdogs=f.integer("watchdogs", 0, MAX_COUNT, required=False, default=0),
            killed=f.integer("killed", 0, MAX_COUNT, required=False, default=0),
            remaining=f.integer("remaining", 0, MAX_COUNT),
        )


@dataclass(frozen=True)
class UploadRequest:
    """``fleetrun_node.py upload RUN_DIR REQUEST``: the command that copies the run directory.

    ``argv`` holds ``{src}`` where the run directory goes; empty means no bucket is configured.
    """

    argv: tuple[str, ...] = ()

    def to_json(self) -> str:
        return encode({"argv": list(self.argv)})

    @classmethod
    def from_json(cls, data: bytes | bytearray | str) -> UploadRequest:
        f = _json_object(data, MAX_SMALL_ANSWER_BYTES, "upload request")
        argv = f.strings("argv", MAX_ARGV, _arg)
        if argv and not any("{src}" in arg for arg in argv):
            raise ProtocolError("upload request: field 'argv': no '{src}' placeholder for the run directory")
        return cls(argv=argv)


@dataclass(frozen=True)
class UploadAnswer:
    """``fleetrun_node.py upload``: one sentence saying what happened, and whether it worked."""

    upload: str
    ok: bool = False

    def to_json(self) -> str:
        return encode({"upload": self.upload, "ok": self.ok})

    @classmethod
    def from_json(cls, data: bytes | bytearray | str) -> UploadAnswer:
        f = _json_object(data, MAX_SMALL_ANSWER_BYTES, "upload answer")
        if not isinstance(f.data.get("upload"), str):
            raise f._fail("upload", "a sentence", f.data.get("upload"))
        return cls(upload=f.text("upload", MAX_ERROR), ok=f.boolean("ok", False))


@dataclass(frozen=True)
class GuardOutcome:
    """``<run dir>/guard-outcome.json``: the watchdog's summary of a takeover.

    ``rule`` is the stop rule it enforced, or ``guard_error`` when its own code failed and it
    fell back to stopping the run.
    """

    rule: str
    reason: str
    time: float
    stopped: StopAnswer | None = None
    upload: str = ""
    malformed_lines: int = 0

    def to_json(self) -> str:
        return encode(
            {
                "rule": self.rule,
                "reason": self.reason,
                "time": self.time,
                "stopped": None if self.stopped is None else self.stopped.to_dict(),
                "upload": self.upload,
                "malformed_lines": self.malformed_lines,
            }
        )

    @classmethod
    def from_json(cls, data: bytes | bytearray | str) -> GuardOutcome:
        f = _json_object(data, MAX_SMALL_ANSWER_BYTES, "guard-outcome.json")
        stopped = f.data.get("stopped")
        time_ = f.number("time", 0.0, MAX_TIMESTAMP, required=True)
        assert time_ is not None
        return cls(
            rule=f.name("rule"),
            reason=f.text("reason", MAX_ERROR),
            time=time_,
            stopped=None if stopped is None else StopAnswer.from_dict(stopped, "guard-outcome.json: stopped"),
            upload=f.text("upload", MAX_ERROR),
            malformed_lines=f.integer("malformed_lines", 0, MAX_OFFSET, required=False, default=0),
        )


@dataclass(frozen=True)
class FileBundle:
    """Files the laptop sends on a command's stdin (``launch.sh``, ``guard.json``, ``setup.sh``).

    Secrets (environment values in ``launch.sh``) never travel in a command line, where other
    users of the machine read them in ``ps``. Names are plain file names inside the run directory.
    """

    files: Mapping[str, str]

    def to_json(self) -> str:
        return encode({"files": dict(self.files)})

    @classmethod
    def from_json(cls, data: bytes | bytearray | str) -> FileBundle:
        f = _json_object(data, MAX_BUNDLE_BYTES, "file bundle")
        files = f.data.get("files")
        if not isinstance(files, dict) or len(files) > MAX_BUNDLE_FILES:
            raise f._fail("files", f"an object of at most {MAX_BUNDLE_FILES} files", files)
        out: dict[str, str] = {}
        for name, content in files.items():
            if not _FILE_NAME_RE.fullmatch(name) or name.startswith("."):
                raise f._fail("files", "plain file names", name)
            if not isinstance(content, str) or len(content) > MAX_BUNDLE_FILE_BYTES:
                raise f._fail(f"files.{name}", f"text of at most {MAX_BUNDLE_FILE_BYTES} characters", content)
            out[name] = content
        return cls(files=out)


@dataclass(frozen=True)
class RelayTransfer:
    source: str
    dest: str
    filters: tuple[str, ...] = ()
    lib: bool = False


@dataclass(frozen=True)
class RelayTarget:
    name: str
    user: str
    address: str
    port: int = 22
    ship_lib: bool = True


@dataclass(frozen=True)
class RelayConfig:
    """The head's instructions for the sync relay (``fleetrun_relay.py``), written by the laptop."""

    key: str
    known_hosts: str
    transfers: tuple[RelayTransfer, ...]
    targets: tuple[RelayTarget, ...]
    parallel: int = 16
    timeout: float = 1800.0

    @classmethod
    def from_json(cls, data: bytes | bytearray | str) -> RelayConfig:
        f = _json_object(data, MAX_RELAY_CONFIG_BYTES, "relay config")
        transfers = []
        for raw in f.objects("transfers", MAX_RELAY_TRANSFERS):
            t = _Fields(raw, "relay config: transfer")
            transfers.append(
                RelayTransfer(
                    source=t.path("source"),
                    dest=t.path("dest"),
                    filters=t.strings("filters", MAX_FILTERS, _arg),
                    lib=t.boolean("lib", False),
                )
            )
        targets = []
        for raw in f.objects("targets", MAX_RELAY_TARGETS):
            t = _Fields(raw, "relay config: target")
            targets.append(
                RelayTarget(
                    name=t.name("name"),
                    user=t.name("user"),
                    address=t.address(t.data.get("address"), "address"),
                    port=t.integer("port", 1, 65535, required=False, default=22),
                    ship_lib=t.boolean("ship_lib", True),
                )
            )
        timeout = f.positive("timeout", 86400.0)
        return cls(
            key=f.path("key"),
            known_hosts=f.path("known_hosts"),
            transfers=tuple(transfers),
            targets=tuple(targets),
            parallel=f.integer("parallel", 1, 1024, required=False, default=16),
            timeout=1800.0 if timeout is None else timeout,
        )


@dataclass(frozen=True)
class RelayResult:
    """One line of the relay's output: how the copy to one worker went."""

    name: str
    ok: bool
    files: int = 0
    sent_bytes: int = 0
    error: str = ""

    def to_json(self) -> str:
        return encode(
            {
                "name": self.name,
                "ok": self.ok,
                "files": self.files,
                "bytes": self.sent_bytes,
                "error": self.error,
            }
        )

    @classmethod
    def from_json(cls, data: bytes | bytearray | str) -> RelayResult:
        f = _json_object(data, MAX_SMALL_ANSWER_BYTES, "relay result")
        return cls(
            name=f.name("name"),
            ok=f.boolean("ok", False),
            files=f.integer("files", 0, MAX_OFFSET, required=False, default=0),
            sent_bytes=f.integer("bytes", 0, MAX_OFFSET, required=False, default=0),
            error=f.text("error", MAX_ERROR),
        )
