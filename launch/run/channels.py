"""Before the start: the playbook's data channels that fleetrun copies onto every node.

``{local: dir}`` channels travel from this machine with rsync; ``{bucket: prefix}`` channels are
copied by each node from the fleet's bucket, with the node's own role, by the command its fleet
kind gives. Both land in ``~/.fleetrun/data/<job>/<channel>``, where ``SM_CHANNEL_<NAME>`` points
(``launch.planning.launchers.sagemaker``). ``path:`` channels are the nodes' own and need nothing.
"""

from __future__ import annotations

from pathlib import Path

from launch.errors import FleetrunError, HostError
from launch.fleets.kinds.registry import fleet_kind
from launch.job.inventory import Inventory
from launch.job.spec import JobSpec
from launch.run.reporter import Reporter
from launch.run.transfers import Transfers
from launch.transport.channel_sync import bucket_commands
from launch.transport.port import FleetPort, NodeResults
from launch.transport.sync import SyncResult


def copy_channels(
    spec: JobSpec,
    inventory: Inventory,
    fleet: FleetPort,
    known_hosts: Path,
    transfers: Transfers,
    parallel: int,
    reporter: Reporter,
) -> dict[str, BaseException]:
    """Copy every ``local`` and ``bucket`` channel to every node; the errors per node (none: done)."""
    channels = spec.all_channels()
    buckets = {n: c.bucket for n, c in channels.items() if c.bucket is not None}
    if buckets:
        try:
            commands = bucket_commands(spec.name, buckets, fleet_kind(inventory.fleet).bucket_download_argv)
        except FleetrunError as exc:
            head = inventory.hosts[0].name
            return {head: HostError(head, str(exc))}
        fetched = transfers.fetch_channels(fleet, commands)
        failed = NodeResults(fetched).failed
        if failed:
            return failed
        reporter.say(f"  data channel(s) {', '.join(sorted(buckets))}: copied from the bucket by every node")
    local = {n: Path(c.local) for n, c in channels.items() if c.local is not None}
    if not local:
        return {}
    results = transfers.sync_channels(fleet, spec.name, local, known_hosts, parallel=parallel)
    outcome = NodeResults(results)
    if outcome.failed:
        return outcome.failed
    sent = [r for r in outcome.ok.values() if isinstance(r, SyncResult)]
    reporter.say(
        f"  data channel(s) {', '.join(sorted(local))}: {sum(r.files_sent for r in sent)} file(s), "
        f"{sum(r.bytes_sent for r in sent)} bytes sent to {len(sent)} node(s)"
    )
    return {}
