"""Ship code to the nodes: rsync over SSH, in parallel, honouring ``.gitignore``, never ``.git``.

rsync rather than SFTP puts: incremental on re-run (only changed files travel), and ``-z`` for
slow links. Shipping ``.git`` made SkyPilot syncs take 15+ minutes (its #1600); fleetrun never
ships it. Uses the OpenSSH client with the same pinned known_hosts as every other connection.
"""

from __future__ import annotations

import shlex
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from launch import remote_layout as layout
from launch.errors import HostError
from launch.inventory import Host
from launch.ssh import openssh_command, parallel_map

NODELIB = Path(__file__).resolve().parent / "nodelib"
ALWAYS_EXCLUDED = [".git", "__pycache__", "*.pyc", ".venv", ".mypy_cache", ".pytest_cache", ".ruff_cache"]


@dataclass(frozen=True)
class SyncResult:
    host: str
    files_sent: int
    bytes_sent: int


def rsync_filters(workdir: Path) -> list[str]:
    """Filters in rsync's terms: per-directory ``.gitignore`` merge, ``.git/info/exclude``, defaults."""
    args = ["--filter=:- .gitignore"]
    info_exclude = workdir / ".git" / "info" / "exclude"
    if info_exclude.is_file():
        args.append(f"--exclude-from={info_exclude}")
    args += [f"--exclude={pattern}" for pattern in ALWAYS_EXCLUDED]
    return args


def rsync_argv(source: Path, host: Host, remote_dir: str, known_hosts: Path, filters: list[str]) -> list[str]:
    """rsync invocation copying the *contents* of ``source`` into ``~/<remote_dir>`` on ``host``."""
    ssh = shlex.join(openssh_command(host, known_hosts))
    return [
        "rsync",
        "-az",
        "--delete",
        "--mkpath",
        "--stats",
        *filters,
        "-e",
        ssh,
        f"{source}/",
        f"{host.user}@{host.address}:{remote_dir}/",
    ]


def _stat(output: str, label: str) -> int:
    for line in output.splitlines():
        if line.startswith(label):
            value = line.split(":", 1)[1].strip().split()[0]
            return int(value.replace(",", ""))
    return 0


def sync_host(host: Host, workdir: Path, job: str, known_hosts: Path, timeout: float = 1800) -> SyncResult:
    """Workdir and fleetrun's node library to one host."""
    sent_files = 0
    sent_bytes = 0
    for source, remote, filters in (
        (workdir, layout.workdir(job), rsync_filters(workdir)),
        (NODELIB, layout.LIB, ["--exclude=__pycache__", "--exclude=__init__.py"]),
    ):
        argv = rsync_argv(source, host, remote, known_hosts, filters)
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            raise HostError(host.name, f"rsync of {source} timed out after {timeout:.0f} s") from None
        if proc.returncode != 0:
            detail = proc.stderr.strip().splitlines()[-3:]
            if "Host key verification failed" in proc.stderr:
                raise HostError(
                    host.name, "host key verification failed during rsync (key differs from the pinned one)"
                )
            raise HostError(host.name, f"rsync of {source} failed ({proc.returncode}): {' / '.join(detail)}")
        sent_files += _stat(proc.stdout, "Number of regular files transferred")
        sent_bytes += _stat(proc.stdout, "Total transferred file size")
    return SyncResult(host.name, sent_files, sent_bytes)


def sync_all(
    hosts: list[Host],
    workdir: Path,
    job: str,
    known_hosts: Path,
    max_parallel: int = 16,
    on_done: Callable[[str, SyncResult | BaseException], None] | None = None,
) -> dict[str, SyncResult | BaseException]:
    """Sync every host in parallel (bounded: each rsync is a process and an SSH connection)."""
    return parallel_map(
        hosts, lambda h: sync_host(h, workdir, job, known_hosts), max_parallel=max_parallel, on_done=on_done
    )
