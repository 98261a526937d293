"""``fab doctor --collective``: all-reduce and matmul through torchrun on groups of nodes.

The test script (``launch/nodelib/fleetrun_collective.py``) is written to each node's
``~/.fleetrun/`` over the doctor's own connections, then every node of a group runs
``python -m torch.distributed.run`` (the launcher ``fab train`` uses for torchrun jobs: static
rendezvous on the group's first node, one process per node; gloo on CPU, NCCL on GPU). Groups
measured at the same time use ports from the job's rendezvous port up. Where to look next is
decided by ``launch.rules.collective`` (bisection); this module only runs and collects.

Each run's figures are saved as ``collective/<time>.json`` in the runs folder (``save_result``)
and read back for the comparison over time (``read_history``): fleetrun's own files, still parsed
through ``launch.rules.collective.SavedResult``, bounded in count and size; a broken or foreign
file is skipped with a one-line note.
"""

from __future__ import annotations

import json
import os
import shlex
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from launch.job.inventory import Host
from launch.reports.safe_text import clean
from launch.rules.collective import (
    CollectiveReport,
    Group,
    GroupResult,
    HistoryFinding,
    SavedResult,
    compare_history,
    locate,
    parse_result,
    saved_result,
)
from launch.transport.ssh import Fleet, NodeConnection

SCRIPT = ".fleetrun/fleetrun_collective.py"
GROUP_TIMEOUT_S = 240.0


def install_script(fleet: Fleet, hosts: Sequence[Host]) -> dict[str, str]:
    """The test script onto every node; errors by node name."""
    source = resources.files("launch.nodelib").joinpath("fleetrun_collective.py").read_bytes()

    def put(conn: NodeConnection) -> None:
        result = conn.run_with_input(
            f'mkdir -p "$HOME/.fleetrun" && cat > "$HOME/{SCRIPT}"', source, timeout=30
        )
        if not result.ok:
            raise RuntimeError(result.stderr.strip()[-300:] or f"exit {result.exit_code}")

    results = fleet.map(put, hosts=list(hosts), deadline=60)
    return {n: str(r) for n, r in results.items() if isinstance(r, BaseException)}


def group_command(host: Host, group: Sequence[Host], rank: int, port: int, env: Mapping[str, str]) -> str:
    head = group[0]
    address = head.private_address or head.address
    exports = {**env}
    if host.interface:
        exports.setdefault("GLOO_SOCKET_IFNAME", host.interface)
        exports.setdefault("NCCL_SOCKET_IFNAME", host.interface)
    prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(exports.items()))
    argv = [
        host.python,
        "-m",
        "torch.distributed.run",
        f"--nnodes={len(group)}",
        "--nproc-per-node=1",
        f"--node-rank={rank}",
        f"--master-addr={address}",
        f"--master-port={port}",
        "--max-restarts=0",
        f"$HOME/{SCRIPT}",
    ]
    quoted = " ".join(a if a.startswith("$HOME") else shlex.quote(a) for a in argv)
    return f'cd "$HOME" && env {prefix} {quoted} 2>&1'.replace("env  ", "env ")


def measurer(fleet: Fleet, hosts: Sequence[Host], port: int, env: Mapping[str, str] | None = None):  # type: ignore[no-untyped-def]
    """The ``measure`` callback of ``locate``: run groups at once, each on its own port."""
    by_name = {h.name: h for h in hosts}

    def measure(groups: Sequence[Group]) -> dict[Group, GroupResult]:
        commands: dict[str, str] = {}
        heads: dict[str, Group] = {}
        for i, group in enumerate(groups):
            members = [by_name[n] for n in group]
            heads[members[0].name] = group
            for rank, host in enumerate(members):
                commands[host.name] = group_command(host, members, rank, port + i, env or {})
        results = fleet.map(
            lambda c: c.run(commands[c.host.name], timeout=GROUP_TIMEOUT_S),
            hosts=[by_name[n] for n in commands],
            deadline=GROUP_TIMEOUT_S + 30,
        )
        found: dict[Group, GroupResult] = {}
        for head, group in heads.items():
            value = results.get(head)
            if isinstance(value, BaseException) or value is None:
                found[group] = GroupResult(None, error=str(value)[:300])
                continue
            result = parse_result(value.stdout)
            if result.busbw_gbps is None:
                tail = " / ".join(value.stdout.strip().splitlines()[-2:])[-300:]
                result = GroupResult(None, error=f"{result.error} (exit {value.exit_code}: {tail})")
            found[group] = result
        return found

    return measure


