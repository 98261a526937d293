"""``fab exec`` on fleetrun's own local fleet without Invoke, Fabric, paramiko or pydantic.

On a small fleet the whole ``fab exec`` process is start-up: the full path imports Invoke to
parse the line, Fabric and paramiko to connect and pydantic to validate the inventory (0.45 s of
its 0.55 s of imports, ``bench/exec_profile.py``). This path parses the one command line it
covers, reads the local fleet's inventory as fleetrun wrote it (``local_hosts``) and runs one
OpenSSH client per node (``launch.transport.openssh_exec``), with the same pinned keys, the same
printer (``ExecReport``) and the same exit codes: 0 when every node answered 0, 1 otherwise.

It covers ``exec COMMAND`` with ``--inventory/-i local[:PREFIX]``, ``--timeout``, ``--parallel``
and ``--quiet``, each at most once, as ``--opt VALUE`` or ``--opt=VALUE``. Anything else (help,
another selector, a value the full path would refuse, a fleet with a jump host, a warm fleet's
deadline to enforce, a setting in error) returns ``None`` before anything was done, and the
caller runs the full path, which answers as it always did. A node whose connection failed for a
reason only paramiko's path names (a host key, a key, a handshake) is run there alone: the
command never ran on it, and its message is the full path's own.
"""

from __future__ import annotations

import math
import os
import sys
from typing import TYPE_CHECKING

from launch.errors import FleetrunError
from launch.settings import MAX_FANOUT, Settings, active

if TYPE_CHECKING:
    from launch.transport.openssh_exec import ExecTarget

COMMAND = "exec"
VALUE_OPTIONS = {
    "--inventory": "inventory",
    "-i": "inventory",
    "--timeout": "timeout",
    "--parallel": "parallel",
}
"""The task's options that take a value, by spelling (``-i`` is ``launch.cli.options.SHORT_FLAGS``'s)."""
FLAG_OPTIONS = {"--quiet": "quiet"}
DEFAULT_TIMEOUT = 60.0
"""``launch.cli.tasks.exec_``'s default (a test checks they agree, and every option above)."""


def parse(args: list[str]) -> dict[str, str] | None:
    """``exec``'s arguments (after the program name) as option -> text, or None when not covered."""
    if not args or args[0] != COMMAND:
        return None
    given: dict[str, str] = {}
    tokens = iter(args[1:])
    for token in tokens:
        name, eq, value = token.partition("=") if token.startswith("--") else (token, "", "")
        if name in VALUE_OPTIONS:
            if not eq:
                value = next(tokens, "")
                if value.startswith("-") or not value:
                    return None
            key = VALUE_OPTIONS[name]
        elif name in FLAG_OPTIONS and not eq:
            key, value = FLAG_OPTIONS[name], "yes"
        elif not token.startswith("-") and token:
            key, value = "command", token
        else:
            return None
        if key in given:
            return None
        given[key] = value
    return given if "command" in given else None


def run(args: list[str]) -> int | None:
    """Run ``fab exec`` here and return its exit code, or None: not covered, nothing done."""
    given = parse(args)
    if given is None:
        return None
    selector = given.get("inventory", "local")
    kind, _, prefix = selector.partition(":")
    if kind != "local" or (_ and not prefix):
        return None
    try:
        timeout = float(given.get("timeout", DEFAULT_TIMEOUT))
        parallel = int(given.get("parallel", "0"))
    except ValueError:
        return None
    if not (math.isfinite(timeout) and timeout > 0) or not 0 <= parallel <= MAX_FANOUT:
        return None
    try:
        settings = Settings.from_env().with_fanout(parallel)
    except FleetrunError:
        return None
    warm = settings.home / "warm"
    if warm.is_dir() and any(warm.glob("*.json")):
        return None  # the full path tears down a warm fleet past its deadline first

    from launch.fleets.kinds.local_hosts import read_local_targets

    if not any(
        os.access(os.path.join(d, "ssh"), os.X_OK) for d in os.environ.get("PATH", os.defpath).split(":")
    ):
        return None  # no OpenSSH client here: paramiko's path needs none
    fleet = prefix or settings.local_prefix
    targets = read_local_targets(settings.home, fleet)
    if targets is None:
        return None
    return _exec(settings, selector, fleet, targets, given["command"], timeout, "quiet" in given)


def _exec(
    settings: Settings,
    selector: str,
    fleet: str,
    targets: list[ExecTarget],
    command: str,
    timeout: float,
    quiet: bool,
) -> int:
    """The command on every target over OpenSSH; the nodes only the full path can name, there."""
    from launch.job.known_hosts import write_known_hosts_lines
    from launch.transport.exec_report import ExecReport
    from launch.transport.openssh_exec import run_openssh

    lines = [t.known_hosts_line() for t in targets]
    with active(settings):  # a file of its own per fleet, written fresh: exactly its pinned keys
        known_hosts = write_known_hosts_lines(settings.home / "known_hosts" / f"exec-local-{fleet}", lines)
        report = ExecReport([t.name for t in targets], sys.stdout, quiet)
        left = run_openssh(targets, known_hosts, command, report, timeout, settings.fanout)
        if left:
            from launch.fleets.select import load_inventory
            from launch.transport.run_everywhere import run_on_hosts

            try:
                inventory = load_inventory(selector)
            except FleetrunError as exc:  # the file changed under the command: as the full path says it
                from launch.reports.plain_text import MAX_LINE_CHARS, clean

                sys.stdout.flush()
                print(f"fleetrun: error: {clean(exc, MAX_LINE_CHARS, multiline=True)}", file=sys.stderr)
                return 2
            hosts = [h for h in inventory.hosts if h.name in left]
            run_on_hosts(inventory, hosts, command, report, timeout=timeout, max_parallel=settings.fanout)
        return 0 if report.finish().all_ok else 1


def main(args: list[str] | None = None) -> int | None:
    """``run`` of ``args`` (``sys.argv`` when None: the program name first), a closed reader (``fab exec ... | head``) as the full
    path treats it (exit 1, nothing more said)."""
    try:
        return run(sys.argv[1:] if args is None else args[1:])
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except KeyboardInterrupt:  # as Invoke's program answers Ctrl-C (every ssh is already killed)
        return 1
