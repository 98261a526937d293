"""The local fleet's record of what it created: the only ground on which ``down`` removes anything.

``$FLEETRUN_HOME/localfleet/<prefix>/created.jsonl``: one JSON line per thing (``user``, ``home``,
``netns``, ``netns_etc``, ``link``, ``run_netns``, ``route``: a bastion fleet's
``unreachable`` route for its internal subnet in the root namespace; a VM-mode fleet's
``node_home``, ``mountns`` and ``mount_dir``: see ``launch.fleets.local.mountns``; ``qdisc``: the
device whose root ``tbf`` an ``--uplink`` fleet added, see ``launch.fleets.local.uplink``; ``slurm_dir``: a
``--with-slurm`` fleet's cluster folder, see ``launch.fleets.local.slurm``; ``mqueue``: a
``--containers`` fleet's hold on the machine's ``/dev/mqueue``, see ``launch.fleets.local.containers``;
``registry_dir``: a ``--registry`` fleet's registry folder, its configuration and images, see
``launch.fleets.local.registry``), appended and fsynced *before* the thing is
created (write-ahead), so a crash at any point of ``up`` leaves a record that covers everything
that may exist. ``up`` checks that no name it is about to use exists before it records or creates
anything, so a recorded name is never someone else's. Users carry a second proof, a GECOS marker
(``FleetNames.marker``): a recorded user without it is left alone.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

KINDS = (
    "user",
    "home",
    "netns",
    "netns_etc",
    "link",
    "run_netns",
    "route",
    "node_home",
    "mountns",
    "mount_dir",
    "qdisc",
    "slurm_dir",
    "mqueue",
    "registry_dir",
)
MAX_STATE_BYTES = 4 * 1024 * 1024


@dataclass
class Created:
    """What one fleet recorded, by kind, in creation order."""

    items: dict[str, list[str]] = field(default_factory=lambda: {k: [] for k in KINDS})

    def add(self, kind: str, name: str) -> None:
        if name not in self.items[kind]:
            self.items[kind].append(name)

    def __getitem__(self, kind: str) -> list[str]:
        return self.items[kind]

    def empty(self) -> bool:
        return not any(self.items.values())


class StateFile:
    """Append-only, fsynced record of what a fleet created (root-only, under its state directory)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def record(self, kind: str, name: str) -> None:
        if kind not in KINDS:
            raise ValueError(f"unknown kind {kind!r}")
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        line = json.dumps({"kind": kind, "name": name}) + "\n"
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            os.write(fd, line.encode())
            os.fsync(fd)
        finally:
            os.close(fd)

    def load(self) -> Created:
        """Everything recorded; a torn last line (crash mid-write) is skipped, the rest kept."""
        created = Created()
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW)
        except FileNotFoundError:
            return created
        with os.fdopen(fd, "rb") as fh:
            data = fh.read(MAX_STATE_BYTES)
        for raw in data.splitlines():
            try:
                entry = json.loads(raw)
            except ValueError:
                continue
            if isinstance(entry, dict) and entry.get("kind") in KINDS and isinstance(entry.get("name"), str):
                created.add(entry["kind"], entry["name"])
        return created
