"""Read untrusted playbooks and inventories, and say what is wrong in one line per problem.

A researcher who mistypes ``nodes: zero`` should read
``playbooks/job.yaml: field 'nodes': expected an integer >= 1, got 'zero'``, not a traceback.

Files are untrusted input, so reading them is bounded before any parsing: a size cap (a
100 MB "playbook" is refused unread), strict UTF-8, duplicate keys refused (YAML silently keeps
the last one, so a reviewer and fleetrun would read different files), and a cap on the values
an alias may expand to (the "billion laughs" file is a few hundred bytes that expand to 10**9
values once a validator walks them). Everything echoed back (paths, field names, values) goes
through ``printable`` so an error message stays one line and never carries control characters.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from launch.errors import SpecError

MAX_FILE_BYTES = 1024 * 1024
"""Largest playbook, inventory or stack-outputs file read (1 MiB: real ones are a few KiB)."""

MAX_VALUES = 100_000
"""Most scalars, lists and mappings a file may hold once aliases are expanded."""

MAX_ALIASES = 1_000
MAX_SHOWN = 120
"""Longest value quoted back in an error message."""


def printable(value: object, limit: int = MAX_SHOWN) -> str:
    """``value`` as one printable line: controls, newlines and undecodable bytes escaped, length capped."""
    text = str(value)
    cut = len(text) > limit
    text = text[:limit]
    out = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return out + ("..." if cut else "")


def shown_value(value: object) -> str:
    """A value as Python would write it (quotes show where it starts and ends), capped."""
    text = repr(value)
    return text if len(text) <= MAX_SHOWN else text[:MAX_SHOWN] + "..."


def _field_path(loc: tuple[Any, ...]) -> str:
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        else:
            parts.append(("." if parts else "") + printable(item, 80))
    return "".join(parts) or "(top level)"


def _expectation(err: Any) -> str:
    kind = err.get("type", "")
    ctx = err.get("ctx") or {}
    if kind == "missing":
        return "this field is required"
    if kind == "extra_forbidden":
        return "unknown field (check the spelling; see the documented fields)"
    if kind in ("greater_than_equal", "greater_than", "less_than_equal", "less_than"):
        return f"expected a value {err['msg'].split('should be ', 1)[-1]}"
    if kind == "literal_error":
        return f"expected one of {ctx.get('expected', '?')}"
    msg = str(err.get("msg", "invalid value"))
    if kind == "value_error":
        msg = msg.removeprefix("Value error, ")
    return printable(msg[0].lower() + msg[1:] if msg else "invalid value", 400)


_SAYS_ITS_FIELD = re.compile(r"field '([^']{1,200})': (.*)", re.DOTALL)
_SAYS_ITS_HOST = re.compile(r"(hosts\[\d{1,6}\])(?: \(([^)]{0,200})\))?: (.*)", re.DOTALL)


def _located(expectation: str) -> tuple[str, str, str] | None:
    """(field, host, rest) for a whole-file check whose message says where the problem is itself:
    ``field 'nodes': ...`` or ``hosts[1] (gpu2): [field 'proxy_jump': ]...``. Such a check sees
    the whole file, so pydantic gives it no field; without this its message read
    ``field '(top level)': hosts[1] (gpu2): field 'proxy_jump': ...``."""
    match = _SAYS_ITS_FIELD.fullmatch(expectation)
    if match:
        return match.group(1), "", match.group(2)
    match = _SAYS_ITS_HOST.fullmatch(expectation)
    if match:
        where, name, rest = match.groups()
        inner = _SAYS_ITS_FIELD.fullmatch(rest)
        if inner:
            where, rest = f"{where}.{inner.group(1)}", inner.group(2)
        return where, f" ({name})" if name else "", rest
    return None


def describe_validation_error(source: str, exc: ValidationError) -> str:
    """One line per problem: ``<source>: field '<path>': <expectation>, got <value>``."""
    lines = []
    for err in exc.errors():
        loc = tuple(err.get("loc", ()))
        path, host, expectation = _field_path(loc), "", _expectation(err)
        located = None if loc else _located(expectation)
        if located is not None:
            path, host, expectation = located
        got = ""
        if err.get("type") not in ("missing",) and "input" in err and ", got " not in expectation:
            value = err["input"]
            if not isinstance(value, dict | list):
                got = f", got {shown_value(value)}"
        lines.append(f"{printable(source, 400)}: field '{path}'{host}: {expectation}{got}")
    return "\n".join(lines)


def read_bytes_bounded(path: Path, what: str, limit: int = MAX_FILE_BYTES) -> bytes:
    """The file's bytes, read once, refused with one clear line when missing, not a file or too big.

    Whoever checks a file's digest (an allowance, a trust record) and parses it hashes and parses
    these same bytes: a second read could see another file swapped in between."""
    shown = printable(path, 400)
    try:
        if not path.exists():
            raise SpecError(f"{shown}: {what} file not found")
        if not path.is_file():
            raise SpecError(f"{shown}: {what} is not a regular file")
        with path.open("rb") as handle:
            data = handle.read(limit + 1)
    except OSError as exc:
        raise SpecError(f"{shown}: cannot read the {what}: {printable(exc.strerror or exc)}") from None
    if len(data) > limit:
        raise SpecError(f"{shown}: {what} file is larger than {limit // 1024} KiB; refusing to parse it")
    return data


def decode_text(data: bytes, path: Path, what: str) -> str:
    """``data`` (read from ``path``) as UTF-8 text, or one line naming the file and the byte."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError(f"{printable(path, 400)}: {what} is not valid UTF-8 (byte {exc.start})") from None


