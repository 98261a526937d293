"""The local fleet: real namespaces and sshd; ``down`` leaves nothing of its own, even after a crash
in ``up``, and never touches what it did not create."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from launch.errors import LocalFleetError
from launch.fleets.local import LocalFleet
from launch.fleets.local.prereqs import pid_alive
from launch.fleets.local.state import Created, StateFile
from tests.conftest import REPO, fleet_prefix, fleet_subnet, needs_root

EMPTY = {"netns": [], "links": [], "qdiscs": [], "routes": [], "users": [], "processes": [], "files": []}

# Run in a subprocess: builds a fleet and dies by SIGKILL right after its second node is made.
CRASH_AFTER_TWO_NODES = """
import os, signal, sys
from launch.fleets.local import fleet as lifecycle
made = []
real_make_node = lifecycle.make_node
def make_node_then_crash(*args, **kwargs):
    host = real_make_node(*args, **kwargs)
    made.append(host)
    if len(made) == 2:
        os.kill(os.getpid(), signal.SIGKILL)  # a hard crash half-way through up
    return host
lifecycle.make_node = make_node_then_crash
lifecycle.LocalFleet(prefix=sys.argv[1], subnet=int(sys.argv[2])).up(3, say=lambda m: None)
"""


def test_not_root_gets_a_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(LocalFleetError, match="needs root: each node is a network namespace"):
        LocalFleet(prefix=fleet_prefix("x")).up(2)


def test_the_image_is_probed_once_per_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each fleet module's ``up`` asks for the image; importing torch to check it costs seconds of
    CPU each time, so a process checks a complete image once."""
    from launch.fleets.local import prereqs

    python = tmp_path / "venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text("")
    (python.parent / "aws").write_text("")
    probes: list[list[str]] = []

    def probe(argv: list[str], check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        probes.append(argv)
        return subprocess.CompletedProcess(argv, 0, "", "")

    monkeypatch.setattr(prereqs, "image_python", lambda: python)
    monkeypatch.setattr(prereqs, "run", probe)
    monkeypatch.setattr(prereqs, "_VERIFIED", set())
    assert prereqs.ensure_image() == python
    assert prereqs.ensure_image() == python
    assert probes == [[str(python), "-c", "import torch, numpy"]]
    monkeypatch.setattr(prereqs, "_VERIFIED", set())  # a new process checks it again
    assert prereqs.ensure_image() == python and len(probes) == 2


def test_account_tools_are_tried_again_while_passwd_is_locked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """shadow's tools give up at once when another holds the lock ("cannot lock /etc/passwd; try
    again later", seen with the suite's two workers making fleets at once): tried again; any
    other failure, or another tool, is not."""
    from launch.fleets.local import prereqs

    count = tmp_path / "count"
    tool = tmp_path / "usermod"
    tool.write_text(
        f"#!/bin/sh\nn=$(cat {count} 2>/dev/null || echo 0); n=$((n+1)); echo $n > {count}\n"
        '[ "$n" -ge 3 ] && exit 0\necho "usermod: cannot lock /etc/passwd; try again later." >&2; exit 1\n'
    )
    tool.chmod(0o755)
    monkeypatch.setattr(prereqs.time, "sleep", lambda _s: None)
    monkeypatch.setattr(prereqs, "ACCOUNT_TOOLS", frozenset({str(tool)}))
    assert prereqs.run([str(tool), "-p", "*", "frxnode0"]).returncode == 0
    assert count.read_text().strip() == "3"
    count.write_text("-100")
    with pytest.raises(LocalFleetError, match="cannot lock /etc/passwd"):
        prereqs.run([str(tool), "-p", "*", "frxnode0"])  # bounded: still locked after every try
    assert count.read_text().strip() == str(-100 + prereqs.LOCK_TRIES)
    count.write_text("0")
    monkeypatch.setattr(prereqs, "ACCOUNT_TOOLS", frozenset())
    assert prereqs.run([str(tool)], check=False).returncode == 1 and count.read_text().strip() == "1"


def test_bad_prefix_and_subnet() -> None:
    with pytest.raises(LocalFleetError, match="fleet prefix 'Bad-Prefix'"):
        LocalFleet(prefix="Bad-Prefix")
    with pytest.raises(LocalFleetError, match="fleet prefix 'ab\\\\n'"):
        LocalFleet(prefix="ab\n")
    with pytest.raises(LocalFleetError, match="fleet subnet 300"):
        LocalFleet(prefix="ok", subnet=300)


def test_state_file_keeps_every_whole_record_and_skips_a_torn_one(tmp_path: Path) -> None:
    state = StateFile(tmp_path / "s" / "created.jsonl")
    assert state.load().empty()
    state.record("netns", "frx-node0")
    state.record("user", "frxnode0")
    state.record("user", "frxnode0")
    with open(state.path, "a") as fh:
        fh.write('{"kind": "link", "na')  # a crash in the middle of a write
    loaded = state.load()
    assert loaded["netns"] == ["frx-node0"] and loaded["user"] == ["frxnode0"] and loaded["link"] == []
    with pytest.raises(ValueError):
        state.record("file", "/etc/passwd")
    assert Created().empty()


@needs_root()
def test_fleet_nodes_are_separate_machines(fleet: LocalFleet) -> None:
    inv = fleet.inventory()
    base = fleet.block_prefix(0)
    assert [h.address for h in inv.hosts] == [f"{base}.10", f"{base}.11", f"{base}.12"]
    for i, host in enumerate(inv.hosts):
        out = subprocess.run(
            ["ip", "netns", "exec", fleet.netns(i), "ip", "-o", "-4", "addr", "show", "dev", "eth0"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert f"inet {host.address}/24" in out
        assert host.user == fleet.node_name(i) and os.path.isdir(f"/home/{host.user}")
        assert fleet.is_ours(host.user), "the fleet's users carry its GECOS marker and are recorded"
    # nodes have no default route: they reach only each other
    routes = subprocess.run(
        ["ip", "-n", fleet.netns(0), "route"], capture_output=True, text=True, check=True
    ).stdout
    assert "default" not in routes


@needs_root()
def test_down_after_crash_half_way_through_up(fleetrun_home: object) -> None:
    crashing = LocalFleet(prefix=fleet_prefix("c"), subnet=fleet_subnet(2))
    proc = subprocess.run(
        [sys.executable, "-c", CRASH_AFTER_TWO_NODES, crashing.prefix, str(crashing.subnet)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == -9, proc.stderr
    half = crashing.leftovers()
    assert len(half["netns"]) == 2 and len(half["users"]) == 2, f"the crash left a half-built fleet: {half}"
    left = crashing.down(say=lambda _m: None)
    assert left == EMPTY
    assert crashing.foreign() == {}, "nothing matching the fleet's names remains either"


@needs_root()
def test_up_down_cycle_leaves_nothing(fleetrun_home: object) -> None:
    other = LocalFleet(prefix=fleet_prefix("d"), subnet=fleet_subnet(3))
    inv = other.up(2, say=lambda _m: None)
    assert len(inv.hosts) == 2
    pids = subprocess.run(
        ["ip", "netns", "pids", other.netns(0)], capture_output=True, text=True
    ).stdout.split()
    assert pids, "sshd runs inside the node's namespace"
    assert other.power_daemon_pids(), "the power daemon runs"
    left = other.down(say=lambda _m: None)
    assert left == EMPTY, left
    for pid in pids:
        assert not pid_alive(int(pid)), "sshd was stopped"
    assert other.foreign() == {}
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    assert f"{other.bridge}:" not in out and f"{other.veth(0)}:" not in out


@needs_root()
def test_a_user_and_home_fleetrun_did_not_create_survive_down_and_block_up(fleetrun_home: object) -> None:
    """A lab user that happens to match the fleet's names: ``down`` leaves it and its home alone,
    ``up`` refuses to build over it, naming it."""
    names = LocalFleet(prefix=fleet_prefix("u"), subnet=fleet_subnet(4))
    user = names.node_name(0)
    home = Path("/home") / user
    subprocess.run(["userdel", "--remove", user], capture_output=True, check=False)
    subprocess.run(
        ["useradd", "--create-home", "--home-dir", str(home), "--shell", "/bin/sh", user],
        check=True,
        capture_output=True,
    )
    keep = home / "thesis.txt"
    keep.write_text("four years of work\n")
    try:
        assert not names.is_ours(user)
        left = names.down(say=lambda _m: None)
        assert left == EMPTY, "nothing of the fleet's own existed"
        assert keep.read_text() == "four years of work\n", "the home and its files survive down"
        assert subprocess.run(["id", user], capture_output=True).returncode == 0, "the user survives down"
        assert names.foreign() == {"users": [user], "homes": [str(home)]}
        with pytest.raises(
            LocalFleetError, match=rf"will not build over .*user {user} \(no marker\).*{home}"
        ):
            names.up(2, say=lambda _m: None, build_image=False)
        assert keep.read_text() == "four years of work\n", "a refused up changes nothing"
        assert names.leftovers() == EMPTY, "the refused up created nothing"
        # Even a user that up's record names is not removed without the fleet's marker.
        names.state.record("user", user)
        names.state.record("home", str(home))
        names.down(say=lambda _m: None)
        assert keep.exists() and subprocess.run(["id", user], capture_output=True).returncode == 0
    finally:
        subprocess.run(["userdel", "--remove", user], capture_output=True, check=False)
        subprocess.run(["rm", "-rf", str(names.state_dir)], check=False)