def check(
    fleet: Fleet, hosts: Sequence[Host], port: int, env: Mapping[str, str] | None = None
) -> tuple[CollectiveReport, float]:
    """Install the script, measure the fleet, bisect to the slow node; the report and seconds."""
    started = time.monotonic()
    errors = install_script(fleet, hosts)
    usable = [h for h in hosts if h.name not in errors]
    report = locate([h.name for h in usable], measurer(fleet, usable, port, env))
    return report, time.monotonic() - started


HISTORY_FILES = 500
"""The newest this many saved results are read (a year of daily doctor runs and more)."""
MAX_RESULT_BYTES = 1024**2
"""A saved result is a few KiB (per node and per group figures); a larger file is not one."""


def save_result(
    folder: Path, report: CollectiveReport, nodes: Sequence[str], seconds: float, now: float
) -> Path:
    """``collective/<time>.json``: the figures of this run; a second run in the same second gets
    a ``-2`` suffix rather than overwriting the first."""
    folder.mkdir(parents=True, exist_ok=True)
    record = {"time": now, "seconds": round(seconds, 2), "nodes": list(nodes), **report.to_json()}
    stem = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    for n in range(1, 100):
        path = folder / (f"{stem}.json" if n == 1 else f"{stem}-{n}.json")
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            continue
        with os.fdopen(fd, "w") as fh:
            fh.write(json.dumps(record, indent=2) + "\n")
        return path
    raise FileExistsError(f"{folder}: 99 collective results saved at {stem} already")


@dataclass
class History:
    """The saved results that could be read, oldest first, and a note for each skipped file."""

    results: list[tuple[Path, SavedResult]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    older_left_out: int = 0
    """Saved results older than the newest ``HISTORY_FILES``, not read."""

    def bounded_notes(self, shown: int = 5) -> list[str]:
        """The first ``shown`` notes, and how many more (a folder of broken files is one line more)."""
        more = len(self.notes) - shown
        return self.notes[:shown] + ([f"{more} more file(s) skipped"] if more > 0 else [])


def read_history(folder: Path, limit: int = HISTORY_FILES) -> History:
    """The newest ``limit`` saved results of ``folder`` (none when it does not exist)."""
    history = History()
    try:
        names = sorted(p for p in folder.iterdir() if p.suffix == ".json")
    except FileNotFoundError:
        return history
    except OSError as exc:
        history.notes.append(f"cannot list {clean(folder, 300)}: {clean(exc, 200)}")
        return history
    history.older_left_out = max(0, len(names) - limit)
    for path in names[-limit:] if limit > 0 else []:
        try:
            if not path.is_file() or path.is_symlink():
                raise ValueError("not a regular file")
            with path.open("rb") as fh:
                text = fh.read(MAX_RESULT_BYTES + 1)
            if len(text) > MAX_RESULT_BYTES:
                raise ValueError(f"over {MAX_RESULT_BYTES} bytes")
            history.results.append((path, saved_result(text)))
        except (OSError, ValueError) as exc:
            history.notes.append(f"skipping {clean(path.name, 200)}: {clean(exc, 300)}")
    history.results.sort(key=lambda item: item[1].time)
    return history


def keep_and_compare(
    folder: Path, report: CollectiveReport, nodes: Sequence[str], seconds: float, now: float
) -> tuple[Path, list[HistoryFinding], list[str]]:
    """Read the results saved before, save this one, compare it with them: its path, the
    findings (``launch.rules.collective.compare_history``) and the notes on skipped files."""
    history = read_history(folder)
    path = save_result(folder, report, nodes, seconds, now)
    try:
        current = saved_result(path.read_bytes())
    except (OSError, ValueError) as exc:  # names past the model's bounds: saved, not compared
        return path, [], [*history.bounded_notes(), f"not compared: {clean(exc, 300)}"]
    return path, compare_history(current, [r for _p, r in history.results]), history.bounded_notes()
