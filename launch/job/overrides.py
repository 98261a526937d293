"""``--set key=value``: change a playbook's field for one run without copying the file.

A researcher who wants 2 nodes instead of 3, or another learning rate, should not copy and
``sed`` the playbook (the copy drifts from the original, and the record no longer says what
changed). An override is a dotted path into the playbook's mapping (``nodes``,
``hyperparameters.lr``, ``env.NCCL_DEBUG``, ``stop.max_wall_time_s``) and a value written as it
would be in the file: the value is read as YAML (``2`` is an integer, ``0.01`` a float, ``[a, b]``
a list, ``2:3`` the elastic string), so it passes through exactly the validation the file does and
fails with the same one-line error, which then names the ``--set`` that caused it. Only ``env.X``
values are kept as the text typed: an environment variable is always a string (``env.SEED=1``).

Overrides are applied to the file's data before validation, so ``--set workdir=../other`` is
relative to the playbook like the file's own ``workdir``. They are recorded with the run (``fab
show``, ``fab compare``) as ``{key: value}``.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from launch.errors import SpecError
from launch.job.validation import describe_validation_error, parse_yaml, printable

MAX_OVERRIDES = 64
MAX_DEPTH = 4
MAX_VALUE_CHARS = 8192
PART_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]{0,127}")
STRING_VALUED = ("env",)
"""Top-level mappings whose values are strings whatever they look like."""


@dataclass(frozen=True)
class Override:
    """One ``--set``: where (``path``), the text as typed, and the value it stands for."""

    path: tuple[str, ...]
    text: str
    value: Any

    @property
    def key(self) -> str:
        return ".".join(self.path)

    @property
    def shown(self) -> str:
        """``--set nodes=2`` as an error message quotes it (bounded, printable)."""
        return f"--set {printable(self.key, 200)}={printable(self.text, 80)}"


def parse_override(item: str) -> Override:
    """``key=value`` checked and its value read (errors are one line naming the ``--set``)."""
    key, sep, text = item.partition("=")
    if not sep or not key.strip():
        raise SpecError(
            f"--set {printable(item, 120)!r}: expected key=value, e.g. --set nodes=2 or --set hyperparameters.lr=0.01"
        )
    key = key.strip()
    parts = tuple(key.split("."))
    if len(parts) > MAX_DEPTH or not all(PART_RE.fullmatch(p) for p in parts):
        raise SpecError(
            f"--set {printable(key, 200)!r}: expected a field name or a dotted path of at most {MAX_DEPTH} "
            "names (letters, digits, '_', '-'), e.g. stop.max_wall_time_s"
        )
    if len(text) > MAX_VALUE_CHARS:
        raise SpecError(f"--set {printable(key, 200)}: the value is longer than {MAX_VALUE_CHARS} characters")
    if parts[0] in STRING_VALUED and len(parts) == 2:
        return Override(parts, text, text)
    return Override(parts, text, parse_yaml(text, f"--set {key}"))


def parse_overrides(items: Iterable[str] | None) -> tuple[Override, ...]:
    """Every ``--set`` of a command line, in order (a later one of the same key wins, as in Hydra)."""
    parsed = tuple(parse_override(item) for item in (items or ()))
    if len(parsed) > MAX_OVERRIDES:
        raise SpecError(f"--set: at most {MAX_OVERRIDES} overrides, got {len(parsed)}")
    return parsed


def apply_overrides(data: dict[str, Any], overrides: Sequence[Override], source: str) -> dict[str, Any]:
    """A copy of a playbook's data with the overrides written in; a missing mapping on the way is
    created (``stop.max_wall_time_s`` on a playbook without ``stop:``), a scalar on the way is an
    error naming the ``--set`` (``nodes.x=1``)."""
    result = copy.deepcopy(data)
    for item in overrides:
        node: dict[str, Any] = result
        for depth, part in enumerate(item.path[:-1]):
            child = node.setdefault(part, {})
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                where = ".".join(item.path[: depth + 1])
                raise SpecError(
                    f"{printable(source, 400)}: {item.shown}: field '{printable(where, 200)}' holds "
                    f"{type(child).__name__} {printable(repr(child), 60)}, not a mapping of fields"
                )
            node = child
        node[item.path[-1]] = copy.deepcopy(item.value)
    return result


def _loc_key(loc: Sequence[Any]) -> str:
    return ".".join(str(part) for part in loc if not isinstance(part, int))


def blamed(loc: Sequence[Any], overrides: Sequence[Override]) -> Override | None:
    """The last ``--set`` at or under (or above) the field an error is about, if any."""
    where = _loc_key(loc)
    for item in reversed(overrides):
        key = item.key
        if where == key or where.startswith(key + ".") or key.startswith(where + "."):
            return item
    return None


def describe_errors(source: str, exc: ValidationError, overrides: Sequence[Override]) -> str:
    """``describe_validation_error``'s lines; a line caused by a ``--set`` names it after the file:
    ``job.yaml: --set nodes=zero: field 'nodes': expected an integer ...``."""
    lines = describe_validation_error(source, exc).split("\n")
    prefix = f"{printable(source, 400)}: "
    out = []
    for line, err in zip(lines, exc.errors(), strict=False):
        item = blamed(tuple(err.get("loc", ())), overrides)
        if item is not None and line.startswith(prefix):
            line = f"{prefix}{item.shown}: {line[len(prefix) :]}"
        out.append(line)
    return "\n".join(out)


def overrides_record(overrides: Sequence[Override]) -> dict[str, Any]:
    """``{key: value}`` as recorded with the run (a later ``--set`` of one key wins)."""
    return {item.key: item.value for item in overrides}
