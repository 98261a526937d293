#!/usr/bin/env python3
"""fleetrun's on-node watchdog: the dead man's switch. Standard library only.

Started beside the job on every node. While the laptop's watcher polls (each poll refreshes
``watcher-heartbeat`` in the run directory) it only watches that heartbeat: the laptop decides.
When the heartbeat goes stale (laptop closed, network lost, watcher killed), it enforces the stop
rules it can see from this node, so no run is left burning money unwatched:

  completed     this node's processes exited: nothing left to do here
  nan_loss      rank 0's metrics (on this node) hold a NaN/Inf loss
  stalled       no new metrics for stall_timeout_s, or none startup_timeout_s after launch (only
                where ``expects_metrics`` and no rank of the job said that rank 0 is elsewhere)
  wall_time     the run is older than max_wall_time_s
  peer_lost     a peer's SSH port has not answered for unreachable_timeout_s (partition, or the
                peer already powered itself off: power-offs propagate through the cluster)

Then it stops every process of the run on this node, copies the run directory to the bucket
with the command the laptop put in ``guard.json`` (``upload_argv``), writes
``guard-outcome.json``, and runs ``~/.fleetrun/poweroff`` if the fleet provides one (cloud: shut
down, which terminates; local fleet: ask the fleet's power daemon to stop this node; lab
machines: none, processes only). Failures elsewhere reach this node through torch itself: when
a peer dies, this node's ranks fail and exit, and the node then counts as completed.

It must never die silently: it is the only thing left when the laptop is gone. Everything it
reads is untrusted (the job writes ``metrics.jsonl`` and can write anything there), so lines are
read with a bound and parsed through ``fleetrun_protocol.py``; a line that does not parse is counted. And
any unexpected error of its own makes it fall back to the safe end: stop the run, upload, power
off (rule ``guard_error``), with the traceback in ``guard.log``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import socket
import subprocess
import sys
import time
import traceback
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if not __package__:  # on a node, beside the other files in ~/.fleetrun/lib (not as launch.nodelib)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
if TYPE_CHECKING or __package__:  # one module per file: launch.nodelib.X here, X on a node
    from launch.nodelib import (
        fleetrun_bucket,
        fleetrun_checkpoint,
        fleetrun_hooks,
        fleetrun_node,
        fleetrun_preempt,
    )
    from launch.nodelib import fleetrun_protocol as protocol
else:
    import fleetrun_bucket  # noqa: E402 - beside this file in ~/.fleetrun/lib
    import fleetrun_checkpoint  # noqa: E402
    import fleetrun_hooks  # noqa: E402
    import fleetrun_node  # noqa: E402
    import fleetrun_preempt  # noqa: E402
    import fleetrun_protocol as protocol  # noqa: E402

TICK = 1.0
PEER_PROBE_S = 3.0
SCAN_CHUNK = 4 * protocol.MAX_METRICS_LINE_BYTES
"""Bytes of ``metrics.jsonl`` read at a time: a line longer than a chunk is skipped, counted."""
SCAN_CHUNKS_PER_TICK = 8
ELSEWHERE = "metrics-elsewhere"
"""Touched by the metrics helper of ranks other than 0: rank 0's metrics go to another node."""
NOTICE_MARGIN_S = 5.0
"""Stop waiting for the checkpoint this long before the cloud's notice window ends."""


def log(message: str) -> None:
    """A line in ``guard.log``; a log that cannot be written (disk full) never stops the guard."""
    with contextlib.suppress(OSError, ValueError):
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
    except (OSError, ValueError):
        return False


def nonfinite_loss(path: str, state: dict[str, Any]) -> str | None:
    """Scan new complete lines of metrics.jsonl for a NaN/Inf loss; remembers its offset.

    Reads at most ``SCAN_CHUNKS_PER_TICK`` chunks a call, so a 50 MB line (or a job writing
    faster than it can be read) costs bounded memory and time; such a line is skipped whole and
    counted in ``state["malformed"]``, as is every line the protocol refuses.
    """
    for _ in range(SCAN_CHUNKS_PER_TICK):
        offset = int(state.get("offset", 0))
        try:
            with open(path, "rb") as fh:
                fh.seek(offset)
                data = fh.read(SCAN_CHUNK)
        except OSError:
            return None
        end = data.rfind(b"\n")
        if end < 0:
            if len(data) >= SCAN_CHUNK:  # inside a line longer than a chunk: skip to its end
                state["offset"] = offset + len(data)
                if not state.get("skipping"):
                    state["malformed"] = state.get("malformed", 0) + 1
                state["skipping"] = True
                continue
            return None
        state["offset"] = offset + end + 1
        lines = data[:end].split(b"\n")
        if state.pop("skipping", False):
            lines = lines[1:]  # the tail of the over-long line
        for line in lines:
            if not line.strip():
                continue
            try:
                record = protocol.parse_metrics_line(line)
            except protocol.ProtocolError:
                state["malformed"] = state.get("malformed", 0) + 1
                continue
            loss = record.get("loss")
            if isinstance(loss, float) and not math.isfinite(loss):
                step = record.get("step")
                return f"loss became {loss} at step {step if isinstance(step, int) else '?'}"
        if len(data) < SCAN_CHUNK:
            return None
    return None


