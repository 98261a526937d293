"""A real Slurm cluster on a local fleet (``LocalFleet.up(slurm=True)``, ``fab local.up --with-slurm``).

Debian's ``slurm-wlm`` and ``munge``, unmodified: node 0 runs ``munged`` and ``slurmctld`` and is
the login host (users reach it over SSH with its pinned host key, as a lab's login node); every
other node runs a ``slurmd`` and is a compute node of the one partition (``PARTITION``), each with
``GPUS`` GPUs declared in ``gres.conf`` (below). A Slurm cluster gives its users one account on
every node, so a Slurm fleet has the VM shape (``launch.fleets.local.mountns``): one user
(``<prefix>fleet``), each node with its own home, ``/tmp`` and PID namespace. Each daemon joins its
node's namespaces (network, hostname, mounts, PIDs) through ``nsenter`` on the node's sshd, so a
job's processes see the same machine as the user's SSH sessions on it.

Nothing of a system Slurm or munge is touched, and two fleets never share anything:

- the configuration is written into each node's ``/etc`` overlay (``/etc/netns/<ns>/slurm``),
  which ``ip netns exec`` binds over ``/etc/slurm`` when the node's sshd starts: on a node,
  ``sinfo``/``salloc``/``srun`` find ``/etc/slurm/slurm.conf`` (Debian's default path) without
  ``SLURM_CONF``, as on a real cluster, and each fleet's nodes see their own. This machine's
  tools reach the cluster with ``SLURM_CONF`` set to node 0's copy (``LocalSlurm.command``);
- ``munged`` runs with a fresh key in a root-only folder and its own socket, which
  ``slurm.conf`` names (``AuthInfo=socket=...``) for the daemons and the commands alike;
- state, spool, pid and log files live under ``/var/lib/fleetrun-slurm/<prefix>/`` (world
  traversable: a batch job's script is read from its node's spool directory as the user),
  recorded in the fleet's state (``slurm_dir``) before it is made, and removed by ``down``.

Settings that work without systemd or cgroup delegation: ``ProctrackType=proctrack/linuxproc``,
``TaskPlugin=task/none``; slurmd 22.05 initialises a cgroup plugin whatever the others are, and
inside a network namespace ``/sys/fs/cgroup`` is a fresh sysfs's empty folder, so ``cgroup.conf``
names ``cgroup/v1`` (its start needs no mounted hierarchy) instead of leaving it to detection.
GPUs: ``gres.conf`` gives each compute node ``File=`` device nodes of its own
(``/etc/slurm/dev/nvidia<k>``, character devices with ``/dev/null``'s numbers, created in the node's
overlay), so Slurm counts, allocates and binds them as real GPUs (``CUDA_VISIBLE_DEVICES`` set per
step), while the node's ``nvidia-smi`` is the test stand-in. Short timeouts (a node whose slurmd
stops is DOWN within ~10 s; ``ReturnToService=1``: it comes back when it answers again, but a
node an administrator set DOWN stays DOWN until resumed, as on most sites) and
``MinJobAge`` keep the cluster quick to react for tests and demos.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml

from launch.errors import LocalFleetError
from launch.fleets.local.naming import FleetNames
from launch.fleets.local.prereqs import run
from launch.job.inventory import Host

Record = Callable[[str, str], None]

SLURM_ROOT = Path("/var/lib/fleetrun-slurm")
PARTITION = "gpu"
GPUS = 2
"""GPUs (gres ``gpu``) per compute node."""
CONTROLLER = 0
"""The node running munged and slurmctld: the cluster's login host."""
REQUIRED = {"slurmctld": "slurmctld", "slurmd": "slurmd", "sinfo": "slurm-client", "munged": "munge"}
DAEMONS = ("munged", "slurmctld", "slurmd", "slurmstepd")
INVENTORY_FILE = "slurm.yaml"
TIME_LIMIT = "01:00:00"
"""The written inventory's allocation time limit: ends an allocation whose laptop and watchdog
are both gone."""
NULL_DEVICE = (1, 3)
"""Major and minor of ``/dev/null``: the fake GPU device nodes' numbers (harmless if opened)."""


