"""``fab exec``: one shell command on every node, pdsh-style, over in-process threaded SSH.

What a lab otherwise does with ``pdsh -w ... cmd``, with the same pinned host keys as every
other fleetrun connection, a bound on concurrency, a per-host timeout (a hung host is reported,
never waited on forever) and per-host results: output lines prefixed ``host: `` and, at the end,
which hosts failed and why. Threaded paramiko ran ~3x faster than pdsh at 64 nodes on the
local-fleet machine kind, and skipping the launch pipeline's imports keeps start-up short.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import TextIO

from launch.job.inventory import Inventory
from launch.paths import known_hosts_file
from launch.settings import DEFAULT_FANOUT
from launch.transport.ssh import CommandResult, Fleet


@dataclass(frozen=True)
class EverywhereResult:
    ok: list[str]
    failed: dict[str, str]

    @property
    def all_ok(self) -> bool:
        return not self.failed


def run_everywhere(
    inventory: Inventory,
    command: str,
    timeout: float = 60.0,
    max_parallel: int = DEFAULT_FANOUT,
    out: TextIO | None = None,
    quiet: bool = False,
) -> EverywhereResult:
    """Run ``command`` on every host; print its output per host; never raise for one host's failure."""
    out = out or sys.stdout
    known_hosts = inventory.write_known_hosts(known_hosts_file(inventory.fingerprint()))
    ok: list[str] = []
    failed: dict[str, str] = {}

    def report(name: str, result: CommandResult | BaseException) -> None:
        if isinstance(result, BaseException):
            failed[name] = str(result).removeprefix(f"{name}: ") or type(result).__name__
            return
        if not quiet:
            for stream in (result.stdout, result.stderr):
                for line in stream.splitlines():
                    out.write(f"{name}: {line}\n")
        if result.ok:
            ok.append(name)
        else:
            failed[name] = f"exit code {result.exit_code}"

    with Fleet(inventory.hosts, known_hosts, max_parallel=max_parallel) as fleet:
        fleet.map(
            lambda conn: conn.run(command, timeout=timeout),
            on_done=report,
            deadline=timeout + 30,
        )
    if failed:
        for name in (h.name for h in inventory.hosts if h.name in failed):
            out.write(f"fleetrun: {name}: FAILED: {failed[name]}\n")
        out.write(f"fleetrun: {len(ok)}/{len(inventory.hosts)} node(s) ok, {len(failed)} failed\n")
    out.flush()
    return EverywhereResult(ok=ok, failed=failed)
