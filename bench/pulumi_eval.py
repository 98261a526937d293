"""How long evaluating the fleet program takes for 8 to 1024 nodes, under Pulumi's mocks.

This is the part of ``pulumi preview`` / ``pulumi up`` spent in fleetrun's own Python program
(settings, components, every resource registration, the outputs), without the engine, the
providers or the cloud: those need the Pulumi CLI and credentials and are not measured here.

Each (cloud, nodes) point runs in a fresh Python process, so its peak memory is its own and
the provider SDK import (a fixed cost, ~1.5 s for AWS and ~2.5 s for GCP) is reported apart
from the evaluation itself.

    .venv/bin/python bench/pulumi_eval.py                    # table + bench/results/pulumi_eval.json
    .venv/bin/python bench/pulumi_eval.py --nodes 8 64 --clouds aws
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "bench" / "results" / "pulumi_eval.json"
CONFIGS: dict[str, dict[str, str]] = {
    # Multi-node GPU clusters with every feature on (EFA, placement, generated keys).
    "aws": {
        "cloud": "aws",
        "region": "us-east-1",
        "machine_type": "p4d.24xlarge",
        "ssh_cidr": "81.2.69.142/32",
    },
    "gcp": {
        "cloud": "gcp",
        "project": "my-gcp-project",
        "zone": "us-central1-a",
        "machine_type": "a2-highgpu-8g",
        "ssh_cidr": "81.2.69.142/32",
    },
}


def measure_one(cloud: str, nodes: int) -> dict[str, Any]:
    """Run in the child process: import, evaluate once, report."""
    sys.path.insert(0, str(REPO))
    started = time.perf_counter()
    import importlib

    from infra.mocks import run_fleet
    from infra.settings import parse_settings

    importlib.import_module(f"infra.clouds.{cloud}")
    imported = time.perf_counter()
    settings = parse_settings({**CONFIGS[cloud], "node_count": str(nodes)}, project="fleetrun", stack="bench")
    snapshot = run_fleet(settings, stack="bench")
    finished = time.perf_counter()
    assert len(snapshot.outputs["nodes"]) == nodes
    return {
        "cloud": cloud,
        "nodes": nodes,
        "resources": len(snapshot.resources),
        "import_s": round(imported - started, 3),
        "eval_s": round(finished - imported, 3),
        "ms_per_node": round((finished - imported) * 1000 / nodes, 2),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


def measure(cloud: str, nodes: int) -> dict[str, Any]:
    result = subprocess.run(
        [sys.executable, __file__, "--child", cloud, str(nodes)],
        capture_output=True,
        text=True,
        check=False,
        cwd=REPO,
        timeout=1800,
    )
    if result.returncode != 0:
        raise SystemExit(f"{cloud} x {nodes} failed:\n{result.stderr[-4000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def table(rows: list[dict[str, Any]]) -> str:
    header = (
        f"{'cloud':<6}{'nodes':>7}{'resources':>11}{'import s':>10}{'eval s':>9}{'ms/node':>9}{'peak MB':>9}"
    )
    lines = [header, "-" * len(header)]
    for r in rows:
        lines.append(
            f"{r['cloud']:<6}{r['nodes']:>7}{r['resources']:>11}{r['import_s']:>10.2f}{r['eval_s']:>9.2f}"
            f"{r['ms_per_node']:>9.1f}{r['peak_rss_mb']:>9.0f}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[8, 64, 256, 1024])
    parser.add_argument("--clouds", nargs="+", default=["aws", "gcp"], choices=sorted(CONFIGS))
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--child", nargs=2, metavar=("CLOUD", "NODES"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure_one(args.child[0], int(args.child[1]))))
        return

    rows = []
    for cloud in args.clouds:
        for nodes in args.nodes:
            rows.append(measure(cloud, nodes))
            print(f"  {cloud} x {nodes}: {rows[-1]['eval_s']:.2f} s", file=sys.stderr)
    print(table(rows))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    report = {
        "what": "fleet program evaluation under pulumi.runtime mocks (no engine, providers or cloud)",
        "command": "python bench/pulumi_eval.py " + " ".join(sys.argv[1:]),
        "machine": {"python": platform.python_version(), "platform": platform.platform(), "cpus": _cpus()},
        "results": rows,
    }
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"written: {args.out.relative_to(REPO) if args.out.is_relative_to(REPO) else args.out}")


def _cpus() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


if __name__ == "__main__":
    main()
