"""``fab doctor --collective``: all-reduce and matmul through ONE torchrun launch over the nodes.

The test script (``launch/nodelib/fleetrun_collective.py``) is written to each node's
``~/.fleetrun/`` over the doctor's own connections, then every node runs
``python -m torch.distributed.run`` (the launcher ``fab train`` uses for torchrun jobs: static
rendezvous on the first node, one process per node, node i rank i; gloo on CPU, NCCL on GPU). The
script runs every round of the fixed schedule in that one launch (starting torch on every node is
what costs, tens of seconds on a loaded fleet, so never twice); rank 0's result line is read back
and ``launch.rules.collective`` names the slow node or link. The suspects' re-measure runs in that
same launch too (rank 0 plans it from the ring's figures and broadcasts the plan): a node is
named only when its re-measure confirms it. This module only runs and collects.

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
    HistoryFinding,
    Measured,
    SavedResult,
    compare_history,
    locate,
    parse_result,
    saved_result,
)
from launch.transport.ssh import Fleet, NodeConnection

SCRIPT = ".fleetrun/fleetrun_collective.py"
LAUNCH_TIMEOUT_S = 300.0
"""One launch: starting torch on every node (a minute on a loaded 16-node local fleet) and 3-4 rounds."""


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


def node_command(host: Host, head: Host, world: int, rank: int, port: int, env: Mapping[str, str]) -> str:
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
        f"--nnodes={world}",
        "--nproc-per-node=1",
        f"--node-rank={rank}",
        f"--master-addr={address}",
        f"--master-port={port}",
        "--max-restarts=0",
        f"$HOME/{SCRIPT}",
    ]
    quoted = " ".join(a if a.startswith("$HOME") else shlex.quote(a) for a in argv)
    return f'cd "$HOME" && env {prefix} {quoted} 2>&1'.replace("env  ", "env ")


def measure(fleet: Fleet, hosts: Sequence[Host], port: int, env: Mapping[str, str] | None = None) -> Measured:
    """The one launch over ``hosts`` (rank i is ``hosts[i]``), parsed from rank 0's output; when
    rank 0 left no usable result, the error carries the tail of its output (or of the first node
    that failed, when rank 0's own says nothing)."""
    names = [h.name for h in hosts]
    commands = {
        h.name: node_command(h, hosts[0], len(hosts), i, port, env or {}) for i, h in enumerate(hosts)
    }
    results = fleet.map(
        lambda c: c.run(commands[c.host.name], timeout=LAUNCH_TIMEOUT_S),
        hosts=list(hosts),
        deadline=LAUNCH_TIMEOUT_S + 30,
    )
    head = results.get(names[0])
    if isinstance(head, BaseException) or head is None:
        return parse_result("", names).with_error(f"rank 0 on {names[0]}: {str(head)[:300]}")
    measured = parse_result(head.stdout, names)
    if measured.fleet.busbw_gbps is None:
        tail = " / ".join(head.stdout.strip().splitlines()[-2:])[-300:]
        measured = measured.with_error(f"{measured.fleet.error} (exit {head.exit_code}: {tail})")
    return measured


def check(
    fleet: Fleet, hosts: Sequence[Host], port: int, env: Mapping[str, str] | None = None
) -> tuple[CollectiveReport, float]:
    """Install the script, run the one launch, name the slow node or link; the report and seconds."""
    started = time.monotonic()
    errors = install_script(fleet, hosts)
    usable = [h for h in hosts if h.name not in errors]
    names = [h.name for h in usable]
    measured = measure(fleet, usable, port, env) if len(usable) >= 2 else parse_result("", names)
    return locate(names, measured), time.monotonic() - started


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
