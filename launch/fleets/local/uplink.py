"""A laptop-like uplink for the local fleet: the root namespace's side of the bridge, rate-limited.

On one machine every node is a namespace on one bridge, so nothing is slow and the head's sync
relay (``launch.transport.sync_relay``) only adds work. Its point is the operator's uplink: code
should cross it once, not once per node. To measure that here, ``tc``'s token bucket filter
(``tbf``) goes on the egress of the bridge device in the root namespace. What this machine (the
"laptop") sends to a node leaves through that device and is shaped; node-to-node traffic is
forwarded by the bridge from one veth port to another and never passes the device's own egress,
so the private network between nodes stays fast (``bench/sync_uplink.py`` checks both by
measurement and records the qdisc's byte counter during a node-to-node transfer). Replies toward
the laptop (the nodes' upload) are not shaped. ``netem`` (delay, loss) is not used: the kernels
this runs on may lack it, while ``tbf`` is in every stock kernel.
"""

from __future__ import annotations

import re

from launch.errors import LocalFleetError
from launch.fleets.local.prereqs import run

RATE_RE = re.compile(r"([1-9][0-9]{0,5})(kbit|mbit|gbit)")
UNITS = {"kbit": 1_000, "mbit": 1_000_000, "gbit": 1_000_000_000}
MIN_RATE_BPS = 1_000_000  # below 1 Mbit/s nothing useful (an SSH handshake) fits a test's time
MAX_RATE_BPS = 100_000_000_000
BURST_S = 0.01  # the bucket holds 10 ms of traffic at the rate ...
MIN_BURST_BYTES = 32 * 1024  # ... and never less than a few TSO-sized packets
QUEUE_LATENCY = "100ms"  # packets waiting longer are dropped: a router's buffer, not an unbounded one


def parse_rate(text: str) -> int:
    """``200mbit`` -> 200_000_000 bits/s; anything else is refused with the accepted form."""
    match = RATE_RE.fullmatch(text.strip().lower())
    if not match:
        raise LocalFleetError(f"uplink {text!r}: expected a rate such as 200mbit, 50mbit or 1gbit")
    bps = int(match.group(1)) * UNITS[match.group(2)]
    if not MIN_RATE_BPS <= bps <= MAX_RATE_BPS:
        raise LocalFleetError(f"uplink {text!r}: expected between 1mbit and 100gbit")
    return bps


def tbf_argv(device: str, bps: int) -> list[str]:
    """``tc`` adding (or replacing) the root ``tbf`` on ``device`` at ``bps`` bits/s."""
    burst = max(MIN_BURST_BYTES, int(bps / 8 * BURST_S))
    return [
        "tc", "qdisc", "replace", "dev", device, "root", "tbf",
        "rate", f"{bps}bit", "burst", str(burst), "latency", QUEUE_LATENCY,
    ]  # fmt: skip


def shape(device: str, bps: int) -> None:
    """Rate-limit what this namespace sends through ``device`` (the fleet's bridge)."""
    proc = run(tbf_argv(device, bps), check=False)
    if proc.returncode != 0:
        raise LocalFleetError(f"tc tbf on {device} failed: {proc.stderr.strip() or proc.stdout.strip()}")


def shaped_rate(device: str) -> int | None:
    """The rate of the ``tbf`` at ``device``'s root, in bits/s; None when there is none (or no device)."""
    out = run(["tc", "-j", "qdisc", "show", "dev", device, "root"], check=False).stdout
    match = re.search(r'"kind":"tbf".*?"rate":(\d+)', out)
    return int(match.group(1)) * 8 if match else None  # tc -j reports bytes per second


def unshape(device: str) -> None:
    """Remove the ``tbf`` from ``device`` if there is one; nothing else (idempotent)."""
    if shaped_rate(device) is not None:
        run(["tc", "qdisc", "del", "dev", device, "root"], check=False)


def sent_bytes(device: str) -> int:
    """Bytes the root qdisc of ``device`` has sent (its counter): how a bench tells what it shaped."""
    out = run(["tc", "-s", "-j", "qdisc", "show", "dev", device, "root"], check=False).stdout
    match = re.search(r'"bytes":(\d+)', out)
    return int(match.group(1)) if match else 0
