"""The local fleet's life cycle: ``up`` builds the nodes, ``down`` removes them, and only them.

Each node is a network namespace with its own address (198.18.<subnet>.10+i, and 198.19.<subnet>.*
past 240 nodes: the benchmarking range, so it never collides with a lab's 10/8, 172.16/12 or
192.168/16), its own UTS hostname, its own user and home, and a real OpenSSH ``sshd`` with its own
host key. The nodes reach each other over a bridge in the root namespace and have no default
route. Faults are real: kill a node's processes, or take its link down (``ip link set <prefix>v<i> down``).

Ownership: a fleet removes only what it recorded creating (``launch.fleets.local.state``, written
ahead of each step, so ``down`` after a crash half-way through ``up`` still leaves nothing), and a
user only when it also carries the fleet's GECOS marker. Things that merely match the fleet's names
(a lab user called ``frnode0``, someone's ``/home/frnode0``) are reported and left alone, and ``up``
refuses to build over them. ``up`` runs ``down`` first, so a crashed earlier run of the same fleet
is cleared. The shared Python "image" (``/opt/fleetrun/image``) is kept, like a machine image.
Needs root (namespaces, users); see ``require_root``.
"""

from __future__ import annotations

import contextlib
import grp
import os
import pwd
import shutil
import signal
import socket
import stat
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import yaml

from launch.errors import LocalFleetError
from launch.fleets.kinds.refs import LocalFleetRef
from launch.fleets.local import containers as local_containers
from launch.fleets.local import daemon, mountns, uplink
from launch.fleets.local import registry as local_registry
from launch.fleets.local import slurm as local_slurm
from launch.fleets.local.container_image import ensure_container_image
from launch.fleets.local.naming import HOMES, MAX_NODES, NETNS_ETC, NODES_PER_BLOCK, FleetNames
from launch.fleets.local.node import Shape, behind_head, make_node, start_sshd
from launch.fleets.local.prereqs import ensure_image, ensure_tools, image_python, pid_alive, require_root, run
from launch.fleets.local.slurm import PARTITION, LocalSlurm
from launch.fleets.local.state import Created, StateFile
from launch.job.inventory import Host, Inventory

POWER_MODULE = "launch.fleets.local.power"
USERDEL_TIMEOUT_S = 900.0
POWER_PID_FILE = "power.pid"
Say = Callable[[str], None]


def _quiet(_msg: str) -> None:
    pass


def _gecos(user: str) -> str | None:
    try:
        return pwd.getpwnam(user).pw_gecos
    except KeyError:
        return None


def _exists_user(name: str) -> bool:
    return _gecos(name) is not None


def _exists_group(name: str) -> bool:
    try:
        grp.getgrnam(name)
    except KeyError:
        return False
    return True


