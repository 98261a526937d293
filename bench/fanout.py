"""Fan-out at 16/32/64 local-fleet nodes: connect, one watcher poll round, and a workdir sync.

Usage (root): .venv/bin/python bench/fanout.py [--sizes 16 32 64]
Prints a table and writes bench/results/fanout.json. The local-fleet notes measured an echo
over threaded paramiko at 0.27/0.59/1.18 s and over threaded OpenSSH at 1.2/2.3/4.0 s.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from launch import remote_layout as layout  # noqa: E402
from launch.localfleet import LocalFleet  # noqa: E402
from launch.paths import known_hosts_file  # noqa: E402
from launch.ssh import Fleet  # noqa: E402
from launch.sync import sync_all  # noqa: E402
from launch.watch import AGENT  # noqa: E402

PREFIX, SUBNET = "frs", 8


def measure(size: int) -> dict[str, float]:
    fleet = LocalFleet(prefix=PREFIX, subnet=SUBNET)
    t = time.monotonic()
    inventory = fleet.up(size, say=lambda _m: None, build_image=False)
    up_s = time.monotonic() - t
    known_hosts = inventory.write_known_hosts(known_hosts_file(inventory.fingerprint()))
    try:
        t = time.monotonic()
        sync = sync_all(inventory.hosts, REPO / "examples" / "digits", "bench-fanout", known_hosts)
        sync_s = time.monotonic() - t
        assert not [r for r in sync.values() if isinstance(r, BaseException)], sync
        with Fleet(inventory.hosts, known_hosts, max_parallel=32) as conns:
            t = time.monotonic()
            first = conns.run("true", timeout=60)
            connect_s = time.monotonic() - t
            assert not [r for r in first.values() if isinstance(r, BaseException)], first
            rounds = []
            for _ in range(5):
                t = time.monotonic()
                polls = conns.map(
                    lambda c: c.run(f'{AGENT} poll "$HOME/{layout.rundir("none")}" 0', timeout=30)
                )
                rounds.append(time.monotonic() - t)
                assert not [r for r in polls.values() if isinstance(r, BaseException)], polls
    finally:
        fleet.down(say=lambda _m: None)
    return {
        "nodes": size,
        "fleet_up_s": up_s,
        "sync_s": sync_s,
        "connect_all_s": connect_s,
        "poll_round_s": sorted(rounds)[len(rounds) // 2],
        "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", type=int, nargs="+", default=[16, 32, 64])
    args = parser.parse_args()
    os.environ.setdefault("FLEETRUN_HOME", tempfile.mkdtemp(prefix="fleetrun-bench-"))
    rows = [measure(n) for n in args.sizes]
    print(f"{'nodes':>5} {'fleet up':>9} {'sync':>7} {'connect':>8} {'poll round':>11} {'laptop RSS':>11}")
    for r in rows:
        print(
            f"{r['nodes']:>5} {r['fleet_up_s']:8.1f}s {r['sync_s']:6.1f}s {r['connect_all_s']:7.2f}s "
            f"{r['poll_round_s']:10.2f}s {r['max_rss_mb']:9.0f}MB"
        )
    out = REPO / "bench" / "results" / "fanout.json"
    out.write_text(json.dumps({"rows": rows, "load": os.getloadavg()}, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
