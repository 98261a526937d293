"""Where `fab exec true` spends its time on a small local fleet, next to pdsh: the profile behind
the `fab exec` figures of bench/scale.py.

Usage (root): .venv/bin/python bench/exec_profile.py [--nodes 4] [--repeat 7]
Prints a table and writes bench/results/exec_profile.json:
  * whole processes, medians: `fab exec true`, `fleetrun exec true` (the console script, no
    Fabric command line), `pdsh -f N true` with fleetrun's strict OpenSSH options, the same pdsh with
    the key exchange `fab exec` prefers (curve25519 first: OpenSSH's default hybrid costs ~90 ms
    of CPU per connection on each side), `python -c pass`. On a local fleet `fab exec` takes its
    OpenSSH path (`launch.cli.fast_exec`: no Invoke, Fabric, paramiko or pydantic);
  * the paramiko path (what `fab exec` runs for a lab or stack inventory or a jump host) split in
    phases inside one process (medians over subprocesses): Fabric's own imports, fleetrun's CLI
    module, the inventory code (pydantic and the models), loading the inventory, connecting and
    authenticating to every node in parallel, running `true`;
  * `python -X importtime` of `fab exec`, self time grouped by top-level package.
The checkout is byte-compiled first (as pip does on install). Environment: FLEETRUN_BENCH_PREFIX /
FLEETRUN_BENCH_SUBNET (the fleet's name and subnet; default fre<FLEETRUN_TEST_TAG> and
12 + FLEETRUN_TEST_SUBNET_BASE, so that a checkout with its own test tag does not collide with CI's).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from scale import compile_checkout, fab_binary, fleetrun_binary, pdsh_env, pdsh_run, timed  # noqa: E402

from launch.fleets.local import LocalFleet  # noqa: E402
from launch.paths import known_hosts_file  # noqa: E402
from launch.transport.openssh_exec import FAST_KEX  # noqa: E402

PREFIX = os.environ.get("FLEETRUN_BENCH_PREFIX") or f"fre{os.environ.get('FLEETRUN_TEST_TAG', '')}"[:6]
SUBNET = int(
    os.environ.get("FLEETRUN_BENCH_SUBNET") or 12 + int(os.environ.get("FLEETRUN_TEST_SUBNET_BASE", "0"))
)

PHASES = """
import json, sys, time
t = [time.perf_counter()]
import fabric.main  # what `fab` imports before it looks for a fabfile
t.append(time.perf_counter())
import launch.cli.tasks
t.append(time.perf_counter())
from launch.fleets.select import load_inventory
from launch.paths import known_hosts_file
from launch.settings import Settings, active
from launch.transport.ssh import Fleet
t.append(time.perf_counter())
with active(Settings.from_env()):
    inventory = load_inventory(sys.argv[1])
known = inventory.write_known_hosts(known_hosts_file(inventory.fingerprint()))
t.append(time.perf_counter())
fleet = Fleet(inventory.hosts, known, max_parallel=64)
errors = [r for r in fleet.map(lambda c: c.open()).values() if isinstance(r, BaseException)]
t.append(time.perf_counter())
results = fleet.map(lambda c: c.run("true", timeout=60))
t.append(time.perf_counter())
fleet.close()
assert not errors and all(not isinstance(r, BaseException) and r.ok for r in results.values())
names = ["Fabric's imports (fabric.main: invoke, paramiko)", "fleetrun's CLI module (launch.cli.tasks)",
         "inventory code (pydantic, models, local fleet)", "load the inventory, write known_hosts",
         "connect + authenticate, all nodes in parallel", "run `true` on every node"]
