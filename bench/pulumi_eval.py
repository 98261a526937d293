"""How long evaluating the fleet program takes for 8 to 1024 nodes, under Pulumi's mocks.

This is the part of ``pulumi preview`` / ``pulumi up`` spent in fleetrun's own Python program
(settings, components, every resource registration, the outputs), without the engine, the
providers or the cloud: those need the Pulumi CLI and credentials and are not measured here.

Each (cloud, nodes) point runs in a fresh Python process, so its peak memory is its own.
``startup_s`` is the fixed cost of every run (importing the program and the provider SDK, whose
submodules load on first use, measured by evaluating a 1-node cluster first); ``eval_s`` is the
evaluation of the N-node cluster after that, the part that grows with N. A cold
``pulumi preview`` pays about ``startup_s + eval_s`` in the program.

    .venv/bin/python bench/pulumi_eval.py                    # table + bench/results/pulumi_eval.json
    .venv/bin/python bench/pulumi_eval.py --nodes 8 64 --clouds aws
"""

from __future__ import annotations

import argparse
import json
import os
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
    """Run in the child process: load the SDK with a 1-node warm-up, then time ``nodes``."""
    sys.path.insert(0, str(REPO))
    started = time.perf_counter()
    from infra.mocks import run_fleet
    from infra.settings import parse_settings

    def settings(count: int) -> Any:
        return parse_settings({**CONFIGS[cloud], "node_count": str(count)}, project="fleetrun", stack="bench")

    # The provider SDKs load their submodules on first use: a fixed cost of every `pulumi preview`,
    # paid here by a 1-node evaluation so that eval_s is the part that grows with the cluster.
    run_fleet(settings(1), stack="warmup")
    warmed = time.perf_counter()
    snapshot = run_fleet(settings(nodes), stack="bench")
    finished = time.perf_counter()
    assert len(snapshot.outputs["nodes"]) == nodes
    return {
        "cloud": cloud,
        "nodes": nodes,
        "resources": len(snapshot.resources),
        "startup_s": round(warmed - started, 3),
        "eval_s": round(finished - warmed, 3),
        "ms_per_node": round((finished - warmed) * 1000 / nodes, 2),
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
        f"{'cloud':<6}{'nodes':>7}{'resources':>11}{'startup s':>11}{'eval s':>9}{'ms/node':>9}{'peak MB':>9}"
    )
    lines = [header, "-" * len(header)]
    for r in rows:
        lines.append(
            f"{r['cloud']:<6}{r['nodes']:>7}{r['resources']:>11}{r['startup_s']:>11.2f}{r['eval_s']:>9.2f}"
            f"{r['ms_per_node']:>9.1f}{r['peak_rss_mb']:>9.0f}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[8, 64, 256, 1024])
    parser.add_argument("--clouds", nargs="+", default=["aws", "gcp"], choices=sorted(CONFIGS))
    parser.add_argument(
        "--repeat", type=int, default=1, help="runs per point; the fastest is kept (others noisy)"
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--child", nargs=2, metavar=("CLOUD", "NODES"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure_one(args.child[0], int(args.child[1]))))
        return

    rows = []
    for cloud in args.clouds:
        for nodes in args.nodes:
            runs = [measure(cloud, nodes) for _ in range(max(1, args.repeat))]
            best = min(runs, key=lambda r: r["eval_s"])
            best["eval_s_all_runs"] = [r["eval_s"] for r in runs]
            rows.append(best)
            print(
                f"  {cloud} x {nodes}: {best['eval_s']:.2f} s (runs: {best['eval_s_all_runs']})",
                file=sys.stderr,
            )
    print(table(rows))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    report = {
        "what": "fleet program evaluation under pulumi.runtime mocks (no engine, providers or cloud); "
        "startup_s = imports + 1-node warm-up, eval_s = the N-node evaluation after it",
        "command": "python bench/pulumi_eval.py " + " ".join(sys.argv[1:]),
        "machine": {
            "python": platform.python_version(),
            "platform": platform.platform(),
            "cpus": _cpus(),
            "load_average_1_5_15": [round(x, 2) for x in os.getloadavg()],
        },
        "results": rows,
    }
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"written: {args.out.relative_to(REPO) if args.out.is_relative_to(REPO) else args.out}")


def _cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


if __name__ == "__main__":
    main()
