"""The local fleet: real namespaces and sshd; ``down`` leaves nothing, even after a crash in ``up``."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from launch.errors import LocalFleetError
from launch.localfleet import FAULT_CRASH_AFTER, LocalFleet, _pid_alive
from tests.conftest import REPO, fleet_prefix, fleet_subnet, needs_root


def test_not_root_gets_a_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(LocalFleetError, match="needs root: each node is a network namespace"):
        LocalFleet(prefix=fleet_prefix("x")).up(2)


def test_bad_prefix_and_subnet() -> None:
    with pytest.raises(LocalFleetError, match="fleet prefix 'Bad-Prefix'"):
        LocalFleet(prefix="Bad-Prefix")
    with pytest.raises(LocalFleetError, match="fleet subnet 300"):
        LocalFleet(prefix="ok", subnet=300)


@needs_root()
def test_fleet_nodes_are_separate_machines(fleet: LocalFleet) -> None:
    inv = fleet.inventory()
    assert [h.address for h in inv.hosts] == ["198.18.1.10", "198.18.1.11", "198.18.1.12"]
    for i, host in enumerate(inv.hosts):
        out = subprocess.run(
            ["ip", "netns", "exec", fleet.netns(i), "ip", "-o", "-4", "addr", "show", "dev", "eth0"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert f"inet {host.address}/24" in out
        assert host.user == f"frtnode{i}" and os.path.isdir(f"/home/frtnode{i}")
    # nodes have no default route: they reach only each other
    routes = subprocess.run(
        ["ip", "-n", fleet.netns(0), "route"], capture_output=True, text=True, check=True
    ).stdout
    assert "default" not in routes


@needs_root()
def test_down_after_crash_half_way_through_up(fleetrun_home: object) -> None:
    crashing = LocalFleet(prefix=fleet_prefix("c"), subnet=fleet_subnet(2))
    code = (
        "from launch.localfleet import LocalFleet; "
        "LocalFleet(prefix='"
        + fleet_prefix("c")
        + "', subnet="
        + str(fleet_subnet(2))
        + ").up(3, say=lambda m: None)"
    )
    env = {**os.environ, FAULT_CRASH_AFTER: "2"}
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == -9, proc.stderr
    half = crashing.leftovers()
    assert len(half["netns"]) == 2 and len(half["users"]) == 2, f"the crash left a half-built fleet: {half}"
    left = crashing.down(say=lambda _m: None)
    assert left == {"netns": [], "links": [], "users": [], "processes": [], "files": []}


@needs_root()
def test_up_down_cycle_leaves_nothing(fleetrun_home: object) -> None:
    other = LocalFleet(prefix=fleet_prefix("d"), subnet=fleet_subnet(3))
    inv = other.up(2, say=lambda _m: None)
    assert len(inv.hosts) == 2
    pids = subprocess.run(
        ["ip", "netns", "pids", other.netns(0)], capture_output=True, text=True
    ).stdout.split()
    assert pids, "sshd runs inside the node's namespace"
    left = other.down(say=lambda _m: None)
    assert not any(left.values()), left
    for pid in pids:
        assert not _pid_alive(int(pid)), "sshd was stopped"
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    assert "frdbr" not in out and "frdv0" not in out
