"""Between attempts, a survivor's ``rc`` must not be read as the next attempt's exit.

The node's wrapper (``sh -c WRAPPER``, its pid in ``pid``) carries no ``FLEETRUN_RUN_ID``: the
agent's ``stop`` kills its child, not it, and the wrapper writes ``rc`` a moment later. Moved to
``attempt-<n>/`` before that, the ``rc`` lands in the run directory and the next attempt's watcher
reads it as that attempt's exit at once (seen under load as ``exited 137`` one second into the
attempt on the spare, bench/gpu_health.py's spare row). The stop command, run here in a
``sh`` on this machine, waits for the wrapper first."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from types import SimpleNamespace

from launch.job.inventory import Host
from launch.planning import remote_layout as layout
from launch.run.attempts import stop_survivors
from launch.transport.port import CommandResult, NodeResults
from tests.conftest import SAMPLE_HOST_KEYS


class LocalLink:
    """A node whose commands run in ``sh`` on this machine, with ``home`` as its home."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.host = SimpleNamespace(name="n0")

    def run(self, command: str, timeout: float | None = None) -> CommandResult:
        proc = subprocess.run(
            ["sh", "-c", command],
            cwd=self.home,
            env={**os.environ, "HOME": str(self.home)},
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        return CommandResult("n0", proc.returncode, proc.stdout, proc.stderr)


class ShellFleet:
    def __init__(self, link: LocalLink) -> None:
        self.link = link

    def map(self, fn, hosts=None, on_done=None, deadline=None):  # type: ignore[no-untyped-def]
        results: NodeResults[object] = NodeResults()
        try:
            results["n0"] = fn(self.link)
        except Exception as exc:  # noqa: BLE001 - per host, as the real map does
            results["n0"] = exc
        return results


def test_the_attempts_files_move_only_once_the_wrapper_wrote_its_rc(tmp_path: Path) -> None:
    run_id = "job-20261125-190451-9061e5"
    run_dir = tmp_path / layout.rundir(run_id)
    run_dir.mkdir(parents=True)
    agent = tmp_path / layout.AGENT
    agent.parent.mkdir(parents=True)
    agent.write_text("#!/bin/sh\nexit 0\n")  # the child is already gone; the wrapper is not
    agent.chmod(0o755)
    # not this process's child (the node's wrapper is not the agent's either): reaped when it ends
    started = subprocess.run(
        ["sh", "-c", "(sleep 0.8; echo 137 > rc.tmp; mv rc.tmp rc) >/dev/null 2>&1 & echo $!"],
        cwd=run_dir,
        capture_output=True,
        text=True,
        check=True,
    )
    (run_dir / "pid").write_text(started.stdout.strip())
    errors = stop_survivors(
        ShellFleet(LocalLink(tmp_path)),  # type: ignore[arg-type]
        [Host(name="n0", address="127.0.0.1", user="u", host_key=SAMPLE_HOST_KEYS[0])],
        run_id,
        0.0,
        1,
    )
    assert errors == {}
    assert (run_dir / "attempt-1" / "rc").read_text().strip() == "137"
    assert not (run_dir / "rc").exists(), "the old attempt's rc would be read as the next one's exit"
    assert (run_dir / "attempt-1" / "pid").exists()
