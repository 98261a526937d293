"""Commands over past and running runs: list, show, logs, and re-attaching a watcher.

Run records live in ``$FLEETRUN_HOME/runs.db``; each record points at its run folder, whose
``watch.json`` holds what a new watcher needs (inventory, rules, teardown policy). A watcher that
died (laptop closed, process killed) leaves a ``running`` record with a dead pid: listing marks it
``interrupted``, and ``fab watch RUN`` takes over where it stopped.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from rich.console import Console

from launch.cli.run_lookup import find_run, open_records
from launch.errors import FleetrunError
from launch.paths import known_hosts_file
from launch.planning import remote_layout as layout
from launch.reports import log_follow
from launch.reports.safe_text import MAX_LINE_CHARS, clean, safe_text
from launch.reports.views import runs_table, show_run
from launch.run import lifecycle
from launch.run.records import RunRecord
from launch.run.reporter import RichReporter
from launch.run.run_folder import read_log_text, read_teardown
from launch.run.summary import RunSummary
from launch.run.target import WatchTarget
from launch.transport.ssh import Fleet


def list_runs(console: Console, limit: int = 20) -> list[RunRecord]:
    with open_records() as records:
        records.mark_stale_as_interrupted(time.time())
        runs = records.list(limit=limit)
    console.print(runs_table(runs, width=console.width))
    return runs


def show(run: str, console: Console) -> RunRecord:
    with open_records() as records:
        records.mark_stale_as_interrupted(time.time())
        record = find_run(records, run)
    teardown = read_teardown(Path(record.run_dir)) if record.run_dir else None
    console.print(show_run(record, teardown=teardown))
    return record


def logs(
    run: str,
    console: Console,
    node: str | None = None,
    follow: bool = False,
    poll: float = 1.0,
    from_start: bool = False,
) -> None:
    """Per-node logs: the pulled copies once a run ended, or live from the nodes while it runs."""
    with open_records() as records:
        records.mark_stale_as_interrupted(time.time())
        record = find_run(records, run)
    folder = Path(record.run_dir or "")
    ended = record.state not in ("running", "interrupted")
    if ended or not follow:
        nodes_dir = folder / "nodes"
        names = sorted(p.name for p in nodes_dir.iterdir()) if nodes_dir.exists() else []
        if node:
            names = [n for n in names if n == node]
            if not names:
                raise FleetrunError(f"run {record.id} has no pulled log for node {clean(node, 100)!r}")
        for name in names:
            console.rule(safe_text(name))
            for line in read_log_text(nodes_dir / name / "node.log").splitlines():
                console.print(safe_text(line, limit=MAX_LINE_CHARS), highlight=False)
        return
    follow_live(WatchTarget.load(folder), console, node, poll, from_start)


OFFSETS_FILE = "follow-offsets.json"
"""In the run folder: per node, the log bytes ``fab logs --follow`` already printed."""


def follow_live(
    target: WatchTarget, console: Console, node: str | None, poll: float = 1.0, from_start: bool = False
) -> None:
    """Every node's log live, merged, each line once (``launch.reports.log_follow``), prefixed
    ``node/rank``; a lost connection is retried from the saved offsets until every log ended."""
    ranks = {h.name: rank for rank, h in enumerate(target.inventory.hosts)}
    hosts = [h for h in target.inventory.hosts if node is None or h.name == node]
    if not hosts:
        raise FleetrunError(f"run {target.run_id} has no node {clean(node or '', 100)!r}")
    known_hosts = target.inventory.write_known_hosts(known_hosts_file(target.inventory.fingerprint()))
    saved = target.folder / OFFSETS_FILE
    text = None if from_start or not saved.exists() else saved.read_text(errors="replace")[:1_000_000]
    offsets = log_follow.load_offsets(text, [h.name for h in hosts])
    run_dir = layout.rundir(target.run_id)
    done: set[str] = set()
    with Fleet(hosts, known_hosts) as fleet, _interrupt_between_batches() as interrupted:
        while not interrupted:
            pending = [h for h in hosts if h.name not in done]
            results = fleet.map(
                lambda c: c.run(
                    log_follow.follow_command(f"{run_dir}/node.log", f"{run_dir}/rc", offsets[c.host.name]),
                    timeout=60,
                ),
                hosts=pending,
            )
            for name, res in results.items():
                try:
                    if isinstance(res, BaseException):
                        raise res
                    chunk = log_follow.parse_answer(res.stdout)
                except Exception as exc:  # noqa: BLE001 - a lost node is retried at the next poll
                    console.print(safe_text(f"{name}: {exc} (retrying)", style="yellow"))
                    continue
                lines, offsets[name], finished = log_follow.complete_lines(chunk, offsets[name])
                label = safe_text(log_follow.prefix(name, ranks[name]), style="dim")
                for line in lines:
                    console.print(
                        label + " " + safe_text(line.decode("utf-8", "replace"), limit=MAX_LINE_CHARS)
                    )
                if finished:
                    done.add(name)
            tmp = saved.with_suffix(".tmp")
            tmp.write_text(log_follow.dump_offsets(offsets))
            tmp.replace(saved)
            if len(done) == len(hosts):
                return
            time.sleep(poll)
    console.print(
        safe_text(f"stopped following; 'fab logs {target.run_id} --follow' continues from here", style="dim")
    )


@contextlib.contextmanager
def _interrupt_between_batches() -> Iterator[list[int]]:
    """Ctrl-C (SIGINT) ends ``--follow`` between two batches, never between printing lines and
    saving their offsets (which would repeat or lose lines at the next ``--follow``). Only in the
    main thread, where Python delivers signals; elsewhere Ctrl-C cannot reach the loop anyway."""
    flag: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield flag
        return
    previous = signal.signal(signal.SIGINT, lambda _signum, _frame: flag.append(1))
    try:
        yield flag
    finally:
        signal.signal(signal.SIGINT, previous)


def reattach(run: str, console: Console, poll_interval: float = 1.0) -> RunSummary:
    """Follow an interrupted run again, every attempt and recovery included, and wrap it up
    (stop, pull, teardown) when it ends (``launch.run.lifecycle.reattach``)."""
    with open_records() as records:
        records.mark_stale_as_interrupted(time.time())
        record = find_run(records, run)
        return lifecycle.reattach(records, record, RichReporter(console), poll_interval)


def pull_again(run: str, console: Console) -> lifecycle.PulledAgain:
    """Pull a finished run's artifacts again (after a failed pull blocked its teardown), then apply
    the playbook's teardown if every node's run directory is now safe."""
    with open_records() as records:
        return lifecycle.pull_again(records, find_run(records, run), RichReporter(console))
