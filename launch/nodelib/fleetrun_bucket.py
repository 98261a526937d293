"""The node's one way to its run's bucket: runs the commands the laptop chose. Standard library only.

Used by the checkpoint helper (in the training processes) and the watchdog (before a node goes).
The commands come from ``guard.json`` (``BucketCommands``: the laptop's cloud module decides the
CLI and its arguments), so nothing here knows a cloud. Every call has a timeout and returns
``(ok, message)``: a missing CLI or an unreachable bucket is reported, never raised, because a
failed upload must not kill a training step or the watchdog.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from typing import TYPE_CHECKING

if not __package__:  # on a node, beside the other files in ~/.fleetrun/lib (not as launch.nodelib)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
if TYPE_CHECKING or __package__:  # one module per file: launch.nodelib.X here, X on a node
    from launch.nodelib import fleetrun_protocol as protocol
else:
    import fleetrun_protocol as protocol  # noqa: E402 - beside this file in ~/.fleetrun/lib

TRANSFER_TIMEOUT_S = 3600.0
SMALL_TIMEOUT_S = 60.0
POINTER = "LATEST.json"


def find_cli(name: str) -> str | None:
    """The CLI's path: absolute as given, on ``PATH``, or beside this Python (a venv's ``bin``)."""
    if os.path.isabs(name):
        return name if os.access(name, os.X_OK) else None
    dirs = os.environ.get("PATH", "").split(os.pathsep) + [os.path.dirname(sys.executable)]
    for directory in dirs:
        path = os.path.join(directory or ".", name)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


def read_commands(run_dir: str | None) -> protocol.BucketCommands | None:
    """The run's bucket commands from ``<run dir>/guard.json``, or None (no bucket, no file)."""
    if not run_dir:
        return None
    try:
        with open(os.path.join(run_dir, "guard.json"), "rb") as fh:
            data = fh.read(protocol.MAX_GUARD_CONFIG_BYTES + 1)
        return protocol.GuardConfig.from_json(data).bucket
    except (OSError, protocol.ProtocolError):
        return None


class Bucket:
    """One run's bucket prefix: ``copy``/``sync``/``remove`` with the laptop's commands."""

    def __init__(self, commands: protocol.BucketCommands) -> None:
        self.commands = commands
        self.url = commands.url

    def checkpoints_url(self, *parts: str) -> str:
        return "/".join([self.url, "checkpoints", *parts])

    def _run(self, template: Sequence[str], values: dict[str, str], timeout: float) -> tuple[bool, str]:
        if not template:
            return False, "no command configured"
        cli = find_cli(template[0])
        if cli is None:
            return False, f"no {template[0]} CLI on this node (PATH or beside {sys.executable})"
        argv = [cli]
        for arg in template[1:]:
            for key, value in values.items():
                arg = arg.replace("{" + key + "}", value)
            argv.append(arg)
        env = {**os.environ, **self.commands.env}
        try:
            proc = subprocess.run(
                argv,
                capture_output=True,
                text=True,
                errors="replace",
                timeout=timeout,
                check=False,
                env=env,
                stdin=subprocess.DEVNULL,
            )
        except (OSError, subprocess.SubprocessError) as exc:
            return False, f"{os.path.basename(cli)} failed: {type(exc).__name__}: {exc}"
        if proc.returncode != 0:
            tail = (proc.stderr.strip() or proc.stdout.strip())[-300:]
            return False, f"{os.path.basename(cli)} exited with {proc.returncode}: {tail}"
        return True, "ok"

    def copy(self, src: str, dest: str, timeout: float = SMALL_TIMEOUT_S) -> tuple[bool, str]:
        return self._run(self.commands.copy, {"src": src, "dest": dest}, timeout)

    def sync(self, src: str, dest: str, timeout: float = TRANSFER_TIMEOUT_S) -> tuple[bool, str]:
        return self._run(self.commands.sync, {"src": src, "dest": dest}, timeout)

    def remove(self, dest: str, timeout: float = SMALL_TIMEOUT_S) -> tuple[bool, str]:
        return self._run(self.commands.remove, {"dest": dest}, timeout)

    def pointer(self, name: str = POINTER, timeout: float = SMALL_TIMEOUT_S) -> protocol.BucketPointer | None:
        """The bucket's ``LATEST.json`` (steps uploaded, newest first), or None (none, unreadable)."""
        with tempfile.TemporaryDirectory(prefix="fleetrun-ptr-") as tmp:
            local = os.path.join(tmp, name)
            ok, _ = self.copy(self.checkpoints_url(name), local, timeout)
            if not ok:
                return None
            try:
                with open(local, "rb") as fh:
                    return protocol.BucketPointer.from_json(fh.read(protocol.MAX_POINTER_BYTES + 1))
            except (OSError, protocol.ProtocolError):
                return None

    def put_pointer(self, pointer: protocol.BucketPointer, name: str = POINTER) -> tuple[bool, str]:
        with tempfile.TemporaryDirectory(prefix="fleetrun-ptr-") as tmp:
            local = os.path.join(tmp, name)
            with open(local, "w", encoding="utf-8") as fh:
                fh.write(pointer.to_json())
            return self.copy(local, self.checkpoints_url(name))

    def durable_since(self, since: float, name: str = POINTER) -> tuple[int, bool] | None:
        """The newest step uploaded after ``since`` and whether it was also made after it, or None."""
        pointer = self.pointer(name, timeout=20.0)
        if pointer is None or not pointer.steps or pointer.updated < since:
            return None
        return pointer.steps[0], pointer.created is not None and pointer.created >= since
