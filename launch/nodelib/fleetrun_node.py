#!/usr/bin/env python3
"""fleetrun's node agent: starts, polls and stops one run on this node. Standard library only.

The laptop calls it over SSH. Keeping this logic on the node makes each poll one short command
with one short JSON answer, whatever the number of files or processes involved.

  fleetrun_node.py start RUN_DIR          start RUN_DIR/launch.sh detached (and the watchdog,
                                          fleetrun_guard.py, when RUN_DIR/guard.json exists)
  fleetrun_node.py poll RUN_DIR OFFSET [--no-heartbeat]
                                          state, exit code, new metrics bytes since OFFSET, status
  fleetrun_node.py serve RUN_DIR          answer "poll OFFSET" lines on stdin with one JSON line
                                          each, until EOF or 10 idle minutes (the watcher's
                                          persistent poll channel: no interpreter start per poll)
  fleetrun_node.py guard RUN_DIR          start only the watchdog (nodes whose ranks the head starts)
  fleetrun_node.py upload RUN_DIR BUCKET CLOUD RUN_ID NODE
                                          copy the run directory to the bucket (cloud fleets)
  fleetrun_node.py stop RUN_ID [GRACE]    stop every process carrying FLEETRUN_RUN_ID=RUN_ID,
                                          the watchdog included (the watcher is wrapping up)

Processes are found by the ``FLEETRUN_RUN_ID`` variable in their environment, not by pid or
process group: torchrun starts its workers in sessions of their own, so killing torchrun alone
leaves them running (checked on the local fleet).
"""

from __future__ import annotations

import base64
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time

WRAPPER = 'sh ./launch.sh; rc=$?; echo "$rc" > rc.tmp; mv rc.tmp rc; exit "$rc"'
MAX_CHUNK = 1 << 20
SERVE_IDLE_S = 600.0


def _alive(pid: int) -> bool:
    """True when the process exists and is not a zombie (``kill -0`` says yes to zombies)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as fh:
            stat = fh.read()
    except OSError:
        return False
    state = stat.rsplit(")", 1)[-1].split()[0]
    return state not in ("Z", "X")


def start_guard(run_dir: str) -> int | None:
    """Start the watchdog beside the job when the run directory has a ``guard.json``."""
    if not os.path.exists(os.path.join(run_dir, "guard.json")):
        return None
    guard = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fleetrun_guard.py")
    with open(os.path.join(run_dir, "guard.json"), encoding="utf-8") as fh:
        run_id = json.load(fh)["run_id"]
    env = {**os.environ, "FLEETRUN_RUN_ID": run_id, "FLEETRUN_GUARD": "1"}
    return _spawn([sys.executable, guard, run_dir], run_dir, "guard.log", env)


def _spawn(argv: list[str], run_dir: str, log_name: str, env: dict[str, str] | None = None) -> int:
    """Start detached: own session, stdio on a log file, so it outlives the SSH session."""
    with open(os.path.join(run_dir, log_name), "ab") as log:
        proc = subprocess.Popen(
            argv,
            cwd=run_dir,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
            env=env,
        )
    return proc.pid


def start(run_dir: str) -> int:
    pid = _spawn(["sh", "-c", WRAPPER], run_dir, "node.log")
    with open(os.path.join(run_dir, "pid.tmp"), "w") as fh:
        fh.write(str(pid))
    os.replace(os.path.join(run_dir, "pid.tmp"), os.path.join(run_dir, "pid"))
    print(json.dumps({"pid": pid, "guard": start_guard(run_dir)}))
    return 0


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except OSError:
        return None


def _tail(path: str, size: int) -> str:
    """The last ``size`` bytes of a file, without reading a long log whole at every poll."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - size))
            return fh.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def _touch(path: str) -> None:
    with open(path, "a", encoding="utf-8"):
        pass
    os.utime(path, None)


def poll(run_dir: str, offset: int, heartbeat: bool = True) -> int:
    print(json.dumps(poll_answer(run_dir, offset, heartbeat)))
    return 0


def serve(run_dir: str, idle_s: float = SERVE_IDLE_S) -> int:
    """Answer poll requests until the watcher goes away.

    Starting Python on every node at every poll cost ~20 ms of CPU per node: 1.4 s a round at 64
    local-fleet nodes. One long-lived agent per node answers a request in well under a millisecond.
    Exits on EOF (the watcher closed its channel) or when no request came for ``idle_s``.
    """
    fd = sys.stdin.fileno()
    out = sys.stdout
    pending = b""
    while True:
        # raw reads with our own buffer: select() cannot see lines a buffered reader already holds
        while b"\n" not in pending:
            ready, _, _ = select.select([fd], [], [], idle_s)
            if not ready:
                return 0
            chunk = os.read(fd, 4096)
            if not chunk:
                return 0
            pending += chunk
        line, pending = pending.split(b"\n", 1)
        parts = line.decode("ascii", "replace").split()
        if len(parts) >= 2 and parts[0] == "poll" and parts[1].isdigit():
            answer = poll_answer(run_dir, int(parts[1]), heartbeat="--no-heartbeat" not in parts)
        else:
            answer = {"error": f"unknown request {line[:60]!r}"}
        out.write(json.dumps(answer) + "\n")
        out.flush()


