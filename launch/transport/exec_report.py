"""What ``fab exec`` prints: each node's output lines as ``name: line`` when the node is done, then
which nodes failed and why, in inventory order.

One printer for both ways ``fab exec`` reaches the nodes (paramiko in ``run_everywhere``,
OpenSSH in ``openssh_exec``): their output must be the same bytes for the same answers. Light
on purpose (no paramiko, no models, no Rich): the OpenSSH path is chosen for its start-up time.

A node's output is data, not terminal control: each line goes through ``clean`` (ESC, BEL,
backspace, C1 and bidi controls become ``?``; tabs stay; a line is capped as ``fab logs`` caps
one), so a node cannot retitle, clear or rewrite the operator's terminal. pdsh prints them raw.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TextIO

from launch.reports.plain_text import MAX_LINE_CHARS, clean


@dataclass(frozen=True)
class EverywhereResult:
    ok: list[str]
    failed: dict[str, str]

    @property
    def all_ok(self) -> bool:
        return not self.failed


@dataclass
class ExecReport:
    """Collects per-node outcomes as they come and prints them pdsh-style to ``out``.

    ``names`` is the inventory order (the failure summary's order); ``quiet`` prints failures only.
    """

    names: list[str]
    out: TextIO
    quiet: bool = False
    ok: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)

    def answered(self, name: str, exit_code: int, stdout: str, stderr: str) -> None:
        """The node ran the command: its output lines (stdout, then stderr), then its verdict."""
        if not self.quiet:
            for stream in (stdout, stderr):
                for line in stream.splitlines():
                    self.out.write(f"{name}: {clean(line, MAX_LINE_CHARS)}\n")
        if exit_code == 0:
            self.ok.append(name)
        else:
            self.failed[name] = f"exit code {exit_code}"

    def unreachable(self, name: str, message: str) -> None:
        """The node gave no answer (no connection, a timeout): ``message`` says why, without the name."""
        self.failed[name] = clean(message)

    def finish(self) -> EverywhereResult:
        """The summary of the failed nodes (nothing when none failed); the output flushed."""
        if self.failed:
            for name in (n for n in self.names if n in self.failed):
                self.out.write(f"fleetrun: {name}: FAILED: {self.failed[name]}\n")
            self.out.write(
                f"fleetrun: {len(self.ok)}/{len(self.names)} node(s) ok, {len(self.failed)} failed\n"
            )
        self.out.flush()
        return EverywhereResult(ok=self.ok, failed=self.failed)
