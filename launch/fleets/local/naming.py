"""Names and addresses of one local fleet, all derived from its ``prefix`` and ``subnet``.

Pure: nothing here looks at the host. A name that matches does not make a thing the fleet's own
(see ``launch.fleets.local.state``): names say where to look, the state file says what is ours.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from launch.errors import LocalFleetError
from launch.paths import fleetrun_home

PREFIX_RE = re.compile(r"[a-z][a-z0-9]{0,5}")
NODES_PER_BLOCK = 240  # 198.18.<subnet>.10-249, then 198.19.<subnet>.10-249
MAX_NODES = 2 * NODES_PER_BLOCK
HOMES = Path("/home")
NETNS_ETC = Path("/etc/netns")


@dataclass(frozen=True)
class FleetNames:
    prefix: str = "fr"
    subnet: int = 0

    def __post_init__(self) -> None:
        if not PREFIX_RE.fullmatch(self.prefix):
            raise LocalFleetError(f"fleet prefix {self.prefix!r}: expected 1-6 lowercase letters/digits")
        if not 0 <= self.subnet <= 255:
            raise LocalFleetError(f"fleet subnet {self.subnet}: expected 0..255 (198.18.<subnet>.0/24)")

    @property
    def marker(self) -> str:
        """The GECOS field of every user this fleet creates: how ``down`` tells its users from others."""
        return f"fleetrun local fleet {self.prefix}"

    @property
    def bridge(self) -> str:
        return f"{self.prefix}br"

    @property
    def gateway(self) -> str:
        return f"198.18.{self.subnet}.1"

    # -- bastion mode: workers on an internal bridge, the head also on the external one ----------
    @property
    def internal_bridge(self) -> str:
        """Bastion mode: the nodes' cluster bridge; it has no address in the root namespace."""
        return f"{self.prefix}bi"

    @property
    def internal_subnet(self) -> str:
        """Bastion mode: the nodes' subnet, made unreachable from this machine's namespace."""
        return f"{self.block_prefix(0)}.0/24"

    @property
    def external_gateway(self) -> str:
        """Bastion mode: the root namespace's address on the external bridge (``bridge``)."""
        return f"198.19.{self.subnet}.1"

    @property
    def external_address(self) -> str:
        """Bastion mode: the head's second address, the only one this machine can reach."""
        return f"198.19.{self.subnet}.10"

    def external_veth(self) -> str:
        return f"{self.prefix}x0"

    def external_peer(self) -> str:
        return f"{self.prefix}y0"

    @staticmethod
    def ssh_port(i: int, mixed: bool) -> int:
        """Node i's sshd port: 22, or with ``mixed`` one of its own (2200 + i), as on a lab's mix."""
        return 2200 + i if mixed else 22

    @staticmethod
    def interface(i: int, mixed: bool) -> str:
        """Node i's cluster interface: ``eth0``, or with ``mixed`` a name of its own (``lan<i>``)."""
        return f"lan{i}" if mixed else "eth0"

    def node_name(self, i: int) -> str:
        return f"{self.prefix}node{i}"

    @property
    def vm_user(self) -> str:
        """VM mode: the one user every node has (as a cloud image's ``ubuntu``)."""
        return f"{self.prefix}fleet"

    def node_index(self, user: str) -> int | None:
        match = re.fullmatch(rf"{re.escape(self.prefix)}node(\d+)", user)
        return int(match.group(1)) if match else None

    def netns(self, i: int) -> str:
        return f"{self.prefix}-node{i}"

    def veth(self, i: int) -> str:
        return f"{self.prefix}v{i}"

    def peer(self, i: int) -> str:
        return f"{self.prefix}p{i}"

    def home(self, i: int) -> Path:
        return HOMES / self.node_name(i)

    def netns_etc(self, i: int) -> Path:
        return NETNS_ETC / self.netns(i)

    def address(self, i: int) -> str:
        """Node i's address: 198.18.<subnet>.(10+i); past 240 nodes, on in 198.19.<subnet>.0/24."""
        block, offset = divmod(i, NODES_PER_BLOCK)
        return f"{self.block_prefix(block)}.{10 + offset}"

    def block_prefix(self, block: int) -> str:
        return f"198.{18 + block}.{self.subnet}"

    @staticmethod
    def blocks(nodes: int) -> int:
        return (nodes + NODES_PER_BLOCK - 1) // NODES_PER_BLOCK

    # -- patterns: what *could* be this fleet's, by name ------------------------------------------
    @property
    def user_pattern(self) -> re.Pattern[str]:
        return re.compile(rf"{re.escape(self.prefix)}(node\d+|fleet)")

    @property
    def netns_pattern(self) -> re.Pattern[str]:
        return re.compile(rf"{re.escape(self.prefix)}-node\d+")

    @property
    def link_pattern(self) -> re.Pattern[str]:
        p = re.escape(self.prefix)
        return re.compile(
            rf"{p}v\d+|{p}p\d+|{p}x0|{p}y0|{re.escape(self.bridge)}|{re.escape(self.internal_bridge)}"
        )

    # -- the operator's side ---------------------------------------------------------------------
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
