"""A command's output from an untrusted node, bounded: the first and last ``MAX_OUTPUT_BYTES`` kept.

Shared by paramiko's channels (``launch.transport.channels`` re-exports it) and ``fab exec``'s
OpenSSH fan-out (``launch.transport.openssh_exec``), which must not import paramiko: both keep
and cut a node's output the same way.
"""

from __future__ import annotations

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