print(json.dumps({n: b - a for n, a, b in zip(names, t, t[1:])}))
"""


def importtime_groups(argv: list[str]) -> dict[str, float]:
    """Self import time (ms) of one run of ``argv`` under ``-X importtime``, by top-level package."""
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", *argv], cwd=REPO, capture_output=True, text=True, check=True
    )
    groups: collections.Counter[str] = collections.Counter()
    for line in proc.stderr.splitlines():
        match = re.match(r"import time:\s+(\d+) \|\s+\d+ \|\s*(\S+)", line)
        if match:
            groups[match.group(2).split(".")[0]] += int(match.group(1)) / 1000
    return dict(groups)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "exec_profile.json")
    args = parser.parse_args()
    os.environ.setdefault("FLEETRUN_HOME", tempfile.mkdtemp(prefix="fleetrun-bench-"))
    bytecode = compile_checkout()
    load_start = os.getloadavg()
    fleet = LocalFleet(prefix=PREFIX, subnet=SUBNET)
    selector = f"local:{PREFIX}"
    try:
        inventory = fleet.up(args.nodes, say=lambda _m: None, build_image=False)
        known = inventory.write_known_hosts(known_hosts_file(inventory.fingerprint()))
        env = pdsh_env(inventory.hosts, known)
        env_kex = {**env, "PDSH_SSH_ARGS": f"-o {FAST_KEX} {env['PDSH_SSH_ARGS']}"}
        commands: dict[str, list[str]] = {
            "fab exec true": [fab_binary(), "exec", "true", "--inventory", selector],
            "python -c pass": [sys.executable, "-c", "pass"],
        }
        entry = fleetrun_binary()
        if entry is not None:
            commands["fleetrun exec true"] = [entry, "exec", "true", "--inventory", selector]
        pdsh_run(inventory.hosts, env, "true")  # warm both sides up, untimed
        pdsh_kex = "pdsh true, curve25519 first"
        whole: dict[str, list[float]] = {name: [] for name in [*commands, "pdsh true", pdsh_kex]}
        phases: list[dict[str, float]] = []
        for _ in range(args.repeat):
            whole["pdsh true"].append(pdsh_run(inventory.hosts, env, "true")[0])
            whole[pdsh_kex].append(pdsh_run(inventory.hosts, env_kex, "true")[0])
            for name, argv in commands.items():
                seconds, proc = timed(argv)
                if proc.returncode != 0:
                    raise RuntimeError(f"{name} failed: {proc.stdout[-500:]} {proc.stderr[-500:]}")
                whole[name].append(seconds)
            out = subprocess.run(
                [sys.executable, "-c", PHASES, selector], cwd=REPO, capture_output=True, text=True, check=True
            )
            phases.append(json.loads(out.stdout))
        imports = [
            importtime_groups([fab_binary(), "exec", "true", "--inventory", selector]) for _ in range(3)
        ]
    finally:
        fleet.down(say=lambda _m: None)
    medians = {name: statistics.median(v) for name, v in whole.items()}
    phase_medians = {name: statistics.median(p[name] for p in phases) for name in phases[0]}
    packages = {k: statistics.median(i.get(k, 0.0) for i in imports) for k in set().union(*imports)}
    total = sum(packages.values())
    top = dict(sorted(packages.items(), key=lambda kv: -kv[1])[:15])
    result: dict[str, Any] = {
        "command": "python bench/exec_profile.py " + " ".join(sys.argv[1:]),
        "nodes": args.nodes,
        "repeat": args.repeat,
        "bytecode": bytecode,
        "load_average_start": load_start,
        "load_average_end": os.getloadavg(),
        "whole_process_median_s": medians,
        "ratio_to_pdsh": {k: v / medians["pdsh true"] for k, v in medians.items()},
        "ratio_to_pdsh_curve25519_first": {k: v / medians[pdsh_kex] for k, v in medians.items()},
        "phases_median_s": phase_medians,
        "import_self_ms_total": total,
        "import_self_ms_by_package": {k: {"ms": v, "share": v / total} for k, v in top.items()},
    }
    print(
        f"{args.nodes} nodes, medians of {args.repeat}; load {load_start[0]:.2f} -> {os.getloadavg()[0]:.2f}"
    )
    for name, value in medians.items():
        print(
            f"  {name:36} {value:6.3f} s  {value / medians['pdsh true']:5.2f}x pdsh"
            f"  {value / medians[pdsh_kex]:5.2f}x pdsh curve25519 first"
        )
    print("the paramiko path inside one process (phases):")
    for name, value in phase_medians.items():
        print(f"  {name:52} {1000 * value:7.1f} ms")
    print(f"imports of `fab exec` (self time, median of 3): {total:.0f} ms")
    for name, value in top.items():
        print(f"  {name:24} {value:6.1f} ms  {100 * value / total:4.1f}%")
    args.out.write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
