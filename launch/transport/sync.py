"""Ship code to the nodes: rsync over SSH, in parallel, honouring ``.gitignore``, never ``.git``.

rsync rather than SFTP puts: incremental on re-run (only changed files travel), and ``-z`` for
slow links. Shipping ``.git`` made SkyPilot syncs take 15+ minutes (its #1600); fleetrun never
ships it. Uses the OpenSSH client with the same pinned known_hosts as every other connection.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

from launch.errors import HostError
from launch.job.inventory import Host
from launch.paths import fleetrun_home
from launch.planning import remote_layout as layout
from launch.settings import DEFAULT_FANOUT
from launch.transport.openssh import jump_slot
from launch.transport.ssh import ensure_open_files, openssh_command, parallel_map
from launch.transport.staging import VERSION_FILE, scratch_dir, stage_library

NODELIB = Path(__file__).resolve().parent.parent / "nodelib"
LIB_DIR = layout.LIB
"""The node library on a node, home-relative; the probe reports the digest of its content."""
ALWAYS_EXCLUDED = [".git", "__pycache__", "*.pyc", ".venv", ".mypy_cache", ".pytest_cache", ".ruff_cache"]


@dataclass(frozen=True)
class SyncResult:
    host: str
    files_sent: int
    bytes_sent: int
    via: str = "laptop"


def nodelib_source() -> tuple[Path, str]:
    """The node library staged with a ``VERSION`` file (a hash of its files), and that hash.

    The version lets a sync skip the library on nodes that already have it: the preflight's
    probe hashes the node's ``~/.fleetrun/lib`` the same way (``fleetrun_probe.library_digest``),
    so a node counts as current by its files' content, never by what its ``VERSION`` file says
    (that file is only a note for people). One rsync per node instead of two on an unchanged re-sync.
    Staged once per content under ``FLEETRUN_HOME`` (``staging.stage_library``), never in the
    temporary folder, so a ``fab`` ended by a signal leaves nothing behind; looked up once per
    process and ``FLEETRUN_HOME``.
    """
    home = fleetrun_home()
    staged = _STAGED.get(home)
    if staged is None or not (staged[0] / VERSION_FILE).is_file():
        files = sorted(p for p in NODELIB.glob("*.py") if p.name != "__init__.py")
        staged = _STAGED[home] = stage_library(files)
    return staged


_STAGED: dict[Path, tuple[Path, str]] = {}


def lib_is_current(reported: str) -> bool:
    """Whether a node's library digest (the probe's, from the files' content) is this fleetrun's."""
    return bool(reported.strip()) and reported.strip() == nodelib_source()[1]


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


def rsync_argv(
    source: Path | Sequence[str], host: Host, remote_dir: str, known_hosts: Path, filters: list[str]
) -> list[str]:
    """rsync copying the *contents* of ``source`` into ``~/<remote_dir>`` on ``host``.

    A list of sources is sent with ``--relative`` (each source names its own ``/./`` root).
    """
    ssh = shlex.join(openssh_command(host, known_hosts))
    sources = [f"{source}/"] if isinstance(source, Path) else list(source)
    relative = [] if isinstance(source, Path) else ["--relative"]
    return [
        "rsync",
        "-az",
        *relative,
        "--delete",
        "--mkpath",
        "--stats",
        *filters,
        "-e",
        ssh,
        *sources,
        host.rsync_target(f"{remote_dir}/"),
    ]


def _stat(output: str, label: str) -> int:
    for line in output.splitlines():
        if line.startswith(label):
            value = line.split(":", 1)[1].strip().split()[0]
            return int(value.replace(",", ""))
    return 0


def single_transfer_filters(workdir: Path, job: str) -> list[str]:
    """The workdir's filters for one rsync rooted at ``~/.fleetrun`` (workdir and library together).

    rsync anchors a leading ``/`` at the transfer root, which is now ``~/.fleetrun`` rather than the
    workdir: anchored ``.git/info/exclude`` patterns are moved under the job's workdir. The library
    and the directories leading to the workdir are included first, so that no user pattern (an
    unanchored ``*.py`` or ``work/``) can drop them; nor does the ``__pycache__`` exclusion protect
    the node's ``lib/__pycache__`` from ``--delete``: a library change takes its old bytecode with it.
    """
    prefix = "/" + layout.workdir(job).removeprefix(f"{layout.ROOT}/")
    lib = "/" + layout.LIB.removeprefix(f"{layout.ROOT}/")
    parts = prefix.strip("/").split("/")
    keep = [f"--include={lib}/***"] + [f"--include=/{'/'.join(parts[: i + 1])}/" for i in range(len(parts))]
    rules = []
    for rule in rsync_filters(workdir):
        kind, _, pattern = rule.partition("=")
        if kind in ("--include", "--exclude") and pattern.startswith("/"):
            rule = f"{kind}={prefix}{pattern}"
        rules.append(rule)
    return keep + rules


def sync_host(
    host: Host, workdir: Path, job: str, known_hosts: Path, timeout: float = 1800, ship_lib: bool = True
) -> SyncResult:
    """Workdir (and, unless the node has this version already, fleetrun's node library) to one host.

    One rsync, not one per directory: both trees are sent with ``--relative`` from a staging
    directory of two symlinks laid out as on the node (``work/<job>`` -> the workdir, ``lib`` -> the
    library), so each node costs one SSH handshake and one rsync process. A source ending in ``/``
    follows its symlink; links *inside* the workdir are copied as links, as before. ``--delete``
    acts only inside the two sent trees (not in ``work/`` itself: other jobs' workdirs stay).
    """
    stage = scratch_dir("sync-")
    try:
        wd_rel = layout.workdir(job).removeprefix(f"{layout.ROOT}/")
        (stage / wd_rel).parent.mkdir(parents=True)
        (stage / wd_rel).symlink_to(workdir.resolve(), target_is_directory=True)
        sources = [f"{stage}/./{wd_rel}/"]
        if ship_lib:
            lib_rel = layout.LIB.removeprefix(f"{layout.ROOT}/")
            (stage / lib_rel).symlink_to(nodelib_source()[0], target_is_directory=True)
            sources.append(f"{stage}/./{lib_rel}/")
        argv = rsync_argv(sources, host, layout.ROOT, known_hosts, single_transfer_filters(workdir, job))
        try:
            with jump_slot(host):
                proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            raise HostError(host.name, f"rsync of {workdir} timed out after {timeout:.0f} s") from None
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    if proc.returncode != 0:
        detail = proc.stderr.strip().splitlines()[-3:]
        if "Host key verification failed" in proc.stderr:
            raise HostError(
                host.name, "host key verification failed during rsync (key differs from the pinned one)"
            )
        raise HostError(host.name, f"rsync of {workdir} failed ({proc.returncode}): {' / '.join(detail)}")
    return SyncResult(
        host.name,
        _stat(proc.stdout, "Number of regular files transferred"),
        _stat(proc.stdout, "Total transferred file size"),
    )


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
