"""The local fleet's real Slurm cluster (``LocalFleet.up(slurm=True)``, ``launch.fleets.local.slurm``).

Debian's slurm-wlm and munge, unmodified, on a 4-node fleet: node 0 the controller and login host,
nodes 1-3 compute nodes with two GPUs each in ``gres.conf``. Asserted through real SSH sessions as
the cluster's user, as a lab's user sees it: ``sinfo`` finds the fleet's own configuration with no
``SLURM_CONF`` and shows the compute nodes idle with their GPUs; ``srun`` runs a task on each node,
inside the node (its hostname, its PID namespace), with Slurm's GPU binding; ``down`` leaves no
daemon, configuration, key or spool folder behind, and never touches a system Slurm's files.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from launch.fleets.local import LocalFleet
from launch.fleets.local.naming import FleetNames
from launch.fleets.local.slurm import PARTITION, SLURM_ROOT, LocalSlurm
from launch.paths import known_hosts_file
from launch.processes import pid_alive
from launch.transport.ssh import CommandResult, Fleet
from tests.conftest import fleet_prefix, fleet_subnet, module_fleet, needs_root

PREFIX = fleet_prefix("s")
NODES = 4


@pytest.fixture(scope="module")
def cluster(fleetrun_home: Path) -> Iterator[LocalFleet]:
    if os.geteuid() != 0:
        pytest.skip("the local fleet needs root (network namespaces, users, sshd)")
    with module_fleet(PREFIX, fleet_subnet(16), NODES, slurm=True) as fleet:
        yield fleet


def _on(fleet: LocalFleet, i: int, command: str) -> str:
    """``command`` on node ``i`` over SSH as the cluster's user (pinned host keys); its stdout."""
    inventory = fleet.inventory()
    kh = inventory.write_known_hosts(known_hosts_file(inventory.fingerprint()))
    host = next(h for h in inventory.hosts if h.name == fleet.node_name(i))
    with Fleet([host], kh) as conns:
        answer = conns.map(lambda c: c.run(command, timeout=60), deadline=90)[host.name]
    assert isinstance(answer, CommandResult) and answer.ok, answer
    return answer.stdout


def test_the_configuration_names_only_the_compute_nodes_with_their_addresses() -> None:
    names = FleetNames(prefix="frq", subnet=7)
    conf = LocalSlurm(names).slurm_conf(3, gpus=4)
    assert "SlurmctldHost=frqnode0(198.18.7.10)" in conf
    node_lines = [line for line in conf.splitlines() if line.startswith("NodeName=")]
    assert [line.split()[:2] for line in node_lines] == [
        ["NodeName=frqnode1", "NodeAddr=198.18.7.11"],
        ["NodeName=frqnode2", "NodeAddr=198.18.7.12"],
    ]
    assert all("Gres=gpu:4" in line for line in node_lines)
    assert f"PartitionName={PARTITION} Nodes=frqnode1,frqnode2 " in conf
    assert f"AuthInfo=socket={SLURM_ROOT}/frq/munge-run/munge.socket" in conf, "its own munged"
    assert LocalSlurm.gres_conf(4) == "Name=gpu File=/etc/slurm/dev/nvidia[0-3]\n"
    assert LocalSlurm.gres_conf(1) == "Name=gpu File=/etc/slurm/dev/nvidia0\n"


@needs_root()
def test_sinfo_on_the_login_host_shows_the_compute_nodes_idle_with_their_gpus(cluster: LocalFleet) -> None:
    out = _on(cluster, 0, 'echo "conf=${SLURM_CONF:-}"; sinfo -h -N -o "%N %P %T %G"')
    lines = out.splitlines()
    assert lines[0] == "conf=", "found through the node's own /etc/slurm, as on a real cluster"
    rows = sorted(line.split() for line in lines[1:])
    assert rows == [[cluster.node_name(i), f"{PARTITION}*", "idle", "gpu:2"] for i in (1, 2, 3)]


@needs_root()
def test_srun_runs_one_task_inside_each_compute_node_with_its_gpus(cluster: LocalFleet) -> None:
    out = _on(
        cluster,
        0,
        "srun -N3 --gres=gpu:2 -t 1 sh -c 'echo \"$(hostname) $CUDA_VISIBLE_DEVICES $SLURM_JOB_ID "
        "$(cat /proc/1/comm) $(whoami)\"'",
    )
    rows = sorted(line.split() for line in out.splitlines())
    assert [r[0] for r in rows] == [cluster.node_name(i) for i in (1, 2, 3)], "one task per compute node"
    job_ids = {r[2] for r in rows}
    assert len(job_ids) == 1 and re.fullmatch(r"\d+", job_ids.pop()), rows
    for _host, gpus, _job, init, user in rows:
        assert gpus == "0,1", "Slurm bound both gres GPUs to the step"
        assert init == "sshd", "the task ran inside the node's PID namespace, beside its SSH sessions"
        assert user == cluster.vm_user
    # the allocation ended with the step: the partition is free again
    assert _on(cluster, 0, "squeue -h -o %i").strip() == ""


@needs_root()
def test_down_leaves_no_daemon_configuration_or_key_behind(cluster: LocalFleet) -> None:
    """Last in the file: takes the module's cluster down itself (the fixture's ``down`` after it
    finds nothing left, and checks that too)."""
    slurm = LocalSlurm(cluster)
    created = cluster.state.load()
    daemons = LocalSlurm.daemon_pids(created["netns"])
    assert {name for name, _pid in daemons} == {"munged", "slurmctld", "slurmd"}, daemons
    assert len([n for n, _ in daemons if n == "slurmd"]) == NODES - 1
    system_etc = sorted(os.listdir("/etc/slurm")) if Path("/etc/slurm").is_dir() else None
    left = cluster.down(say=lambda _m: None)
    assert not any(left.values()), left
    assert not [pid for _name, pid in daemons if pid_alive(pid)], "every daemon ended"
    assert not slurm.root.exists() and not slurm.conf_dir(0).exists()
    after = sorted(os.listdir("/etc/slurm")) if Path("/etc/slurm").is_dir() else None
    assert after == system_etc, "the system's /etc/slurm is never written"