@dataclass(frozen=True)
class LocalFleet(FleetNames):
    """One local fleet: its names (``FleetNames``) and what it does with them."""

    @property
    def state(self) -> StateFile:
        return StateFile(self.state_dir / "created.jsonl")

    # -- discovery: what exists now that matches the fleet's names -------------------------------
    def existing_netns(self) -> list[str]:
        out = run(["ip", "netns", "list"], check=False).stdout
        names = [line.split()[0] for line in out.splitlines() if line.split()]
        return [n for n in names if self.netns_pattern.fullmatch(n)]

    def existing_users(self) -> list[str]:
        return sorted(p.pw_name for p in pwd.getpwall() if self.user_pattern.fullmatch(p.pw_name))

    def existing_links(self) -> list[str]:
        out = run(["ip", "-o", "link", "show"], check=False).stdout
        names = []
        for line in out.splitlines():
            parts = line.split(":")
            if len(parts) > 1:
                name = parts[1].strip().split("@")[0]
                if self.link_pattern.fullmatch(name):
                    names.append(name)
        return names

    def _matching_paths(self, parent: Path, pattern_of: Callable[[str], bool]) -> list[str]:
        if not parent.is_dir():
            return []
        return sorted(str(parent / p) for p in os.listdir(parent) if pattern_of(p))

    def is_ours(self, user: str, created: Created | None = None) -> bool:
        """Recorded by this fleet *and* marked as its own (GECOS)."""
        created = created if created is not None else self.state.load()
        return user in created["user"] and _gecos(user) == self.marker

    def foreign(self, created: Created | None = None) -> dict[str, list[str]]:
        """Things matching this fleet's names that it did not create: never touched, only reported."""
        created = created if created is not None else self.state.load()
        ours_users = {u for u in created["user"] if _gecos(u) == self.marker}
        found = {
            "users": [u for u in self.existing_users() if u not in ours_users],
            "netns": [n for n in self.existing_netns() if n not in created["netns"]],
            "links": [n for n in self.existing_links() if n not in created["link"]],
            "homes": [
                h
                for h in self._matching_paths(HOMES, lambda n: bool(self.user_pattern.fullmatch(n)))
                if h not in created["node_home"]
                and (h not in created["home"] or Path(h).name not in ours_users | self._gone_users(created))
            ],
            "netns_etc": [
                p
                for p in self._matching_paths(NETNS_ETC, lambda n: bool(self.netns_pattern.fullmatch(n)))
                if p not in created["netns_etc"]
            ],
        }
        return {k: v for k, v in found.items() if v}

    @staticmethod
    def _gone_users(created: Created) -> set[str]:
        return {u for u in created["user"] if not _exists_user(u)}

    def conflicts(self, nodes: int) -> list[str]:
        """Names ``up`` would create that exist already (after ``down`` removed the fleet's own)."""
        found = [f"user {self.vm_user}"] if _exists_user(self.vm_user) else []
        if os.path.lexists(mountns.mount_dir(self)):
            found.append(str(mountns.mount_dir(self)))
        if os.path.lexists(LocalSlurm(self).root):
            found.append(str(LocalSlurm(self).root))
        if os.path.lexists(local_registry.registry_dir(self.prefix)):
            found.append(str(local_registry.registry_dir(self.prefix)))
        for i in range(nodes):
            user = self.node_name(i)
            if _exists_user(user):
                found.append(
                    f"user {user} ({'GECOS ' + repr(_gecos(user)) if _gecos(user) else 'no marker'})"
                )
            elif _exists_group(user):
                found.append(f"group {user}")
            for path in (self.home(i), self.netns_etc(i)):
                if os.path.lexists(path):
                    found.append(str(path))
        netns = set(self.existing_netns())
        links = set(self.existing_links())
        found += [f"namespace {self.netns(i)}" for i in range(nodes) if self.netns(i) in netns]
        wanted = [self.bridge, self.internal_bridge, self.external_veth(), self.external_peer()]
        wanted += [n for i in range(nodes) for n in (self.veth(i), self.peer(i))]
        found += [f"link {n}" for n in wanted if n in links]
        if self._route_exists(self.internal_subnet):
            found.append(f"route unreachable {self.internal_subnet}")
        return found

    def leftovers(self, created: Created | None = None) -> dict[str, list[str]]:
        """What this fleet created that still exists; all lists empty after a clean ``down``."""
        created = created if created is not None else self.state.load()
        users = [u for u in created["user"] if _gecos(u) == self.marker]
        owners = set(users) | self._gone_users(created)
        procs = [f"power-daemon:{pid}" for pid in self.power_daemon_pids()]
        procs += [f"{name}:{pid}" for name, pid in self.helper_pids()]
        for user in users:
            procs += [f"{user}:{pid}" for pid in run(["pgrep", "-u", user], check=False).stdout.split()]
        netns = set(self.existing_netns())
        if created["slurm_dir"]:
            daemons = LocalSlurm.daemon_pids([n for n in created["netns"] if n in netns])
            procs += [f"{name}:{pid}" for name, pid in daemons]
        links = set(self.existing_links())
        homes = [h for h in created["home"] if os.path.lexists(h) and Path(h).name in owners]
        paths = homes + [p for p in created["netns_etc"] + created["node_home"] if os.path.lexists(p)]
        paths += mountns.mount_leftovers(created)  # VM mode's namespace files and their directory
        paths += [p for p in created["slurm_dir"] + created["registry_dir"] if os.path.lexists(p)]
        if created["mqueue"] and local_containers.holds_mqueue(self.prefix):
            paths.append(str(local_containers.MQUEUE_LEDGER / "holders" / self.prefix))
        # userdel removes a user's subordinate ids; a line left for one of the fleet's users
        # (gone or not) is the fleet's leftover (a next user of that name would inherit the range)
        paths += local_containers.subid_lines(owners)
        return {
            "netns": [n for n in created["netns"] if n in netns],
            "links": [n for n in created["link"] if n in links],
            "qdiscs": [d for d in created["qdisc"] if d in links and uplink.shaped_rate(d) is not None],
            "routes": [r for r in created["route"] if self._route_exists(r)],
            "users": users,
            "processes": procs,
            "files": ([str(self.state_dir)] if self.state_dir.exists() else []) + paths,
        }

    @staticmethod
    def _route_exists(subnet: str) -> bool:
        return bool(run(["ip", "route", "show", "type", "unreachable", subnet], check=False).stdout.strip())

    # -- life cycle ------------------------------------------------------------------------------
    def up(
        self,
        nodes: int,
        say: Say = print,
        build_image: bool = True,
        bastion: bool = False,
        mixed: bool = False,
        vm: bool = False,
        uplink_rate: str | None = None,
        bucket: bool = False,
        spot_notices: bool = False,
        containers: bool = False,
        slurm: bool = False,
        registry: bool = False,
    ) -> Inventory:
        """Build ``nodes`` nodes. ``bastion``: the nodes sit on an internal bridge this machine
        cannot reach, the head also on the external one, and the workers' inventory entries jump
        through the head (``proxy_jump``: its external address and host key). ``mixed``: each node
        has its own sshd port and interface name. ``vm``: one user and home path on every node, each
        node with its own mount namespace (its home and /tmp; ``launch.fleets.local.mountns``).
        ``uplink_rate`` (``200mbit``): what this machine sends to the nodes is rate-limited, as over a
        laptop's uplink, while the nodes reach each other at full speed (``launch.fleets.local.uplink``).
        ``bucket``: an S3-compatible server of the fleet's own on its bridge, given to the nodes as
        their bucket (``launch.fleets.local.bucket``). ``spot_notices``: a metadata endpoint in every
        node's namespace that ``serve_notice`` makes announce a spot interruption, and the
        watchdog's poller for it (``launch.fleets.local.spot``). ``containers``: rootless podman on
        every node, reading images from this machine's shared store (``launch.fleets.local.containers``),
        where the fleet's own Python is an image (``launch.fleets.local.container_image``).
        ``registry`` (with ``containers``): an image registry of the fleet's own on its bridge,
        holding the test image as ``<address>/fleetrun-test:latest``, which the nodes pull over
        the network (``launch.fleets.local.registry``).
        ``slurm``: a real Slurm cluster
        on the nodes (``launch.fleets.local.slurm``): node 0 its controller and login host, the
        others its compute nodes; implies ``vm`` (a cluster's user is the same on every node).
        All off: the default fleet, as it always was."""
        require_root()
        if not 1 <= nodes <= MAX_NODES:
            raise LocalFleetError(f"--nodes {nodes}: expected 1..{MAX_NODES}")
        if bastion and not 2 <= nodes <= NODES_PER_BLOCK:
            raise LocalFleetError(f"--nodes {nodes}: a bastion fleet has 2..{NODES_PER_BLOCK} nodes")
        if bastion and (bucket or spot_notices):
            raise LocalFleetError("--bucket and --spot are for a fleet without --bastion")
        if slurm and (bastion or mixed):
            raise LocalFleetError("--with-slurm is for a fleet without --bastion or --mixed")
        vm = vm or slurm
        # the bucket's S3 server and the spot notices are imported only for a fleet that has them
        # (``--inventory local`` reads this class for every command, e.g. ``fab exec``)
        from launch.fleets.local import bucket as local_bucket
        from launch.fleets.local import spot

        if bucket and not local_bucket.have_moto():
            raise LocalFleetError(
                "--bucket needs moto's S3 server on this machine: pip install 'fleetrun[local-bucket]'"
            )
        if containers and vm:
            raise LocalFleetError("--containers is for a fleet without --vm")
        if registry and (not containers or bastion or nodes > NODES_PER_BLOCK):
            raise LocalFleetError(
                f"--registry is for a --containers fleet without --bastion, of at most {NODES_PER_BLOCK} nodes"
            )
        shape = Shape(bastion=bastion, mixed=mixed, vm=vm, containers=containers)
        rate = None if uplink_rate is None else uplink.parse_rate(uplink_rate)
        ensure_tools(say)
        python = ensure_image(say) if build_image else image_python()
        self.down(say=_quiet)
        conflicts = self.conflicts(nodes)
        if conflicts:
            raise LocalFleetError(
                f"local fleet {self.prefix}: will not build over things it did not create: "
                f"{', '.join(conflicts)}. Remove them yourself or choose another prefix."
            )
        started = time.monotonic()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.state_dir.chmod(0o700)
        record = self.state.record
        if not Path("/run/netns").exists():
            record("run_netns", "/run/netns")
        for stale in (self.key_path, self.key_path.with_suffix(".pub")):
            stale.unlink(missing_ok=True)
        comment = f"fleetrun-operator@{self.prefix}"
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(self.key_path)])
        operator_pub = self.key_path.with_suffix(".pub").read_text().strip()
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
        record("link", self.bridge)
        run(["ip", "link", "add", self.bridge, "type", "bridge"])
        if bastion:
            # This machine gets no way to the nodes' subnet (as a laptop has none into a lab's
            # internal network): without this route, packets would follow the default route.
            record("route", self.internal_subnet)
            run(["ip", "route", "add", "unreachable", self.internal_subnet])
            run(["ip", "addr", "add", f"{self.external_gateway}/24", "dev", self.bridge])
            record("link", self.internal_bridge)
            run(["ip", "link", "add", self.internal_bridge, "type", "bridge"])
            run(["ip", "link", "set", self.internal_bridge, "up"])
        else:
            run(["ip", "addr", "add", f"{self.gateway}/24", "dev", self.bridge])
            for block in range(1, self.blocks(nodes)):
                run(["ip", "addr", "add", f"{self.block_prefix(block)}.1/24", "dev", self.bridge])
        run(["ip", "link", "set", self.bridge, "up"])
        if rate is not None:
            record("qdisc", self.bridge)
            uplink.shape(self.bridge, rate)
        if vm:
            mountns.make_mount_dir(self, record)
        hosts: list[Host] = [
            make_node(self, i, nodes, operator_pub, str(python), record, shape) for i in range(nodes)
        ]
        if bastion:
            hosts = behind_head(hosts)
        if containers:
            local_containers.check_ready([host.user for host in hosts])
            record("mqueue", self.prefix)
            local_containers.hold_mqueue(self.prefix)
            image = ensure_container_image()
            say(
                f"local fleet {self.prefix}: image {image} in the nodes' shared store {local_containers.IMAGE_STORE}"
            )
            if registry:
                self._start_registry(nodes, say)
        cluster = LocalSlurm(self) if slurm else None
        if cluster is not None:
            cluster.write(nodes, record)  # before the sshd start: they bind the nodes' /etc/slurm
        for i in range(nodes):
            start_sshd(self, i, shape)
        self.wait_for_sshd(dict(enumerate(hosts)), bastion)
        if cluster is not None:
            cluster.start(nodes)
            say(
                f"local fleet {self.prefix}: Slurm cluster {cluster.cluster_name} up: login "
                f"{cluster.login}, partition {PARTITION} of {nodes - 1} node(s)"
            )
        self._start_power_daemon()
        ref = LocalFleetRef(prefix=self.prefix)
        if bucket:
            name, endpoint = local_bucket.start(self, self.gateway)
            ref = ref.model_copy(update={"bucket": name, "s3_endpoint": endpoint})
            say(f"local fleet {self.prefix}: bucket {name} at {endpoint} (lives until local.down)")
        if spot_notices:
            spot.start(self, nodes)
            ref = ref.model_copy(update={"preemption_poller": spot.POLLER})
            say(f"local fleet {self.prefix}: spot notices on (fab local.preempt --node NAME)")
        ref = LocalFleetRef.model_validate(ref.model_dump())  # the endpoint's pattern checked
        inventory = Inventory(hosts=hosts, source=f"local fleet {self.prefix}", fleet=ref)
        self.inventory_path.write_text(yaml.safe_dump(inventory.to_yaml_data(), sort_keys=False))
        if cluster is not None:
            say(f"local fleet {self.prefix}: Slurm inventory {cluster.write_inventory(hosts)}")
        say(
            f"local fleet {self.prefix}: {nodes} node(s) up in {time.monotonic() - started:.1f} s; "
            f"inventory {self.inventory_path}"
        )
        return inventory

    def wait_for_sshd(self, nodes: Mapping[int, Host], bastion: bool, timeout: float = 30.0) -> None:
        """Until each node's sshd listens (``nodes``: index -> its inventory entry, whose private
        address and port are the truth, whatever ``subnet`` this object was made with): a connect
        from here, or (bastion mode, where this machine cannot reach the nodes' addresses) its
        listening socket seen in the namespace."""
        deadline = time.monotonic() + timeout
        pending = set(nodes)
        while pending and time.monotonic() < deadline:
            for i in sorted(pending):
                if self._listening(i, nodes[i], bastion):
                    pending.discard(i)
            if pending:
                time.sleep(0.05)
        if pending:
            names = ", ".join(self.node_name(i) for i in sorted(pending))
            raise LocalFleetError(f"sshd did not come up on {names}; see {self.state_dir}/nodes/*/sshd.log")

    def _listening(self, i: int, host: Host, bastion: bool) -> bool:
        address, port = host.private_address, host.port
        if bastion:
            out = run(["ss", "-N", self.netns(i), "-Hltn", f"sport = :{port}"], check=False).stdout
            return f"{address}:{port}" in out
        try:
            with socket.create_connection((address, port), timeout=0.5):
                return True
        except OSError:
            return False

    def inventory(self) -> Inventory:
        if not self.inventory_path.exists():
            raise LocalFleetError(
                f"local fleet {self.prefix!r} is not up (no {self.inventory_path}); start it with: fab local.up --nodes 3"
            )
        return Inventory.from_own_state(self.inventory_path)

    def _start_registry(self, nodes: int, say: Say) -> None:
        """The fleet's registry on the bridge, the test image pushed into it, and every node's
        podman told it is plain HTTP (before the nodes' sshd start)."""
        from launch.fleets.local import image_push  # HTTP and gzip: only for a fleet that pushes

        self.state.record("registry_dir", str(local_registry.registry_dir(self.prefix)))
        location = local_registry.start(self, self.gateway)
        for i in range(nodes):
            local_registry.drop_in(self.netns_etc(i), location)
        layer = image_push.test_image_layer()
        image = image_push.push(location, local_registry.TEST_REPOSITORY, "latest", [layer])
        say(
            f"local fleet {self.prefix}: registry at {location}, the nodes pull {image} (lives until local.down)"
        )

    def registry_image(self) -> str:
        """The test image's reference in the fleet's registry (``up(registry=True)``)."""
        return local_registry.test_image(self)

    # -- power -----------------------------------------------------------------------------------
    def _start_power_daemon(self) -> None:
        """The root side of the nodes' power-off hook (see ``launch.fleets.local.power``); nothing
        to wait for: it serves requests as they come."""
        daemon.start(
            self.state_dir,
            [sys.executable, "-m", POWER_MODULE, self.prefix, str(self.subnet)],
            POWER_PID_FILE,
            "power.log",
            lambda: True,
            0.0,
            "the power daemon",
            cwd=Path(__file__).resolve().parents[3],
        )

    def power_daemon_pids(self) -> list[int]:
        """This fleet's power daemon, found by its pid file and confirmed by its command line."""
        return daemon.pids(self.state_dir, POWER_PID_FILE, POWER_MODULE, (self.prefix,))

    def helper_pids(self) -> list[tuple[str, int]]:
        """The fleet's S3 server, spot notice daemon and registry, when it has them (pid files,
        command lines)."""
        from launch.fleets.local import bucket as local_bucket
        from launch.fleets.local import spot

        found = [("s3-server", pid) for pid in local_bucket.server_pids(self.state_dir)]
        found += [("registry", pid) for pid in local_registry.server_pids(self)]
        return found + [("spot-daemon", pid) for pid in spot.spot_pids(self.state_dir)]

    def powered_off(self, i: int) -> bool:
        return (self.node_dir(i) / "powered-off").exists()

    def stop_node(self, i: int) -> None:
        """Power a node off: every process of its user and its sshd end. The watchdog's local hook."""
        created = self.state.load()
        user = self.node_name(i)
        if self.is_ours(user, created):
            run(["pkill", "-KILL", "-u", user], check=False)
        if self.netns(i) in created["netns"] and self.netns(i) in self.existing_netns():
            for pid in run(["ip", "netns", "pids", self.netns(i)], check=False).stdout.split():
                with contextlib.suppress(OSError):
                    os.kill(int(pid), signal.SIGKILL)

    # -- down ------------------------------------------------------------------------------------
    def down(self, say: Say = print) -> dict[str, list[str]]:
        """Remove what this fleet created; idempotent; returns what of it is left (empty when clean).

        Anything that only matches the fleet's names is reported and left alone.
        """
        require_root()
        created = self.state.load()
        users = [u for u in created["user"] if self.is_ours(u, created)]
        unmarked = [u for u in created["user"] if _exists_user(u) and u not in users]
        self._kill(created, users)
        local_slurm.remove(created["slurm_dir"])  # its daemons ran in the nodes' namespaces: killed
        mountns.remove_mounts(created)
        if created["mqueue"]:
            local_containers.release_mqueue(self.prefix)
        for folder in created["registry_dir"]:  # its server was killed above
            local_registry.remove_dir(Path(folder))
        for user in users:
            try:
                entry = pwd.getpwnam(user)
            except KeyError:  # a concurrent teardown of the same fleet removed it first
                continue
            gid = entry.pw_gid
            remove_queue_folders(entry.pw_uid)
            if created["mqueue"]:  # a --containers fleet: its users' podman state in /tmp, and
                # the blobs of a pull cut short in podman's big-files folder (/var/tmp/storage*)
                local_containers.remove_tmp_of(entry.pw_uid)
                local_containers.remove_tmp_of(entry.pw_uid, Path("/var/tmp"))
            # a home may hold pulled images (a --registry fleet's: 1.3 GB, 30,000 files per node),
            # whose removal took over a minute on a loaded disk
            # shadow's lock taken by another fleet's useradd/userdel: run() tries again
            run(["userdel", "--force", "--remove", user], check=False, timeout=USERDEL_TIMEOUT_S)
            with contextlib.suppress(KeyError):
                if grp.getgrgid(gid).gr_name == user:
                    run(["groupdel", user], check=False)
        gone = self._gone_users(created)
        for home in created["home"]:
            path = Path(home)
            if path.name in gone and path.is_dir() and not path.is_symlink() and self._orphaned(path):
                shutil.rmtree(path, ignore_errors=True)
        existing_links = set(self.existing_links())
        for device in created["qdisc"]:
            if device in existing_links:
                uplink.unshape(device)  # goes with the bridge anyway; removed first, by name
        for link in created["link"]:
            if link in existing_links and link != self.bridge:
                run(["ip", "link", "del", link], check=False)
        existing_netns = set(self.existing_netns())
        for ns in created["netns"]:
            if ns in existing_netns:
                run(["ip", "netns", "del", ns], check=False)
        for node_home in created["node_home"]:
            path = Path(node_home)
            if path.is_dir() and not path.is_symlink() and self._orphaned(path):
                shutil.rmtree(path, ignore_errors=True)
        for etc in created["netns_etc"]:
            if Path(etc).is_dir() and not Path(etc).is_symlink():
                shutil.rmtree(etc, ignore_errors=True)
        if self.bridge in created["link"] and self.bridge in self.existing_links():
            run(["ip", "link", "del", self.bridge], check=False)
        for subnet in created["route"]:
            if self._route_exists(subnet):
                run(["ip", "route", "del", "unreachable", subnet], check=False)
        run_netns = Path("/run/netns")
        if created["run_netns"] and run_netns.exists() and not any(run_netns.iterdir()):
            run(["umount", str(run_netns)], check=False)
            with contextlib.suppress(OSError):
                run_netns.rmdir()
        left = self.leftovers(created)
        if not any(v for k, v in left.items() if k != "files") and left["files"] in (
            [],
            [str(self.state_dir)],
        ):
            shutil.rmtree(self.state_dir, ignore_errors=True)
            left = self.leftovers(Created())
        remaining = {k: v for k, v in left.items() if v}
        if unmarked:
            say(
                f"local fleet {self.prefix}: recorded users without the fleet's marker left alone: {unmarked}"
            )
        foreign = self.foreign(created)
        if foreign:
            say(f"local fleet {self.prefix}: not created by this fleet, left alone: {foreign}")
        say(
            f"local fleet {self.prefix}: left behind after down: {remaining}"
            if remaining
            else f"local fleet {self.prefix}: down, nothing of it left behind"
        )
        return left

    def _kill(self, created: Created, users: list[str]) -> None:
        """SIGKILL the power daemon, everything in the fleet's namespaces and of its users; wait."""
        killed: list[int] = []
        for helper in self.power_daemon_pids() + [pid for _name, pid in self.helper_pids()]:
            with contextlib.suppress(OSError):
                os.kill(helper, signal.SIGKILL)
                killed.append(helper)
        existing = set(self.existing_netns())
        for ns in created["netns"]:
            if ns not in existing:
                continue
            for text in run(["ip", "netns", "pids", ns], check=False).stdout.split():
                with contextlib.suppress(OSError):
                    os.kill(int(text), signal.SIGKILL)
                    killed.append(int(text))
        for user in users:
            run(["pkill", "-KILL", "-u", user], check=False)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and (
            any(pid_alive(p) for p in killed)
            or any(run(["pgrep", "-u", u], check=False).stdout.strip() for u in users)
        ):
            time.sleep(0.05)
        self._kill_helpers_again()

    def _kill_helpers_again(self) -> None:
        """The fleet's helpers (power daemon, S3 server, spot daemon) looked for again and killed
        until none is found (three rounds at most): one was found alive after the kill above under
        a loaded full test run (its pid file and command line unchanged; not reproduced alone),
        and a helper left running keeps its fleet's state folder. By pid file and command line."""
        for _ in range(3):
            pids = self.power_daemon_pids() + [pid for _name, pid in self.helper_pids()]
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and any(pid_alive(p) for p in pids):
                time.sleep(0.05)

    @staticmethod
    def _orphaned(path: Path) -> bool:
        """A home whose owner no longer exists: what ``userdel`` of the fleet's own user leaves."""
        try:
            pwd.getpwuid(path.lstat().st_uid)
        except KeyError:
            return True
        return False


def remove_queue_folders(uid: int) -> None:
    """A node user's run-hold queue folders (``launch.planning.queue``: ``/tmp/fleetrun-queue-*``
    owned by it). Without a mount namespace the nodes share this machine's /tmp, and a fleet
    torn down before its run could remove its entries would leave them to the next fleet of the
    same node names (whose users may get the same uid back)."""
    with contextlib.suppress(OSError), os.scandir("/tmp") as found:
        for entry in found:
            if not entry.name.startswith("fleetrun-queue-"):
                continue
            with contextlib.suppress(OSError):
                info = entry.stat(follow_symlinks=False)
                if stat.S_ISDIR(info.st_mode) and info.st_uid == uid:
                    shutil.rmtree(entry.path, ignore_errors=True)
