"""Connection limits shared by every SSH path: the connect timeout, and the lock-file slots that
bound how many connections fleetrun opens through one jump host at once.

Apart from ``launch.transport.jump`` (paramiko's jump connections, which re-exports these) so the
OpenSSH command lines (``launch.transport.openssh``) and ``fab exec``'s OpenSSH fan-out import
neither paramiko nor the inventory models.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator
from pathlib import Path

DEFAULT_CONNECT_TIMEOUT = 10
KEEPALIVE_S = 5
JUMP_SLOTS = 8
"""SSH connections (handshakes) fleetrun opens through one jump host at once, across every fleetrun
process of this user: sshd's default ``MaxStartups 10:30:100`` starts dropping concurrent
unauthenticated connections past 10, and two ``fab`` commands through one login node (a train
and a pull) would each think they had the whole budget."""
SLOT_POLL_S = 0.05


def _slot_files(endpoint: tuple[str, int], directory: Path | None) -> list[Path]:
    import hashlib  # here: OpenSSL's loader is a cost every ``fab exec`` would pay for nothing

    from launch.paths import fleetrun_home

    where = directory if directory is not None else fleetrun_home() / "locks"
    where.mkdir(parents=True, exist_ok=True, mode=0o700)
    name = hashlib.sha256(f"{endpoint[0]}:{endpoint[1]}".encode()).hexdigest()[:16]
    return [where / f"jump-{name}-{i}" for i in range(JUMP_SLOTS)]


def take_jump_slot(
    endpoint: tuple[str, int], blocking: bool = True, directory: Path | None = None
) -> int | None:
    """One of the ``JUMP_SLOTS`` shared by all fleetrun processes for the jump host ``endpoint``:
    an open descriptor holding an ``flock`` on one of its slot files (``$FLEETRUN_HOME/locks``),
    released by ``give_jump_slot`` or when the process dies (the kernel drops the lock, so a
    killed ``fab`` never leaves a slot taken). None when ``blocking`` is False and all are taken."""
    files = _slot_files(endpoint, directory)
    while True:
        for path in files:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            return fd
        if not blocking:
            return None
        time.sleep(SLOT_POLL_S)


def give_jump_slot(fd: int) -> None:
    with contextlib.suppress(OSError):
        fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)


@contextlib.contextmanager
def shared_jump_slot(endpoint: tuple[str, int], directory: Path | None = None) -> Iterator[None]:
    """Hold one cross-process slot of the jump host ``endpoint`` for the ``with`` block."""
    fd = take_jump_slot(endpoint, directory=directory)
    try:
        yield
    finally:
        if fd is not None:
            give_jump_slot(fd)
