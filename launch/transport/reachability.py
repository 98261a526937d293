"""Is a host's sshd there? One cheap check, and a bounded wait for it to come (back).

Used where a fleet must tell a node that is gone from one that is slow: recovery's evidence
re-checks, a lab host coming back after a reboot, a new cloud instance booting. The check reads
the SSH banner over a fresh TCP connection, so an address whose port is open for another program
(or a default gateway that accepts any TCP connection) is not taken for a working node. A host
behind a jump host (``proxy_jump``) is checked through the jump host's shared connection: the
laptop cannot reach it directly, and a direct check would call every such node lost.
"""

from __future__ import annotations

import contextlib
import socket
import time
from typing import TYPE_CHECKING, Any, Protocol

from launch.errors import HostKeyMismatch

if TYPE_CHECKING:
    from collections.abc import Callable

    from launch.job.inventory import Host

CHECK_TIMEOUT_S = 3.0
WAIT_POLL_S = 5.0


class _Stream(Protocol):
    """A socket or a paramiko channel: both read the banner the same way."""

    def settimeout(self, timeout: float | None) -> None: ...
    def recv(self, nbytes: int) -> bytes: ...


class JumpChannels(Protocol):
    """What the check needs of ``launch.transport.jump.JumpHosts`` (a protocol, so the lab and
    stack kinds can use this module without importing paramiko)."""

    def channel(self, host: Host, timeout: float) -> Any: ...


def _banner(stream: _Stream, timeout: float) -> bytes:
    stream.settimeout(timeout)
    return stream.recv(64)


def sshd_answers(host: Host, timeout: float = CHECK_TIMEOUT_S, jumps: JumpChannels | None = None) -> bool:
    """One check: a fresh connection to ``host``'s sshd (through its jump host when it has one)
    sends back an SSH banner within ``timeout``. Any failure is "no", except a jump host whose
    pinned key changed (``HostKeyMismatch``): waiting longer cannot fix that."""
    try:
        if host.proxy_jump is not None:
            if jumps is None:
                return False
            channel = jumps.channel(host, timeout)
            try:
                return _banner(channel, timeout).startswith(b"SSH-")
            finally:
                with contextlib.suppress(Exception):
                    channel.close()
        with socket.create_connection((host.address, host.port), timeout=timeout) as sock:
            return _banner(sock, timeout).startswith(b"SSH-")
    except HostKeyMismatch:
        raise
    except Exception:  # noqa: BLE001 - a host that cannot be checked does not answer
        return False


def wait_for_sshd(
    host: Host,
    timeout_s: float,
    jumps: JumpChannels | None = None,
    poll_s: float = WAIT_POLL_S,
    check: Callable[[Host, float], bool] | None = None,
) -> bool:
    """True as soon as ``host``'s sshd answers, False when ``timeout_s`` passed without it.
    ``check(host, timeout)`` asks instead of ``sshd_answers`` (a run's ``Fleet.answers``)."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = deadline - time.monotonic()
        step = min(CHECK_TIMEOUT_S, max(0.1, left))
        if check(host, step) if check is not None else sshd_answers(host, step, jumps):
            return True
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        time.sleep(min(poll_s, left))
