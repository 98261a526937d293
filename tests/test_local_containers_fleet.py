"""The ``--containers`` local fleet: its ``/dev/mqueue`` is a mount the machine's fleets share, so
each fleet holds it and ``down`` undoes exactly what fleetrun made (the last holder out), never a
mount it found; a node user's own (rootless) podman sees the images of the machine's shared
store, so a run's image is on every node without a pull."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from launch.fleets.local import LocalFleet
from launch.fleets.local import containers as local_containers
from tests.conftest import fleet_prefix, fleet_subnet, needs_root
from tests.containerkit import ensure_test_image, node_podman


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


@needs_root()
def test_a_node_user_podman_sees_the_shared_store_image(fleetrun_home: object) -> None:
    tag = ensure_test_image()
    fleet = LocalFleet(prefix=fleet_prefix("i"), subnet=fleet_subnet(20))
    try:
        inventory = fleet.up(1, containers=True, say=lambda m: None)
        found = node_podman(inventory.hosts[0].user, fleet.netns(0), "image", "exists", tag)
        assert found.returncode == 0, found.stderr[-1000:]
    finally:
        left = fleet.down(say=lambda m: None)
    assert not any(left.values()), left
