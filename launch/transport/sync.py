"""Ship code to the nodes: rsync over SSH, in parallel, honouring ``.gitignore``, never ``.git``.

rsync rather than SFTP puts: incremental on re-run (only changed files travel), and ``-z`` for
slow links. Shipping ``.git`` made SkyPilot syncs take 15+ minutes (its #1600); fleetrun never
ships it. Uses the OpenSSH client with the same pinned known_hosts as every other connection.
"""

from __future__ import annotations

import atexit
import functools
import hashlib
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path

from launch.errors import HostError
from launch.job.inventory import Host
from launch.planning import remote_layout as layout
from launch.settings import DEFAULT_FANOUT
from launch.transport.openssh import jump_slot
from launch.transport.ssh import ensure_open_files, openssh_command, parallel_map

NODELIB = Path(__file__).resolve().parent.parent / "nodelib"
LIB_VERSION = f"{layout.LIB}/VERSION"
ALWAYS_EXCLUDED = [".git", "__pycache__", "*.pyc", ".venv", ".mypy_cache", ".pytest_cache", ".ruff_cache"]


@dataclass(frozen=True)
class SyncResult:
    host: str
    files_sent: int
    bytes_sent: int
    via: str = "laptop"


@functools.cache
def nodelib_source() -> tuple[Path, str]:
    """A copy of the node library with a ``VERSION`` file (a hash of its files), and that hash.

    The version lets a sync skip the library on nodes that already have it (the preflight reads
    ``~/.fleetrun/lib/VERSION``): one rsync per node instead of two on an unchanged re-sync.
    """
    files = sorted(p for p in NODELIB.glob("*.py") if p.name != "__init__.py")
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    version = digest.hexdigest()[:16]
    staging = Path(tempfile.mkdtemp(prefix="fleetrun-nodelib-"))
    for path in files:
        shutil.copy2(path, staging / path.name)
    (staging / "VERSION").write_text(version + "\n")
    atexit.register(shutil.rmtree, staging, True)
    return staging, version


def lib_is_current(reported: str) -> bool:
    """Whether a node's ``VERSION`` (as read by the preflight) matches this fleetrun's library."""
    return reported.strip() == nodelib_source()[1]


def rsync_filters(workdir: Path) -> list[str]:
    """Filters in rsync's terms: per-directory ``.gitignore`` merge, ``.git/info/exclude``, defaults.

    ``.git/info/exclude`` is spelled out as explicit patterns (not ``--exclude-from``), so the same
    filters work where the file does not exist, on the head relaying to the workers.
    """
    args = ["--filter=:- .gitignore"]
    info_exclude = workdir / ".git" / "info" / "exclude"
    if info_exclude.is_file():
        for line in info_exclude.read_text(errors="replace").splitlines():
            pattern = line.strip()
            if not pattern or pattern.startswith("#"):
                continue
            args.append(f"--include={pattern[1:]}" if pattern.startswith("!") else f"--exclude={pattern}")
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
        host.rsync_target(f"{remote_dir}/"),
    ]


def _stat(output: str, label: str) -> int:
    for line in output.splitlines():
        if line.startswith(label):
            value = line.split(":", 1)[1].strip().split()[0]
            return int(value.replace(",", ""))
    return 0


def sync_host(
    host: Host, workdir: Path, job: str, known_hosts: Path, timeout: float = 1800, ship_lib: bool = True
) -> SyncResult:
    """Workdir (and, unless the node has this version already, fleetrun's node library) to one host."""
    sent_files = 0
    sent_bytes = 0
    transfers = [(workdir, layout.workdir(job), rsync_filters(workdir))]
    if ship_lib:
        transfers.append((nodelib_source()[0], layout.LIB, []))
    for source, remote, filters in transfers:
        argv = rsync_argv(source, host, remote, known_hosts, filters)
        try:
            with jump_slot(host):
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
    max_parallel: int = DEFAULT_FANOUT,
    on_done: Callable[[str, SyncResult | BaseException], None] | None = None,
    lib_current: Collection[str] = (),
) -> dict[str, SyncResult | BaseException]:
    """Sync every host in parallel (bounded: each rsync is a process and an SSH connection).

    ``lib_current``: names of hosts known to hold this version of the node library already.
    """
    ensure_open_files(8 * max_parallel + 256)
    return parallel_map(
        hosts,
        lambda h: sync_host(h, workdir, job, known_hosts, ship_lib=h.name not in lib_current),
        max_parallel=max_parallel,
        on_done=on_done,
    )
