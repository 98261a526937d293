"""Mixed hosts in one lab inventory, exercised by a real ``fab doctor`` and a real ``fab train``.

A local fleet with ``mixed=True`` (each node its own user, sshd port and interface name), then a
lab inventory over it that also gives each node its own SSH key and its own Python:

=====  ==========  =====  ==================  =====================================  =========
node   user        port   key                 python                                 interface
=====  ==========  =====  ==================  =====================================  =========
0      <p>node0    2200   the fleet's (from    the image's (from ``defaults``)        lan0
                          ``defaults``)
1      <p>node1    2201   key1 (only key the   ``~/bin/python3``, a wrapper           lan1
                          node accepts)
2      <p>node2    2202   key2 (likewise)      ``~/.local/py/python``, a wrapper      lan2
=====  ==========  =====  ==================  =====================================  =========

Each wrapper leaves a mark before it ``exec``s the image's Python, so the run proves which
Python ran; nodes 1 and 2 accept only their own key, so the run proves which key was used.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from launch.fleets.local import LocalFleet
from launch.job.inventory import Inventory
from launch.transport.ssh import openssh_command
from tests.conftest import fab, fleet_prefix, fleet_subnet, module_fleet, needs_root, write_playbook

pytestmark = needs_root()
PREFIX = fleet_prefix("m")
PYTHONS = {1: "bin/python3", 2: ".local/py/python"}


@pytest.fixture(scope="module")
def mixed(fleetrun_home: Path) -> Iterator[LocalFleet]:
    with module_fleet(PREFIX, fleet_subnet(8), 3, mixed=True) as fleet:
        yield fleet


def as_user(fleet: LocalFleet, i: int, path: Path) -> None:
    for part in [path, *path.parents]:
        if part == fleet.home(i):
            break
        shutil.chown(part, fleet.node_name(i), fleet.node_name(i))


def mixed_inventory(fleet: LocalFleet, tmp_path: Path) -> Path:
    """The lab file: defaults for what node 0 uses, per-host overrides for nodes 1 and 2."""
    own = fleet.inventory()
    image_python = own.hosts[0].python
    hosts = []
    for i, host in enumerate(own.hosts):
        entry: dict[str, object] = {
            "name": host.name,
            "address": host.address,
            "user": host.user,
            "port": host.port,
            "interface": host.interface,
            "host_key": host.host_key,
        }
        if i:
            key = tmp_path / f"key{i}"
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
            authorized = fleet.home(i) / ".ssh" / "authorized_keys"
            authorized.write_text(key.with_suffix(".pub").read_text())  # only this node's own key
            wrapper = fleet.home(i) / PYTHONS[i]
            wrapper.parent.mkdir(parents=True, exist_ok=True)
            wrapper.write_text(f'#!/bin/sh\ntouch "$HOME/python-wrapper-{i}-ran"\nexec {image_python} "$@"\n')
            wrapper.chmod(0o755)
            as_user(fleet, i, wrapper)
            entry.update(key=str(key), python=str(wrapper))
        hosts.append(entry)
    path = tmp_path / "mixed.yaml"
    path.write_text(
        yaml.safe_dump({"defaults": {"key": str(fleet.key_path), "python": image_python}, "hosts": hosts})
    )
    return path


def test_one_inventory_of_mixed_hosts_passes_doctor_and_trains(
    mixed: LocalFleet, fleetrun_home: Path, digits_workdir: Path, tmp_path: Path
) -> None:
    inventory = mixed_inventory(mixed, tmp_path)
    lab = Inventory.from_static_yaml(inventory)
    for field in ("user", "port", "key", "python", "interface"):
        values = {str(getattr(h, field)) for h in lab.hosts}
        assert len(values) == 3, f"every host has its own {field}: {values}"

    # The per-host key is the one that works: the fleet's key is refused on node 1 now.
    known_hosts = lab.write_known_hosts(tmp_path / "kh")
    node1 = lab.hosts[1]
    with_fleet_key = node1.model_copy(update={"key": mixed.key_path})
    refused = subprocess.run(
        [*openssh_command(with_fleet_key, known_hosts), f"{node1.user}@{node1.address}", "true"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert refused.returncode == 255 and "Permission denied" in refused.stderr, refused.stderr

    runs = tmp_path / "runs"
    doctor = fab("doctor", "--verbose", "--inventory", str(inventory), home=fleetrun_home, runs=runs)
    assert doctor.returncode == 0, doctor.stdout[-3000:] + doctor.stderr[-2000:]
    for i in range(3):
        node = mixed.node_name(i)
        assert f"{node} ssh        ok" in doctor.stdout and f"{node} torch      ok" in doctor.stdout
        assert f"{node} interface  ok     lan{i} MTU" in doctor.stdout, doctor.stdout[-3000:]
    for i in (1, 2):
        mark = mixed.home(i) / f"python-wrapper-{i}-ran"
        assert mark.exists(), f"node {i}'s probe ran with its own Python"
        mark.unlink()

    playbook = write_playbook(tmp_path / "job.yaml", digits_workdir, name="t-mixed")
    proc = fab("train", str(playbook), "--inventory", str(inventory), home=fleetrun_home, runs=runs)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "succeeded (completed)" in proc.stdout
    for i in (1, 2):
        assert (mixed.home(i) / f"python-wrapper-{i}-ran").exists(), f"node {i}'s own Python ran for the run"
    (folder,) = runs.iterdir()
    for i in range(3):
        launch = (folder / "nodes" / mixed.node_name(i) / "launch.sh").read_text()
        assert f"IFACE=lan{i}\n" in launch, f"node {i} runs with its own interface"
