"""``fab exec`` over the OpenSSH client: one ``ssh`` per node, run in parallel as pdsh does.

Why a second way to reach the nodes: on a small fleet the whole ``fab exec`` process is start-up,
and paramiko with Fabric and the inventory models cost ~0.45 s of imports before the first packet
(``bench/exec_profile.py``). Here the interpreter imports nothing but the standard library and
fleetrun's light modules, and each node is one ``ssh`` process driven from one thread.

Trust is the same as every fleetrun connection: the pinned keys in a known_hosts file of their own,
``StrictHostKeyChecking=yes``, no config file, the inventory's key only (``openssh_command``).
The key exchange prefers ``curve25519-sha256``: what paramiko negotiates on the other path, and
OpenSSH's default hybrid (``sntrup761x25519``) costs ~90 ms of CPU per connection on each side.

What each node's ``ssh`` says about itself goes to a log pipe of its own (``-E``, ``LogLevel=DEBUG1``),
not into the node's stderr, and decides the outcome:
  * ``Authenticated to`` then ``Exit status N``: the command ran; N is its exit code (``-1`` for a
    command killed by a signal, as paramiko reports it);
  * no ``Authenticated to``: the command never ran. A failed TCP connect is named as the paramiko
    path names it; anything else (host key, authentication, handshake) is handed back to the
    caller, which asks the paramiko path for the same node and so prints its exact message;
  * the per-node ``timeout`` counts from authentication (as paramiko's counts from the open
    connection); past ``timeout + 30`` s from the start, every node still busy is reported as the
    paramiko fan-out reports it.
Output lines go through ``ExecReport``, the printer of both paths.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import selectors
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from launch.processes import ensure_open_files
from launch.transport.bounded import BoundedOutput
from launch.transport.exec_report import ExecReport
from launch.transport.openssh import openssh_command

if TYPE_CHECKING:
    from launch.job.inventory import JumpHost

FAST_KEX = "KexAlgorithms=^curve25519-sha256"
"""Prefer (``^``: put first, keep the rest) the key exchange paramiko uses on the other path."""
DEADLINE_EXTRA_S = 30.0
"""As ``run_everywhere``: the whole fan-out gives up on a node ``timeout`` + this after its start."""
LOG_KEPT_BYTES = 16 << 10
"""Of each ``ssh``'s own log, the last this many bytes are kept (its messages, never the node's)."""
READ_BYTES = 65536
AUTHENTICATED = b"Authenticated to "
EXIT_STATUS_RE = re.compile(rb"^debug1: Exit status (-?\d+)\s*$", re.MULTILINE)
CONNECT_FAILED_RE = re.compile(rb"^ssh: connect to host .* port \d+: (.+?)\s*$", re.MULTILINE)
CONNECT_REASONS = {
    b"Connection timed out": "connection timed out",
    b"Connection refused": "connection refused",
    b"No route to host": "no route to host",
    b"Network is unreachable": "no route to host",
}
"""OpenSSH's words for a failed TCP connect -> ``launch.transport.jump.unreachable_reason``'s."""


@dataclass(frozen=True)
class ExecTarget:
    """One node as the OpenSSH fan-out needs it, read from fleetrun's own fleet state. A node
    behind a jump host is never one: those go through the paramiko path (one shared connection
    to the jump host, as every other command)."""

    name: str
    address: str
    port: int
    user: str
    key: Path | None
    host_key: str
    proxy_jump: JumpHost | None = None

    def known_hosts_line(self) -> str:
        """As ``SshEndpoint.known_hosts_line``: the name OpenSSH looks up, then the pinned key."""
        name = self.address if self.port == 22 else f"[{self.address}]:{self.port}"
        return f"{name} {self.host_key}"


def ssh_argv(target: ExecTarget, known_hosts: Path, log_path: Path, command: str) -> list[str]:
    """``ssh`` for one node: its own log into ``log_path``, then exactly ``openssh_command``'s strict
    options (OpenSSH keeps the first value of an option, so the log level must come first), no
    stdin, no terminal, and ``--`` so neither the address nor the command is read as an option."""
    strict = openssh_command(target, known_hosts)
    return [
        strict[0],
        *("-o", "LogLevel=DEBUG1", "-E", str(log_path), "-o", FAST_KEX),
        *strict[1:],
        *("-n", "-T", "-l", target.user, "--", target.address, command),
    ]


def connect_failure(log: bytes, target: ExecTarget) -> str | None:
    """A failed TCP connect in ``ssh``'s log, in the paramiko path's words
    (``launch.transport.jump.connect_errors``); None for any other failure."""
    reason = CONNECT_FAILED_RE.search(log)
    words = CONNECT_REASONS.get(reason.group(1)) if reason else None
    if words is None:
        return None
    return f"unreachable at {target.user}@{target.address}:{target.port} ({words})"


class _Node:
    """One ``ssh`` in flight: its process, its pipes (stdout, stderr, and a FIFO for its own log:
    ``ssh`` closes every inherited descriptor above stderr, so ``-E`` must name a path), what it
    said so far."""

    def __init__(self, target: ExecTarget, known_hosts: Path, command: str, log_path: Path) -> None:
        self.target = target
        self.out = BoundedOutput(target.name, "output")
        self.err = BoundedOutput(target.name, "error output")
        self.log = bytearray()
        self.authenticated_at: float | None = None
        self.verdict: str | None = None
        """Set when the fan-out gave up on this node (a timeout): the message to report."""
        os.mkfifo(log_path, 0o600)
        self.log_path = log_path
        # no writer yet: a FIFO read end reports neither data nor a hang-up until one came and went
        self.log_fd = os.open(log_path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        self.log_watched = True
        pipes = [os.pipe() for _ in range(2)]
        try:
            self.proc = subprocess.Popen(
                ssh_argv(target, known_hosts, log_path, command),
                stdin=subprocess.DEVNULL,
                stdout=pipes[0][1],
                stderr=pipes[1][1],
            )
        except BaseException:
            for read_end, _ in pipes:
                os.close(read_end)
            os.close(self.log_fd)
            log_path.unlink()
            raise
        finally:
            for _, write_end in pipes:
                os.close(write_end)
        for read_end, _ in pipes:
            os.set_blocking(read_end, False)
        self.sinks: dict[int, BoundedOutput | None] = {pipes[0][0]: self.out, pipes[1][0]: self.err}
        """stdout's and stderr's read ends while open, and where their bytes go; the node is done
        when both are closed (and its log read to the end)."""

    def take(self, fd: int, chunk: bytes, now: float) -> None:
        sink = self.sinks.get(fd)
        if sink is not None:
            sink.add(chunk)
            return
        self.log += chunk
        if self.authenticated_at is None and AUTHENTICATED in self.log:
            self.authenticated_at = now
        if len(self.log) > LOG_KEPT_BYTES:
            del self.log[: len(self.log) - LOG_KEPT_BYTES]

    def give_up(self, verdict: str) -> None:
        """Stop waiting for this node: its ``ssh`` is killed (the connection with it)."""
        self.verdict = verdict
        if self.proc.poll() is None:
            self.proc.kill()

    def close(self, fd: int, selector: selectors.BaseSelector) -> None:
        """stdout's or stderr's read end at its end (or given up on)."""
        selector.unregister(fd)
        os.close(fd)
        del self.sinks[fd]

    def park_log(self, selector: selectors.BaseSelector) -> None:
        """Stop watching the log (its writer is gone: a hang-up would wake every select)."""
        if self.log_watched:
            selector.unregister(self.log_fd)
            self.log_watched = False

    def end_log(self, selector: selectors.BaseSelector, now: float) -> None:
        """Once ``ssh`` exited: the rest of its log, then the FIFO gone."""
        self.park_log(selector)
        with contextlib.suppress(BlockingIOError):
            while chunk := os.read(self.log_fd, READ_BYTES):
                self.take(self.log_fd, chunk, now)
        os.close(self.log_fd)
        self.log_path.unlink(missing_ok=True)

    def outcome(self) -> tuple[int, str] | str | None:
        """(exit code, "") when the command ran; the failure's message when it is known here; None
        when the command never ran and only the paramiko path can name why."""
        if self.verdict is not None:
            return self.verdict
        log = bytes(self.log)
        if self.authenticated_at is None:  # not the kept log's tail: its start may be cut (LOG_KEPT_BYTES)
            return connect_failure(log, self.target)
        statuses = EXIT_STATUS_RE.findall(log)
        if statuses:
            return int(statuses[-1]), ""
        last = [line for line in log.decode("utf-8", "replace").splitlines() if line.strip()][-1:]
        return f"connection lost: {last[0] if last else f'ssh exited with code {self.proc.returncode}'}"


def _private_folder() -> Path:
    """A new 0700 folder for the FIFOs under the temporary folder (what ``tempfile.mkdtemp`` makes,
    without importing ``tempfile``, ``random`` and ``shutil`` for it)."""
    base = Path(os.environ.get("TMPDIR") or "/tmp")
    while True:
        folder = base / f"fleetrun-exec-{os.urandom(6).hex()}"
        try:
            folder.mkdir(mode=0o700)
        except FileExistsError:
            continue
        return folder


def run_openssh(
    targets: Sequence[ExecTarget],
    known_hosts: Path,
    command: str,
    report: ExecReport,
    timeout: float,
    max_parallel: int,
) -> list[str]:
    """``command`` on every target, at most ``max_parallel`` at once, each outcome into ``report``
    as the node ends.

    Returns the names of the nodes whose failure only the paramiko path can name (see the module
    doc): the command did not run there.
    """
    ensure_open_files(3 * min(max_parallel, len(targets)) + 256)  # three pipes per ssh in flight
    started = time.monotonic()
    deadline = started + timeout + DEADLINE_EXTRA_S
    late = f"no answer within {timeout + DEADLINE_EXTRA_S:.0f} s"
    waiting = list(targets)
    nodes: dict[int, _Node] = {}  # by read end
    flying: list[_Node] = []
    handed_back: list[str] = []
    selector = selectors.DefaultSelector()
    logs = _private_folder()
    numbers = itertools.count()
    try:
        while waiting or flying:
            now = time.monotonic()
            while waiting and len(flying) < max_parallel and now < deadline:
                node = _Node(waiting.pop(0), known_hosts, command, logs / f"ssh-{next(numbers)}.log")
                flying.append(node)
                for fd in (*node.sinks, node.log_fd):
                    selector.register(fd, selectors.EVENT_READ)
                    nodes[fd] = node
            if now >= deadline:
                for target in waiting:
                    report.unreachable(target.name, late)
                waiting.clear()
            wake = [deadline, *(n.authenticated_at + timeout for n in flying if n.authenticated_at)]
            for key, _ in selector.select(max(0.0, min(wake) - now) + 0.005):
                fd = int(key.fd)
                node = nodes[fd]
                try:
                    chunk = os.read(fd, READ_BYTES)
                except BlockingIOError:
                    continue
                if chunk:
                    node.take(fd, chunk, time.monotonic())
                elif fd == node.log_fd:  # ssh closed its log: the rest is read once it has exited
                    node.park_log(selector)
                else:
                    node.close(fd, selector)
            now = time.monotonic()
            for node in list(flying):
                if node.verdict is None and now >= deadline:
                    node.give_up(late)
                elif (
                    node.verdict is None and node.authenticated_at and now >= node.authenticated_at + timeout
                ):
                    node.give_up(f"command timed out after {timeout} s: {command[:80]}")
                if node.verdict is not None:
                    for fd in list(node.sinks):
                        node.close(fd, selector)
                if node.sinks:
                    continue
                node.proc.wait()
                node.end_log(selector, time.monotonic())
                flying.remove(node)
                outcome = node.outcome()
                if outcome is None:
                    handed_back.append(node.target.name)
                elif isinstance(outcome, str):
                    report.unreachable(node.target.name, outcome)
                else:
                    report.answered(node.target.name, outcome[0], node.out.text(), node.err.text())
    finally:
        for node in flying:  # interrupted (Ctrl-C): no ssh outlives the command
            node.give_up("interrupted")
            for fd in list(node.sinks):
                node.close(fd, selector)
            node.proc.wait()
            node.end_log(selector, time.monotonic())
        selector.close()
        for leftover in logs.iterdir():  # each node removes its own FIFO; this is for a failed start
            leftover.unlink(missing_ok=True)
        logs.rmdir()
    return handed_back
