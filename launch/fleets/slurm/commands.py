"""The Slurm commands fleetrun runs on the login host, and the one way it runs them.

Each command is an argv of fixed words and validated values (``SlurmFleetRef`` fields, job ids
fleetrun got from ``sbatch``, node names ``answers.hostnames`` checked), joined with
``shlex.join`` for the login shell: nothing from the cluster or the inventory is ever read by a
shell as code. The login host is reached over SSH with its pinned key, like every hop.

The allocation is a holding batch job (``sbatch --wrap 'exec sleep infinity'``), not
``salloc --no-shell``: ``sbatch --parsable`` answers with the job id at once, so the id is
recorded (and a Ctrl-C while queued cancels it) before any wait, and the wait is fleetrun's own
poll of ``squeue``, which shows the position and reason in Slurm's queue. ``salloc`` blocks until
the grant and says its id only on stderr. ``--no-kill`` keeps the allocation when one of its
nodes fails: the run's recovery, not Slurm, decides what happens to the others. ``--exclusive``:
the nodes are the run's alone (no other job's processes on its GPUs, and a replacement can never
land on a node the run already holds).
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Protocol

from launch.job.fleet_refs import SlurmFleetRef
from launch.transport.port import CommandResult

JOB_NAME_PREFIX = "fleetrun-"
HOLD_SCRIPT = "exec sleep infinity"
"""The holding job's whole script: it holds the nodes until ``scancel`` or the time limit."""
COMMAND_TIMEOUT_S = 60.0


class SlurmShell(Protocol):
    """Runs one Slurm command (an argv) on the login host."""

    def run(self, argv: list[str], timeout: float = COMMAND_TIMEOUT_S) -> CommandResult: ...

    def close(self) -> None: ...


class LoginShell:
    """``SlurmShell`` over SSH to the reference's login host, its pinned key only."""

    def __init__(self, ref: SlurmFleetRef, known_hosts: Path) -> None:
        from launch.job.inventory import Host
        from launch.transport.ssh import NodeConnection

        login = ref.login
        host = Host(
            name="slurm-login",
            address=login.address,
            user=login.user,
            port=login.port,
            key=login.key,
            host_key=login.host_key,
        )
        known_hosts.parent.mkdir(parents=True, exist_ok=True)
        known_hosts.write_text(login.known_hosts_line() + "\n")
        self.conn = NodeConnection(host, known_hosts)

    def run(self, argv: list[str], timeout: float = COMMAND_TIMEOUT_S) -> CommandResult:
        return self.conn.run(shlex.join(argv), timeout=timeout)

    def close(self) -> None:
        self.conn.close()


def sbatch_argv(ref: SlurmFleetRef, nodes: int, job_name: str, exclude: tuple[str, ...] = ()) -> list[str]:
    """The holding job for ``nodes`` machines, with every option of the inventory."""
    argv = [
        "sbatch",
        "--parsable",
        f"--job-name={JOB_NAME_PREFIX}{job_name}"[:128],
        f"--partition={ref.partition}",
        f"--nodes={nodes}",
        "--ntasks-per-node=1",
        "--exclusive",
        f"--time={ref.time_limit}",
        "--no-kill",
        "--no-requeue",
        "--output=/dev/null",
        "--chdir=/tmp",
    ]
    if ref.account:
        argv.append(f"--account={ref.account}")
    if ref.qos:
        argv.append(f"--qos={ref.qos}")
    if ref.gres:
        argv.append(f"--gres={ref.gres}")
    if ref.constraint:
        argv.append(f"--constraint={ref.constraint}")
    excluded = list(dict.fromkeys((*ref.exclude, *exclude)))
    if excluded:
        argv.append(f"--exclude={','.join(excluded)}")
    return [*argv, f"--wrap={HOLD_SCRIPT}"]


def squeue_job_argv(*job_ids: int) -> list[str]:
    """``squeue`` of the named jobs, one line each (a purged id among several is left out)."""
    return ["squeue", "-h", "-j", ",".join(map(str, job_ids)), "-o", "%i|%T|%r|%N|%Q"]


def squeue_pending_argv(partition: str) -> list[str]:
    return ["squeue", "-h", "-p", partition, "-t", "PENDING", "-o", "%i|%Q"]


def hostnames_argv(nodelist: str) -> list[str]:
    return ["scontrol", "show", "hostnames", nodelist]


def node_states_argv(nodes: list[str] | None = None, partition: str | None = None) -> list[str]:
    argv = ["sinfo", "-h", "-N", "-o", "%N|%T|%G|%P"]
    if partition:
        argv += ["-p", partition]
    if nodes:
        argv += ["-n", ",".join(nodes)]
    return argv


def scancel_argv(job_ids: tuple[int, ...]) -> list[str]:
    return ["scancel", *map(str, job_ids)]


def drain_argv(node: str, reason: str) -> list[str]:
    """``scontrol update`` of one node to DRAIN with ``reason`` (printable, bounded by the caller)."""
    return ["scontrol", "update", f"nodename={node}", "state=drain", f"reason={reason}"]
