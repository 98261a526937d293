"""The two steps of a run that move files with rsync, as replaceable functions.

The life cycle syncs code to the nodes and the wrap-up pulls run directories back; both go through a
``Transfers`` so that unit tests can run the whole life cycle on an in-memory fleet
(``tests/fakefleet.py``) without rsync, SSH or root.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from launch.run.artifacts import pull
from launch.run.checkpoints import Spread, spread_latest
from launch.run.run_folder import RunFolder
from launch.transport.channel_sync import ChannelSyncFn, fetch_channels, sync_channels
from launch.transport.port import FleetPort
from launch.transport.sync import SyncResult
from launch.transport.sync_relay import sync_fleet

SyncFn = Callable[..., dict[str, SyncResult | BaseException]]
"""``sync_fleet(fleet, workdir, job, known_hosts, relay_above=, on_done=, lib_current=)``."""
SpreadFn = Callable[..., Spread]
"""``spread_latest(port, hosts, run_id, known_hosts, staging, recorded=, bucket=, peers=)`` -> the
resume path (or None), a sentence for the operator and one for the run record."""
PullFn = Callable[[FleetPort, str, RunFolder, Path, Console], dict[str, str]]
"""``pull(fleet, run_id, folder, known_hosts, console)`` -> errors per host."""


@dataclass(frozen=True)
class Transfers:
    sync: SyncFn = sync_fleet
    pull: PullFn = pull
    sync_channels: ChannelSyncFn = sync_channels
    """The playbook's ``local`` data channels to every node (``launch.transport.channel_sync``)."""
    fetch_channels: Callable[..., dict[str, str | BaseException]] = fetch_channels
    """Every node copies the ``bucket`` channels from the fleet's bucket."""
    spread_checkpoint: SpreadFn = spread_latest
    """Before a later attempt: the newest complete checkpoint onto every node that lacks it."""
