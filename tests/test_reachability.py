"""The sshd check that recovery and replacements rely on: a banner, not just an open port."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from launch.job.inventory import Host, JumpHost
from launch.transport.reachability import sshd_answers, wait_for_sshd
from tests.conftest import SAMPLE_HOST_KEYS


@contextlib.contextmanager
def listener(greeting: bytes | None) -> Iterator[int]:
    """A local port that sends ``greeting`` to each connection (None: accepts and stays silent)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()

    def serve() -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = server.accept()
                if greeting is not None:
                    with conn:
                        conn.sendall(greeting)

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield server.getsockname()[1]
    finally:
        server.shutdown(socket.SHUT_RDWR)  # wakes serve()'s accept()
        server.close()


def host(port: int, **extra: Any) -> Host:
    return Host(name="n0", address="127.0.0.1", port=port, user="u", host_key=SAMPLE_HOST_KEYS[0], **extra)


def test_a_banner_answers_an_open_port_alone_does_not() -> None:
    with listener(b"SSH-2.0-OpenSSH_9.2\r\n") as port:
        assert sshd_answers(host(port))
        assert wait_for_sshd(host(port), 1.0)
    with listener(b"HTTP/1.1 400 Bad Request\r\n") as port:
        assert not sshd_answers(host(port))
    with listener(None) as port:
        assert not sshd_answers(host(port), timeout=0.2)
    with listener(None) as port:
        pass
    assert not sshd_answers(host(port))  # closed: refused
    assert not wait_for_sshd(host(port), 0.3, poll_s=0.1)


class FakeJumps:
    """Stands in for ``JumpHosts``: a channel is a socket connected to the given port."""

    def __init__(self, port: int | None) -> None:
        self.port = port
        self.asked: list[str] = []

    def channel(self, target: Host, timeout: float) -> socket.socket:
        self.asked.append(target.name)
        if self.port is None:
            raise OSError("the jump host could not connect")
        return socket.create_connection(("127.0.0.1", self.port), timeout=timeout)


@pytest.mark.parametrize("banner", [True, False])
def test_a_host_behind_a_jump_host_is_checked_through_it(banner: bool) -> None:
    """The laptop cannot reach such a host directly: a direct check would call it lost."""
    jump = JumpHost(address="127.0.0.1", port=1, user="u", host_key=SAMPLE_HOST_KEYS[1])
    with listener(b"SSH-2.0-x\r\n" if banner else b"nope\r\n") as port:
        behind = host(9, proxy_jump=jump)  # port 9 is not the listener: only the jump's channel is
        jumps = FakeJumps(port)
        assert sshd_answers(behind, 1.0, jumps) is banner
        assert jumps.asked == ["n0"]
        assert not sshd_answers(behind, 1.0, None)
        assert not sshd_answers(behind, 1.0, FakeJumps(None))
