"""The fan-out abandons a hung node at its deadline, also at the process's exit: its workers are
daemon threads (``launch.transport.daemon_pool``), so a call no ``close`` can unblock (a TCP
connect to an address that drops packets) never keeps ``fab train`` or ``fab exec`` alive."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
from pathlib import Path

from launch.errors import HostError
from launch.job.inventory import Host
from launch.transport.daemon_pool import DaemonPool
from launch.transport.ssh import parallel_map
from tests.fakefleet import fake_hosts

REPO = Path(__file__).resolve().parent.parent


def test_a_hung_node_is_reported_and_its_worker_is_a_daemon_thread() -> None:
    release = threading.Event()
    hosts = fake_hosts(2)

    def call(host: Host) -> str:
        if host.name == hosts[1].name:
            release.wait(600)
        return f"{host.name} ok"

    try:
        results = parallel_map(hosts, call, deadline=0.5)
        assert results[hosts[0].name] == f"{hosts[0].name} ok"
        assert isinstance(results[hosts[1].name], HostError)
        assert "no answer within" in str(results[hosts[1].name])
        workers = [t for t in threading.enumerate() if t.name.startswith("fleetrun_")]
        assert workers and all(t.daemon for t in workers)
    finally:
        release.set()


def test_a_process_whose_fan_out_gave_up_on_a_node_exits() -> None:
    """The hung call would block for an hour; the process ends as soon as its own work is done
    (with ``ThreadPoolExecutor`` the interpreter's exit joined that thread: this timed out)."""
    script = textwrap.dedent(
        """
        import time
        from launch.transport.ssh import parallel_map
        from tests.fakefleet import fake_hosts

        hosts = fake_hosts(2)
        results = parallel_map(hosts, lambda h: time.sleep(3600) if h is hosts[1] else "ok", deadline=0.5)
        print(sorted(type(r).__name__ for r in results.values()))
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "['HostError', 'str']"


def test_shutdown_cancels_what_has_not_started() -> None:
    started, release = threading.Event(), threading.Event()
    pool = DaemonPool(max_workers=1)

    def hold() -> bool:
        started.set()
        return release.wait(600)

    busy = pool.submit(hold)
    assert started.wait(60)
    queued = [pool.submit(lambda: "never") for _ in range(2)]
    pool.shutdown(wait=False, cancel_futures=True)
    assert all(f.cancelled() for f in queued)
    release.set()
    assert busy.result(timeout=60) is True