@dataclass(frozen=True)
class LocalSlurm:
    """The Slurm cluster of one local fleet (``names``): its files, daemons and commands."""

    names: FleetNames

    # -- where things are ------------------------------------------------------------------------
    @property
    def root(self) -> Path:
        return SLURM_ROOT / self.names.prefix

    @property
    def munge_key_dir(self) -> Path:
        return self.root / "munge"

    @property
    def munge_socket(self) -> Path:
        return self.root / "munge-run" / "munge.socket"

    @property
    def controller_dir(self) -> Path:
        return self.root / "ctld"

    def node_dir(self, name: str) -> Path:
        return self.root / "nodes" / name

    def conf_dir(self, i: int) -> Path:
        """Node ``i``'s ``/etc/slurm`` (its ``/etc`` overlay's ``slurm`` folder)."""
        return self.names.netns_etc(i) / "slurm"

    @property
    def conf_path(self) -> Path:
        """``slurm.conf`` as this machine sees it: for ``SLURM_CONF`` outside the nodes."""
        return self.conf_dir(CONTROLLER) / "slurm.conf"

    @property
    def cluster_name(self) -> str:
        return self.names.prefix

    @property
    def login(self) -> str:
        return self.names.node_name(CONTROLLER)

    @staticmethod
    def compute_indexes(nodes: int) -> range:
        return range(1, nodes)

    def compute_nodes(self, nodes: int) -> list[str]:
        return [self.names.node_name(i) for i in self.compute_indexes(nodes)]

    # -- the configuration -----------------------------------------------------------------------
    def slurm_conf(self, nodes: int, gpus: int = GPUS) -> str:
        names = self.names
        cpus = os.cpu_count() or 1
        lines = [
            f"# fleetrun local fleet {names.prefix}: written by launch.fleets.local.slurm, removed by down",
            f"ClusterName={self.cluster_name}",
            f"SlurmctldHost={self.login}({names.address(CONTROLLER)})",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket}",
            f"StateSaveLocation={self.controller_dir}",
            f"SlurmctldPidFile={self.controller_dir / 'slurmctld.pid'}",
            f"SlurmctldLogFile={self.controller_dir / 'slurmctld.log'}",
            f"SlurmdSpoolDir={self.root / 'nodes' / '%n' / 'spool'}",
            f"SlurmdPidFile={self.root / 'nodes' / '%n' / 'slurmd.pid'}",
            f"SlurmdLogFile={self.root / 'nodes' / '%n' / 'slurmd.log'}",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "GresTypes=gpu",
            "AccountingStorageType=accounting_storage/none",
            "JobAcctGatherType=jobacct_gather/none",
            "JobCompType=jobcomp/none",
            "MpiDefault=none",
            "SchedulerType=sched/backfill",
            "SchedulerParameters=bf_interval=5,sched_interval=5",
            "ReturnToService=1",
            "SlurmctldTimeout=10",
            "SlurmdTimeout=10",
            "MessageTimeout=5",
            "InactiveLimit=0",
            "KillWait=5",
            "MinJobAge=5",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
        ]
        lines += [
            f"NodeName={names.node_name(i)} NodeAddr={names.address(i)} NodeHostname={names.node_name(i)} "
            f"CPUs={cpus} Gres=gpu:{gpus} State=UNKNOWN"
            for i in self.compute_indexes(nodes)
        ]
        lines.append(
            f"PartitionName={PARTITION} Nodes={','.join(self.compute_nodes(nodes))} "
            "Default=YES MaxTime=INFINITE State=UP"
        )
        return "\n".join(lines) + "\n"

    @staticmethod
    def gres_conf(gpus: int) -> str:
        last = f"[0-{gpus - 1}]" if gpus > 1 else "0"
        return f"Name=gpu File=/etc/slurm/dev/nvidia{last}\n" if gpus else ""

    def write(self, nodes: int, record: Record, gpus: int = GPUS) -> None:
        """Every node's ``/etc/slurm`` and the cluster's folders; before the nodes' sshd start
        (``ip netns exec`` binds the overlay when it starts a process, not later)."""
        missing = sorted({pkg for tool, pkg in REQUIRED.items() if not _have(tool)})
        if missing:
            raise LocalFleetError(
                f"--with-slurm needs Slurm and munge on this machine: apt-get install {' '.join(missing)}"
            )
        if nodes < 2:
            raise LocalFleetError(f"--nodes {nodes}: a Slurm fleet has a login node and 1+ compute nodes")
        if not 0 <= gpus <= 64:
            raise LocalFleetError(f"slurm gpus {gpus}: expected 0..64")
        record("slurm_dir", str(self.root))
        SLURM_ROOT.mkdir(mode=0o755, exist_ok=True)
        self.root.mkdir(mode=0o755, exist_ok=False)
        self.munge_key_dir.mkdir(mode=0o700)
        self.munge_socket.parent.mkdir(mode=0o755)
        self.controller_dir.mkdir(mode=0o700)
        (self.root / "nodes").mkdir(mode=0o755)
        run(["mungekey", "--create", f"--keyfile={self.munge_key_dir / 'munge.key'}"])
        conf = self.slurm_conf(nodes, gpus)
        for i in range(nodes):
            folder = self.conf_dir(i)
            folder.mkdir(mode=0o755)
            (folder / "slurm.conf").write_text(conf)
            (folder / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\n")
            if i == CONTROLLER:
                continue
            (folder / "gres.conf").write_text(self.gres_conf(gpus))
            (folder / "dev").mkdir(mode=0o755)
            for k in range(gpus):
                os.mknod(folder / "dev" / f"nvidia{k}", 0o666 | 0o020000, os.makedev(*NULL_DEVICE))
            node = self.node_dir(self.names.node_name(i))
            node.mkdir(mode=0o755)
            (node / "spool").mkdir(mode=0o755)

    # -- the daemons -----------------------------------------------------------------------------
    def node_init_pid(self, i: int) -> int:
        """The host pid of node ``i``'s sshd, the init of its PID namespace (VM shape): the
        process whose namespaces a daemon joins to run "on" the node."""
        out = run(["ip", "netns", "pids", self.names.netns(i)], check=False).stdout
        for text in out.split():
            with contextlib.suppress(OSError, ValueError):
                status = Path(f"/proc/{int(text)}/status").read_text()
                fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
                if fields.get("Name", "").strip() == "sshd" and fields.get("NSpid", "").split()[-1:] == ["1"]:
                    return int(text)
        raise LocalFleetError(f"local fleet {self.names.prefix}: node {i}'s sshd is not running")

    def on_node(self, i: int, argv: list[str], timeout: float = 30) -> subprocess.CompletedProcess[str]:
        """``argv`` as root in node ``i``'s namespaces (network, hostname, mounts, PIDs)."""
        pid = str(self.node_init_pid(i))
        return run(["nsenter", "-t", pid, "-n", "-u", "-m", "-p", "--wd=/", *argv], timeout=timeout)

    def start(self, nodes: int, timeout: float = 60) -> None:
        """munged and slurmctld on the login node, a slurmd on each compute node; returns when
        ``sinfo`` shows every compute node idle."""
        self.on_node(
            CONTROLLER,
            [
                "munged",
                f"--socket={self.munge_socket}",
                f"--key-file={self.munge_key_dir / 'munge.key'}",
                f"--pid-file={self.munge_socket.parent / 'munged.pid'}",
                f"--log-file={self.munge_key_dir / 'munged.log'}",
                f"--seed-file={self.munge_key_dir / 'munged.seed'}",
                f"--origin={self.names.address(CONTROLLER)}",
            ],
        )
        self.on_node(CONTROLLER, ["slurmctld"])
        for i in self.compute_indexes(nodes):
            self.on_node(i, ["slurmd", "-N", self.names.node_name(i)])
        self.wait_idle(nodes, timeout)

    def wait_idle(self, nodes: int, timeout: float = 60) -> None:
        wanted = set(self.compute_nodes(nodes))
        deadline = time.monotonic() + timeout
        states: dict[str, str] = {}
        while time.monotonic() < deadline:
            states = self.node_states()
            if wanted <= set(states) and all(states[n] == "idle" for n in wanted):
                return
            time.sleep(0.3)
        raise LocalFleetError(
            f"local fleet {self.names.prefix}: Slurm's nodes did not come up idle in {timeout:.0f} s "
            f"({states or 'slurmctld not answering'}); see {self.root}/*/*.log"
        )

    # -- the cluster as its users see it --------------------------------------------------------
    @property
    def inventory_path(self) -> Path:
        """The fleet's Slurm inventory (``--inventory slurm:PATH``), beside its own inventory."""
        return self.names.state_dir / INVENTORY_FILE

    def inventory_data(self, hosts: list[Host], time_limit: str = TIME_LIMIT) -> dict[str, object]:
        """A Slurm inventory of this cluster, as a lab would write one: the login host (node 0)
        and the compute nodes, each with its pinned host key; ``hosts`` is the fleet's nodes."""
        login, *compute = hosts
        login_entry = {
            "address": login.address,
            "port": login.port,
            "user": login.user,
            "key": str(login.key),
            "host_key": login.host_key,
        }
        return {
            "slurm": {
                "login": login_entry,
                "partition": PARTITION,
                "gres": f"gpu:{GPUS}",
                "time_limit": time_limit,
            },
            "defaults": {"user": login.user, "key": str(login.key), "python": login.python},
            "hosts": [
                {"name": h.name, "address": h.address, "port": h.port, "host_key": h.host_key}
                for h in compute
            ],
        }

    def write_inventory(self, hosts: list[Host]) -> Path:
        self.inventory_path.write_text(yaml.safe_dump(self.inventory_data(hosts), sort_keys=False))
        return self.inventory_path

    # -- this machine's view ---------------------------------------------------------------------
    def command(self, argv: list[str], timeout: float = 30) -> subprocess.CompletedProcess[str]:
        """A Slurm command run here as root against the fleet's cluster (``SLURM_CONF``): the
        site administrator's hand (``scontrol update``, ``squeue``, ``scancel``)."""
        env = {**os.environ, "SLURM_CONF": str(self.conf_path)}
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False, env=env)

    def node_states(self) -> dict[str, str]:
        """``sinfo``'s state of each node (``idle``, ``alloc``, ``down*``...); empty when the
        controller does not answer."""
        proc = self.command(["sinfo", "-h", "-N", "-o", "%N %T"], timeout=15)
        states: dict[str, str] = {}
        for line in proc.stdout.splitlines() if proc.returncode == 0 else []:
            parts = line.split()
            if len(parts) == 2:
                states[parts[0]] = parts[1]
        return states

    @staticmethod
    def daemon_pids(netns: list[str]) -> list[tuple[str, int]]:
        """Slurm and munge processes in the namespaces ``netns`` (the fleet's own)."""
        found = []
        for ns in netns:
            for text in run(["ip", "netns", "pids", ns], check=False).stdout.split():
                with contextlib.suppress(OSError, ValueError):
                    name = Path(f"/proc/{int(text)}/comm").read_text().strip()
                    if name in DAEMONS:
                        found.append((name, int(text)))
        return found


def _have(tool: str) -> bool:
    return shutil.which(tool) is not None or Path("/usr/sbin", tool).exists()


def remove(created_roots: list[str]) -> None:
    """The recorded cluster folders (after their daemons are killed with the fleet)."""
    for name in created_roots:
        path = Path(name)
        if path.parent == SLURM_ROOT and path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
    with contextlib.suppress(OSError):
        SLURM_ROOT.rmdir()  # when no other fleet has a cluster
