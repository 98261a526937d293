"""Getting a run's results off the nodes: stop every process of the run, pull each node's run
directory (the bucket copy is in ``launch.run.wrapup``). These are the I/O steps the wrap-up orders; they report
errors per host and never raise for one bad node, because the wrap-up must decide with all of them.
"""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path
from typing import Any

from rich.console import Console

from launch.errors import HostError
from launch.job.inventory import Host
from launch.nodelib.fleetrun_protocol import StopAnswer
from launch.planning import remote_layout as layout
from launch.planning.cluster_ssh import revoke_command
from launch.reports.safe_text import clean, markup_safe
from launch.run.run_folder import RunFolder
from launch.run.watch import AGENT
from launch.transport.openssh import jump_slot
from launch.transport.port import FleetPort, NodeLink, NodeResults
from launch.transport.ssh import openssh_command


def rsync_error(stderr: str, code: int) -> str:
    """The lines of rsync's stderr that say what failed (its last line is only the generic code)."""
    lines = [line.strip() for line in stderr.strip().splitlines() if line.strip()]
    specific = [line for line in lines if "rsync error" not in line][:3]
    generic = [line for line in lines if "rsync error" in line][-1:]
    return "; ".join(specific + generic) or f"rsync exit {code}"


def fallback_stop_command(run_id: str) -> str:
    """Shell that kills every process of the run without fleetrun's node agent.

    The agent lives in the node user's home, so a hostile (or broken) job can replace it with
    one that answers garbage. This needs only ``sh``, ``tr`` and ``grep``: it finds the run's
    processes by the ``FLEETRUN_RUN_ID=<id>`` entry in their environment (exact, NUL-separated),
    as the agent does, and prints how many are left after SIGKILL.
    """
    marker = shlex.quote(f"FLEETRUN_RUN_ID={run_id}")
    find = (
        'for d in /proc/[0-9]*; do p=${d#/proc/}; [ "$p" = $$ ] && continue; '
        f"{{ tr '\\0' '\\n' < $d/environ; }} 2>/dev/null | grep -qxF {marker} && echo $p; done"
    )
    return (
        f'pids=$({find}); [ -n "$pids" ] && kill -KILL $pids 2>/dev/null; sleep 1; '
        f'left=$({find} | wc -l); echo "fallback-stop remaining=$left"'
    )


def stop_all(fleet: FleetPort, run_id: str, console: Console, grace: float = 10.0) -> dict[str, str]:
    """Stop every process of this run on every node (found by its run id: the whole tree).

    When the node agent does not answer in the protocol (a job replaced it, or it is broken),
    the run's processes are killed by ``fallback_stop_command`` instead, and said so.
    """

    def stop(conn: NodeLink) -> dict[str, Any]:
        result = conn.run(f"{AGENT} stop {shlex.quote(run_id)} {grace}", timeout=grace + 30)
        try:
            answer: dict[str, Any] = StopAnswer.from_json(result.stdout.strip().splitlines()[-1]).to_dict()
        except (ValueError, IndexError):
            fallback = conn.run(fallback_stop_command(run_id), timeout=60)
            last = fallback.stdout.strip().splitlines()[-1:] or [""]
            if not last[0].startswith("fallback-stop remaining=0"):
                raise HostError(
                    conn.host.name,
                    f"stop failed: the node agent did not answer ({clean(result.stderr.strip()[-200:])}) "
                    f"and the fallback could not confirm it ({clean(last[0], 200)})",
                ) from None
            return {"terminated": 0, "fallback": True, "remaining": 0}
        if answer.get("remaining"):
            raise HostError(conn.host.name, f"{answer['remaining']} process(es) survived SIGKILL")
        return answer

    results = NodeResults(fleet.map(stop, deadline=grace + 100))  # a test's stand-in may give a dict
    for name, exc in results.failed.items():
        console.print(f"  [red]{markup_safe(name)}: could not confirm the run stopped: {markup_safe(exc)}[/]")
    for name, res in results.ok.items():
        if res.get("fallback"):
            console.print(
                f"  [yellow]{markup_safe(name)}: the node agent answered outside the protocol; the run's "
                "processes were killed by their run-id marker instead[/]"
            )
        elif res.get("terminated"):
            console.print(
                f"  {markup_safe(name)}: stopped {markup_safe(res['terminated'])} process(es) of the run still running"
            )
    return results.errors()


# What one pull may bring back from one node. A run directory is the job's to fill, and the job is
# untrusted: past these caps nothing is pulled and the teardown is blocked, like any failed pull.
PULL_MAX_TOTAL_BYTES = 32 * 1024**3
PULL_MAX_FILE_BYTES = 8 * 1024**3
MAX_SKIP_NOTES = 20


def pull_argv(source: str, target: Path, rsh: str, max_file_bytes: int = PULL_MAX_FILE_BYTES) -> list[str]:
    """rsync that takes a node's files as data, never as instructions for this machine.

    ``--munge-links``: symlinks arrive neutered (``/rsyncd-munged/...``), never pointing at a file
    here; ``--no-devices --no-specials``: no device nodes, FIFOs or sockets (even when run as root);
    ``--no-owner --no-group``: files belong to the operator; ``--chmod=ug-s,go-w``: no setuid or
    setgid bit, nothing writable by others; ``--max-size``: no single file above the cap (a sparse
    file of a terabyte takes no disk on the node). ``--info=skip1`` names what was skipped.
    """
    return [
        "rsync",
        "-az",
        "--munge-links",
        "--no-devices",
        "--no-specials",
        "--no-owner",
        "--no-group",
        "--chmod=ug-s,go-w",
        f"--max-size={max_file_bytes}",
        "--info=skip1",
        f"--exclude=/{layout.RUN_TMP}/",  # the job's TMPDIR: scratch, not a result
        "-e",
        rsh,
        source,
        f"{target}/",
    ]


