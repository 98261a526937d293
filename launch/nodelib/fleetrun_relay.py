#!/usr/bin/env python3
"""fleetrun's sync relay, run on the head node: copy the head's synced code to the workers.

For big fleets the laptop uploads the code once, to the head, and the head fans it out over the
private network (fast, and free of the laptop's uplink) instead of N uploads from the laptop.
Standard library only; the laptop writes CONFIG and reads one JSON line per worker as each ends.

  fleetrun_relay.py CONFIG

CONFIG (JSON): ``key`` and ``known_hosts`` (files the laptop put on the head for this relay only:
an ephemeral key that the workers accept from the head's address alone, and the workers' pinned
host keys), ``parallel``, ``timeout``, ``transfers`` (``source`` under the head's home, ``dest``
under the worker's home, rsync ``filters``, ``lib``: only for workers with ``ship_lib``) and
``targets`` (``name``, ``user``, ``address``, ``port``, ``ship_lib``).
Output: ``{"name", "ok", "files", "bytes", "error"}`` per worker, one line each. Both are
records of ``fleetrun_protocol.py`` (``RelayConfig``, ``RelayResult``): a config that does not parse is
refused whole, with one line on stderr, and the laptop then syncs every worker directly.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

if not __package__:  # on a node, beside the other files in ~/.fleetrun/lib (not as launch.nodelib)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
if TYPE_CHECKING or __package__:  # one module per file: launch.nodelib.X here, X on a node
    from launch.nodelib import fleetrun_protocol as protocol
else:
    import fleetrun_protocol as protocol  # noqa: E402 - beside this file in ~/.fleetrun/lib

_print_lock = threading.Lock()


def _stat(output: str, label: str) -> int:
    for line in output.splitlines():
        if line.startswith(label):
            value = line.split(":", 1)[1].strip().split()[0]
            try:
                return int(value.replace(",", ""))
            except ValueError:
                return 0
    return 0


def ssh_command(config: protocol.RelayConfig, port: int) -> list[str]:
    """Strict OpenSSH: only the pinned worker keys, only the relay key, no config files."""
    return [
        "ssh",
        "-F",
        "/dev/null",
        "-p",
        str(port),
        "-i",
        config.key,
        "-o",
        "IdentitiesOnly=yes",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        f"UserKnownHostsFile={config.known_hosts}",
        "-o",
        "GlobalKnownHostsFile=/dev/null",
        "-o",
        "BatchMode=yes",
        "-o",
        "ConnectTimeout=10",
        "-o",
        "LogLevel=ERROR",
    ]


def rsync_host(address: str) -> str:
    """The host part of an rsync destination: an IPv6 address in brackets. Bare, rsync reads
    ``user@2001:db8::11:path`` as host ``2001`` and path ``db8::11:path``."""
    return f"[{address}]" if ":" in address else address


def copy_to(config: protocol.RelayConfig, target: protocol.RelayTarget) -> protocol.RelayResult:
    home = os.path.expanduser("~")
    ssh = shlex.join(ssh_command(config, target.port))
    files = sent = 0
    for transfer in config.transfers:
        if transfer.lib and not target.ship_lib:
            continue
        source = os.path.join(home, transfer.source).rstrip("/") + "/"
        dest = f"{target.user}@{rsync_host(target.address)}:{transfer.dest.rstrip('/')}/"
        argv = ["rsync", "-a", "--delete", "--mkpath", "--stats", *transfer.filters, "-e", ssh]
        try:
            proc = subprocess.run(
                [*argv, source, dest],
                capture_output=True,
                text=True,
                errors="replace",
                timeout=config.timeout,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return protocol.RelayResult(target.name, False, error=f"rsync from the head timed out ({dest})")
        if proc.returncode != 0:
            tail = " / ".join(proc.stderr.strip().splitlines()[-3:])
            return protocol.RelayResult(
                target.name, False, error=f"rsync from the head exited {proc.returncode}: {tail}"
            )
        files += _stat(proc.stdout, "Number of regular files transferred")
        sent += _stat(proc.stdout, "Total transferred file size")
    return protocol.RelayResult(target.name, True, files=files, sent_bytes=sent)


def _report(answer: protocol.RelayResult) -> None:
    with _print_lock:
        sys.stdout.write(answer.to_json() + "\n")
        sys.stdout.flush()


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        with open(argv[0], "rb") as fh:
            config = protocol.RelayConfig.from_json(fh.read(protocol.MAX_RELAY_CONFIG_BYTES + 1))
    except (OSError, protocol.ProtocolError) as exc:
        print(f"fleetrun_relay.py: {exc}", file=sys.stderr)
        return 2

    def one(target: protocol.RelayTarget) -> None:
        try:
            answer = copy_to(config, target)
        except Exception as exc:  # noqa: BLE001 - reported per worker, never stops the others
            answer = protocol.RelayResult(target.name, False, error=f"{type(exc).__name__}: {exc}")
        _report(answer)

    targets = config.targets
    with ThreadPoolExecutor(max_workers=max(1, min(config.parallel, len(targets)))) as pool:
        list(pool.map(one, targets))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
