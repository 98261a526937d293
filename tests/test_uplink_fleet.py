"""``local.up --uplink``: the laptop side of the bridge shaped by ``tc tbf``, node-to-node not.

Asserted by the qdisc's own byte counter, not by timing: 8 MB sent from this machine to a node
pass the shaped qdisc, 8 MB from one node to another do not. ``down`` removes the qdisc with the
fleet, and a rate in the wrong form is refused before anything is built.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from launch.errors import LocalFleetError
from launch.fleets.local import LocalFleet
from launch.fleets.local import uplink as shaping
from tests.conftest import fleet_prefix, fleet_subnet, needs_root

PREFIX = fleet_prefix("q")
MB = 8
RECEIVE = "import socket,sys\ns=socket.create_server((sys.argv[1],5998));c,_=s.accept()\nn=0\nwhile d:=c.recv(1<<20): n+=len(d)\nprint(n)"
SEND = "import socket,sys\nc=socket.create_connection((sys.argv[1],5998))\nc.sendall(bytes(int(sys.argv[2])))\nc.close()"


@pytest.mark.parametrize("text", ["200", "200mb", "0mbit", "fast", "999999gbit", "200mbit; rm"])
def test_rate_in_the_wrong_form_is_refused(text: str) -> None:
    with pytest.raises(LocalFleetError, match="uplink"):
        shaping.parse_rate(text)


def test_rates_parse() -> None:
    assert shaping.parse_rate("200mbit") == 200_000_000
    assert shaping.parse_rate("1gbit") == 1_000_000_000
    assert "rate" in shaping.tbf_argv("frbr", 200_000_000)


def _transfer(fleet: LocalFleet, sender: int | None, receiver: int) -> int:
    """Bytes the shaped qdisc sent while ``sender`` (None: this machine) sent MB MiB to ``receiver``."""
    address = fleet.address(receiver)
    ns = ["ip", "netns", "exec"]
    recv = subprocess.Popen(
        [*ns, fleet.netns(receiver), "/usr/bin/python3", "-c", RECEIVE, address],
        stdout=subprocess.PIPE,
        text=True,
    )
    before = shaping.sent_bytes(fleet.bridge)
    send = [sys.executable, "-c", SEND, address, str(MB << 20)]
    if sender is not None:
        send = [*ns, fleet.netns(sender), "/usr/bin/python3", "-c", SEND, address, str(MB << 20)]
    for _ in range(50):  # until the receiver listens
        if subprocess.run(send, capture_output=True, check=False).returncode == 0:
            break
        subprocess.run(["sleep", "0.1"], check=True)
    out, _err = recv.communicate(timeout=120)
    assert int(out) == MB << 20
    return shaping.sent_bytes(fleet.bridge) - before


@needs_root()
def test_uplink_shapes_laptop_to_node_only_and_leaves_nothing() -> None:
    fleet = LocalFleet(prefix=PREFIX, subnet=fleet_subnet(19))
    try:
        with pytest.raises(LocalFleetError, match="uplink"):
            fleet.up(2, build_image=False, uplink_rate="fast", say=lambda _m: None)
        assert fleet.bridge not in fleet.existing_links(), "refused before building anything"
        fleet.up(3, build_image=False, uplink_rate="100mbit", say=lambda _m: None)
        assert shaping.shaped_rate(fleet.bridge) == 100_000_000
        assert fleet.bridge in fleet.state.load()["qdisc"]
        assert _transfer(fleet, None, 1) >= MB << 20  # the laptop's traffic passes the tbf
        assert _transfer(fleet, 0, 1) < (MB << 20) // 100  # the nodes' does not
    finally:
        left = fleet.down(say=lambda _m: None)
    assert not any(left.values()), left
    assert shaping.shaped_rate(fleet.bridge) is None
