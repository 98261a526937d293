"""Bounded reads from an SSH channel: a command's output and a line-per-request session.

A node is untrusted: a command that prints forever, or an agent that answers without a newline,
must not fill the laptop's memory. ``BoundedOutput`` keeps the head and tail of a command's
output; ``LineSession`` refuses an answer line over ``MAX_ANSWER_BYTES`` and closes the channel.
Split from ``launch.transport.ssh`` (connections and fan-out) to keep each module small.
"""

from __future__ import annotations

import contextlib

import paramiko

from launch.errors import HostError
from launch.transport.bounded import (  # noqa: F401 - re-exported: callers import them from here
    MAX_OUTPUT_BYTES,
    BoundedOutput,
)

MAX_ANSWER_BYTES = 4 << 20
"""Longest answer line taken from a node's long-lived agent (a poll answer is at most ~1.5 MiB)."""


class LineSession:
    """A long-lived command on a node that answers each request line with one line.

    The watcher polls through one of these per node: a request and its answer travel over a
    channel that is already open, so a poll round starts no process anywhere.
    """

    def __init__(self, host: str, channel: paramiko.Channel) -> None:
        self.host = host
        self.channel = channel
        self._pending = b""

    @property
    def closed(self) -> bool:
        return self.channel.closed or self.channel.exit_status_ready()

    def ask(self, request: str, timeout: float) -> str:
        """Send one line, return the answer line; a dead or silent channel is a ``HostError``.

        An answer line longer than ``MAX_ANSWER_BYTES`` is refused (and the channel closed, as
        the rest of it would be read as the next answer): a node that streams without a newline
        must not fill the laptop's memory until the deadline.
        """
        try:
            self.channel.settimeout(timeout)
            self.channel.sendall((request + "\n").encode())
            while b"\n" not in self._pending:
                if len(self._pending) > MAX_ANSWER_BYTES:
                    self.close()
                    raise HostError(
                        self.host, f"answer on the poll channel longer than {MAX_ANSWER_BYTES} bytes; refused"
                    )
                chunk = self.channel.recv(65536)
                if not chunk:
                    raise HostError(self.host, "the node agent's poll channel closed")
                self._pending += chunk
        except TimeoutError:
            self.close()
            raise HostError(self.host, f"no answer on the poll channel within {timeout:.0f} s") from None
        except (paramiko.SSHException, OSError, EOFError) as exc:
            self.close()
            raise HostError(self.host, f"poll channel lost: {exc or type(exc).__name__}") from None
        line, self._pending = self._pending.split(b"\n", 1)
        return line.decode("utf-8", "replace")

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.channel.close()
