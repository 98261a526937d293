"""Copy a playbook's ``local`` data channels to every node before the start (rsync over SSH).

A channel ``{local: data/test}`` is a folder on this machine; every node gets it at
``~/.fleetrun/data/<job>/<channel>`` (``SM_CHANNEL_<NAME>`` points there). A channel
``{bucket: prefix}`` is copied there by each node itself from the fleet's bucket, with the node's
own role, by the command the fleet kind gives (``bucket_download_argv``). Incremental like the
code sync (only changed files travel on a re-run), but without the ``.gitignore`` filters: data
folders are usually ignored by git and are exactly what must travel. Each node is sent the data
from this machine; for large data sets use a folder already on the nodes (``path:``).
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path

from launch.errors import FleetrunError, HostError
from launch.job.inventory import Host
from launch.planning import remote_layout as layout
from launch.planning.launchers.sagemaker import channel_dir
from launch.settings import DEFAULT_FANOUT
from launch.transport.openssh import jump_slot
from launch.transport.ssh import Fleet, NodeConnection, parallel_map
from launch.transport.staging import scratch_dir
from launch.transport.sync import SyncResult, _stat, rsync_argv

ChannelSyncFn = Callable[..., dict[str, SyncResult | BaseException]]
"""``sync_channels(fleet, job, channels, known_hosts, parallel=)``: results or errors per host."""


def sync_host_channels(
    host: Host, job: str, channels: Mapping[str, Path], known_hosts: Path, timeout: float = 3600
) -> SyncResult:
    """Every local channel to ``host`` in one rsync (one SSH connection, through the login node
    too), as the code sync does: each channel is a symlink in a staging directory laid out as on
    the node (``data/<job>/<name>``), sent with ``--relative``; ``--delete`` acts only inside them."""
    if not channels:
        return SyncResult(host.name, 0, 0)
    stage = scratch_dir("channels-")
    try:
        sources = []
        for name, source in sorted(channels.items()):
            relative = channel_dir(job, name).removeprefix(f"{layout.ROOT}/")
            (stage / relative).parent.mkdir(parents=True, exist_ok=True)
            (stage / relative).symlink_to(Path(source).resolve(), target_is_directory=True)
            sources.append(f"{stage}/./{relative}/")
        argv = rsync_argv(sources, host, layout.ROOT, known_hosts, [])
        try:
            with jump_slot(host):  # one more connection to the login node: bounded as the code sync's
                proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            raise HostError(
                host.name, f"rsync of channel(s) {_named(channels)} timed out after {timeout:.0f} s"
            ) from None
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    if proc.returncode != 0:
        detail = " / ".join(proc.stderr.strip().splitlines()[-3:])
        raise HostError(
            host.name, f"rsync of channel(s) {_named(channels)} failed ({proc.returncode}): {detail}"
        )
    return SyncResult(
        host.name,
        _stat(proc.stdout, "Number of regular files transferred"),
        _stat(proc.stdout, "Total transferred file size"),
    )


def _named(channels: Mapping[str, Path]) -> str:
    return ", ".join(f"{name} ({source})" for name, source in sorted(channels.items()))


def sync_channels(
    fleet: Fleet,
    job: str,
    channels: Mapping[str, Path],
    known_hosts: Path,
    parallel: int = DEFAULT_FANOUT,
) -> dict[str, SyncResult | BaseException]:
    """Every local channel to every node of ``fleet``, nodes in parallel (bounded)."""
    return parallel_map(
        fleet.hosts, lambda h: sync_host_channels(h, job, channels, known_hosts), max_parallel=parallel
    )


def bucket_commands(
    job: str, prefixes: Mapping[str, str], download_argv: Callable[[str], list[str] | None]
) -> dict[str, str]:
    """Per ``{bucket: prefix}`` channel, the shell command a node runs to copy it from the fleet's
    bucket (the fleet kind's ``bucket_download_argv``) into ``~/.fleetrun/data/<job>/<channel>``.

    Raises ``FleetrunError`` naming the channel when the fleet has no bucket (lab machines, the
    local fleet): the playbook asks for data that cannot be had there.
    """
    commands = {}
    for name, prefix in sorted(prefixes.items()):
        argv = download_argv(prefix)
        if argv is None:
            raise FleetrunError(
                f"channel {name!r} is taken from the fleet's bucket ({prefix}), and this fleet has no bucket; "
                "use a folder on the nodes (path:) or one on this machine (local:)"
            )
        dest = '"$HOME"/' + shlex.quote(channel_dir(job, name))
        words = [dest if word == "{dest}" else shlex.quote(word) for word in argv]
        commands[name] = f"mkdir -p {dest} && " + " ".join(words)
    return commands


def fetch_channels(
    fleet: Fleet, commands: Mapping[str, str], timeout: float = 3600
) -> dict[str, str | BaseException]:
    """Every node copies every bucket channel with its own role (the commands of ``bucket_commands``)."""

    def fetch(conn: NodeConnection) -> str:
        for name, command in commands.items():
            result = conn.run(command, timeout=timeout)
            if not result.ok:
                tail = (result.stderr or result.stdout).strip()[-300:]
                raise HostError(
                    conn.host.name,
                    f"copying channel {name} from the bucket failed (exit {result.exit_code}): {tail}",
                )
        return f"{len(commands)} channel(s) from the bucket"

    return fleet.map(fetch, deadline=timeout + 60)
