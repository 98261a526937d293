"""``fab pull RUN``: the wrap-up's pull again for a run that ended, and its exit code."""

from __future__ import annotations

import socket
import time
from pathlib import Path

from launch.job.inventory import Host, Inventory
from launch.rules.stoprules import StopRules, Teardown
from launch.run.records import RunRecords
from launch.run.target import WatchTarget
from tests.conftest import SAMPLE_HOST_KEYS, fab


def test_a_failed_pull_exits_1_even_when_nothing_waits_on_it(tmp_path: Path) -> None:
    """``fab pull`` printed "pulling artifacts ... failed" and exited 0 when the playbook keeps its
    fleet (``teardown: never``: no teardown to block); docs/reference/exit-codes.md promises 1
    ("fab pull could not secure every node's artifacts"). The node is a port on this machine
    that refuses (bound, not listening), so the pull fails at once and for real."""
    home, runs = tmp_path / "home", tmp_path / "runs"
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))  # held, never listening: a connection is refused
    try:
        host = Host(
            name="n0", address="127.0.0.1", port=closed.getsockname()[1], user="nobody",
            host_key=SAMPLE_HOST_KEYS[0],
        )  # fmt: skip
        folder = runs / "20261128-120000-ab12"
        folder.mkdir(parents=True)
        WatchTarget(
            run_id=folder.name, job="t-pull", inventory=Inventory(hosts=[host]), starters=("n0",),
            rules=StopRules(), teardown=Teardown.NEVER, started_at=time.time(), folder=folder,
        ).save()  # fmt: skip
        home.mkdir()
        with RunRecords(home / "runs.db") as records:
            records.start(run_id=folder.name, run_dir=str(folder), playbook_name="t-pull")
            records.finish(folder.name, state="succeeded")
        proc = fab("pull", folder.name, home=home, runs=runs, timeout=120)
    finally:
        closed.close()
    out = proc.stdout + proc.stderr
    assert "pulling artifacts from n0 failed: n0: unreachable" in out and "teardown: skipped" in out, out
    assert proc.returncode == 1, out
