"""How long from `fab train` on a ready local fleet to the first logged step, next to a plain
`torchrun` started by hand on the same nodes (OpenSSH to each node, same environment, same job).

Usage (root): .venv/bin/python bench/first_step.py [--nodes 3] [--repeat 3]
Prints a table and writes bench/results/first_step.json. Timing goals live here, not in tests.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from rich.console import Console  # noqa: E402

from launch import app  # noqa: E402
from launch.localfleet import LocalFleet  # noqa: E402
from launch.paths import known_hosts_file  # noqa: E402
from launch.ssh import openssh_command  # noqa: E402
from launch.wrapup import RunResult  # noqa: E402

PREFIX, SUBNET = "frb", 6
EPOCHS = 3


def write_playbook(path: Path, nodes: int) -> Path:
    path.write_text(
        "\n".join(
            [
                "name: bench-digits",
                f"workdir: {REPO / 'examples' / 'digits'}",
                f"nodes: {nodes}",
                "procs_per_node: 1",
                f"entrypoint: python -m trainer.task --epochs {EPOCHS}",
                "env: {OMP_NUM_THREADS: '1'}",
                "teardown: never",
            ]
        )
        + "\n"
    )
    return path


def first_step_time(metrics: Path) -> float | None:
    for line in metrics.read_text().splitlines():
        record = json.loads(line)
        if "step" in record:
            return float(record["time"])
    return None


def fleetrun_once(playbook: Path) -> dict[str, float]:
    started = time.time()
    result = app.train(
        playbook, inventory=f"local:{PREFIX}", console=Console(file=io.StringIO()), poll_interval=0.5
    )
    ended = time.time()
    assert isinstance(result, RunResult) and result.ok, getattr(result, "reason", result)
    first = first_step_time(result.folder / "metrics.jsonl")
    assert first is not None
    return {"to_first_step_s": first - started, "wall_s": ended - started}


def plain_torchrun_once(fleet: LocalFleet, nodes: int) -> dict[str, float]:
    """What a user does by hand: ssh to every node and start torchrun there, head's address as endpoint."""
    inventory = fleet.inventory()
    known_hosts = inventory.write_known_hosts(known_hosts_file(inventory.fingerprint()))
    head = inventory.head
    run_id = f"plain-{int(time.time() * 1000)}"
    procs = []
    started = time.time()
    for rank, host in enumerate(inventory.hosts[:nodes]):
        remote = (
            f"cd ~/.fleetrun/work/bench-digits && . ~/.fleetrun/envs/bench-digits/bin/activate && "
            f"mkdir -p ~/plain/{run_id} && FLEETRUN_RUN_DIR=~/plain/{run_id} OMP_NUM_THREADS=1 "
            f"PYTHONPATH=~/.fleetrun/lib python -m torch.distributed.run --nnodes={nodes} --nproc-per-node=1 "
            f"--rdzv-backend=c10d --rdzv-endpoint={head.private_address}:29511 --rdzv-id={run_id} "
            f"--rdzv-conf=is_host={1 if rank == 0 else 0} --local-addr={host.private_address} "
            f"-m trainer.task --epochs {EPOCHS}"
        )
        argv = [*openssh_command(host, known_hosts), f"{host.user}@{host.address}", remote]
        procs.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    codes = [p.wait(timeout=600) for p in procs]
    ended = time.time()
    assert codes == [0] * nodes, codes
    metrics = [Path(f"/home/{h.user}/plain/{run_id}/metrics.jsonl") for h in inventory.hosts[:nodes]]
    first = next(first_step_time(m) for m in metrics if m.exists())
    assert first is not None
    return {"to_first_step_s": first - started, "wall_s": ended - started}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    os.environ.setdefault("FLEETRUN_HOME", tempfile.mkdtemp(prefix="fleetrun-bench-"))
    fleet = LocalFleet(prefix=PREFIX, subnet=SUBNET)
    fleet.up(args.nodes, say=lambda _m: None)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            playbook = write_playbook(Path(tmp) / "bench.yaml", args.nodes)
            warm = fleetrun_once(playbook)  # first run builds the environments: not a "ready fleet"
            rows: dict[str, list[dict[str, float]]] = {"fleetrun": [], "plain torchrun": []}
            for _ in range(args.repeat):
                rows["fleetrun"].append(fleetrun_once(playbook))
                rows["plain torchrun"].append(plain_torchrun_once(fleet, args.nodes))
    finally:
        fleet.down(say=lambda _m: None)
    summary = {
        name: {key: statistics.median(r[key] for r in runs) for key in ("to_first_step_s", "wall_s")}
        for name, runs in rows.items()
    }
    ratio = summary["fleetrun"]["to_first_step_s"] / summary["plain torchrun"]["to_first_step_s"]
    print(
        f"{'':16} {'to first step (s)':>18} {'whole job (s)':>14}   (median of {args.repeat}, {args.nodes} nodes)"
    )
    for name, values in summary.items():
        print(f"{name:16} {values['to_first_step_s']:18.2f} {values['wall_s']:14.2f}")
    print(
        f"fleetrun / plain torchrun, to first step: {ratio:.2f}x   (first run, building environments: {warm['to_first_step_s']:.1f} s)"
    )
    out = REPO / "bench" / "results" / "first_step.json"
    out.write_text(
        json.dumps(
            {
                "nodes": args.nodes,
                "repeat": args.repeat,
                "runs": rows,
                "median": summary,
                "ratio_to_first_step": ratio,
                "first_run": warm,
                "load": os.getloadavg(),
                "command": "python bench/first_step.py " + shlex.join(sys.argv[1:]),
            },
            indent=2,
        )
    )
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
