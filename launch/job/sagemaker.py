"""A playbook's ``hyperparameters:`` and named data ``channels:``, as SageMaker defines them.

SageMaker passes a job's hyperparameters to its entry point twice: as command-line arguments
(``--name value``, names sorted, a one-letter name as ``-n``; strings as they are, other values
with ``str``) and as environment (``SM_HPS``, a JSON object, and one ``SM_HP_<NAME>`` each, where
strings are as they are and other values JSON). Data arrives as named channels, each a folder
(``SM_CHANNEL_<NAME>``; their names in ``SM_CHANNELS``). The functions here reproduce those
encodings (the rules of sagemaker-training-toolkit's ``mapping.to_cmd_args``/``to_env_vars``),
so a script written for SageMaker reads the same values under fleetrun.

A channel is a folder on every node (``training: /data/digits/train``, or ``{path: ...}``), a
folder on this machine (``{local: data/test}``, relative to the playbook) that ``fab train``
copies to every node before the start, or a prefix in the fleet's bucket (``{bucket:
datasets/digits}``) that every node copies from the bucket with its own role before the start
(both land in ``~/.fleetrun/data/<job>/<channel>``).

Pure: validation only; the launchers turn these into environment and arguments.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from launch.job.shell_text import CONTROL_CHARS

HP_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}")
"""A hyperparameter name: it becomes ``--name`` and ``SM_HP_<NAME>`` (``batch-size`` is allowed,
as on SageMaker, where scripts read ``--batch-size``)."""
CHANNEL_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
"""A channel name as SageMaker's API takes it (letters, digits, ``.``, ``-``, ``_``; here at most
64, not starting with ``.``/``-``/``_``): it becomes ``SM_CHANNEL_<NAME>``, upper-cased and otherwise kept, as the
training toolkit writes it (``train-set`` is ``SM_CHANNEL_TRAIN-SET``; like ``SM_HP_BATCH-SIZE``,
such a name is passed by ``env`` on the command that starts the job, since ``sh`` cannot export it)."""
MAX_HYPERPARAMETERS = 256
MAX_CHANNELS = 64
MAX_HP_VALUE_CHARS = 4096
MAX_PATH_CHARS = 4096
BUCKET_PREFIX_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._=+-]*(/[A-Za-z0-9_][A-Za-z0-9._=+-]*)*/?")
"""A key prefix inside the fleet's bucket: relative, no ``..``, no URL scheme (the bucket is the fleet's)."""

HyperparameterScalar = bool | int | float | str
HyperparameterValue = bool | int | float | str | list[HyperparameterScalar] | dict[str, HyperparameterScalar]
"""What SageMaker's estimators accept: a scalar, or a list or mapping of scalars (``layers: [64, 32]``
arrives as ``--layers "[64, 32]"``, as the training toolkit writes it with ``str``)."""
MAX_HP_ITEMS = 256


class Channel(BaseModel):
    """One named data channel: ``path`` on the nodes, ``local`` on this machine (synced), or a
    ``bucket`` prefix (copied from the fleet's bucket by each node)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str | None = Field(default=None, max_length=MAX_PATH_CHARS)
    """A folder that already exists on every node (``/data/x``)."""
    local: str | None = Field(default=None, max_length=MAX_PATH_CHARS)
    """A folder on this machine, relative to the playbook, copied to ``~/.fleetrun/data/<job>/<channel>`` on every node before the start."""
    bucket: str | None = Field(default=None, max_length=1024)
    """A key prefix in the fleet's bucket, copied by each node with its own role (cloud stacks only)."""

    @model_validator(mode="after")
    def _one_source(self) -> Channel:
        given = [
            getattr(self, name) for name in ("path", "local", "bucket") if getattr(self, name) is not None
        ]
        if len(given) != 1:
            raise ValueError(
                "expected exactly one of 'path' (a folder on every node), 'local' (a folder here, synced) "
                "or 'bucket' (a prefix in the fleet's bucket)"
            )
        value = given[0]
        if not value.strip() or CONTROL_CHARS.search(value):
            raise ValueError("expected a folder path without control characters")
        if self.bucket is not None and (
            not BUCKET_PREFIX_RE.fullmatch(self.bucket) or ".." in self.bucket.split("/")
        ):
            raise ValueError(
                f"bucket: {self.bucket[:80]!r} is not a key prefix inside the fleet's bucket (relative, "
                "letters, digits, '._=+-/', no '..'; the bucket itself is the fleet's)"
            )
        return self

    @property
    def copied(self) -> bool:
        """Whether fleetrun copies this channel to ``~/.fleetrun/data/<job>/<name>`` (local, bucket)."""
        return self.path is None


def _check_names(names: Iterable[str], pattern: re.Pattern[str], rule: str, env_prefix: str) -> None:
    """Each name matches ``pattern`` (``rule`` says how), and no two differ only in case: both
    would be the one environment variable ``<env_prefix><NAME>``."""
    seen: dict[str, str] = {}
    for name in names:
        if not pattern.fullmatch(name):
            raise ValueError(f"{name[:80]!r} is not a valid {rule}")
        other = seen.setdefault(name.upper(), name)
        if other != name:
            raise ValueError(f"{other!r} and {name!r} would both be {env_prefix}{name.upper()}")


def _type_name(value: object) -> str:
    if value is None:
        return "null"
    return {bool: "true/false", dict: "a mapping", list: "a list"}.get(type(value), type(value).__name__)


def _scalar(value: object) -> bool:
    return isinstance(value, bool | int | float | str)


def _leaves(item: object) -> list[object]:
    """A hyperparameter's scalars: itself, a list's items, or a mapping's keys and values."""
    if isinstance(item, dict):
        return [part for pair in item.items() for part in pair]
    return list(item) if isinstance(item, list) else [item]


def hyperparameter_shape_problems(value: object) -> object:
    """Before the typed check: one line per hyperparameter whose value is not one SageMaker passes
    (null, a nested list, a list in a mapping), naming the hyperparameter, not pydantic's union
    members (``.bool``, ``.int``, ...). Raises ``ValueError``; returns ``value`` when it is fine."""
    if not isinstance(value, dict):
        return value
    expected = "expected a number, a string, true/false, or a list or mapping of those"
    for name, item in value.items():
        shown = str(name)[:80]
        if not isinstance(item, list | dict):
            if _scalar(item):
                continue
            raise ValueError(f"{shown}: {expected}, got {_type_name(item)}")
        if len(item) > MAX_HP_ITEMS:
            raise ValueError(f"{shown}: at most {MAX_HP_ITEMS} items, got {len(item)}")
        bad_key = next((k for k in item if not isinstance(k, str)), None) if isinstance(item, dict) else None
        if bad_key is not None:
            raise ValueError(f"{shown}: a mapping's keys must be strings, got {_type_name(bad_key)}")
        bad = next((x for x in _leaves(item) if not _scalar(x)), None)
        if bad is not None or None in _leaves(item):
            raise ValueError(
                f"{shown}: {expected} (one level deep), got {_type_name(item)} holding {_type_name(bad)}"
            )
    return value


Hyperparameters = Annotated[dict[str, HyperparameterValue], BeforeValidator(hyperparameter_shape_problems)]
"""A playbook's ``hyperparameters:`` field: shapes SageMaker cannot pass are named before the typed check."""


def check_hyperparameters(value: dict[str, HyperparameterValue]) -> dict[str, HyperparameterValue]:
    """Names usable as ``--name`` and ``SM_HP_<NAME>``; scalar values that JSON and a shell can carry."""
    _check_names(
        value,
        HP_NAME_RE,
        "hyperparameter name (a letter or '_' first, then letters, digits, '_', '-', '.'; at most 64 characters)",
        "SM_HP_",
    )
    for name, item in value.items():
        for part in _leaves(item):
            if isinstance(part, float) and not math.isfinite(part):
                raise ValueError(f"{name}: expected a finite number, got {part!r}")
            if isinstance(part, str) and (len(part) > MAX_HP_VALUE_CHARS or CONTROL_CHARS.search(part)):
                raise ValueError(
                    f"{name}: a value must be one line without control characters, at most {MAX_HP_VALUE_CHARS} characters"
                )
        if len(cli_value(item)) > MAX_HP_VALUE_CHARS:
            raise ValueError(f"{name}: longer than {MAX_HP_VALUE_CHARS} characters as an argument")
    return value


def check_channel_names(value: dict[str, Channel]) -> dict[str, Channel]:
    _check_names(
        value,
        CHANNEL_NAME_RE,
        "channel name (a letter or digit first, then letters, digits, '_', '-', '.'; it becomes SM_CHANNEL_<NAME>)",
        "SM_CHANNEL_",
    )
    return value


def channel_from_yaml(value: object) -> object:
    """``training: /data/x`` is short for ``training: {path: /data/x}``."""
    return {"path": value} if isinstance(value, str) else value


def cli_value(value: HyperparameterValue) -> str:
    """A value on the command line, as SageMaker writes it (``mapping.to_cmd_args``: ``str``, so
    ``True``, ``0.01``, ``64``, ``[64, 32]``; a mapping as ``k=v,k2=v2``, keys sorted)."""
    if isinstance(value, dict):
        return ",".join(f"{k}={v}" for k, v in sorted(value.items()))
    return str(value)


def env_value(value: HyperparameterValue) -> str:
    """A value in ``SM_HP_<NAME>``, as SageMaker writes it (``mapping.to_env_vars``: strings as they
    are, others as compact JSON with sorted keys)."""
    return value if isinstance(value, str) else json_text(value)


def hyperparameter_args(hyperparameters: dict[str, HyperparameterValue]) -> list[str]:
    """``--name value`` per hyperparameter, names sorted; a one-letter name is ``-n``."""
    args: list[str] = []
    for name in sorted(hyperparameters):
        args += [f"--{name}" if len(name) > 1 else f"-{name}", cli_value(hyperparameters[name])]
    return args


def hyperparameter_env(hyperparameters: dict[str, HyperparameterValue]) -> dict[str, str]:
    """``SM_HPS`` and ``SM_HP_<NAME>`` for each (names upper-cased, as SageMaker does)."""
    env = {"SM_HPS": json.dumps(hyperparameters, sort_keys=True, separators=(",", ":"))}
    for name, value in hyperparameters.items():
        env[f"SM_HP_{name.upper()}"] = env_value(value)
    return env


def json_text(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))
