"""Image pull time (issue 34): fleetrun's pull stage bringing a 1 GB image from a registry on the
fleet's network to 16 nodes vs. to one node.

One ``--containers --registry`` local fleet of ``--nodes`` nodes (``LocalFleet.up(containers=True,
registry=True)``: Debian's docker-registry on the fleet's bridge, each node user's rootless
podman pulling into its own storage). The image is the fleet's test image: Python, torch and the
fleet's venv, 1.3 GB as ``podman images`` sizes it (about 30,000 files), 364 MiB of gzip on the
wire; ``--filler-mb N`` adds a layer of N MiB of incompressible random bytes (a bigger image on
the wire, cheap to unpack). It is pushed to the fleet's registry once.

Each trial runs ``fab train`` of a job whose ``container.image`` is that image, on 1 node and on
``--nodes`` nodes (and, with ``--bounded K``, on ``--nodes`` nodes with ``FLEETRUN_FANOUT=K``: at
most K nodes pulling at once), and takes the pull stage's own time from the run's
``summary.json`` (``timings.pull``: from the first node's pull to the last one's answer). Before
each run every node's storage is emptied of the image (``podman rmi``: each pull starts from
nothing). The load average and the free disk are recorded with each run.

Usage (root): .venv/bin/python bench/container_pull.py [--trials 3] [--nodes 16] [--filler-mb 0] [--bounded 4]
Prints the medians so far and writes bench/results/container_pull.json after each run. Needs
about 21 GB of free disk (16 copies of the image) and time: on 2 cores under other load, one
trial of 1, 16 and 16-4-at-once took about 40 min, emptying 16 nodes between runs about 10, and
the fleet's ``down`` (16 homes holding the image) several more; give it no ``timeout`` shorter
than that, or its fleet is left up (``fab local.down --prefix frp<tag>``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from launch.fleets.local import LocalFleet, image_push  # noqa: E402
from launch.fleets.local import registry as local_registry  # noqa: E402
from tests.containerkit import node_podman  # noqa: E402

TAG = os.environ.get("FLEETRUN_TEST_TAG", "")
PREFIX = f"frp{TAG}"[:6]
SUBNET = 6 + int(os.environ.get("FLEETRUN_TEST_SUBNET_BASE", "0"))
REPOSITORY = "fleetrun-pull-bench"
DEADLINE_S = 3600.0
MIB = 1 << 20


def free_gb(path: str = "/home") -> float:
    return round(shutil.disk_usage(path).free / 1e9, 1)


def write_job(tmp: Path, nodes: int, image: str) -> Path:
    workdir = tmp / "job"
    workdir.mkdir(exist_ok=True)
    (workdir / "hello.py").write_text("print('pulled')\n")
    job = {
        "name": f"bench-pull-{nodes}",
        "workdir": str(workdir),
        "nodes": nodes,
        "procs_per_node": 1,
        "entrypoint": "python hello.py",
        "teardown": "never",
        "container": {"image": image, "runtime": "podman"},
    }
    playbook = tmp / f"pull-{nodes}.json"
    playbook.write_text(json.dumps(job))
    return playbook


def empty_nodes(fleet: LocalFleet, nodes: int, image: str) -> None:
    """Every node's storage without the image (its layers go with it)."""
    for i in range(nodes):
        done = node_podman(fleet, i, "rmi", "--force", "--ignore", image, timeout=600)
        if done.returncode != 0:
            raise RuntimeError(f"node {i}: podman rmi: {done.stderr[-1000:]}")


def size_on_node(fleet: LocalFleet, image: str) -> float:
    """The image's size as ``podman images`` gives it on node 0 (unpacked), GB."""
    done = node_podman(fleet, 0, "image", "inspect", "--format", "{{.Size}}", image)
    return round(int(done.stdout.strip()) / 1e9, 2) if done.returncode == 0 else -1.0


