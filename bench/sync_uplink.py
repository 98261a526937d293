"""Code sync under a laptop-like uplink: direct from the laptop against through the head.

On one machine the head's relay only adds work (every rsync runs on the same CPUs); its point is
the operator's uplink, which direct syncs cross once per node. Here the root namespace's side of
the fleet's bridge is shaped with `tc tbf` (``launch.fleets.local.uplink``, default 200mbit): what
the "laptop" sends to nodes is rate-limited, node-to-node traffic (the relay's) is not. Both are
checked by measurement first (throughput laptop -> node and node -> node, and the qdisc's byte
counter during the node-to-node transfer), then:

  * first sync of a workdir of ``--mb`` MB (default 50: a few incompressible binary files, the
    rest small source files) to 1 and each of ``--sizes`` nodes (subsets of one fleet), direct
    (``sync_all``) and through the head (``relay_sync``), the node library included;
  * a one-file change to the largest size, through the head (the default above
    ``relay_sync_above``) and direct, ``--repeat`` times each, in turn.

Usage (root): .venv/bin/python bench/sync_uplink.py [--uplink 200mbit] [--sizes 4 16 64] [--mb 50]
              [--repeat 3] [--out bench/results/sync_uplink.json]
Fleet prefix/subnet: FLEETRUN_BENCH_UPLINK_PREFIX (default fru), FLEETRUN_BENCH_UPLINK_SUBNET (12).
Goals (printed, never asserted): first sync at the largest size <= 1.5x the 1-node time; a one-file
change to the largest size within 3 s. The qdisc is removed and the fleet torn down in every case.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from scale import BenchError, machine, quiet  # noqa: E402

from launch.fleets.local import LocalFleet  # noqa: E402
from launch.fleets.local import uplink as shaping  # noqa: E402
from launch.job.inventory import Host  # noqa: E402
from launch.paths import known_hosts_file  # noqa: E402
from launch.transport.ssh import Fleet  # noqa: E402
from launch.transport.sync import SyncResult, sync_all  # noqa: E402
from launch.transport.sync_relay import relay_sync, sync_fleet  # noqa: E402

PREFIX = os.environ.get("FLEETRUN_BENCH_UPLINK_PREFIX", "fru")
SUBNET = int(os.environ.get("FLEETRUN_BENCH_UPLINK_SUBNET", "12"))
JOB = "bench-uplink"
GOAL_FIRST_RATIO = 1.5
GOAL_ONE_FILE_S = 3.0
PROBE_PORT = 5999
RECEIVER = (
    "import socket,sys,time\n"
    "s=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n"
    "s.bind((sys.argv[1],int(sys.argv[2])));s.listen(1);print('ready',flush=True)\n"
    "c,_=s.accept();n=0;t=None\n"
    "while True:\n"
    " d=c.recv(1<<20)\n"
    " if not d: break\n"
    " t=t or time.monotonic();n+=len(d)\n"
    "print(n,time.monotonic()-(t or time.monotonic()),flush=True)\n"
)
SENDER = (
    "import socket,sys\n"
    "c=socket.create_connection((sys.argv[1],int(sys.argv[2])));b=bytes(1<<20)\n"
    "for _ in range(int(sys.argv[3])): c.sendall(b)\n"
    "c.close()\n"
)


def make_workdir(root: Path, megabytes: int, seed: int = 1) -> dict[str, int]:
    """``megabytes`` MB: 400 small source-like files (about 0.4 MB) and the rest in 5 MB binary
    files of random (incompressible: ``rsync -z`` cannot shrink them) bytes, as data or weights."""
    rng = random.Random(seed)
    small = 0
    for d in range(4):
        sub = root / f"src{d}"
        sub.mkdir(parents=True)
        for f in range(100):
            (sub / f"mod{f:03d}.py").write_text(f"# module {d}.{f}\n" + "x = 1\n" * rng.randint(100, 200))
            small += 1
    left = megabytes * 1_000_000 - sum(p.stat().st_size for p in root.rglob("*.py"))
    big = 0
    while left > 0:
        chunk = min(5_000_000, left)
        (root / "data").mkdir(exist_ok=True)
        (root / "data" / f"blob{big:02d}.bin").write_bytes(rng.randbytes(chunk))
        left -= chunk
        big += 1
    total = sum(p.stat().st_size for p in root.rglob("*") if p.is_file())
    return {"files": small + big, "bytes": total}


def ns_python(fleet: LocalFleet, i: int, code: str, *args: str) -> list[str]:
    return ["ip", "netns", "exec", fleet.netns(i), "/usr/bin/python3", "-c", code, *args]


def throughput(fleet: LocalFleet, sender: int | None, receiver: int, megabytes: int) -> dict[str, float]:
    """MB/s from node ``sender`` (None: this machine, the laptop) to node ``receiver``, as the
    receiver counts it, and the bytes the bridge's root qdisc sent meanwhile."""
    address = fleet.address(receiver)
    recv = subprocess.Popen(
        ns_python(fleet, receiver, RECEIVER, address, str(PROBE_PORT)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert recv.stdout is not None
        if recv.stdout.readline().strip() != "ready":
            raise BenchError(f"throughput receiver on node {receiver} did not start: {recv.stderr.read()}")
        before = shaping.sent_bytes(fleet.bridge)
        argv = [sys.executable, "-c", SENDER, address, str(PROBE_PORT), str(megabytes)]
        if sender is not None:
            argv = ns_python(fleet, sender, SENDER, address, str(PROBE_PORT), str(megabytes))
        subprocess.run(argv, check=True, timeout=300, capture_output=True)
        out, err = recv.communicate(timeout=60)
        qdisc = shaping.sent_bytes(fleet.bridge) - before
    finally:
        recv.kill()
        recv.wait()
    words = out.split()
    if len(words) != 2 or int(words[0]) != megabytes << 20:
        raise BenchError(f"throughput probe to node {receiver}: got {out!r} {err[-200:]!r}")
    return {"mb_per_s": megabytes * 1.048576 / max(float(words[1]), 1e-6), "qdisc_bytes": qdisc}


def clear(hosts: list[Host]) -> None:
    """The fleet's copies gone (untimed): the next sync is a first one, library included."""
    for host in hosts:
        subprocess.run(["rm", "-rf", f"/home/{host.user}/.fleetrun"], check=True)


def timed_sync(how: str, hosts: list[Host], tree: Path, known_hosts: Path) -> dict[str, Any]:
    with Fleet(hosts, known_hosts, max_parallel=64) as conns:
        conns.run("true", timeout=120)  # `fab train` connects before it syncs: not timed
        current = {h.name for h in hosts if lib_current_on(h)}
        started = time.monotonic()
        if how == "direct":
            results = sync_all(hosts, tree, JOB, known_hosts, lib_current=current)
        elif how == "default":  # what `fab train` does: open connections for a small change, else rsync
            results = sync_fleet(conns, tree, JOB, known_hosts, relay_above=16, lib_current=current)
        else:
            results = relay_sync(conns, tree, JOB, known_hosts, lib_current=current)
        seconds = time.monotonic() - started
    failed = {n: str(r) for n, r in results.items() if isinstance(r, BaseException)}
    if failed:
        raise BenchError(f"{how} sync failed on {len(failed)} node(s): {list(failed.items())[:3]}")
    synced = [r for r in results.values() if isinstance(r, SyncResult)]
    return {
        "seconds": seconds,
        "files_sent": sum(r.files_sent for r in synced),
        "bytes_sent": sum(r.bytes_sent for r in synced),
        "via_head": sum(1 for r in synced if r.via != "laptop"),
    }


def lib_current_on(host: Host) -> bool:
    """What the connect step reads (the node's library version), read here from the node's home."""
    from launch.transport.sync import lib_is_current

    path = Path(f"/home/{host.user}/.fleetrun/lib/VERSION")
    return path.exists() and lib_is_current(path.read_text())


def check_copies(hosts: list[Host], tree: Path) -> None:
    want = sorted(str(p.relative_to(tree)) for p in tree.rglob("*") if p.is_file())
    for host in hosts:
        root = Path(f"/home/{host.user}/.fleetrun/work/{JOB}")
        got = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
        if got != want:
            raise BenchError(f"{host.name}: {len(got)} files in its workdir, expected {len(want)}")


def measure(args: argparse.Namespace, tree: Path, result: dict[str, Any]) -> None:
    fleet = LocalFleet(prefix=PREFIX, subnet=SUBNET)
    largest = max(args.sizes)
    started = time.monotonic()
    try:
        inventory = fleet.up(largest, say=quiet, build_image=False, uplink_rate=args.uplink)
        result["fleet_up_s"] = time.monotonic() - started
        hosts = inventory.hosts
        known_hosts = inventory.write_known_hosts(known_hosts_file(inventory.fingerprint()))
        result["shaped_rate_bps"] = shaping.shaped_rate(fleet.bridge)
        result["check"] = {
            "laptop_to_node": throughput(fleet, None, 1, 20),
            "node_to_node": throughput(fleet, 0, 1, 200),
        }
        print(f"  check: {result['check']}", flush=True)
        first: dict[str, dict[str, Any]] = {}
        for n in sorted({1, *args.sizes}):
            for how in ("direct", "via head") if n > 1 else ("direct",):
                clear(hosts[:n])
                run = timed_sync(how, hosts[:n], tree, known_hosts)
                check_copies(hosts[:n], tree)
                first.setdefault(str(n), {})[how] = run
                print(f"  first sync, {n} node(s), {how}: {run['seconds']:.2f} s", flush=True)
        result["first_sync"] = first
        changed = tree / "src0" / "mod000.py"
        one: dict[str, list[dict[str, Any]]] = {"default": [], "via head": [], "direct": []}
        for rep in range(args.repeat):
            for how in (
                ("default", "via head", "direct") if rep % 2 == 0 else ("direct", "via head", "default")
            ):
                changed.write_text(f"# changed {how} {rep} {time.time()}\n")
                run = timed_sync(how, hosts, tree, known_hosts)
                if run["files_sent"] != len(hosts):
                    raise BenchError(
                        f"one-file change ({how}) sent {run['files_sent']} files to {len(hosts)} nodes"
                    )
                one[how].append(run)
                print(f"  one-file change, {len(hosts)} nodes, {how}: {run['seconds']:.2f} s", flush=True)
        result["one_file_change"] = {
            how: {"median_s": statistics.median(r["seconds"] for r in runs), "runs": runs}
            for how, runs in one.items()
        }
    finally:
        left = fleet.down(say=quiet)
        if shaping.shaped_rate(fleet.bridge) is not None:
            left["qdiscs"] = [fleet.bridge]
    if any(left.values()):
        raise BenchError(f"fleet {PREFIX} left things behind: {left}")


def report(result: dict[str, Any], largest: int) -> None:
    first = result.get("first_sync", {})
    one_node = first.get("1", {}).get("direct", {}).get("seconds")
    print(
        f"\nuplink {result['uplink']}; workdir {result['workdir']}; load {result['machine']['load_average_start']}"
    )
    for n, runs in first.items():
        cells = "  ".join(f"{how} {r['seconds']:6.2f} s" for how, r in runs.items())
        ratio = (
            ""
            if not one_node
            else "  (best / 1 node: " + f"{min(r['seconds'] for r in runs.values()) / one_node:.2f}x)"
        )
        print(f"  first sync {n:>3} node(s): {cells}{ratio}")
    for how, r in result.get("one_file_change", {}).items():
        print(f"  one-file change to {largest}: {how} {r['median_s']:.2f} s (median)")
    goals = []
    big = first.get(str(largest), {})
    if one_node and big:
        best = min(r["seconds"] for r in big.values())
        goals.append(
            (
                f"first sync at {largest} <= {GOAL_FIRST_RATIO}x 1 node",
                best / one_node,
                best / one_node <= GOAL_FIRST_RATIO,
            )
        )
    if "one_file_change" in result:
        best = min(r["median_s"] for r in result["one_file_change"].values())
        goals.append((f"one-file change to {largest} <= {GOAL_ONE_FILE_S} s", best, best <= GOAL_ONE_FILE_S))
    result["goals"] = [{"goal": g, "value": v, "met": m} for g, v, m in goals]
    print("goals (not asserted):")
    for g, v, m in goals:
        print(f"  {g:<40} {v:8.2f}  {'met' if m else 'MISSED'}")
    for e in result["errors"]:
        print(f"ERROR: {e['error']}")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--uplink", default="200mbit", help="the laptop side's rate (tc tbf)")
    parser.add_argument(
        "--sizes", type=int, nargs="+", default=[4, 16, 64], help="fleet sizes (1 is always measured)"
    )
    parser.add_argument("--mb", type=int, default=50, help="workdir size in MB")
    parser.add_argument("--repeat", type=int, default=3, help="one-file changes per way")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "sync_uplink.json")
    args = parser.parse_args()
    shaping.parse_rate(args.uplink)
    own_home = "FLEETRUN_HOME" not in os.environ
    if own_home:
        os.environ["FLEETRUN_HOME"] = tempfile.mkdtemp(prefix="fleetrun-bench-")
    result: dict[str, Any] = {
        "command": "python bench/sync_uplink.py " + shlex.join(sys.argv[1:]),
        "machine": machine(),
        "uplink": args.uplink,
        "errors": [],
    }
    with tempfile.TemporaryDirectory(prefix="uplink-tree-") as tmp:
        tree = Path(tmp) / "workdir"
        result["workdir"] = make_workdir(tree, args.mb)
        os.chmod(tmp, 0o755)
        try:
            measure(args, tree, result)
        except Exception as exc:  # noqa: BLE001 - recorded; the JSON is still written
            result["errors"].append({"error": str(exc), "traceback": traceback.format_exc()})
    if own_home:
        shutil.rmtree(os.environ["FLEETRUN_HOME"], ignore_errors=True)
    result["machine"]["load_average_end"] = os.getloadavg()
    report(result, max(args.sizes))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")
    return 1 if result["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
