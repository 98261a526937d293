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
Output: ``{"name", "ok", "files", "bytes", "error"}`` per worker, one line each.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

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


def ssh_command(config: dict[str, Any], port: int) -> list[str]:
    """Strict OpenSSH: only the pinned worker keys, only the relay key, no config files."""
    return [
        "ssh",
        "-F",
        "/dev/null",
        "-p",
        str(port),
        "-i",
        config["key"],
        "-o",
        "IdentitiesOnly=yes",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        f"UserKnownHostsFile={config['known_hosts']}",
        "-o",
        "GlobalKnownHostsFile=/dev/null",
        "-o",
        "BatchMode=yes",
        "-o",
        "ConnectTimeout=10",
        "-o",
        "LogLevel=ERROR",
    ]


def copy_to(config: dict[str, Any], target: dict[str, Any]) -> dict[str, Any]:
    home = os.path.expanduser("~")
    ssh = shlex.join(ssh_command(config, int(target.get("port", 22))))
    files = sent = 0
    for transfer in config["transfers"]:
        if transfer.get("lib") and not target.get("ship_lib", True):
            continue
        source = os.path.join(home, transfer["source"]).rstrip("/") + "/"
        dest = f"{target['user']}@{target['address']}:{transfer['dest'].rstrip('/')}/"
        argv = ["rsync", "-a", "--delete", "--mkpath", "--stats", *transfer.get("filters", []), "-e", ssh]
        try:
            proc = subprocess.run(
                [*argv, source, dest],
                capture_output=True,
                text=True,
                timeout=float(config.get("timeout", 1800)),
                check=False,
            )
        except subprocess.TimeoutExpired:
            return {"name": target["name"], "ok": False, "error": f"rsync from the head timed out ({dest})"}
        if proc.returncode != 0:
            tail = " / ".join(proc.stderr.strip().splitlines()[-3:])
            return {
                "name": target["name"],
                "ok": False,
                "error": f"rsync from the head exited {proc.returncode}: {tail}",
            }
        files += _stat(proc.stdout, "Number of regular files transferred")
        sent += _stat(proc.stdout, "Total transferred file size")
    return {"name": target["name"], "ok": True, "files": files, "bytes": sent}


def _report(answer: dict[str, Any]) -> None:
    with _print_lock:
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    with open(argv[0], encoding="utf-8") as fh:
        config = json.load(fh)
    targets = config["targets"]

    def one(target: dict[str, Any]) -> None:
        try:
            answer = copy_to(config, target)
        except Exception as exc:  # noqa: BLE001 - reported per worker, never stops the others
            answer = {"name": target["name"], "ok": False, "error": f"{type(exc).__name__}: {exc}"}
        _report(answer)

    with ThreadPoolExecutor(max_workers=max(1, min(int(config.get("parallel", 16)), len(targets)))) as pool:
        list(pool.map(one, targets))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
