"""Getting a run's results off the nodes: stop every process of the run, pull each node's run
directory, copy it to the job's bucket. These are the I/O steps the wrap-up orders; they report
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
from launch.run.run_folder import RunFolder
from launch.run.watch import AGENT, WatchTarget
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
            console.print(f"  [red]{name}: could not confirm the run stopped: {res}[/]")
        elif res.get("terminated"):
            console.print(f"  {name}: stopped {res['terminated']} process(es) of the run still running")
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
            host.rsync_target(f"{run_dir}/"),
            f"{target}/",
        ]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=3600, check=False)
        if proc.returncode != 0:
            raise HostError(host.name, rsync_error(proc.stderr, proc.returncode))

    errors = {
        name: str(r) for name, r in fleet.map(pull_one, deadline=3700).items() if isinstance(r, BaseException)
    }
    for name, err in errors.items():
        console.print(f"  [red]pulling artifacts from {name} failed: {err}[/]")
    return errors


def upload_to_bucket(fleet: Fleet, target: WatchTarget, console: Console) -> dict[str, str]:
    """Cloud fleets: each node copies its run directory to the job bucket with its instance role.

    The local pull is the copy teardown waits for; the bucket copy is reported, not blocking.
    """
    run_dir = layout.rundir(target.run_id)
    bucket = shlex.quote(target.inventory.bucket or "")
    cloud = shlex.quote(target.cloud or "aws")

    def upload(conn: NodeConnection) -> str:
        result = conn.run(
            f'{AGENT} upload "$HOME/{run_dir}" {bucket} {cloud} {shlex.quote(target.run_id)} {shlex.quote(conn.host.name)}',
            timeout=3600,
        )
        answer = json.loads(result.stdout.strip().splitlines()[-1])
        return str(answer["upload"])

    messages: dict[str, str] = {}
    for name, res in fleet.map(upload, deadline=3700).items():
        messages[name] = str(res)
        console.print(f"  {name}: {res}")
    return messages
