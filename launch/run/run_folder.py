"""The local run folder: everything a run leaves on the operator's machine.

``<runs>/<run_id>/``: ``plan.txt`` (the exact scripts), ``nodes/<host>/`` (each node's run
directory pulled back: ``node.log``, ``launch.sh``, ``rc``, outputs), ``metrics.jsonl`` and
``status.json`` (from whichever node held global rank 0), ``summary.json`` and ``loss.png``.

Everything under ``nodes/`` came from a node and is read as untrusted: through ``open_pulled``
(no symlink followed, regular files only, FIFOs never waited on) and never more than a cap, so a
``metrics.jsonl -> ~/.aws/credentials`` link copies nothing and a ``node.log -> /dev/zero`` or a
huge log cannot exhaust memory.
"""

from __future__ import annotations

import json
import os
import secrets
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launch.paths import runs_dir
from launch.rules.metrics_stream import MetricsStream, MetricsSummary

MAX_METRICS_BYTES = 512 * 1024**2
MAX_STATUS_BYTES = 1024**2
MAX_LOG_VIEW_BYTES = 4 * 1024**2
CHUNK = 1024**2


class UnsafePulledFile(Exception):
    """A pulled path that is not a plain regular file (a symlink, device, FIFO, directory...)."""


def open_pulled(path: Path) -> int | None:
    """A read-only descriptor of the regular file at ``path``, or None when nothing is there.

    ``O_NOFOLLOW``: a symlink is refused, not followed; ``O_NONBLOCK``: opening a FIFO does not
    wait for a writer. Anything but a regular file raises ``UnsafePulledFile``.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:  # ELOOP: a symlink; others: unreadable
        raise UnsafePulledFile(f"{path.name}: not read ({exc.strerror or exc})") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UnsafePulledFile(f"{path.name}: not a regular file, not read")
    return fd


def read_pulled(path: Path, limit: int) -> bytes | None:
    """At most the first ``limit`` bytes of a pulled regular file (None when absent)."""
    fd = open_pulled(path)
    if fd is None:
        return None
    with os.fdopen(fd, "rb") as fh:
        return fh.read(limit)


def read_pulled_tail(path: Path, limit: int) -> tuple[bytes, int] | None:
    """The last ``limit`` bytes of a pulled regular file and how many bytes precede them."""
    fd = open_pulled(path)
    if fd is None:
        return None
    with os.fdopen(fd, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        skipped = max(0, size - limit)
        fh.seek(skipped)
        return fh.read(limit), skipped


MAX_SUMMARY_BYTES = 4 * 1024 * 1024


def read_teardown(folder: Path) -> tuple[str, str] | None:
    """How the run's fleet ended (``summary.json``'s ``teardown``: its state and message, as the
    run's end and a kept-warm fleet's later teardown wrote them), for ``fab show``; None when the
    run has no summary yet or it does not say. Read like any file a hook may have touched: bounded,
    a regular file, only strings taken."""
    try:
        raw = read_pulled(folder / "summary.json", MAX_SUMMARY_BYTES)
        data = json.loads(raw) if raw is not None else None
    except (OSError, UnsafePulledFile, ValueError, RecursionError):
        return None
    teardown = data.get("teardown") if isinstance(data, dict) else None
    if not isinstance(teardown, dict):
        return None
    state, message = teardown.get("state"), teardown.get("message")
    if not isinstance(state, str) or not isinstance(message, str):
        return None
    return state, message


def read_log_text(path: Path, limit: int = MAX_LOG_VIEW_BYTES) -> str:
    """A pulled log for display (``fab logs``): its tail, decoded leniently, or why there is none."""
    try:
        found = read_pulled_tail(path, limit)
    except UnsafePulledFile as exc:
        return f"({exc})"
    if found is None:
        return "(no log)"
    data, skipped = found
    head = f"[... first {skipped} bytes not shown ...]\n" if skipped else ""
    return head + data.decode("utf-8", errors="replace")


def copy_pulled(source: Path, dest: Path, limit: int) -> bool:
    """Copy at most ``limit`` bytes of a pulled regular file to ``dest`` (written fresh, 0600)."""
    fd = open_pulled(source)
    if fd is None:
        return False
    tmp = dest.with_name(dest.name + ".tmp")
    with os.fdopen(fd, "rb") as src:
        out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(out, "wb") as dst:
            left = limit
            while left > 0:
                chunk = src.read(min(CHUNK, left))
                if not chunk:
                    break
                dst.write(chunk)
                left -= len(chunk)
    tmp.replace(dest)
    return True


def new_run_id(job: str) -> str:
    """Unique and sortable: job, UTC time, and randomness (also the torchrun rendezvous id)."""
    return f"{job}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{secrets.token_hex(3)}"


@dataclass(frozen=True)
class RunFolder:
    path: Path

    @classmethod
    def create(cls, run_id: str, base: Path | None = None) -> RunFolder:
        path = (base or runs_dir()) / run_id
        (path / "nodes").mkdir(parents=True, exist_ok=True)
        path.chmod(0o700)  # plan.txt, logs and outputs are the operator's alone
        return cls(path)

    def node_dir(self, host: str) -> Path:
        return self.path / "nodes" / host

    def write_json(self, name: str, data: Any) -> Path:
        target = self.path / name
        tmp = target.with_suffix(target.suffix + ".tmp")
        tmp.write_text(json.dumps(data, indent=2, sort_keys=True, default=str))
        tmp.replace(target)
        return target

    def write_text(self, name: str, text: str) -> Path:
        """Written 0600 (``plan.txt`` holds the exact scripts)."""
        target = self.path / name
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        return target

    def artifacts(self, limit: int = 500) -> list[str]:
        """Regular files of the run folder, relative to it (for the run record); links are not followed."""
        return sorted(
            str(p.relative_to(self.path)) for p in self.path.rglob("*") if p.is_file() and not p.is_symlink()
        )[:limit]

    def read_metrics(self) -> tuple[list[dict[str, Any]], MetricsSummary]:
        """Rank 0's ``metrics.jsonl`` as pulled back (capped), parsed whole: its records and their summary."""
        stream = MetricsStream()
        try:
            data = read_pulled(self.path / "metrics.jsonl", MAX_METRICS_BYTES)
        except UnsafePulledFile:
            data = None
        records = stream.feed(data) + stream.flush() if data is not None else []
        return records, stream.summary()

    def collect_rank0_files(self) -> str | None:
        """Copy metrics.jsonl/status.json from the node that held rank 0 to the top; return that node.

        Only regular files count and are copied (capped); a symlink or device in their place is skipped.
        """
        best: tuple[int, str] | None = None
        nodes = self.path / "nodes"
        for node_dir in sorted(nodes.iterdir()) if nodes.is_dir() and not nodes.is_symlink() else []:
            try:
                info = (node_dir / "metrics.jsonl").lstat()
            except OSError:
                continue
            if stat.S_ISREG(info.st_mode) and (best is None or info.st_size > best[0]):
                best = (info.st_size, node_dir.name)
        if best is None:
            return None
        source = self.node_dir(best[1])
        for name, cap in (("metrics.jsonl", MAX_METRICS_BYTES), ("status.json", MAX_STATUS_BYTES)):
            try:
                copy_pulled(source / name, self.path / name, cap)
            except UnsafePulledFile:
                continue
        return best[1]
