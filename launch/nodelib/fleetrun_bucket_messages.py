"""Checkpoint and preemption messages: how a node reaches its run's bucket (``BucketCommands``),
a checkpoint's ``MANIFEST.json`` (``Manifest``), the bucket's ``LATEST.json`` pointer
(``BucketPointer``) and the watchdog's preemption record (``PreemptionNotice``, the flag file
``preempt.json`` that the checkpoint helper and the node agent read).

Kept apart from ``fleetrun_protocol`` (which re-exports them) so each module stays small; the same
rules hold: bounded, typed, only ``ProtocolError`` on bad input. A manifest or a pointer is written
by the job (the checkpoint helper runs in the training process), so the watchdog and a resuming
rank read it like any other untrusted file. Standard library only, Python 3.8 at run time.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING or __package__:
    from launch.nodelib.fleetrun_wire import (
        MAX_ARGV,
        MAX_ERROR,
        MAX_INT,
        MAX_OFFSET,
        MAX_SMALL_ANSWER_BYTES,
        MAX_TIMESTAMP,
        KiB,
        MiB,
        ProtocolError,
        _arg,
        _Fields,
        _json_object,
        encode,
    )
else:  # on a node: beside this file in ~/.fleetrun/lib
    from fleetrun_wire import (  # type: ignore[no-redef]
        MAX_ARGV,
        MAX_ERROR,
        MAX_INT,
        MAX_OFFSET,
        MAX_SMALL_ANSWER_BYTES,
        MAX_TIMESTAMP,
        KiB,
        MiB,
        ProtocolError,
        _arg,
        _Fields,
        _json_object,
        encode,
    )

__all__ = [
    "MAX_MANIFEST_BYTES",
    "MAX_MANIFEST_FILES",
    "MAX_POINTER_BYTES",
    "POLLERS",
    "BucketCommands",
    "BucketPointer",
    "Manifest",
    "PreemptionNotice",
    "env_field",
]

MAX_MANIFEST_BYTES = 4 * MiB
MAX_MANIFEST_FILES = 10000
MAX_POINTER_BYTES = 64 * KiB
MAX_POINTER_STEPS = 64
MAX_BUCKET_ENV = 16
POLLERS = ("ec2-imdsv2", "gce-metadata")
"""The preemption-notice pollers the watchdog knows (``fleetrun_preempt.POLLERS``); the laptop's
cloud module names one in ``guard.json``."""
_ENV_NAME_RE = re.compile(r"[A-Z][A-Z0-9_]{0,63}")
_URL_RE = re.compile(r"[a-z][a-z0-9+.-]{0,15}://[A-Za-z0-9._~/:@%+=-]{1,1024}")
_SHA256_RE = re.compile(r"[0-9a-f]{64}")
_REL_PATH_RE = re.compile(r"[A-Za-z0-9._+-][A-Za-z0-9._+/-]{0,511}")


def _argv(f: _Fields, key: str, placeholders: tuple[str, ...]) -> tuple[str, ...]:
    argv = f.strings(key, MAX_ARGV, _arg)
    for placeholder in placeholders:
        if argv and not any(placeholder in arg for arg in argv):
            raise f._fail(key, f"a command with a {placeholder!r} placeholder", list(argv))
    return argv


@dataclass(frozen=True)
class BucketCommands:
    """How a node copies to and from its run's bucket prefix, decided by the laptop's cloud module.

    ``url`` is the run's prefix (``<scheme>://<bucket>/runs/<run id>``): checkpoints go under
    ``<url>/checkpoints/``. ``copy`` copies one file and ``sync`` one directory, either way
    (``{src}``, ``{dest}``: a local path or a URL); ``remove`` deletes a prefix (``{dest}``).
    ``env`` is added to the commands' environment (a test's S3 endpoint and dummy keys). The node
    knows no cloud: one uploader per cloud, on the laptop.
    """

    url: str
    copy: tuple[str, ...]
    sync: tuple[str, ...]
    remove: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "copy": list(self.copy),
            "sync": list(self.sync),
            "remove": list(self.remove),
            "env": dict(self.env),
        }

    @classmethod
    def from_dict(cls, data: object, what: str = "bucket") -> BucketCommands:
        f = _Fields(data, what)
        url = f.data.get("url")
        if not isinstance(url, str) or not _URL_RE.fullmatch(url):
            raise f._fail("url", "a bucket URL such as <scheme>://<bucket>/<prefix>", url)
        env = env_field(f, "env")
        copy = _argv(f, "copy", ("{src}", "{dest}"))
        sync = _argv(f, "sync", ("{src}", "{dest}"))
        if not copy or not sync:
            raise ProtocolError(f"{what}: fields 'copy' and 'sync' must both be commands")
        return cls(
            url=url.rstrip("/"),
            copy=copy,
            sync=sync,
            remove=_argv(f, "remove", ("{dest}",)),
            env=dict(env),
        )


def env_field(f: _Fields, key: str) -> dict[str, str]:
    """An object of environment variables for a command (upper-case names, bounded values with
    no newline: they reach a node's shell one per line on stdin, never on a command line)."""
    env = f.data.get(key) or {}
    if not isinstance(env, dict) or len(env) > MAX_BUCKET_ENV:
        raise f._fail(key, f"an object of at most {MAX_BUCKET_ENV} variables", env)
    for name, value in env.items():
        if not _ENV_NAME_RE.fullmatch(name):
            raise f._fail(key, "upper-case variable names", name)
        if "\n" in _arg(value, f"{key}.{name}"):
            raise f._fail(key, "values without a newline", name)
    return dict(env)


@dataclass(frozen=True)
class Manifest:
    """``step-<N>/MANIFEST.json``: what a complete checkpoint holds (size and sha256 per file).

    A checkpoint without one, or whose files differ from it, is incomplete: never resumed from.
    ``rank``/``world`` are set for a per-rank shard.
    """

    step: int
    files: Mapping[str, tuple[int, str]]
    created: float
    rank: int | None = None
    world: int | None = None

    def to_json(self) -> str:
        data: dict[str, Any] = {
            "step": self.step,
            "files": {name: {"size": s, "sha256": h} for name, (s, h) in sorted(self.files.items())},
            "created": self.created,
        }
        if self.rank is not None:
            data["rank"], data["world"] = self.rank, self.world
        return encode(data)

    @classmethod
    def from_json(cls, data: bytes | bytearray | str) -> Manifest:
        f = _json_object(data, MAX_MANIFEST_BYTES, "MANIFEST.json")
        files = f.data.get("files")
        if not isinstance(files, dict) or len(files) > MAX_MANIFEST_FILES:
            raise f._fail("files", f"an object of at most {MAX_MANIFEST_FILES} files", files)
        out: dict[str, tuple[int, str]] = {}
        for name, entry in files.items():
            parts = name.split("/") if isinstance(name, str) else []
            if not _REL_PATH_RE.fullmatch(name) or any(p in ("", ".", "..") for p in parts):
                raise f._fail("files", "relative file names inside the checkpoint", name)
            e = _Fields(entry, f"MANIFEST.json: files.{name}")
            sha = e.data.get("sha256")
            if not isinstance(sha, str) or not _SHA256_RE.fullmatch(sha):
                raise e._fail("sha256", "64 hex digits", sha)
            out[name] = (e.integer("size", 0, MAX_OFFSET), sha)
        created = f.number("created", 0.0, MAX_TIMESTAMP, required=True)
        assert created is not None
        rank = f.optional_integer("rank", 0, 2**31)
        world = f.optional_integer("world", 1, 2**31)
        if (rank is None) != (world is None) or (rank is not None and world is not None and rank >= world):
            raise ProtocolError("MANIFEST.json: fields 'rank' and 'world': both or neither, rank < world")
        return cls(step=f.integer("step", 0, MAX_INT), files=out, created=created, rank=rank, world=world)


@dataclass(frozen=True)
class BucketPointer:
    """``<url>/checkpoints/LATEST.json``: the steps whose upload finished, newest first.

    Written after a step's files are in the bucket, so a step listed here is complete there (its
    manifest is still checked after download). ``updated`` and ``created`` (when the newest
    step was made) tell the watchdog whether a checkpoint made after a preemption notice is
    durable.
    """

    steps: tuple[int, ...]
    updated: float
    created: float | None = None

    def to_json(self) -> str:
        return encode({"steps": list(self.steps), "updated": self.updated, "created": self.created})

    @classmethod
    def from_json(cls, data: bytes | bytearray | str) -> BucketPointer:
        f = _json_object(data, MAX_POINTER_BYTES, "LATEST.json")
        steps = f.data.get("steps")
        if not isinstance(steps, list) or len(steps) > MAX_POINTER_STEPS:
            raise f._fail("steps", f"a list of at most {MAX_POINTER_STEPS} steps", steps)
        for step in steps:
            if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step <= MAX_INT:
                raise f._fail("steps", "step numbers", step)
        updated = f.number("updated", 0.0, MAX_TIMESTAMP, required=True)
        assert updated is not None
        return cls(
            steps=tuple(sorted(set(steps), reverse=True)),
            updated=updated,
            created=f.number("created", 0.0, MAX_TIMESTAMP),
        )


@dataclass(frozen=True)
class PreemptionNotice:
    """``<run dir>/preempt.json``: the cloud announced this node's end (the watchdog writes it).

    Its existence is the checkpoint helper's ``should_save()`` flag; the node agent reports it in
    every poll (``PollAnswer.preempted``) so the laptop records the attempt as preempted, not
    failed. ``durable_step`` is set once a checkpoint reached the bucket after the notice.

    For the laptop's drain (``launch.run.drain``): ``deadline_at`` is when the cloud takes the node
    (the notice's own time, else the notice plus the cloud's window), ``saved_step`` a complete
    checkpoint made on this node after the notice, ``durable_made_after`` whether ``durable_step``
    was made after the notice too (not an older step whose upload ended after it), and
    ``settled_at`` when the watchdog stopped waiting (the ranks are gone and the bucket said what it will say): past it nothing on this
    node changes any more. All on the node's clock.
    """

    noticed_at: float
    source: str
    detail: str = ""
    signalled: int = 0
    durable_step: int | None = None
    durable_at: float | None = None
    deadline_at: float | None = None
    saved_step: int | None = None
    settled_at: float | None = None
    durable_made_after: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "noticed_at": self.noticed_at,
            "source": self.source,
            "detail": self.detail,
            "signalled": self.signalled,
            "durable_step": self.durable_step,
            "durable_at": self.durable_at,
            "deadline_at": self.deadline_at,
            "saved_step": self.saved_step,
            "settled_at": self.settled_at,
            "durable_made_after": self.durable_made_after,
        }

    def to_json(self) -> str:
        return encode(self.to_dict())

    @classmethod
    def from_json(cls, data: bytes | bytearray | str) -> PreemptionNotice:
        return cls.from_dict(_json_object(data, MAX_SMALL_ANSWER_BYTES, "preempt.json").data)

    @classmethod
    def from_dict(cls, data: object, what: str = "preempt.json") -> PreemptionNotice:
        f = _Fields(data, what)
        noticed = f.number("noticed_at", 0.0, MAX_TIMESTAMP, required=True)
        assert noticed is not None
        return cls(
            noticed_at=noticed,
            source=f.name("source"),
            detail=f.text("detail", MAX_ERROR),
            signalled=f.integer("signalled", 0, 10**6, required=False, default=0),
            durable_step=f.optional_integer("durable_step", 0, MAX_INT),
            durable_at=f.number("durable_at", 0.0, MAX_TIMESTAMP),
            deadline_at=f.number("deadline_at", 0.0, MAX_TIMESTAMP),
            saved_step=f.optional_integer("saved_step", 0, MAX_INT),
            settled_at=f.number("settled_at", 0.0, MAX_TIMESTAMP),
            durable_made_after=f.boolean("durable_made_after", False),
        )
