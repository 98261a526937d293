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

MAX_ANSWER_BYTES = 4 << 20
"""Longest answer line taken from a node's long-lived agent (a poll answer is at most ~1.5 MiB)."""
MAX_OUTPUT_BYTES = 1 << 20
"""Of a command's output, this much of the start and this much of the end are kept."""


class BoundedOutput:
    """A command's output, of which the first and the last ``MAX_OUTPUT_BYTES`` are kept.

    Memory stays at about twice that however much a node sends, and each chunk costs time in
    proportion to its own size (the tail is a ``bytearray`` trimmed in place), where keeping the
    whole answer and joining it cost time in the square of its size. What was cut is said in the
    text, naming the node that sent it (``host``).
    """

    def __init__(self, host: str = "", stream: str = "output") -> None:
        self.host = host
        self.stream = stream
        self.head = bytearray()
        self.tail = bytearray()
        self.dropped = 0

    def add(self, chunk: bytes) -> None:
        room = MAX_OUTPUT_BYTES - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self.tail += chunk
            excess = len(self.tail) - MAX_OUTPUT_BYTES
            if excess > 0:
                self.dropped += excess
                del self.tail[:excess]

    @property
    def kept(self) -> int:
        """Bytes held now (never more than ``2 * MAX_OUTPUT_BYTES``)."""
        return len(self.head) + len(self.tail)

    def cut_line(self) -> str:
        """One line naming the node and how much of its answer was not kept ("" when none)."""
        if not self.dropped:
            return ""
        who = f"{self.host} sent" if self.host else "the node sent"
        return (
            f"{who} {self.dropped + self.kept} bytes of {self.stream}, more than the "
            f"{2 * MAX_OUTPUT_BYTES >> 20} MiB kept of an answer: the middle {self.dropped} bytes were cut"
        )

    def text(self) -> str:
        gap = f"\n[... {self.cut_line()} ...]\n".encode() if self.dropped else b""
        return bytes(self.head + gap + self.tail).decode("utf-8", "replace")


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
