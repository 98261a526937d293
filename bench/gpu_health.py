"""GPU health figures (issue 20), with the scripted ``nvidia-smi`` stand-in (no GPU here).

1. ``fab doctor`` with GPU health, 64 and 256 nodes of 8 GPUs: what GPU health adds to the doctor.
   On the node: the reader (``fleetrun_gpu.read_health``) against the stand-in, timed (the
   stand-in is a Python script, so this is an upper bound of the tool calls' own cost). On the
   laptop: parsing N probe answers (one real answer of the reader, one node with a bad GPU) and
   judging every node and GPU, timed. The fan-out itself is ``bench/doctor.py``'s figure (today's
   doctor); a 64/256-node local fleet was not brought up for this bench on the shared 2-core
   machine.
2. ``gpu_fault`` injected -> stop decision, in poll intervals: the real rule (``evaluate``) fed
   the real reader's answers before and after an Xid 79, polled every ``--poll`` s while the
   node agent refreshes its reading every ``GPU_READ_EVERY_S``; every injection phase tried.
3. Straggler throttled -> flagged: the real rule (``slow_nodes``) with ``window_s``, the node's
   pace reaching the laptop ``PACE_WRITE_S`` late at worst; every phase tried.

Usage: .venv/bin/python bench/gpu_health.py [--poll 1.0] [--window 120] [--out bench/results/gpu_health.json]
Prints a table and writes JSON; goals are printed, never asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from launch.nodelib import fleetrun_metrics, fleetrun_node  # noqa: E402
from launch.rules.gpu_health import parse_gpu_health  # noqa: E402
from launch.rules.preflight import Job, Observation, judge  # noqa: E402
from launch.rules.probe_facts import parse_probe_answer  # noqa: E402
from launch.rules.stoprules import NodeObservation, RuleState, StopRules, evaluate  # noqa: E402
from launch.rules.stoprules import Observation as Poll  # noqa: E402
from launch.rules.stragglers import NodePace, StragglerRule, slow_nodes  # noqa: E402
from tests.gpustandin import install, xid  # noqa: E402

NODELIB = REPO / "launch" / "nodelib"
XID79 = xid(1, 79, "2026-11-25T14:02:11", "pid=4242, GPU has fallen off the bus.")


def reader_answer(folder: Path, scenario: dict[str, Any], full: bool) -> tuple[dict[str, Any], float]:
    fakebin = install(folder, scenario)
    env = {**os.environ, "PATH": f"{fakebin}:{os.environ['PATH']}"}
    code = (
        f"import sys, json, time; sys.path.insert(0, {str(NODELIB)!r}); import fleetrun_gpu; "
        f"t = time.perf_counter(); a = fleetrun_gpu.read_health({full}); "
        "print(json.dumps({'a': a, 's': time.perf_counter() - t}))"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    data = json.loads(out.stdout)
    return data["a"], data["s"]


def probe_line(health: dict[str, Any]) -> str:
    return json.dumps(
        {"v": 1, "mode": "full", "python": "3.12.3", "hostname": "n", "hostname_addrs": ["10.0.0.1"],
         "rsync": True, "home_free": 50 * 2**30, "lib": "", "time": time.time(), "gpu_health": health}
    )  # fmt: skip


def doctor_rows(tmp: Path) -> list[dict[str, Any]]:
    healthy, node_s = reader_answer(tmp / "ok", {"count": 8}, True)
    gpus: list[dict[str, Any]] = [{} for _ in range(8)]
    gpus[1] = {"ecc_volatile": 2}
    bad, _ = reader_answer(tmp / "bad", {"gpus": gpus, "xids": [XID79]}, True)
    rows = []
    for n in (64, 256):
        lines = [probe_line(bad if i == 7 else healthy) for i in range(n)]
        started = time.perf_counter()
        observations = [
            Observation(
                f"node{i}", "u", f"10.0.{i // 250}.{i % 250}", facts=parse_probe_answer(line), gpus_expected=8
            )
            for i, line in enumerate(lines)
        ]
        findings = judge(observations, Job(head="node0", port=29500, full=True))
        laptop_s = time.perf_counter() - started
        gpu_lines = [v for v in findings.verdicts if v.check.startswith("gpu")]
        named = [f"{v.node} {v.check} {v.message}" for v in findings.errors if v.check.startswith("gpu")]
        rows.append(
            {
                "nodes": n,
                "gpus": 8 * n,
                "reader_on_node_s": round(node_s, 3),
                "laptop_parse_judge_s": round(laptop_s, 3),
                "gpu_lines": len(gpu_lines),
                "errors": named,
            }
        )
    return rows


def gpu_fault_polls(tmp: Path, poll: float) -> dict[str, Any]:
    before = parse_gpu_health(reader_answer(tmp / "f0", {"count": 2}, False)[0])
    gpus: list[dict[str, Any]] = [{}, {"lost": True}]
    after = parse_gpu_health(reader_answer(tmp / "f1", {"gpus": gpus, "xids": [XID79]}, False)[0])
    refresh = fleetrun_node.GPU_READ_EVERY_S
    counts = []
    for phase in range(20):
        fault_at = 10.0 + phase * poll / 20  # the fault lands anywhere inside one poll interval
        state, now = RuleState(), 0.0
        while True:
            now += poll
            last_refresh = (now // refresh) * refresh  # the agent's reading was taken then
            reading = after if last_refresh >= fault_at else before
            obs = Poll(now=now, started_at=0.0, nodes=(NodeObservation("n1", "running", gpu_health=reading),))
            if evaluate(StopRules(), obs, state) is not None:
                counts.append((now - fault_at) / poll)
                break
    return {
        "poll_s": poll,
        "agent_refresh_s": refresh,
        "max_polls": round(max(counts), 2),
        "mean_polls": round(sum(counts) / len(counts), 2),
    }


def straggler_delay(poll: float, window: float) -> dict[str, Any]:
    rule = StragglerRule(factor=1.3, window_s=window, action="stop")
    write = fleetrun_metrics.PACE_WRITE_S
    delays = []
    for phase in range(20):
        throttled_at = 10.0 + phase * write / 20
        slow_since: dict[str, float] = {}
        now = 0.0
        while True:
            now += poll
            # the node's pace file shows the throttling from its first write after it began
            seen = now >= (throttled_at // write + 1) * write
            paces = {f"n{i}": NodePace(3.0 if (i == 2 and seen) else 1.0) for i in range(3)}
            if slow_nodes(rule, paces, now, slow_since):
                delays.append(now - throttled_at)
                break
    return {
        "poll_s": poll,
        "window_s": window,
        "pace_write_s": write,
        "max_s": round(max(delays), 2),
        "goal_s": window + 5,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--poll", type=float, default=1.0)
    parser.add_argument("--window", type=float, default=120.0)
    parser.add_argument("--out", default=str(REPO / "bench" / "results" / "gpu_health.json"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="fleetrun-gpu-bench-") as tmp:
        rows = doctor_rows(Path(tmp))
        fault = gpu_fault_polls(Path(tmp), args.poll)
    strag = straggler_delay(args.poll, args.window)
    console = Console()
    table = Table(title="GPU health (scripted nvidia-smi stand-in)")
    for col in ("what", "figure", "goal"):
        table.add_column(col)
    for row in rows:
        table.add_row(
            f"doctor GPU health, {row['nodes']} nodes x 8 GPUs",
            f"node reader {row['reader_on_node_s']:.2f} s (in parallel); laptop {row['laptop_parse_judge_s']:.3f} s",
            "<= 10 s" if row["nodes"] == 64 else "<= 60 s",
        )
    table.add_row(
        "gpu_fault -> stop decision",
        f"{fault['max_polls']} polls max, {fault['mean_polls']} mean",
        "<= 2 polls",
    )
    table.add_row(
        "straggler throttled -> flagged",
        f"{strag['max_s']} s max (window {strag['window_s']:g} s)",
        f"<= {strag['goal_s']:g} s",
    )
    console.print(table)
    result = {
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
        "doctor": rows,
        "gpu_fault": fault,
        "straggler": strag,
        "notes": "stand-in nvidia-smi; doctor fan-out over SSH not included (bench/doctor.py); no GPU on this machine",
    }
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    console.print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
