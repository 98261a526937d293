"""Getting a run's results off the nodes: stop every process of the run, pull each node's run
directory (the bucket copy is in ``launch.run.wrapup``). These are the I/O steps the wrap-up orders; they report
errors per host and never raise for one bad node, because the wrap-up must decide with all of them.
"""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path
from typing import Any

from rich.console import Console

from launch.errors import HostError
from launch.planning import remote_layout as layout
from launch.reports.safe_text import markup_safe
from launch.run.run_folder import RunFolder
from launch.run.watch import AGENT
from launch.transport.ssh import Fleet, NodeConnection, openssh_command


def rsync_error(stderr: str, code: int) -> str:
    """The lines of rsync's stderr that say what failed (its last line is only the generic code)."""
    lines = [line.strip() for line in stderr.strip().splitlines() if line.strip()]
    specific = [line for line in lines if "rsync error" not in line][:3]
    generic = [line for line in lines if "rsync error" in line][-1:]
    return "; ".join(specific + generic) or f"rsync exit {code}"


def stop_all(fleet: Fleet, run_id: str, console: Console, grace: float = 10.0) -> dict[str, str]:
    """Stop every process of this run on every node (found by its run id: the whole tree)."""

    def stop(conn: NodeConnection) -> dict[str, Any]:
        result = conn.run(f"{AGENT} stop {shlex.quote(run_id)} {grace}", timeout=grace + 30)
        try:
            answer: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            raise HostError(conn.host.name, f"stop failed: {result.stderr.strip()[-200:]}") from None
        if answer.get("remaining"):
            raise HostError(conn.host.name, f"{answer['remaining']} process(es) survived SIGKILL")
        return answer

    errors: dict[str, str] = {}
    for name, res in fleet.map(stop, deadline=grace + 40).items():
        if isinstance(res, BaseException):
            errors[name] = str(res)
            console.print(
                f"  [red]{markup_safe(name)}: could not confirm the run stopped: {markup_safe(res)}[/]"
            )
        elif res.get("terminated"):
            console.print(
                f"  {markup_safe(name)}: stopped {markup_safe(res['terminated'])} process(es) of the run still running"
            )
    return errors


def pull(fleet: Fleet, run_id: str, folder: RunFolder, known_hosts: Path, console: Console) -> dict[str, str]:
    """Each node's run directory into the local run folder (rsync). Returns errors per host."""
    run_dir = layout.rundir(run_id)

    def pull_one(conn: NodeConnection) -> None:
        host = conn.host
        target = folder.node_dir(host.name)
        target.mkdir(parents=True, exist_ok=True)
        argv = [
            "rsync",
            "-az",
            "-e",
            shlex.join(openssh_command(host, known_hosts)),
            f"{host.user}@{host.address}:{run_dir}/",
            f"{target}/",
        ]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=3600, check=False)
        if proc.returncode != 0:
            raise HostError(host.name, rsync_error(proc.stderr, proc.returncode))

    errors = {
        name: str(r) for name, r in fleet.map(pull_one, deadline=3700).items() if isinstance(r, BaseException)
    }
    for name, err in errors.items():
        console.print(f"  [red]pulling artifacts from {markup_safe(name)} failed: {markup_safe(err)}[/]")
    return errors
