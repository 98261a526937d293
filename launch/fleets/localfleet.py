"""The local fleet: real SSH machines on one computer, for the demo and the tests.

Each node is a network namespace with its own address (198.18.<subnet>.10+i, and 198.19.<subnet>.*
past 240 nodes: the benchmarking range, so it never collides with a lab's 10/8, 172.16/12 or
192.168/16), its own UTS hostname,
its own user and home, and a real OpenSSH ``sshd`` with its own host key. The nodes reach each
other over a bridge in the root namespace and have no default route. Faults are real: kill a
node's processes, or take its link down (``ip link set <prefix>v<i> down``).

Everything a fleet creates is named from its prefix, so ``down`` finds it by name, not from a
state file: it works after a crash half-way through ``up`` and leaves nothing behind. ``up`` runs
``down`` first. The shared Python "image" (``/opt/fleetrun/image``) is kept, like a machine image.
Needs root (namespaces, users); see ``require_root``.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml

from fleetrun_images import runtime_file
from launch.errors import LocalFleetError
from launch.job.inventory import Host, Inventory
from launch.paths import fleetrun_home, image_dir

PREFIX_RE = re.compile(r"^[a-z][a-z0-9]{0,5}$")
NODES_PER_BLOCK = 240  # 198.18.<subnet>.10-249, then 198.19.<subnet>.10-249
MAX_NODES = 2 * NODES_PER_BLOCK
REQUIRED_TOOLS = {"sshd": "openssh-server", "ssh": "openssh-client", "rsync": "rsync", "ip": "iproute2"}
SSHD = "/usr/sbin/sshd"
FAULT_CRASH_AFTER = "FLEETRUN_FAULT_LOCALFLEET_CRASH_AFTER"


def require_root() -> None:
    if os.geteuid() != 0:
        raise LocalFleetError(
            "the local fleet needs root: each node is a network namespace with its own address, "
            "user and sshd, and creating namespaces, veth links and users requires root. "
            "Run as root (e.g. in a VM, a container with CAP_NET_ADMIN and CAP_SYS_ADMIN, or CI), "
            "or use an inventory of real machines instead (--inventory hosts.yaml)."
        )


def _run(argv: list[str], check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if check and proc.returncode != 0:
        raise LocalFleetError(f"command failed ({proc.returncode}): {' '.join(argv)}\n{proc.stderr.strip()}")
    return proc


def _pid_alive(pid: int) -> bool:
    """Exists and is not a zombie (a zombie holds no resources; only its parent can reap it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] not in ("Z", "X")


def ensure_tools(say: Callable[[str], None] = print) -> None:
    """Install what the fleet needs (openssh-server, rsync, iproute2) when it is missing."""
    missing = sorted(
        {
            pkg
            for tool, pkg in REQUIRED_TOOLS.items()
            if shutil.which(tool) is None and not (tool == "sshd" and Path(SSHD).exists())
        }
    )
    if not missing:
        return
    if shutil.which("apt-get") is None:
        raise LocalFleetError(f"missing packages {', '.join(missing)} and no apt-get to install them")
    say(f"installing {', '.join(missing)} (apt-get)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for argv in (
        ["apt-get", "update", "-qq"],
        ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing],
    ):
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, check=False, timeout=900)
        if proc.returncode != 0:
            raise LocalFleetError(f"{' '.join(argv)} failed:\n{proc.stderr.strip()[-2000:]}")


def image_python() -> Path:
    return image_dir() / "venv" / "bin" / "python"