def job_done(run_dir: str, cfg: protocol.GuardConfig) -> bool:
    if cfg.starts_processes:
        return os.path.exists(os.path.join(run_dir, "rc"))
    return not [p for p in fleetrun_node._run_pids(cfg.run_id) if p != os.getpid()]


def decide(
    run_dir: str, cfg: protocol.GuardConfig, now: float, memory: dict[str, Any]
) -> tuple[str, str] | None:
    if job_done(run_dir, cfg):
        rc_text = fleetrun_node._read(os.path.join(run_dir, "rc"))
        rc = protocol.parse_exit_code(rc_text)
        if rc is not None:
            return "completed", f"this node's processes exited with code {rc}"
        if rc_text and rc_text.strip():
            return "completed", "this node's processes exited (the rc file does not hold an exit code)"
        return "completed", "this node's processes exited"
    metrics = os.path.join(run_dir, "metrics.jsonl")
    scan = memory.setdefault("scan", {})
    if cfg.nan_loss:
        bad = nonfinite_loss(metrics, scan)
        if bad:
            return "nan_loss", bad
    last_metric = mtime(metrics)
    if last_metric is not None and cfg.stall_timeout_s and now - last_metric > cfg.stall_timeout_s:
        return "stalled", f"no new metrics for {now - last_metric:.0f} s"
    if (
        last_metric is None
        and cfg.expects_metrics
        and cfg.startup_timeout_s
        and now - cfg.started_at > cfg.startup_timeout_s
        and not os.path.exists(os.path.join(run_dir, ELSEWHERE))
    ):
        return "stalled", f"no metrics {now - cfg.started_at:.0f} s after launch"
    if cfg.max_wall_time_s and now - cfg.started_at > cfg.max_wall_time_s:
        return "wall_time", f"run older than max_wall_time_s={cfg.max_wall_time_s:g}"
    if cfg.unreachable_timeout_s:
        seen = check_peers(cfg, now, memory)
        for peer, last in sorted(seen.items()):
            if now - last > cfg.unreachable_timeout_s:
                return (
                    "peer_lost",
                    f"peer {peer} unreachable for {now - last:.0f} s (partitioned or powered off)",
                )
    return None


def check_peers(cfg: protocol.GuardConfig, now: float, memory: dict[str, Any]) -> dict[str, float]:
    """When each peer's SSH port last answered. A powered-off peer refuses; a partitioned one times out.

    A distributed job cannot go on without a peer, so once the watcher is gone a lost peer ends
    the run here too, and power-offs propagate through the cluster.
    """
    seen: dict[str, float] = memory.setdefault("peers_seen", {})
    # Probed only after a takeover, and at most every PEER_PROBE_S: each probe costs the peer's
    # sshd a fork, and a cluster-wide all-to-all every second would be N*(N-1) of them.
    if now - float(memory.get("peers_probed_at", 0.0)) < PEER_PROBE_S:
        for peer in cfg.peers:
            seen.setdefault(peer, now)
        return seen
    memory["peers_probed_at"] = now
    for peer in cfg.peers:
        seen.setdefault(peer, now)
        if reachable(peer, cfg.peer_port, timeout=1.0):
            seen[peer] = now
    return seen


def _step(label: str, action: Any, fallback: Any) -> Any:
    """Run one step of the shutdown; an error in it is logged and the next step still runs."""
    try:
        return action()
    except Exception:  # noqa: BLE001 - the shutdown must reach the power-off whatever fails
        log(f"{label} failed:\n{traceback.format_exc().rstrip()}")
        return fallback


