"""The checkpoint helper's on-disk format: the manifest, the atomic write, the verification.

A checkpoint directory is complete only when its ``MANIFEST.json`` exists and every file it lists
has the listed size (and, when loading, sha256). The writer's files are fsynced, then the
manifest, then the directory is renamed into place: a crash at any point leaves either the old
state or a temporary directory, never a step that looks complete and is not. Standard library
only; shipped to nodes beside ``fleetrun_checkpoint``.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import socket
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if not __package__:  # on a node, beside the other files in ~/.fleetrun/lib (not as launch.nodelib)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
if TYPE_CHECKING or __package__:  # one module per file: launch.nodelib.X here, X on a node
    from launch.nodelib import fleetrun_protocol as protocol
else:
    import fleetrun_protocol as protocol  # noqa: E402 - beside this file in ~/.fleetrun/lib

MANIFEST = "MANIFEST.json"
_HASH_CHUNK = 1024 * 1024
MAX_CHECKPOINT_BYTES = 32 * 1024**3
_HOST = re.sub(r"[^A-Za-z0-9.]", "_", socket.gethostname())[:64] or "host"  # no '-': see the RE
_SCRATCH_RE = re.compile(
    r"(?:\.tmp-step-\d+-rank-\d+|\.incoming-\d+|(?:step|rank)-\d+\.old)-(?P<host>[A-Za-z0-9._]{1,64})-(?P<pid>\d{1,9})(?:-\d+)?"
)


def scratch_name(prefix: str) -> str:
    """A temporary name that says who made it (this host and process), so ``sweep_scratch`` can
    tell a dead writer's leftovers from a live one's, on this node's disk or a shared one."""
    return f"{prefix}-{_HOST}-{os.getpid()}"