def poll_answer(run_dir: str, offset: int, heartbeat: bool = True) -> dict[str, object]:
    """One short answer: process state, exit code, new metrics bytes, final status, log tail.

    Also refreshes ``watcher-heartbeat``: the on-node watchdog takes over when it goes stale.
    """
    answer: dict[str, object] = {
        "state": "absent",
        "rc": None,
        "offset": offset,
        "metrics_b64": "",
        "status": None,
    }
    if not os.path.isdir(run_dir):
        return answer
    rc_text = _read(os.path.join(run_dir, "rc"))
    pid_text = _read(os.path.join(run_dir, "pid"))
    if rc_text is not None and rc_text.strip():
        answer["state"] = "exited"
        answer["rc"] = int(rc_text.strip())
        answer["exited_at"] = os.stat(os.path.join(run_dir, "rc")).st_mtime
    elif pid_text is not None and pid_text.strip():
        answer["state"] = "running" if _alive(int(pid_text)) else "vanished"
    metrics_path = os.path.join(run_dir, "metrics.jsonl")
    try:
        with open(metrics_path, "rb") as fh:
            fh.seek(offset)
            chunk = fh.read(MAX_CHUNK)
        # raw bytes: a chunk may end inside a multi-byte character; the laptop reassembles lines
        answer["metrics_b64"] = base64.b64encode(chunk).decode("ascii")
        answer["offset"] = offset + len(chunk)
    except OSError:
        pass
    if heartbeat:
        _touch(os.path.join(run_dir, "watcher-heartbeat"))
    status = _read(os.path.join(run_dir, "status.json"))
    if status:
        try:
            answer["status"] = json.loads(status)
        except ValueError:
            answer["status"] = None
    answer["log_tail"] = _tail(os.path.join(run_dir, "node.log"), 2000)
    answer["gpu_util"] = gpu_utilization()
    return answer


def upload(run_dir: str, bucket: object, cloud: object, run_id: str, node: str) -> str:
    """Copy the run directory to ``<bucket>/runs/<run id>/<node>/`` with the node's own cloud role.

    Used by the watchdog before a power-off and by the watcher for cloud fleets; a missing CLI or
    a failed copy is reported in the returned sentence, never raised.
    """
    if not bucket:
        return "no bucket configured; artifacts stay on the node's disk"
    dest = f"runs/{run_id}/{node}"
    if cloud == "gcp" and shutil.which("gcloud"):
        argv = ["gcloud", "storage", "rsync", "--recursive", run_dir, f"gs://{bucket}/{dest}"]
    elif shutil.which("aws"):
        argv = ["aws", "s3", "sync", "--only-show-errors", run_dir, f"s3://{bucket}/{dest}"]
    else:
        return f"no aws/gcloud CLI on this node; could not upload to {bucket}"
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=3600, check=False)
    if proc.returncode != 0:
        return f"upload to {bucket} failed: {proc.stderr.strip()[-300:]}"
    return f"uploaded to {bucket}/{dest}"


def gpu_utilization() -> float | None:
    """Mean GPU utilisation in percent from nvidia-smi; None without GPUs (or without the tool)."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        ).stdout
        values = [float(v) for v in out.split() if v.strip()]
    except (OSError, ValueError, subprocess.SubprocessError):
        return None
    return sum(values) / len(values) if values else None


def _run_pids(run_id: str, watchdogs: bool | None = None) -> list[int]:
    """Live processes carrying ``FLEETRUN_RUN_ID=run_id``; ``watchdogs`` selects guards (True),
    job processes (False) or both (None)."""
    marker = f"FLEETRUN_RUN_ID={run_id}".encode()
    me = os.getpid()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                env = fh.read().split(b"\0")
        except OSError:
            continue
        if marker not in env or not _alive(int(entry)):
            continue
        if watchdogs is None or (b"FLEETRUN_GUARD=1" in env) == watchdogs:
            pids.append(int(entry))
    return pids


def stop(run_id: str, grace: float) -> int:
    answer = stop_run(run_id, grace)
    print(json.dumps(answer))
    return 0 if not answer["remaining"] else 1


def stop_run(run_id: str, grace: float, spare: int | None = None) -> dict[str, int]:
    """SIGTERM everything of the run, wait ``grace`` seconds, then SIGKILL what is left.

    ``spare`` is a pid not to touch (the watchdog stopping the run it belongs to).
    """
    guards = [p for p in _run_pids(run_id, watchdogs=True) if p != spare]
    found = [p for p in _run_pids(run_id) if p != spare]
    for pid in found:
        try:
            os.kill(pid, signal.SIGCONT)
            os.kill(pid, signal.SIGTERM)
        except OSError:
            pass
    deadline = time.time() + grace
    left = found
    while left and time.time() < deadline:
        time.sleep(0.1)
        left = [p for p in left if _alive(p)]
    killed = []
    for pid in _run_pids(run_id):
        if pid == spare:
            continue
        try:
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        except OSError:
            pass
    time.sleep(0.05)
    remaining = [p for p in _run_pids(run_id) if p != spare]
    return {
        "terminated": len(set(found) - set(guards)),
        "watchdogs": len(guards),
        "killed": len(killed),
        "remaining": len(remaining),
    }


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[0] == "start":
        return start(argv[1])
    if len(argv) >= 3 and argv[0] == "poll":
        return poll(argv[1], int(argv[2]), heartbeat="--no-heartbeat" not in argv)
    if len(argv) >= 2 and argv[0] == "serve":
        return serve(argv[1])
    if len(argv) >= 2 and argv[0] == "guard":
        print(json.dumps({"guard": start_guard(argv[1])}))
        return 0
    if len(argv) >= 6 and argv[0] == "upload":
        message = upload(argv[1], argv[2], argv[3], argv[4], argv[5])
        print(json.dumps({"upload": message, "ok": message.startswith("uploaded")}))
        return 0
    if len(argv) >= 2 and argv[0] == "stop":
        return stop(argv[1], float(argv[2]) if len(argv) > 2 else 10.0)
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
