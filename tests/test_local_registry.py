"""The local fleet's registry (``fab local.up --containers --registry``): its configuration, the
nodes' insecure mark, and its life with the fleet: started as ``nobody`` from the fleet's record,
an image pushed through the Distribution API and served back, and ``down`` killing the server
and removing its folder with every image in it (nothing left behind). The nodes' pull from it
is tests/test_container_runs_fleet.py's."""

from __future__ import annotations

import json
import os
import shutil
import urllib.request
from pathlib import Path

import pytest
import yaml

from launch.errors import LocalFleetError
from launch.fleets.local import LocalFleet, image_push
from launch.fleets.local import registry as local_registry
from launch.processes import pid_alive
from tests.conftest import fleet_prefix, needs_root

PREFIX = fleet_prefix("n")


def test_the_configuration_serves_plain_http_on_the_bridge_from_the_fleets_folder(tmp_path: Path) -> None:
    config = yaml.safe_load(local_registry.config_text("198.18.75.1:5000", tmp_path / "storage"))
    assert config["http"] == {"addr": "198.18.75.1:5000"}, "the bridge's address only, no TLS"
    assert config["storage"]["filesystem"] == {"rootdirectory": str(tmp_path / "storage")}
    assert "auth" not in config
    assert config["log"]["accesslog"] == {"disabled": True}


def test_each_node_marks_the_registry_insecure_in_its_own_etc(tmp_path: Path) -> None:
    node_etc = tmp_path / "netns" / "frn0"
    local_registry.drop_in(node_etc, "198.18.75.1:5000")
    conf = node_etc / "containers" / "registries.conf.d" / local_registry.DROP_IN
    lines = [line for line in conf.read_text().splitlines() if not line.startswith("#")]
    assert lines == ["[[registry]]", 'location = "198.18.75.1:5000"', "insecure = true"]


def test_the_registry_folder_is_the_fleets_own_by_prefix() -> None:
    assert local_registry.registry_dir("frn") != local_registry.registry_dir("frm")
    assert local_registry.registry_dir("frn").name == "fleetrun-registry-frn"


def test_a_fleet_without_a_registry_says_how_to_get_one(fleetrun_home: Path) -> None:
    with pytest.raises(LocalFleetError, match="--registry"):
        LocalFleet(prefix=PREFIX).registry_image()


def test_a_registry_needs_a_containers_fleet(fleetrun_home: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("up needs root")
    with pytest.raises(LocalFleetError, match="--registry is for a --containers fleet"):
        LocalFleet(prefix=PREFIX).up(1, registry=True, say=lambda _m: None)


@needs_root()
@pytest.mark.skipif(not local_registry.have_registry(), reason="docker-registry is not installed")
def test_the_registry_serves_what_is_pushed_and_down_leaves_nothing(
    fleetrun_home: Path, tmp_path: Path
) -> None:
    fleet = LocalFleet(prefix=PREFIX)
    folder = local_registry.registry_dir(PREFIX)
    fleet.down(say=lambda _m: None)  # a crashed earlier run of this test
    fleet.state_dir.mkdir(parents=True, exist_ok=True)
    fleet.state.record("registry_dir", str(folder))
    location = local_registry.start(fleet, "127.0.0.1")
    try:
        (pid,) = local_registry.server_pids(fleet)
        assert Path(f"/proc/{pid}/status").read_text().count("\t65534\t") >= 2, "it serves as nobody"
        layer = image_push.random_layer(1, tmp_path)
        image = image_push.push(location, "fleetrun-test", "latest", [layer])
        assert image == f"{location}/fleetrun-test:latest"
        request = urllib.request.Request(
            f"http://{location}/v2/fleetrun-test/manifests/latest",
            headers={"Accept": image_push.MANIFEST_TYPE},
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            manifest = json.loads(response.read())
        assert [x["digest"] for x in manifest["layers"]] == [layer.digest]
        with urllib.request.urlopen(
            f"http://{location}/v2/fleetrun-test/blobs/{layer.digest}", timeout=30
        ) as blob:
            assert blob.read() == layer.path.read_bytes()
        assert image_push.push(location, "fleetrun-test", "latest", [layer]) == image, "a second push is fine"
        assert local_registry.location_of(fleet) == location
        assert any(folder.rglob("data")), "the blobs are in the fleet's folder"
    finally:
        left = fleet.down(say=lambda _m: None)
    assert not any(left.values()), left
    assert not pid_alive(pid), "the registry was stopped"
    assert not folder.exists(), "its storage went with it"
    assert not local_registry.answers(location)


@needs_root()
def test_a_registry_folder_the_fleet_did_not_record_is_refused_and_kept(fleetrun_home: Path) -> None:
    fleet = LocalFleet(prefix=PREFIX)
    folder = local_registry.registry_dir(PREFIX)
    fleet.down(say=lambda _m: None)
    folder.mkdir()
    try:
        (folder / "someone's").write_text("kept")
        assert str(folder) in fleet.conflicts(1)
        fleet.state_dir.mkdir(parents=True, exist_ok=True)
        # recorded write-ahead (as up does before start), then refused: still not the fleet's
        fleet.state.record("registry_dir", str(folder))
        with pytest.raises(LocalFleetError, match="is not this fleet's"):
            local_registry.start(fleet, "127.0.0.1")
        fleet.down(say=lambda _m: None)
        assert (folder / "someone's").read_text() == "kept", "down removes only what the fleet made"
    finally:
        shutil.rmtree(folder, ignore_errors=True)