def rsync_pull(
    host: Host,
    remote_dir: str,
    target: Path,
    known_hosts: Path,
    max_file_bytes: int = PULL_MAX_FILE_BYTES,
    *,
    what: str = "",
    timeout: float = 3600.0,
) -> str:
    """``remote_dir`` (relative to the node user's home) into ``target`` with the hardened
    ``pull_argv``, holding a jump slot like every OpenSSH command through a bastion. Returns
    rsync's output; a failure or a timeout raises ``HostError`` (``what``: how it starts)."""
    rsh = shlex.join(openssh_command(host, known_hosts))
    argv = pull_argv(host.rsync_target(f"{remote_dir}/"), target, rsh, max_file_bytes)
    lead = f"{what}: " if what else ""
    try:
        with jump_slot(host):
            proc = subprocess.run(
                argv, capture_output=True, text=True, errors="replace", timeout=timeout, check=False
            )
    except subprocess.TimeoutExpired:
        raise HostError(host.name, f"{lead}rsync timed out after {timeout:.0f} s") from None
    if proc.returncode != 0:
        raise HostError(host.name, lead + clean(rsync_error(proc.stderr, proc.returncode), 600))
    return proc.stdout


def run_dir_bytes(conn: NodeLink, run_dir: str) -> int:
    """The run directory's size on the node (one ``du``), before anything is pulled."""
    result = conn.run(f'du -sk -- "$HOME/{run_dir}"', timeout=120)
    words = result.stdout.split()
    if not result.ok or not words or not words[0].isdigit():
        detail = clean(result.stderr.strip() or result.stdout.strip() or f"exit {result.exit_code}", 300)
        raise HostError(conn.host.name, f"could not measure the run directory before pulling it: {detail}")
    return int(words[0]) * 1024


def pull(
    fleet: FleetPort,
    run_id: str,
    folder: RunFolder,
    known_hosts: Path,
    console: Console,
    max_total_bytes: int = PULL_MAX_TOTAL_BYTES,
    max_file_bytes: int = PULL_MAX_FILE_BYTES,
) -> dict[str, str]:
    """Each node's run directory into the local run folder (rsync, hardened). Returns errors per host.

    A run directory above ``max_total_bytes`` is not pulled at all: an error, which blocks the
    teardown (the node keeps the only copy) like any other failed pull.
    """
    run_dir = layout.rundir(run_id)

    def pull_one(conn: NodeLink) -> list[str]:
        host = conn.host
        size = run_dir_bytes(conn, run_dir)
        if size > max_total_bytes:
            raise HostError(
                host.name,
                f"the run directory holds {size / 1024**3:.1f} GiB, more than the pull cap of "
                f"{max_total_bytes / 1024**3:.1f} GiB: nothing pulled, the node is kept; "
                f"copy what you need from ~/{run_dir} yourself",
            )
        target = folder.node_dir(host.name)
        target.mkdir(parents=True, exist_ok=True)
        out = rsync_pull(host, run_dir, target, known_hosts, max_file_bytes)
        return [line for line in out.splitlines() if line.endswith(" is over max-size")]

    results = NodeResults(fleet.map(pull_one, deadline=3700))
    for name, exc in results.failed.items():
        console.print(f"  [red]pulling artifacts from {markup_safe(name)} failed: {markup_safe(exc)}[/]")
    for name, res in results.ok.items():
        if res:
            notes = ", ".join(
                clean(line.removesuffix(" is over max-size"), 200) for line in res[:MAX_SKIP_NOTES]
            )
            more = f" and {len(res) - MAX_SKIP_NOTES} more" if len(res) > MAX_SKIP_NOTES else ""
            console.print(
                f"  {clean(name)}: not pulled, over the {max_file_bytes / 1024**3:.1f} GiB per-file cap: {notes}{more}",
                markup=False,
            )
    return results.errors()


def _is_connected(conn: object) -> bool:
    """An open Fabric connection; a connection object without one (a test double) counts as open."""
    return bool(getattr(getattr(conn, "conn", None), "is_connected", conn is not None))


def revoke_cluster_keys(fleet: FleetPort) -> dict[str, str]:
    """Revoke this run's cluster key on every node this run is connected to; errors per node.

    A no-op on nodes without one (other launchers), and one round trip on the open connections:
    a node never reached this run never got a key, so no new connection is tried (which would
    make a failed run's wrap-up wait for unreachable nodes). Never raises for a node: the
    wrap-up calls it on every exit path and must go on.
    """
    connected = [h for h in fleet.hosts if _is_connected(fleet.connections.get(h.name))]
    results = NodeResults(
        fleet.map(lambda c: c.run(revoke_command(), timeout=30), hosts=connected, deadline=60)
    )
    errors = results.errors()
    for name, result in results.ok.items():
        if not result.ok:
            errors[name] = (result.stderr.strip() or f"exit {result.exit_code}")[-300:]
    return errors