def ensure_image(say: Callable[[str], None] = print) -> Path:
    """Build the shared Python the nodes start from (torch CPU + numpy), once.

    Made from Debian's ``/usr/bin/python3`` outside ``/root``: a venv of the pyenv Python under
    /root is unusable by node users (/root is mode 700).
    """
    python = image_python()
    if python.exists():
        probe = _run([str(python), "-c", "import torch, numpy"], check=False, timeout=120)
        if probe.returncode == 0:
            return python
    base = shutil.which("python3", path="/usr/bin:/usr/local/bin") or "/usr/bin/python3"
    requirements = runtime_file("local/requirements.txt")
    say(f"building the local fleet image at {image_dir()} (torch CPU, numpy; about a minute, once)")
    image_dir().mkdir(parents=True, exist_ok=True)
    _run([base, "-m", "venv", str(image_dir() / "venv")], timeout=300)
    proc = subprocess.run(
        [str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q", "-r", str(requirements)],
        text=True,
        check=False,
        timeout=1800,
    )
    if proc.returncode != 0:
        raise LocalFleetError(f"installing the local fleet image from {requirements} failed")
    for path in [image_dir(), *image_dir().parents]:
        if path == Path("/"):
            break
        path.chmod(path.stat().st_mode | 0o755)
    return python


@dataclass(frozen=True)
class LocalFleet:
    """Names and addresses of one local fleet, all derived from ``prefix`` and ``subnet``."""

    prefix: str = "fr"
    subnet: int = 0

    def __post_init__(self) -> None:
        if not PREFIX_RE.match(self.prefix):
            raise LocalFleetError(f"fleet prefix {self.prefix!r}: expected 1-6 lowercase letters/digits")
        if not 0 <= self.subnet <= 255:
            raise LocalFleetError(f"fleet subnet {self.subnet}: expected 0..255 (198.18.<subnet>.0/24)")

    # -- names ---------------------------------------------------------------------------------
    @property
    def bridge(self) -> str:
        return f"{self.prefix}br"

    @property
    def gateway(self) -> str:
        return f"198.18.{self.subnet}.1"

    def node_name(self, i: int) -> str:
        return f"{self.prefix}node{i}"

    def netns(self, i: int) -> str:
        return f"{self.prefix}-node{i}"

    def veth(self, i: int) -> str:
        return f"{self.prefix}v{i}"

    def peer(self, i: int) -> str:
        return f"{self.prefix}p{i}"

    def address(self, i: int) -> str:
        """Node i's address: 198.18.<subnet>.(10+i); past 240 nodes, on in 198.19.<subnet>.0/24."""
        block, offset = divmod(i, NODES_PER_BLOCK)
        return f"{self.block_prefix(block)}.{10 + offset}"

    def block_prefix(self, block: int) -> str:
        return f"198.{18 + block}.{self.subnet}"

    @staticmethod
    def blocks(nodes: int) -> int:
        return (nodes + NODES_PER_BLOCK - 1) // NODES_PER_BLOCK

    @property
    def state_dir(self) -> Path:
        return fleetrun_home() / "localfleet" / self.prefix

    @property
    def inventory_path(self) -> Path:
        return self.state_dir / "inventory.yaml"

    @property
    def key_path(self) -> Path:
        return self.state_dir / "id_ed25519"

    def node_dir(self, i: int) -> Path:
        return self.state_dir / "nodes" / self.node_name(i)

    # -- discovery (what exists now, found by name) ----------------------------------------------
    def existing_netns(self) -> list[str]:
        out = _run(["ip", "netns", "list"], check=False).stdout
        pattern = re.compile(rf"^{re.escape(self.prefix)}-node\d+$")
        return [
            line.split()[0] for line in out.splitlines() if line.split() and pattern.match(line.split()[0])
        ]

    def existing_users(self) -> list[str]:
        pattern = re.compile(rf"^{re.escape(self.prefix)}node\d+$")
        users = []
        with open("/etc/passwd", encoding="utf-8") as fh:
            for line in fh:
                name = line.split(":", 1)[0]
                if pattern.match(name):
                    users.append(name)
        return users

    def existing_links(self) -> list[str]:
        out = _run(["ip", "-o", "link", "show"], check=False).stdout
        pattern = re.compile(
            rf"^({re.escape(self.prefix)}v\d+|{re.escape(self.prefix)}p\d+|{re.escape(self.bridge)})$"
        )
        names = []
        for line in out.splitlines():
            parts = line.split(":")
            if len(parts) > 1:
                name = parts[1].strip().split("@")[0]
                if pattern.match(name):
                    names.append(name)
        return names

    def leftovers(self) -> dict[str, list[str]]:
        """Everything of this fleet that still exists; empty lists after a clean ``down``."""
        procs = [f"power-daemon:{pid}" for pid in self.power_daemon_pids()]
        for user in self.existing_users():
            out = _run(["pgrep", "-u", user], check=False).stdout.split()
            procs += [f"{user}:{pid}" for pid in out]
        netns_dirs = (
            [str(p) for p in Path("/etc/netns").glob(f"{self.prefix}-node*")]
            if Path("/etc/netns").exists()
            else []
        )
        homes = [str(p) for p in Path("/home").glob(f"{self.prefix}node*")]
        files = ([str(self.state_dir)] if self.state_dir.exists() else []) + netns_dirs + homes
        return {
            "netns": self.existing_netns(),
            "links": self.existing_links(),
            "users": self.existing_users(),
            "processes": procs,
            "files": files,
        }

    # -- lifecycle -------------------------------------------------------------------------------
    def up(self, nodes: int, say: Callable[[str], None] = print, build_image: bool = True) -> Inventory:
        require_root()
        if not 1 <= nodes <= MAX_NODES:
            raise LocalFleetError(f"--nodes {nodes}: expected 1..{MAX_NODES}")
        ensure_tools(say)
        python = ensure_image(say) if build_image else image_python()
        self.down(say=lambda _msg: None)
        started = time.monotonic()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.state_dir.chmod(0o700)
        if not Path("/run/netns").exists():
            (self.state_dir / "created-run-netns").touch()
        _run(
            [
                "ssh-keygen",
                "-q",
                "-t",
                "ed25519",
                "-N",
                "",
                "-C",
                f"fleetrun-operator@{self.prefix}",
                "-f",
                str(self.key_path),
            ]
        )
        operator_pub = (self.key_path.with_suffix(".pub")).read_text().strip()
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
        _run(["ip", "link", "add", self.bridge, "type", "bridge"])
        _run(["ip", "addr", "add", f"{self.gateway}/24", "dev", self.bridge])
        for block in range(1, self.blocks(nodes)):
            _run(["ip", "addr", "add", f"{self.block_prefix(block)}.1/24", "dev", self.bridge])
        _run(["ip", "link", "set", self.bridge, "up"])
        crash_after = os.environ.get(FAULT_CRASH_AFTER)
        hosts: list[Host] = []
        for i in range(nodes):
            hosts.append(self._make_node(i, nodes, operator_pub, str(python)))
            if crash_after is not None and i + 1 >= int(crash_after):
                os.kill(os.getpid(), signal.SIGKILL)  # fault injection: a hard crash half-way through up
        for i in range(nodes):
            self._start_sshd(i)
        self._wait_for_sshd(nodes)
        self._start_power_daemon()
        inventory = Inventory(
            hosts=hosts, source=f"local fleet {self.prefix}", cluster_id=self.prefix, teardown="local-fleet"
        )
        self.inventory_path.write_text(yaml.safe_dump(inventory.to_yaml_data(), sort_keys=False))
        say(
            f"local fleet {self.prefix}: {nodes} node(s) up in {time.monotonic() - started:.1f} s; inventory {self.inventory_path}"
        )
        return inventory

    def _make_node(self, i: int, total: int, operator_pub: str, python: str) -> Host:
        ns, veth, peer, name, addr = (
            self.netns(i),
            self.veth(i),
            self.peer(i),
            self.node_name(i),
            self.address(i),
        )
        _run(["ip", "netns", "add", ns])
        _run(["ip", "link", "add", veth, "type", "veth", "peer", "name", peer])
        _run(["ip", "link", "set", peer, "netns", ns])
        _run(["ip", "-n", ns, "link", "set", peer, "name", "eth0"])
        _run(["ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0"])
        _run(["ip", "-n", ns, "link", "set", "eth0", "up"])
        _run(["ip", "-n", ns, "link", "set", "lo", "up"])
        own_block = i // NODES_PER_BLOCK
        for block in range(self.blocks(total)):
            if block != own_block:  # one L2 bridge: the other blocks are on-link too
                _run(["ip", "-n", ns, "route", "add", f"{self.block_prefix(block)}.0/24", "dev", "eth0"])
        _run(["ip", "link", "set", veth, "master", self.bridge])
        _run(["ip", "link", "set", veth, "up"])
        # Per-namespace /etc overlays: every node resolves every node; DNS fails fast (no route out).
        etc = Path("/etc/netns") / ns
        etc.mkdir(parents=True, exist_ok=True)
        hosts_lines = ["127.0.0.1 localhost"] + [
            f"{self.address(j)} {self.node_name(j)}" for j in range(total)
        ]
        (etc / "hosts").write_text("\n".join(hosts_lines) + "\n")
        (etc / "resolv.conf").write_text("nameserver 127.0.0.1\noptions timeout:1 attempts:1\n")
        # The node's user: own home, no password (the '*' keeps the account usable with UsePAM no).
        home = Path("/home") / name
        _run(
            [
                "useradd",
                "--create-home",
                "--home-dir",
                str(home),
                "--shell",
                "/bin/bash",
                "--user-group",
                name,
            ]
        )
        _run(["usermod", "-p", "*", name])
        ssh_dir = home / ".ssh"
        ssh_dir.mkdir(mode=0o700, exist_ok=True)
        (ssh_dir / "authorized_keys").write_text(operator_pub + "\n")
        (ssh_dir / "authorized_keys").chmod(0o600)
        shutil.chown(ssh_dir, name, name)
        shutil.chown(ssh_dir / "authorized_keys", name, name)
        # The node's sshd: own host key, listens only on the node's address, only this user.
        node_dir = self.node_dir(i)
        node_dir.mkdir(parents=True, exist_ok=True)
        host_key = node_dir / "ssh_host_ed25519_key"
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", str(host_key)])
        (node_dir / "sshd_config").write_text(
            "\n".join(
                [
                    f"ListenAddress {addr}:22",
                    f"HostKey {host_key}",
                    f"PidFile {node_dir / 'sshd.pid'}",
                    f"AllowUsers {name}",
                    "UsePAM no",
                    "PermitRootLogin no",
                    "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no",
                    "PubkeyAuthentication yes",
                    "AuthorizedKeysFile .ssh/authorized_keys",
                    "StrictModes yes",
                    "UseDNS no",
                    "X11Forwarding no",
                    "PrintMotd no",
                    "MaxStartups 200:30:400",
                    "MaxSessions 200",
                    "Subsystem sftp internal-sftp",
                    "",
                ]
            )
        )
        return Host(
            name=name,
            address=addr,
            private_address=addr,
            user=name,
            port=22,
            key=self.key_path,
            host_key=host_key.with_suffix(".pub").read_text().strip(),
            gpus=0,
            interface="eth0",
            python=python,
        )

    def _start_sshd(self, i: int) -> None:
        node_dir = self.node_dir(i)
        script = f"hostname {self.node_name(i)} && exec {SSHD} -f {node_dir / 'sshd_config'} -E {node_dir / 'sshd.log'}"
        _run(["ip", "netns", "exec", self.netns(i), "unshare", "--uts", "sh", "-c", script])

    def _start_power_daemon(self) -> None:
        """The root side of the nodes' power-off hook (see ``launch.fleets.localfleet_power``)."""
        log = open(self.state_dir / "power.log", "ab")  # noqa: SIM115 - handed to the daemon
        proc = subprocess.Popen(
            [sys.executable, "-m", "launch.fleets.localfleet_power", self.prefix, str(self.subnet)],
            cwd=Path(__file__).resolve().parents[2],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        (self.state_dir / "power.pid").write_text(str(proc.pid))

    def power_daemon_pids(self) -> list[int]:
        out = _run(["pgrep", "-f", f"launch.fleets.localfleet_power {self.prefix} "], check=False).stdout
        return [int(p) for p in out.split()]

    def powered_off(self, i: int) -> bool:
        return (self.node_dir(i) / "powered-off").exists()

    def _wait_for_sshd(self, nodes: int, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        pending = set(range(nodes))
        while pending and time.monotonic() < deadline:
            for i in sorted(pending):
                try:
                    with socket.create_connection((self.address(i), 22), timeout=0.5):
                        pending.discard(i)
                except OSError:
                    pass
            if pending:
                time.sleep(0.05)
        if pending:
            names = ", ".join(self.node_name(i) for i in sorted(pending))
            raise LocalFleetError(f"sshd did not come up on {names}; see {self.state_dir}/nodes/*/sshd.log")

    def inventory(self) -> Inventory:
        if not self.inventory_path.exists():
            raise LocalFleetError(
                f"local fleet {self.prefix!r} is not up (no {self.inventory_path}); start it with: fab local.up --nodes 3"
            )
        return Inventory.from_static_yaml(self.inventory_path)

    def stop_node(self, i: int) -> None:
        """Power a node off: every process of its user and its sshd end. The watchdog's local hook."""
        user = self.node_name(i)
        _run(["pkill", "-KILL", "-u", user], check=False)
        if self.netns(i) in self.existing_netns():
            for pid in _run(["ip", "netns", "pids", self.netns(i)], check=False).stdout.split():
                with contextlib.suppress(OSError):
                    os.kill(int(pid), signal.SIGKILL)

    def down(self, say: Callable[[str], None] = print) -> dict[str, list[str]]:
        """Remove everything of this fleet; idempotent; returns what was left (empty when clean)."""
        require_root()
        killed: list[int] = []
        for daemon in self.power_daemon_pids():
            with contextlib.suppress(OSError):
                os.kill(daemon, signal.SIGKILL)
                killed.append(daemon)
        for ns in self.existing_netns():
            for text in _run(["ip", "netns", "pids", ns], check=False).stdout.split():
                with contextlib.suppress(OSError):
                    os.kill(int(text), signal.SIGKILL)
                    killed.append(int(text))
        users = self.existing_users()
        for user in users:
            _run(["pkill", "-KILL", "-u", user], check=False)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and (
            any(_pid_alive(p) for p in killed)
            or any(_run(["pgrep", "-u", u], check=False).stdout.strip() for u in users)
        ):
            time.sleep(0.05)
        for user in users:
            _run(["userdel", "--force", "--remove", user], check=False)
            _run(["groupdel", user], check=False)
            shutil.rmtree(Path("/home") / user, ignore_errors=True)
        for link in self.existing_links():
            if link != self.bridge:
                _run(["ip", "link", "del", link], check=False)
        for ns in self.existing_netns():
            _run(["ip", "netns", "del", ns], check=False)
        if Path("/etc/netns").exists():
            for path in Path("/etc/netns").glob(f"{self.prefix}-node*"):
                shutil.rmtree(path, ignore_errors=True)
        if self.bridge in self.existing_links():
            _run(["ip", "link", "del", self.bridge], check=False)
        created_run_netns = (self.state_dir / "created-run-netns").exists()
        shutil.rmtree(self.state_dir, ignore_errors=True)
        if created_run_netns and Path("/run/netns").exists() and not any(Path("/run/netns").iterdir()):
            _run(["umount", "/run/netns"], check=False)
            with contextlib.suppress(OSError):
                Path("/run/netns").rmdir()
        left = self.leftovers()
        remaining = {k: v for k, v in left.items() if v}
        if remaining:
            say(f"local fleet {self.prefix}: left behind after down: {remaining}")
        else:
            say(f"local fleet {self.prefix}: down, nothing left behind")
        return left
