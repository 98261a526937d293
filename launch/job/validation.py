"""Turn pydantic validation errors into one message that names the file, the field and the expectation.

A researcher who mistypes ``nodes: zero`` should read
``playbooks/job.yaml: field 'nodes': expected an integer >= 1, got 'zero'``, not a traceback.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from launch.errors import SpecError


def _field_path(loc: tuple[Any, ...]) -> str:
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        else:
            parts.append(("." if parts else "") + str(item))
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
    return msg[0].lower() + msg[1:] if msg else "invalid value"


def describe_validation_error(source: str, exc: ValidationError) -> str:
    """One line per problem: ``<source>: field '<path>': <expectation>, got <value>``."""
    lines = []
    for err in exc.errors():
        path = _field_path(tuple(err.get("loc", ())))
        got = ""
        if err.get("type") not in ("missing",) and "input" in err:
            value = err["input"]
            if not isinstance(value, dict | list):
                got = f", got {value!r}"
        lines.append(f"{source}: field '{path}': {_expectation(err)}{got}")
    return "\n".join(lines)


def load_yaml_mapping(path: Path, what: str) -> dict[str, Any]:
    """Read a YAML file that must hold a mapping; errors name the file and the line."""
    if not path.exists():
        raise SpecError(f"{path}: {what} file not found")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise SpecError(f"{path}: not valid YAML{where}: {problem}") from None
    if not isinstance(data, dict):
        raise SpecError(f"{path}: expected a mapping of fields at the top level, got {type(data).__name__}")
    return data
