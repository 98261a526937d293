#!/usr/bin/env python3
"""fleetrun's on-node watchdog: the dead man's switch. Standard library only.

Started beside the job on every node. While the laptop's watcher polls (each poll refreshes
``watcher-heartbeat`` in the run directory) it only watches that heartbeat: the laptop decides.
When the heartbeat goes stale (laptop closed, network lost, watcher killed), it enforces the stop
rules it can see from this node, so no run is left burning money unwatched:

  completed     this node's processes exited: nothing left to do here
  nan_loss      rank 0's metrics (on this node) hold a NaN/Inf loss
  stalled       no new metrics for stall_timeout_s (or none startup_timeout_s after launch)
  wall_time     the run is older than max_wall_time_s
  peer_lost     a peer's SSH port has not answered for unreachable_timeout_s (partition, or the
                peer already powered itself off: power-offs propagate through the cluster)

Then it stops every process of the run on this node, copies the run directory to the bucket
when one is configured (``aws s3 sync`` / ``gcloud storage rsync``), writes ``guard-outcome.json``,
and runs ``~/.fleetrun/poweroff`` if the fleet provides one (cloud: shut down, which terminates;
local fleet: ask the fleet's power daemon to stop this node; lab machines: none, processes only).
Failures elsewhere reach this node through torch itself: when a peer dies, this node's ranks
fail and exit, and the node then counts as completed.
"""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fleetrun_node  # noqa: E402

TICK = 1.0
PEER_PROBE_S = 3.0


def log(message: str) -> None:
    print(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} guard: {message}", flush=True)


def mtime(path: str) -> float | None:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return None


def reachable(addr: str, port: int, timeout: float = 2.0) -> bool:
    try:
        with socket.create_connection((addr, port), timeout=timeout):
            return True
    except OSError:
        return False


def nonfinite_loss(path: str, state: dict[str, int]) -> str | None:
    """Scan new complete lines of metrics.jsonl for a NaN/Inf loss; remembers its offset."""
    try:
        with open(path, "rb") as fh:
            fh.seek(state.get("offset", 0))
            data = fh.read()
    except OSError:
        return None
    end = data.rfind(b"\n")
    if end < 0:
        return None
    state["offset"] = state.get("offset", 0) + end + 1
    for line in data[: end + 1].splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        loss = record.get("loss") if isinstance(record, dict) else None
        if isinstance(loss, int | float) and not math.isfinite(loss):
            return f"loss became {loss} at step {record.get('step')}"
    return None


def job_done(run_dir: str, cfg: dict[str, object], run_id: str) -> bool:
    if cfg.get("starts_processes", True):
        return os.path.exists(os.path.join(run_dir, "rc"))
    return not [p for p in fleetrun_node._run_pids(run_id) if p != os.getpid()]


def decide(
    run_dir: str, cfg: dict[str, object], now: float, memory: dict[str, object]
) -> tuple[str, str] | None:
    run_id = str(cfg["run_id"])
    if job_done(run_dir, cfg, run_id):
        rc = (fleetrun_node._read(os.path.join(run_dir, "rc")) or "").strip()
        return "completed", f"this node's processes exited{f' with code {rc}' if rc else ''}"
    metrics = os.path.join(run_dir, "metrics.jsonl")
    scan = memory.setdefault("scan", {})
    assert isinstance(scan, dict)
    if cfg.get("nan_loss", True):
        bad = nonfinite_loss(metrics, scan)
        if bad:
            return "nan_loss", bad
    started = float(cfg["started_at"])  # type: ignore[arg-type]
    last_metric = mtime(metrics)
    stall = cfg.get("stall_timeout_s")
    startup = cfg.get("startup_timeout_s")
    if last_metric is not None and stall and now - last_metric > float(stall):  # type: ignore[arg-type]
        return "stalled", f"no new metrics for {now - last_metric:.0f} s"
    if last_metric is None and startup and cfg.get("expects_metrics") and now - started > float(startup):  # type: ignore[arg-type]
        return "stalled", f"no metrics {now - started:.0f} s after launch"
    wall = cfg.get("max_wall_time_s")
    if wall and now - started > float(wall):  # type: ignore[arg-type]
        return "wall_time", f"run older than max_wall_time_s={wall}"
    limit = cfg.get("unreachable_timeout_s")
    if limit:
        seen = check_peers(cfg, now, memory)
        for peer, last in sorted(seen.items()):
            if now - last > float(limit):  # type: ignore[arg-type]
                return (
                    "peer_lost",
                    f"peer {peer} unreachable for {now - last:.0f} s (partitioned or powered off)",
                )
    return None