def read_text_bounded(path: Path, what: str, limit: int = MAX_FILE_BYTES) -> str:
    """The file's text, refused with one clear line when missing, not a file, too big or not UTF-8."""
    return decode_text(read_bytes_bounded(path, what, limit), path, what)


class StrictSafeLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses duplicate keys and counts aliases."""

    aliases_seen = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            self.aliases_seen += 1
            if self.aliases_seen > MAX_ALIASES:
                event = self.peek_event()
                raise yaml.constructor.ConstructorError(
                    None, None, f"more than {MAX_ALIASES} aliases", event.start_mark
                )
        return super().compose_node(parent, index)

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node)
            try:
                duplicate = key in seen
            except TypeError:
                continue
            if duplicate:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {shown_value(key)}", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _check_expanded_size(data: Any, source: str) -> None:
    """Refuse structures that hold more than ``MAX_VALUES`` values once shared references are expanded.

    Iterative, with a budget: a self-referencing list or an alias bomb stops the walk early.
    """
    budget = MAX_VALUES
    stack = [data]
    while stack:
        item = stack.pop()
        budget -= 1
        if budget < 0:
            raise SpecError(
                f"{printable(source, 400)}: more than {MAX_VALUES} values once YAML aliases are expanded "
                "(an alias bomb?); refusing it"
            )
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def _yaml_error(source: str, exc: yaml.YAMLError) -> SpecError:
    mark = getattr(exc, "problem_mark", None)
    where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
    problem = getattr(exc, "problem", None) or str(exc)
    return SpecError(f"{printable(source, 400)}: not valid YAML{where}: {printable(problem, 200)}")


_INT_TAG = "tag:yaml.org,2002:int"
# YAML 1.1 reads ``2:3`` as the base-60 integer 123, which turns ``nodes: 2:3`` (elastic MIN:MAX)
# into 123 nodes; YAML 1.2 dropped base 60. Integers here are YAML 1.1's without it.
StrictSafeLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != _INT_TAG]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
StrictSafeLoader.add_implicit_resolver(
    _INT_TAG,
    re.compile(
        r"^(?:[-+]?0b[0-1_]+|[-+]?0[0-7_]+|[-+]?(?:0|[1-9][0-9_]*)|[-+]?0x[0-9a-fA-F_]+)$",
    ),
    list("-+0123456789"),
)
# YAML 1.1 reads ``1e-3`` (no dot) as a string, YAML 1.2 and every SageMaker/JSON user as 0.001: a
# hyperparameter ``lr: 1e-3`` must arrive as the number. Floats here are YAML 1.1's plus 1.2's; one
# that overflows (``1e400``) stays the text it was, so no field quietly gets infinity.
_EXPONENT_FLOAT_TAG = "tag:fleetrun,2026:yaml12-float"
StrictSafeLoader.add_implicit_resolver(
    _EXPONENT_FLOAT_TAG,
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def _exponent_float(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> float | str:
    text = loader.construct_scalar(node)
    number = float(text.replace("_", ""))
    return number if math.isfinite(number) else text


StrictSafeLoader.add_constructor(_EXPONENT_FLOAT_TAG, _exponent_float)


def parse_yaml(text: str, source: str) -> Any:
    """YAML text as data, bounded (see the module docstring); errors name the source and the line."""
    loader = StrictSafeLoader(text)
    try:
        data = loader.get_single_data()
    except yaml.YAMLError as exc:
        raise _yaml_error(source, exc) from None
    except RecursionError:
        raise SpecError(f"{printable(source, 400)}: not valid YAML: nested too deeply") from None
    finally:
        loader.dispose()
    _check_expanded_size(data, source)
    return data


def load_yaml_mapping(path: Path, what: str) -> dict[str, Any]:
    """Read a YAML file that must hold a mapping; errors name the file and the line."""
    return yaml_mapping(read_bytes_bounded(path, what), path, what)


def yaml_mapping(data: bytes, path: Path, what: str) -> dict[str, Any]:
    """``data``, the bytes read from ``path``, as a YAML mapping (``load_yaml_mapping``'s parse)."""
    parsed = parse_yaml(decode_text(data, path, what), str(path))
    if not isinstance(parsed, dict):
        raise SpecError(
            f"{printable(path, 400)}: expected a mapping of fields at the top level, got {type(parsed).__name__}"
        )
    return parsed


def _refuse_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise ValueError(f"duplicate key {shown_value(key)}")
        result[key] = value
    return result


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def load_json_mapping(path: Path, what: str) -> dict[str, Any]:
    """Read a JSON file that must hold an object: bounded, UTF-8, no duplicate keys, no NaN/Infinity."""
    return json_mapping(read_bytes_bounded(path, what), path, what)


def json_mapping(raw: bytes, path: Path, what: str) -> dict[str, Any]:
    """``raw``, the bytes read from ``path``, as a JSON object (``load_json_mapping``'s parse)."""
    text = decode_text(raw, path, what)
    try:
        data = json.loads(text, object_pairs_hook=_refuse_duplicates, parse_constant=_refuse_constant)
    except json.JSONDecodeError as exc:
        raise SpecError(
            f"{printable(path, 400)}: not valid JSON (line {exc.lineno}, column {exc.colno}): {exc.msg}"
        ) from None
    except (ValueError, RecursionError) as exc:
        problem = "nested too deeply" if isinstance(exc, RecursionError) else printable(exc, 200)
        raise SpecError(f"{printable(path, 400)}: not valid JSON: {problem}") from None
    if not isinstance(data, dict):
        raise SpecError(
            f"{printable(path, 400)}: expected a JSON object of {what}, got {type(data).__name__}"
        )
    _check_expanded_size(data, str(path))
    return data
