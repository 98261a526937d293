"""A lab behind a login node, on the local fleet: ``LocalFleet.up(bastion=True, mixed=True)``.

The nodes sit on an internal bridge this machine has no address on (and an ``unreachable`` route
for their subnet); the head has a second interface on the external bridge and is the workers'
jump host (``proxy_jump``: its external address and its own pinned host key). Each node also
has its own sshd port and interface name. Everything goes through the real CLI or the real
transport: ``fab doctor``, ``fab train`` (rsync through the ``ProxyCommand``, paramiko through
one shared jump connection, pulls back through it), ``fab exec``, and plain OpenSSH.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from launch.errors import HostError, HostKeyMismatch
from launch.fleets.local import LocalFleet
from launch.job.inventory import Host, Inventory
from launch.transport.jump import JumpHosts
from launch.transport.reachability import sshd_answers
from launch.transport.ssh import Fleet, openssh_command
from tests.conftest import REPO, fab, fleet_prefix, fleet_subnet, module_fleet, needs_root, write_playbook

pytestmark = needs_root()
PREFIX = fleet_prefix("j")


@pytest.fixture(scope="module")
def bastion(fleetrun_home: Path) -> Iterator[LocalFleet]:
    with module_fleet(PREFIX, fleet_subnet(6), 3, bastion=True, mixed=True) as fleet:
        yield fleet
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=False).stdout
    assert f"{PREFIX}bi" not in links and f"{PREFIX}x0" not in links, (
        "both bridges and the head's second link gone"
    )
    routes = subprocess.run(
        ["ip", "route", "show", "type", "unreachable"], capture_output=True, text=True
    ).stdout
    assert fleet.internal_subnet not in routes, "the unreachable route is removed with the fleet"


def test_the_inventory_says_the_workers_are_behind_the_head(bastion: LocalFleet) -> None:
    inv = bastion.inventory()
    head, workers = inv.hosts[0], inv.hosts[1:]
    assert head.proxy_jump is None and head.address == bastion.external_address
    assert head.private_address == bastion.address(0), "the cluster still meets on the internal network"
    for host in workers:
        assert host.proxy_jump is not None
        assert (host.proxy_jump.address, host.proxy_jump.port) == (head.address, head.port)
        assert host.proxy_jump.host_key == head.host_key and host.proxy_jump.user == head.user
    assert len({h.port for h in inv.hosts}) == 3 and len({h.interface for h in inv.hosts}) == 3


def test_this_machine_cannot_reach_a_worker_directly(bastion: LocalFleet) -> None:
    worker = bastion.inventory().hosts[1]
    with pytest.raises(OSError), socket.create_connection((worker.address, worker.port), timeout=3):
        pass
    with socket.create_connection((bastion.external_address, bastion.ssh_port(0, True)), timeout=3) as sock:
        sock.settimeout(3)
        assert sock.recv(64).startswith(b"SSH-2.0-"), "the head's external sshd answers"


def test_every_node_through_one_shared_jump_connection(bastion: LocalFleet, fleetrun_home: Path) -> None:
    inv = bastion.inventory()
    known_hosts = inv.write_known_hosts(fleetrun_home / "kh-bastion")
    assert f"[{bastion.external_address}]:2200 " in known_hosts.read_text()
    with Fleet(inv.hosts, known_hosts) as fleet:
        results = fleet.run("hostname", timeout=30)
        assert {name: getattr(r, "stdout", repr(r)).strip() for name, r in results.items()} == {
            h.name: h.name for h in inv.hosts
        }
        head = f"{bastion.external_address}:2200"
        ss = subprocess.run(
            ["ss", "-Htn", "state", "established", "dst", head], capture_output=True, text=True, check=True
        ).stdout
        assert len(ss.splitlines()) == 2, (
            f"the head's own connection and one jump connection, not one per node:\n{ss}"
        )


def test_doctor_and_a_digits_job_through_the_bastion(
    bastion: LocalFleet, fleetrun_home: Path, digits_workdir: Path, tmp_path: Path
) -> None:
    doctor = fab("doctor", "--verbose", "--inventory", f"local:{PREFIX}", home=fleetrun_home)
    assert doctor.returncode == 0, doctor.stdout[-3000:] + doctor.stderr[-2000:]
    for i in range(3):
        assert f"{bastion.node_name(i)} interface  ok     lan{i} MTU" in doctor.stdout, doctor.stdout[-3000:]

    playbook = write_playbook(tmp_path / "job.yaml", digits_workdir, name="t-bastion", outputs="outputs")
    runs = tmp_path / "runs"
    proc = fab("train", str(playbook), "--inventory", f"local:{PREFIX}", home=fleetrun_home, runs=runs)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "succeeded (completed)" in proc.stdout
    world = " ".join(proc.stdout.split())
    for i in range(3):
        assert f"{i}@{bastion.node_name(i)}({bastion.address(i)})" in world, (
            "ranks meet on the private addresses"
        )
    (folder,) = runs.iterdir()
    for i in (1, 2):
        pulled = folder / "nodes" / bastion.node_name(i)
        assert (pulled / "metrics.jsonl").is_file() or (pulled / "node.log").is_file(), (
            "pulled through the jump"
        )
        assert f"IFACE=lan{i}\n" in (pulled / "launch.sh").read_text(), "the node's own interface"


def test_a_wrong_jump_host_key_is_refused_on_both_transports(bastion: LocalFleet, tmp_path: Path) -> None:
    """The workers alone (so the head's real key is pinned nowhere), the jump pinned with node 1's key."""
    data = bastion.inventory().to_yaml_data()
    wrong = data["hosts"][1]["host_key"]
    workers = []
    for host in data["hosts"][1:]:
        host["proxy_jump"]["host_key"] = wrong
        workers.append({k: v for k, v in host.items() if v is not None})
    inventory = tmp_path / "lab.yaml"
    inventory.write_text(yaml.safe_dump({"hosts": workers}))
    home = tmp_path / "home"
    proc = fab("exec", "hostname", "--inventory", str(inventory), home=home)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    jump = f"{bastion.node_name(0)}@{bastion.external_address}:2200"
    for i in (1, 2):
        line = next(
            x for x in proc.stdout.splitlines() if x.startswith(f"fleetrun: {bastion.node_name(i)}: FAILED")
        )
        assert f"jump host: host key at {jump} does not match the pinned key" in line
        assert "proxy_jump.host_key" in line
    assert f"{bastion.node_name(1)}: {bastion.node_name(1)}" not in proc.stdout, "no command ran"

    lab = Inventory.from_static_yaml(inventory)
    known_hosts = lab.write_known_hosts(tmp_path / "kh")
    pinned = known_hosts.read_text()
    worker = lab.hosts[0]
    ssh = subprocess.run(
        [*openssh_command(worker, known_hosts), f"{worker.user}@{worker.address}", "hostname"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert ssh.returncode == 255 and "Host key verification failed" in ssh.stderr, ssh.stderr
    assert known_hosts.read_text() == pinned, "nothing learned"
    assert not (home / "known_hosts").exists() or all(
        bastion.inventory().hosts[0].host_key not in p.read_text() for p in (home / "known_hosts").iterdir()
    ), "the head's real key was never written anywhere"


def test_a_node_the_jump_host_cannot_reach_is_named_with_the_jump(
    bastion: LocalFleet, tmp_path: Path
) -> None:
    """Node 2 listed on a port nothing listens on: the jump host connects, the channel is refused."""
    data = bastion.inventory().to_yaml_data()
    data["hosts"][2]["port"] = 2299
    inventory = tmp_path / "lab.yaml"
    inventory.write_text(yaml.safe_dump({"hosts": data["hosts"]}))
    proc = fab("exec", "hostname", "--inventory", str(inventory), home=tmp_path / "home")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    two = bastion.node_name(2)
    line = next(x for x in proc.stdout.splitlines() if x.startswith(f"fleetrun: {two}: FAILED"))
    jump = f"{bastion.node_name(0)}@{bastion.external_address}:2200"
    assert f"unreachable at {bastion.address(2)}:2299 through jump host {jump}" in line
    assert "the jump host could not connect" in line
    assert f"{bastion.node_name(1)}: {bastion.node_name(1)}" in proc.stdout, (
        "the node behind it that is up answers"
    )


def test_the_recovery_recheck_reaches_workers_through_the_jump_host(
    bastion: LocalFleet, fleetrun_home: Path
) -> None:
    """After a failed attempt the recovery re-checks every node's sshd before calling it lost.
    A worker behind the bastion cannot be reached directly, so that check goes through the jump
    host; a direct check would find every worker silent and take them all for lost nodes."""

    def through(jumps: JumpHosts, host: Host) -> bool:
        return sshd_answers(host, 3.0, jumps)

    inv = bastion.inventory()
    known_hosts = inv.write_known_hosts(fleetrun_home / "kh-recheck")
    workers = inv.hosts[1:]
    assert not any(sshd_answers(h, timeout=1.0) for h in workers), "no direct route to the workers"
    with Fleet(inv.hosts, known_hosts) as fleet:
        assert all(through(fleet.jumps, h) for h in workers)
        closed = workers[0].model_copy(update={"port": 1})  # nothing listens there: a gone sshd
        assert not through(fleet.jumps, closed)
        assert through(fleet.jumps, workers[0]), "a refused channel leaves the jump usable"


def test_a_lab_host_behind_the_jump_is_seen_answering_again(bastion: LocalFleet, fleetrun_home: Path) -> None:
    """Recovery's wait for a lost lab machine asks through the jump host (``Fleet.answers``, the
    run's shared jump connection): from here the worker's address has no route, so a direct probe
    would wait out the whole timeout and give up."""
    from launch.fleets.kinds.lab import LabKind
    from launch.fleets.kinds.refs import LabFleet

    inv = bastion.inventory()
    worker = inv.hosts[1]
    kind, said = LabKind(LabFleet()), []
    with Fleet(inv.hosts, inv.write_known_hosts(fleetrun_home / "kh-probe")) as fleet:
        assert kind.replace(worker, said.append, timeout_s=20, probe=fleet.answers) == worker, said
        gone = worker.model_copy(update={"port": 2299})
        assert kind.replace(gone, said.append, timeout_s=1, probe=fleet.answers) is None, "nothing listens"
    assert kind.replace(worker, said.append, timeout_s=1) is None, "no route from here without the jump"
    wrong_kh = fleetrun_home / "kh-probe-wrong"
    wrong_kh.write_text(f"[{bastion.external_address}]:2200 {worker.host_key}\n")
    with Fleet(inv.hosts[1:], wrong_kh) as fleet, pytest.raises(HostKeyMismatch):
        kind.replace(worker, said.append, timeout_s=5, probe=fleet.answers)


def test_a_silent_node_behind_the_jump_does_not_cut_the_others(
    bastion: LocalFleet, fleetrun_home: Path
) -> None:
    """A node the jump host cannot reach in time (no such address on the internal network: the
    channel open times out while the jump host still resolves it) is unreachable by itself; the
    shared jump connection, which carries the other nodes' sessions, stays up."""
    inv = bastion.inventory()
    known_hosts = inv.write_known_hosts(fleetrun_home / "kh-silent")
    with Fleet(inv.hosts, known_hosts) as fleet:
        worker = fleet.connections[inv.hosts[1].name]
        assert worker.run("hostname", timeout=30).stdout.strip() == inv.hosts[1].name
        silent = inv.hosts[2].model_copy(update={"address": f"{bastion.block_prefix(0)}.99"})
        with pytest.raises(HostError, match="through jump host"):
            fleet.jumps.channel(silent, timeout=0.5)
        assert worker.run("hostname", timeout=30).stdout.strip() == inv.hosts[1].name, (
            "the session through the shared jump connection survived"
        )


def test_fab_ssh_reaches_a_worker_through_the_jump_and_refuses_a_changed_key(
    bastion: LocalFleet, fleetrun_home: Path, tmp_path: Path
) -> None:
    """``fab ssh`` to a worker only the head can reach: by inventory and by a recorded run; with
    the worker's pinned key swapped for another node's, ssh refuses and nothing is learned."""
    from launch.run.records import RunRecords

    home = fleetrun_home  # the local fleet's state is there
    one = bastion.node_name(1)
    proc = fab("ssh", f"local:{PREFIX}", "--node", one, "--command", "hostname", home=home)
    assert proc.returncode == 0 and proc.stdout.strip() == one, proc.stdout + proc.stderr
    with RunRecords(home / "runs.db") as records:
        records.start(run_id="r-ssh", inventory=bastion.inventory().to_yaml_data())
    proc = fab("ssh", "r-ssh", "--command", "hostname", home=home)
    assert proc.returncode == 0 and proc.stdout.strip() == bastion.node_name(0), "the head by default"
    proc = fab("ssh", "r-ssh", "--node", "nope", "--command", "hostname", home=home)
    assert proc.returncode == 2 and "--node 'nope': run r-ssh has no such node" in proc.stderr

    data = bastion.inventory().to_yaml_data()
    data["hosts"][1]["host_key"] = data["hosts"][2]["host_key"]
    inventory = tmp_path / "changed.yaml"
    inventory.write_text(
        yaml.safe_dump({"hosts": [{k: v for k, v in h.items() if v is not None} for h in data["hosts"]]})
    )
    proc = fab("ssh", str(inventory), "--node", one, "--command", "echo RAN", home=home)
    assert proc.returncode == 255 and "Host key verification failed" in proc.stderr, proc.stderr
    assert "RAN" not in proc.stdout
    pinned = (home / "known_hosts" / Inventory.from_static_yaml(inventory).fingerprint()).read_text()
    assert bastion.inventory().hosts[1].host_key not in pinned, "the worker's real key was not learned"


def test_fab_forward_a_workers_port_and_ssh_config(
    bastion: LocalFleet, fleetrun_home: Path, tmp_path: Path
) -> None:
    """A web server on a worker's localhost answers on 127.0.0.1 here through ``fab forward``;
    ``fab ssh-config`` writes entries plain OpenSSH uses through the jump host."""
    home = fleetrun_home
    two = bastion.node_name(2)
    port = 18765  # on the node, in its own network namespace
    with socket.socket() as probe:  # here: a port no other test run on this machine holds
        probe.bind(("127.0.0.1", 0))
        local_port = probe.getsockname()[1]
    start = (
        # in the node user's home: the local fleet's nodes share this machine's /tmp
        'mkdir -p "$HOME/fwd" && echo forwarded-ok > "$HOME/fwd/index.html" && '
        f'(setsid nohup python3 -m http.server {port} --bind 127.0.0.1 --directory "$HOME/fwd" '
        '> /dev/null 2>&1 < /dev/null & echo $! > "$HOME/fwd/pid")'
    )
    proc = fab("ssh", f"local:{PREFIX}", "--node", two, "--command", start, home=home)
    assert proc.returncode == 0, proc.stderr
    env = {**os.environ, "FLEETRUN_HOME": str(home)}
    forward = subprocess.Popen(
        [str(REPO / ".venv" / "bin" / "fab"), "forward", f"local:{PREFIX}", str(port), "--node", two,
         "--local-port", str(local_port)],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        body = ""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and forward.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{local_port}/", timeout=5) as answer:
                    body = answer.read().decode()
                break
            except OSError:
                time.sleep(0.5)
    finally:
        forward.terminate()
        out, err = forward.communicate(timeout=30)
        fab(
            "ssh",
            f"local:{PREFIX}",
            "--node",
            two,
            "--command",
            'kill $(cat "$HOME/fwd/pid"); rm -rf "$HOME/fwd"',
            home=home,
        )
    assert body.strip() == "forwarded-ok", (body, out, err)
    assert f"forwarding http://127.0.0.1:{local_port} -> {two}:localhost:{port}" in out, out + err

    config = tmp_path / "ssh.conf"
    proc = fab("ssh-config", f"local:{PREFIX}", "--output", str(config), home=home)
    assert proc.returncode == 0, proc.stderr
    text = config.read_text()
    assert text.count("StrictHostKeyChecking yes") == 3 and text.count("ProxyCommand ssh") == 2
    ssh = subprocess.run(
        ["ssh", "-F", str(config), "-o", "BatchMode=yes", f"fleetrun-{two}", "hostname"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert ssh.returncode == 0 and ssh.stdout.strip() == two, ssh.stderr


def test_replacing_the_head_repins_it_as_the_workers_jump_host(
    bastion: LocalFleet, fleetrun_home: Path
) -> None:
    """A fresh head (new host key) and a fresh worker (its sshd seen in its namespace: no route
    from here): the fleet's inventory pins the head's new key on the workers' ``proxy_jump`` too,
    and every node answers through the new head. Last in the module: it changes the fleet."""
    from launch.fleets.kinds.local import LocalFleetKind
    from launch.fleets.kinds.refs import LocalFleetRef

    kind, said = LocalFleetKind(LocalFleetRef(prefix=PREFIX)), []  # as recovery calls it: no subnet known
    before = bastion.inventory()
    head = kind.replace(before.hosts[0], said.append, 60)
    worker = kind.replace(before.hosts[1], said.append, 60)
    assert head is not None and worker is not None, said
    after = bastion.inventory()
    assert head.host_key != before.hosts[0].host_key and worker.host_key != before.hosts[1].host_key
    assert after.hosts[0] == head and after.hosts[1].host_key == worker.host_key
    assert all(h.proxy_jump is not None and h.proxy_jump.host_key == head.host_key for h in after.hosts[1:])
    known_hosts = after.write_known_hosts(fleetrun_home / "kh-replaced")
    with Fleet(after.hosts, known_hosts) as fleet:
        results = fleet.run("hostname", timeout=30)
    assert {name: getattr(r, "stdout", repr(r)).strip() for name, r in results.items()} == {
        h.name: h.name for h in after.hosts
    }