def sweep_scratch(directory: str) -> list[str]:
    """Remove what a writer killed mid-save left in ``directory`` and its step directories:
    temporary dirs named by ``scratch_name`` whose process (on this host) is gone. A kill -9 or a
    power-off mid-save leaves a whole checkpoint's size there, and later attempts add more. Only
    real directories with those names; never a symlink; never another host's or a live writer's."""
    removed = []
    with contextlib.suppress(OSError):
        tops = [(directory, n) for n in os.listdir(directory)]
        steps = [os.path.join(directory, n) for _, n in tops if n.startswith("step-") and "." not in n]
        for step_dir in steps:
            if os.path.isdir(step_dir) and not os.path.islink(step_dir):
                with contextlib.suppress(OSError):
                    tops += [(step_dir, n) for n in os.listdir(step_dir)]
    for parent, name in tops:
        match = _SCRATCH_RE.fullmatch(name)
        path = os.path.join(parent, name)
        if match is None or match["host"] != _HOST or os.path.islink(path) or not os.path.isdir(path):
            continue
        if not os.path.exists(f"/proc/{match['pid']}"):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(_HASH_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def read_manifest(path: str) -> protocol.Manifest | None:
    try:
        with open(os.path.join(path, MANIFEST), "rb") as fh:
            return protocol.Manifest.from_json(fh.read(protocol.MAX_MANIFEST_BYTES + 1))
    except (OSError, protocol.ProtocolError):
        return None


def manifest_digest(path: str) -> str | None:
    """sha256 of ``path``'s ``MANIFEST.json`` bytes, or None: what rank 0 records when it saves
    (``checkpoint_saved``), so the laptop can tell the step it saw saved from one a node claims."""
    try:
        with open(os.path.join(path, MANIFEST), "rb") as fh:
            data = fh.read(protocol.MAX_MANIFEST_BYTES + 1)
    except OSError:
        return None
    return hashlib.sha256(data).hexdigest() if len(data) <= protocol.MAX_MANIFEST_BYTES else None


def max_checkpoint_bytes() -> int:
    """The most one checkpoint may list (``FLEETRUN_CHECKPOINT_MAX_BYTES``, default 32 GiB, the
    laptop's pull cap): a planted manifest naming a sparse terabyte is refused before any byte
    of it is hashed or copied."""
    try:
        return max(1, int(os.environ.get("FLEETRUN_CHECKPOINT_MAX_BYTES", "")))
    except ValueError:
        return MAX_CHECKPOINT_BYTES


def verify(path: str, hashes: bool = True) -> protocol.Manifest | None:
    """The manifest when every file it lists is there with its size (and sha256), else None.
    One that lists more than ``max_checkpoint_bytes`` in all is never complete."""
    manifest = read_manifest(path)
    if manifest is None:
        return None
    if sum(size for size, _ in manifest.files.values()) > max_checkpoint_bytes():
        return None
    for name, (size, sha) in manifest.files.items():
        full = os.path.join(path, name)
        try:
            if os.path.islink(full) or os.path.getsize(full) != size:
                return None
            if hashes and _sha256(full) != sha:
                return None
        except OSError:
            return None
    return manifest


def _fsync_dir(path: str) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def seal(tmp: str, step: int, rank: int | None, world: int | None) -> protocol.Manifest:
    """fsync every file the writer left in ``tmp`` and write its manifest (fsynced too)."""
    files: dict[str, tuple[int, str]] = {}
    for root, dirs, names in os.walk(tmp):
        dirs.sort()
        for name in sorted(names):
            full = os.path.join(root, name)
            rel = os.path.relpath(full, tmp).replace(os.sep, "/")
            if rel == MANIFEST:
                continue
            if os.path.islink(full) or not os.path.isfile(full):
                raise ValueError(f"checkpoint writer left {rel!r}, which is not a regular file")
            with open(full, "rb") as fh:
                os.fsync(fh.fileno())
            files[rel] = (os.path.getsize(full), _sha256(full))
        _fsync_dir(root)
    manifest = protocol.Manifest(step=step, files=files, created=time.time(), rank=rank, world=world)
    with open(os.path.join(tmp, MANIFEST), "w", encoding="utf-8") as fh:
        fh.write(manifest.to_json())
        fh.flush()
        os.fsync(fh.fileno())
    _fsync_dir(tmp)
    return manifest


def replace_dir(src: str, dest: str) -> None:
    """Rename ``src`` to ``dest``; an existing ``dest`` (the same step saved again) goes first."""
    old = None
    if os.path.exists(dest):
        old = f"{scratch_name(dest + '.old')}-{time.monotonic_ns()}"
        os.rename(dest, old)
    os.rename(src, dest)
    _fsync_dir(os.path.dirname(dest))
    if old:
        shutil.rmtree(old, ignore_errors=True)


def fetch_step(
    bucket: Any, url: str, directory: str, step: int, final: str, log: Callable[[str], None]
) -> protocol.Manifest | None:
    """Copy one step from ``url`` (``bucket.sync``) into a temporary dir, verify it, and move it to
    ``final``; its manifest, or None (logged) when the copy failed or is incomplete."""
    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, scratch_name(f".incoming-{step}"))
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        ok, message = bucket.sync(url, tmp)
        manifest = verify(tmp) if ok else None
        if manifest is None or manifest.step != step:
            log(f"checkpoint step {step} from {url}: {message if not ok else 'incomplete, skipped'}")
            return None
        os.makedirs(os.path.dirname(final), exist_ok=True)
        replace_dir(tmp, final)
        return manifest
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def written_here(step_dir: str, own: str, step: int) -> bool:
    """Whether ``own`` (``step_dir`` or this rank's shard of it) is a step the helper wrote.

    A real directory (no symlink on the way) holding a manifest of that step: a user's own
    ``step-<N>`` directory, or a link out of the checkpoint directory, is never deleted.
    """
    if any(os.path.islink(p) for p in (step_dir, own, os.path.join(own, MANIFEST))):
        return False
    manifest = read_manifest(own)
    return manifest is not None and manifest.step == step
