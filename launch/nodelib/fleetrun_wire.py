"""The wire rules of the node protocol: bounded decoding and typed field readers.

Split from ``fleetrun_protocol`` (the messages) so each stays small. Everything here is what a
message reader needs to refuse hostile input cheaply: byte and depth bounds checked *before*
``json.loads`` recurses, integer digit limits, and one ``_Fields`` reader per message that names
the message and the field in every error. Standard library only, Python 3.8 at run time; shipped
to nodes beside ``fleetrun_protocol``.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

__all__ = [
    "KiB",
    "is_name",
    "MAX_ARG",
    "MAX_ARGV",
    "MAX_BUNDLE_BYTES",
    "MAX_BUNDLE_FILES",
    "MAX_BUNDLE_FILE_BYTES",
    "MAX_CHUNK",
    "MAX_COUNT",
    "MAX_DEPTH",
    "MAX_DURATION_S",
    "MAX_ERROR",
    "MAX_FILTERS",
    "MAX_GUARD_CONFIG_BYTES",
    "MAX_INT",
    "MAX_INT_DIGITS",
    "MAX_LOG_TAIL",
    "MAX_METRICS_KEYS",
    "MAX_METRICS_LINE_BYTES",
    "MAX_NAME",
    "MAX_NOTE",
    "MAX_NOTES",
    "MAX_OFFSET",
    "MAX_PEERS",
    "MAX_POLL_ANSWER_BYTES",
    "MAX_RELAY_CONFIG_BYTES",
    "MAX_RELAY_TARGETS",
    "MAX_RELAY_TRANSFERS",
    "MAX_REQUEST_BYTES",
    "MAX_SMALL_ANSWER_BYTES",
    "MAX_STATUS_BYTES",
    "MAX_STATUS_FIELDS",
    "MAX_TEXT",
    "MAX_TIMESTAMP",
    "MiB",
    "ProtocolError",
    "STATES",
    "VERSION",
    "_ADDRESS_RE",
    "_FILE_NAME_RE",
    "_Fields",
    "_NAME_RE",
    "_STATUS_WORD_RE",
    "_STRING_REST_RE",
    "_TOKEN_RE",
    "_arg",
    "_bounded_int",
    "_clip",
    "_clip_tail",
    "_json_object",
    "_kind",
    "_note",
    "_shown",
    "_within_depth",
    "decode",
    "encode",
    "parse_exit_code",
    "parse_metrics_line",
    "parse_pid",
]

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


def is_name(value: str) -> bool:
    """Whether ``value`` is a plain name (a run id, a job): what ``name`` fields accept."""
    return bool(_NAME_RE.fullmatch(value)) and ".." not in value


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