def shut_down(
    run_dir: str,
    run_id: str,
    upload_argv: tuple[str, ...],
    rule: str,
    reason: str,
    malformed: int = 0,
    upload_env: Mapping[str, str] | None = None,
) -> None:
    """Stop the run on this node, upload, record the outcome, run the power-off hook.

    Each step is independent: a failed upload or a full disk does not keep the node running.
    """
    log(f"stopping: {rule}: {reason}")
    hook = _step("the before_stop hook", lambda: fleetrun_hooks.run_before_stop(run_dir), None)
    if hook is not None:  # bounded, and its failure changes nothing below: only logged and recorded
        log(f"before_stop hook: exit {hook['rc']}{' (killed at its timeout)' if hook['timed_out'] else ''}")
    stopped = _step("stopping the run", lambda: fleetrun_node.stop_run(run_id, 10.0, spare=os.getpid()), None)
    uploaded = _step(
        "the upload", lambda: fleetrun_node.upload(run_dir, upload_argv, upload_env).upload, "upload failed"
    )
    log(uploaded)
    outcome = protocol.GuardOutcome(
        rule=rule,
        reason=reason,
        time=time.time(),
        stopped=stopped,
        upload=uploaded,
        malformed_lines=malformed,
    )

    def record() -> None:
        tmp = os.path.join(run_dir, "guard-outcome.json.tmp")
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(outcome.to_json())
        os.replace(tmp, os.path.join(run_dir, "guard-outcome.json"))

    _step("recording the outcome", record, None)
    hook = os.path.expanduser("~/.fleetrun/poweroff")
    if os.path.exists(hook):
        log("powering this node off")
        _step("the power-off hook", lambda: subprocess.run(["sh", hook], check=False, timeout=120), None)
    else:
        log("no power-off hook on this node (lab machine): processes stopped, machine kept")


def on_notice(
    run_dir: str, cfg: protocol.GuardConfig, notice: fleetrun_preempt.Notice, window: float
) -> None:
    """The cloud will take this node: flag, SIGTERM the ranks, wait for a durable checkpoint.

    The flag file comes first, so a rank checking ``should_save()`` before its signal arrives
    still saves; the record says how many ranks were told and which step reached the bucket
    after the notice (the laptop reads it: the attempt was preempted, not failed). It also says
    when the node goes (the notice's own time, EC2's ``time``, else the window), the step this
    node saved after the notice and when the wait was over: the laptop keeps the node until that
    checkpoint is safe (``launch.run.drain``), so this node's processes are still here meanwhile.
    """
    noticed = time.time()
    deadline_at = fleetrun_preempt.deadline_of(notice, noticed, cfg.notice_window_s or window)
    record = protocol.PreemptionNotice(
        noticed_at=noticed, source=cfg.preemption, detail=notice.detail, deadline_at=deadline_at
    )
    fleetrun_preempt.write_notice(run_dir, record)
    sent = fleetrun_preempt.signal_ranks(cfg.run_id, spare=(os.getpid(),))
    record = dataclasses.replace(record, signalled=sent)
    fleetrun_preempt.write_notice(run_dir, record)
    log(
        f"preemption notice ({notice.detail[:120]}): SIGTERM sent to {sent} rank(s); "
        f"the node goes in {deadline_at - noticed:.0f} s"
    )
    durable = wait_durable(run_dir, cfg, noticed, deadline_at - NOTICE_MARGIN_S)
    step = durable[0] if durable is not None else None
    record = dataclasses.replace(
        record,
        durable_step=step,
        durable_at=None if step is None else time.time(),
        durable_made_after=durable is not None and durable[1],
        saved_step=saved_after(run_dir, cfg, noticed),
        settled_at=time.time(),
    )
    fleetrun_preempt.write_notice(run_dir, record)
    log(
        f"checkpoint step {step} is in the bucket, {time.time() - noticed:.1f} s after the notice"
        if step is not None
        else "no checkpoint reached the bucket after the notice"
    )


def saved_after(run_dir: str, cfg: protocol.GuardConfig, noticed: float) -> int | None:
    """The step of a complete checkpoint on this node made after the notice, or None (rank 0 runs
    elsewhere, or saved nothing). The laptop's drain keeps the node until that step is safe
    elsewhere (a peer copy); an error here is "none", never a crash of the preemption path."""
    try:
        local = fleetrun_checkpoint.Checkpointer(
            run_dir=run_dir, bucket=cfg.bucket, rank=0, handle_sigterm=False
        )
        found = local.on_node(hashes=False)
    except Exception as exc:  # noqa: BLE001 - reported in the log, the drain goes on without it
        log(f"could not list this node's checkpoints: {type(exc).__name__}: {exc}")
        return None
    return found.step if found is not None and found.manifest.created >= noticed else None