def pull_time(fleet: LocalFleet, playbook: Path, fanout: int | None) -> float:
    """``fab train`` to its end; the pull stage's time from its run's summary."""
    env = dict(os.environ)
    if fanout is not None:
        env["FLEETRUN_FANOUT"] = str(fanout)
    runs = Path(env["FLEETRUN_HOME"]) / "runs"
    before = set(runs.iterdir()) if runs.exists() else set()
    proc = subprocess.run(
        [str(REPO / ".venv" / "bin" / "fab"), "train", str(playbook), "--inventory", f"local:{fleet.prefix}"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
    )
    (folder,) = set(runs.iterdir()) - before
    summary = json.loads((folder / "summary.json").read_text())
    if proc.returncode != 0 or summary.get("outcome") != "succeeded":
        raise RuntimeError(f"fab train exited {proc.returncode}: {(proc.stdout + proc.stderr)[-3000:]}")
    return float(summary["timings"]["pull"])


def registry_cpu(fleet: LocalFleet) -> float:
    """CPU seconds the fleet's registry process has used (user + system)."""
    (pid,) = local_registry.server_pids(fleet)
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_cpu() -> tuple[int, int]:
    """(busy, total) jiffies of this machine's CPUs so far."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = values[3] + values[4]  # idle, iowait
    return sum(values) - idle, sum(values)


def busy_since(start: tuple[int, int]) -> float:
    """The share of the machine's CPU time busy since ``start`` (0..1; iowait counts as idle)."""
    busy, total = machine_cpu()
    return round((busy - start[0]) / max(1, total - start[1]), 2)


def report(
    args: argparse.Namespace,
    kinds: list[tuple[str, int, int | None]],
    rows: list[dict[str, Any]],
    image_info: dict[str, Any],
) -> None:
    """The medians so far, printed and written (after each run: a bench cut short keeps its rows)."""
    medians = {
        kind: statistics.median(r["pull_s"] for r in rows if r["kind"] == kind)
        for kind, _n, _f in kinds
        if any(r["kind"] == kind for r in rows)
    }
    print(
        f"\npull of {image_info['compressed_mb']} MiB (compressed) from the fleet's registry, medians so far"
    )
    print(f"{'':>24} {'pull':>8} {'vs 1 node':>10}")
    one = medians.get("1 node")
    for kind, value in medians.items():
        ratio = f"{value / one:>9.1f}x" if one else ""
        print(f"{kind:>24} {value:>6.1f} s {ratio}")
    result = {
        "command": "python bench/container_pull.py " + " ".join(sys.argv[1:]),
        **image_info,
        "registry": "docker-registry (Debian) on the fleet's bridge, plain HTTP",
        "runtime": "podman (rootless, per node user, own storage)",
        "trials": args.trials,
        "median_pull_s": medians,
        "rows": rows,
        "cpu_count": os.cpu_count(),
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--filler-mb", type=int, default=0, help="a layer of this many MiB of random bytes")
    parser.add_argument(
        "--bounded", type=int, default=0, help="also --nodes nodes with at most this many pulling at once"
    )
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "container_pull.json")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("the local fleet needs root", file=sys.stderr)
        return 2
    own_home = "FLEETRUN_HOME" not in os.environ
    if own_home:
        os.environ["FLEETRUN_HOME"] = tempfile.mkdtemp(prefix="fleetrun-bench-pull-")
    fleet = LocalFleet(prefix=PREFIX, subnet=SUBNET)
    kinds: list[tuple[str, int, int | None]] = [
        ("1 node", 1, None),
        (f"{args.nodes} nodes", args.nodes, None),
    ]
    if args.bounded:
        kinds.append((f"{args.nodes} nodes, {args.bounded} at once", args.nodes, args.bounded))
    rows: list[dict[str, Any]] = []
    image_info: dict[str, Any] = {}
    try:
        fleet.up(args.nodes, containers=True, registry=True, say=lambda _m: None)
        location = local_registry.location_of(fleet)
        assert location is not None
        with tempfile.TemporaryDirectory(dir="/var/tmp") as name:
            tmp = Path(name)
            layers = [image_push.test_image_layer()]
            if args.filler_mb:
                layers.append(image_push.random_layer(args.filler_mb, tmp))
            image = image_push.push(location, REPOSITORY, "1", layers)
            image_info = {
                "image": image,
                "compressed_mb": round(sum(x.size for x in layers) / MIB),
                "layers_mb": [round(x.size / MIB) for x in layers],
            }
            print(json.dumps(image_info), flush=True)
            books = {n: write_job(tmp, n, image) for _kind, n, _f in kinds}
            for trial in range(args.trials):
                for kind, nodes, fanout in kinds:
                    empty_nodes(fleet, args.nodes, image)
                    row: dict[str, Any] = {
                        "trial": trial + 1,
                        "kind": kind,
                        "nodes": nodes,
                        "at_once": fanout or nodes,
                        "load_before": os.getloadavg(),
                        "free_gb_before": free_gb(),
                    }
                    cpu, served = machine_cpu(), registry_cpu(fleet)
                    row["pull_s"] = round(pull_time(fleet, books[nodes], fanout), 1)
                    row["registry_cpu_s"] = round(registry_cpu(fleet) - served, 1)
                    row["machine_busy"] = busy_since(cpu)
                    row["load_after"] = os.getloadavg()
                    row["free_gb_after"] = free_gb()
                    rows.append(row)
                    print(json.dumps(row), flush=True)
                    if "size_on_node_gb" not in image_info:
                        image_info["size_on_node_gb"] = size_on_node(fleet, image)
                    report(args, kinds, rows, image_info)
    finally:
        left = fleet.down(say=lambda _m: None)
        if own_home:
            shutil.rmtree(os.environ["FLEETRUN_HOME"], ignore_errors=True)
        if any(left.values()):
            print(f"the bench's fleet left things behind: {left}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
