"""The ``--containers`` local fleet: its ``/dev/mqueue`` is a mount the machine's fleets share, so
each fleet holds it and ``down`` undoes exactly what fleetrun made (the last holder out), never a
mount it found; its nodes' sshd replay this machine's cgroup mounts, which ``ip netns exec``'s
fresh ``/sys`` lacks. Runs in containers on such a fleet: tests/test_container_runs_fleet.py."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from launch.fleets.local import LocalFleet
from launch.fleets.local import containers as local_containers
from tests.conftest import fleet_prefix, fleet_subnet, needs_root


def mounted(where: Path) -> bool:
    return any(line.split()[1:2] == [str(where)] for line in Path("/proc/mounts").read_text().splitlines())


@pytest.fixture
def mqueue_at(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A mount point and ledger of the test's own, in place of the machine's ``/dev/mqueue``."""
    where = tmp_path / "mqueue"
    monkeypatch.setattr(local_containers, "MQUEUE", where)
    monkeypatch.setattr(local_containers, "MQUEUE_LEDGER", tmp_path / "ledger")
    yield where
    if mounted(where):
        subprocess.run(["umount", str(where)], check=False)


@needs_root()
def test_the_last_holder_out_undoes_the_mount_fleetrun_made(mqueue_at: Path) -> None:
    local_containers.hold_mqueue("fra")
    local_containers.hold_mqueue("frb")
    assert mounted(mqueue_at)
    local_containers.release_mqueue("fra")
    assert mounted(mqueue_at), "another fleet still holds it"
    local_containers.release_mqueue("frb")
    assert not mounted(mqueue_at)
    assert not mqueue_at.exists(), "fleetrun made the folder: it goes too"
    local_containers.release_mqueue("frb")  # idempotent


@needs_root()
def test_a_mount_found_in_place_is_never_undone(mqueue_at: Path) -> None:
    mqueue_at.mkdir()
    subprocess.run(["mount", "-t", "mqueue", "mqueue", str(mqueue_at)], check=True)
    local_containers.hold_mqueue("fra")
    local_containers.release_mqueue("fra")
    assert mounted(mqueue_at)


@needs_root()
def test_a_containers_fleet_down_undoes_its_mqueue_mount(fleetrun_home: object, mqueue_at: Path) -> None:
    fleet = LocalFleet(prefix=fleet_prefix("e"), subnet=fleet_subnet(20))
    try:
        fleet.up(1, containers=True, say=lambda m: None)
        assert mounted(mqueue_at)
    finally:
        left = fleet.down(say=lambda m: None)
    assert not mounted(mqueue_at)
    assert not mqueue_at.exists()
    assert not any(left.values()), left


HYBRID = """\
sysfs /sys sysfs rw,nosuid,nodev,noexec,relatime 0 0
tmpfs /sys/fs/cgroup tmpfs rw,relatime,mode=755 0 0
cgroup /sys/fs/cgroup/cpu cgroup rw,relatime,cpu 0 0
cgroup /sys/fs/cgroup/cpu,cpuacct cgroup rw,nosuid,nodev,noexec,relatime,cpu,cpuacct 0 0
cgroup /sys/fs/cgroup/systemd cgroup rw,relatime,xattr,name=systemd 0 0
cgroup /sys/fs/cgroup/pids cgroup rw,relatime,pids 0 0
cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0
cgroup /sys/fs/cgroup/pids cgroup rw,relatime,pids 0 0
cgroup /srv/elsewhere cgroup rw,relatime,memory 0 0
tmpfs /sys/fs/cgroup/not-a-cgroup tmpfs rw 0 0
"""


def test_the_machines_cgroup_mounts_are_replayed_in_order_each_once() -> None:
    assert local_containers.cgroup_mount_commands(HYBRID) == [
        "mount -t tmpfs -o mode=755,nosuid,nodev,noexec cgroup-root /sys/fs/cgroup",
        "mkdir -p /sys/fs/cgroup/cpu && mount -t cgroup -o cpu cgroup /sys/fs/cgroup/cpu",
        "mkdir -p /sys/fs/cgroup/cpu,cpuacct && mount -t cgroup -o cpu,cpuacct cgroup /sys/fs/cgroup/cpu,cpuacct",
        "mkdir -p /sys/fs/cgroup/systemd && mount -t cgroup -o xattr,name=systemd cgroup /sys/fs/cgroup/systemd",
        "mkdir -p /sys/fs/cgroup/pids && mount -t cgroup -o pids cgroup /sys/fs/cgroup/pids",
        "mkdir -p /sys/fs/cgroup/unified && mount -t cgroup2 cgroup2 /sys/fs/cgroup/unified",
    ]


def test_a_cgroup2_only_machine_gets_one_cgroup2_mount_and_a_bare_name_gets_none() -> None:
    v2 = (
        "cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid,nodev,noexec,relatime,nsdelegate,memory_recursiveprot 0 0\n"
    )
    assert local_containers.cgroup_mount_commands(v2) == [
        "mount -t cgroup2 -o nsdelegate,memory_recursiveprot cgroup2 /sys/fs/cgroup"
    ]
    named = "cgroup /sys/fs/cgroup/systemd cgroup rw,relatime,name=systemd 0 0\n"
    assert local_containers.cgroup_mount_commands(named) == [
        "mkdir -p /sys/fs/cgroup/systemd && mount -t cgroup -o none,name=systemd cgroup /sys/fs/cgroup/systemd"
    ]


@needs_root()
def test_a_users_podman_state_in_tmp_goes_and_nothing_else(tmp_path: Path) -> None:
    """What a removed (or replaced) node user of uid 4242 left at the top of /tmp goes; another
    user's entries stay, and a link of the user's is removed without following it."""
    theirs, other, target = tmp_path / "containers-user-4242", tmp_path / "keep", tmp_path / "target"
    (theirs / "containers").mkdir(parents=True)
    other.mkdir()
    target.mkdir()
    (tmp_path / "link").symlink_to(target)
    for path in (theirs, theirs / "containers", tmp_path / "link"):
        os.lchown(path, 4242, 4242)
    local_containers.remove_tmp_of(4242, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep", "target"]