def wait_durable(
    run_dir: str, cfg: protocol.GuardConfig, noticed: float, deadline: float
) -> tuple[int, bool] | None:
    """The newest step that reached the bucket after ``noticed``, once the ranks are done, and
    whether it was made after ``noticed`` too (False: an older step, at the deadline), or None.

    The ranks upload their checkpoint themselves and exit (the helper's ``wait_uploaded``); the
    watchdog waits for this node's ranks (until ``deadline``), then reads the bucket's pointer
    until it moves (rank 0 may be on another node, still uploading). A complete checkpoint made
    on this node after the notice that did not reach the bucket (its rank died mid-upload) is
    uploaded from here, with the same commands.
    """
    while time.time() < deadline and fleetrun_preempt.rank_pids(cfg.run_id):
        time.sleep(0.5)
    if cfg.bucket is None:
        return None
    bucket = fleetrun_bucket.Bucket(cfg.bucket)
    local = fleetrun_checkpoint.Checkpointer(run_dir=run_dir, bucket=cfg.bucket, rank=0, handle_sigterm=False)
    found = local.on_node(hashes=False)
    stranded = found is not None and found.manifest.created >= noticed
    older: int | None = None
    while True:  # rank 0 may run on another node and still be uploading: poll the pointer
        durable = bucket.durable_since(noticed)
        if durable is not None and durable[1]:
            return durable[0], True  # made and uploaded after the notice: the ranks' last word
        older = durable[0] if durable is not None else older
        if time.time() >= deadline:
            return None if older is None else (older, False)  # uploaded after the notice, made before
        if stranded and found is not None:
            stranded = False
            log(f"uploading checkpoint step {found.step} from this node")
            local._upload(found.step)
            local._drop_old()
            continue
        time.sleep(1.0)


def poll_notice(run_dir: str, cfg: protocol.GuardConfig, memory: dict[str, Any], now: float) -> None:
    """One preemption poll (at most one a second); handles the first notice, logs errors sparingly."""
    watcher = memory.get("notice")
    if watcher is None or memory.get("preempted"):
        return
    notice = watcher.poll(now)
    if watcher.last_error and watcher.errors % 60 == 1:
        log(f"preemption poll failed ({watcher.errors} so far): {watcher.last_error}")
    if notice is not None:
        memory["preempted"] = True
        try:
            on_notice(run_dir, cfg, notice, watcher.window_s)
        except Exception:  # noqa: BLE001 - the node goes anyway; guard_error would kill ranks mid-save
            log(f"the preemption path failed; the stop rules go on:\n{traceback.format_exc().rstrip()}")


def watch(run_dir: str, cfg: protocol.GuardConfig) -> tuple[str, str, int]:
    """Wait for the watcher to go silent, then for a stop rule; returns (rule, reason, malformed).

    Preemption notices are polled all along, watcher or not: the laptop cannot see them.
    """
    guard_started = time.time()
    memory: dict[str, Any] = {}
    if cfg.preemption:
        memory["notice"] = fleetrun_preempt.Watch(cfg.preemption, cfg.metadata_address)
    announced = False
    reported_malformed = 0
    while True:
        now = time.time()
        poll_notice(run_dir, cfg, memory, now)
        beat = mtime(os.path.join(run_dir, "watcher-heartbeat")) or guard_started
        if now - beat < cfg.watcher_lost_after_s:
            if announced:
                log("the watcher is back; standing by")
                announced = False
        else:
            if not announced:
                log(f"no watcher heartbeat for {now - beat:.0f} s: enforcing the stop rules here")
                announced = True
                memory.pop("peers_seen", None)  # peer timers run from the takeover
            decision = decide(run_dir, cfg, now, memory)
            malformed = int(memory.get("scan", {}).get("malformed", 0))
            if malformed > reported_malformed:
                log(f"{malformed - reported_malformed} malformed metrics line(s) skipped")
                reported_malformed = malformed
            if decision is not None:
                return decision[0], decision[1], malformed
        time.sleep(TICK)


def main(run_dir: str) -> int:
    """Watch, then shut down; on any error of its own, shut down anyway (rule ``guard_error``)."""
    run_id = os.environ.get("FLEETRUN_RUN_ID", "")
    upload_argv: tuple[str, ...] = ()
    upload_env: Mapping[str, str] = {}
    try:
        cfg = fleetrun_node.read_guard_config(run_dir)
        run_id, upload_argv, upload_env = cfg.run_id, cfg.upload_argv, cfg.upload_env
        log(
            f"watching run {run_id}; takes over when the watcher is silent for {cfg.watcher_lost_after_s:.0f} s"
        )
        rule, reason, malformed = watch(run_dir, cfg)
    except Exception as exc:  # noqa: BLE001 - the dead man's switch falls back to the safe end
        log(f"the watchdog failed; falling back to stopping the run:\n{traceback.format_exc().rstrip()}")
        rule, reason, malformed = "guard_error", f"the watchdog failed: {type(exc).__name__}: {exc}", 0
    if not run_id:
        log(
            "no run id (guard.json unreadable and FLEETRUN_RUN_ID unset): cannot tell which processes to stop"
        )
        return 1
    shut_down(run_dir, run_id, upload_argv, rule, reason, malformed, upload_env)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