def check_peers(cfg: dict[str, object], now: float, memory: dict[str, object]) -> dict[str, float]:
    """When each peer's SSH port last answered. A powered-off peer refuses; a partitioned one times out.

    A distributed job cannot go on without a peer, so once the watcher is gone a lost peer ends
    the run here too, and power-offs propagate through the cluster.
    """
    seen = memory.setdefault("peers_seen", {})
    assert isinstance(seen, dict)
    # Probed only after a takeover, and at most every PEER_PROBE_S: each probe costs the peer's
    # sshd a fork, and a cluster-wide all-to-all every second would be N*(N-1) of them.
    if now - float(memory.get("peers_probed_at", 0.0)) < PEER_PROBE_S:  # type: ignore[arg-type]
        for peer in cfg.get("peers") or []:  # type: ignore[attr-defined]
            seen.setdefault(peer, now)
        return seen
    memory["peers_probed_at"] = now
    for peer in cfg.get("peers") or []:  # type: ignore[attr-defined]
        seen.setdefault(peer, now)
        if reachable(str(peer), int(cfg.get("peer_port", 22)), timeout=1.0):  # type: ignore[call-overload]
            seen[peer] = now
    return seen


def main(run_dir: str) -> int:
    with open(os.path.join(run_dir, "guard.json"), encoding="utf-8") as fh:
        cfg = json.load(fh)
    run_id = str(cfg["run_id"])
    lost_after = float(cfg.get("watcher_lost_after_s", 120))
    guard_started = time.time()
    memory: dict[str, object] = {}
    log(f"watching run {run_id}; takes over when the watcher is silent for {lost_after:.0f} s")
    announced = False
    while True:
        now = time.time()
        beat = mtime(os.path.join(run_dir, "watcher-heartbeat")) or guard_started
        watcher_alive = now - beat < lost_after
        if watcher_alive:
            if announced:
                log("the watcher is back; standing by")
                announced = False
            decide_now = None
        else:
            if not announced:
                log(f"no watcher heartbeat for {now - beat:.0f} s: enforcing the stop rules here")
                announced = True
                memory.pop("peers_seen", None)  # peer timers run from the takeover
            decide_now = decide(run_dir, cfg, now, memory)
        if decide_now is not None:
            rule, reason = decide_now
            log(f"stopping: {rule}: {reason}")
            stopped = fleetrun_node.stop_run(run_id, 10.0, spare=os.getpid())
            uploaded = fleetrun_node.upload(
                run_dir, cfg.get("bucket"), cfg.get("cloud"), str(cfg["run_id"]), str(cfg["node"])
            )
            log(uploaded)
            outcome = {
                "rule": rule,
                "reason": reason,
                "time": time.time(),
                "stopped": stopped,
                "upload": uploaded,
            }
            tmp = os.path.join(run_dir, "guard-outcome.json.tmp")
            with open(tmp, "w", encoding="utf-8") as fh:
                json.dump(outcome, fh)
            os.replace(tmp, os.path.join(run_dir, "guard-outcome.json"))
            hook = os.path.expanduser("~/.fleetrun/poweroff")
            if os.path.exists(hook):
                log("powering this node off")
                subprocess.run(["sh", hook], check=False, timeout=120)
            else:
                log("no power-off hook on this node (lab machine): processes stopped, machine kept")
            return 0
        time.sleep(TICK)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
