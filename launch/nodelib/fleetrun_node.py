#!/usr/bin/env python3
"""fleetrun's node agent: starts, polls and stops one run on this node. Standard library only.

The laptop calls it over SSH. Keeping this logic on the node makes each poll one short command
with one short JSON answer, whatever the number of files or processes involved. Every message
in and out is a record of ``fleetrun_protocol.py`` (shipped beside this file).

  fleetrun_node.py receive RUN_DIR        write a bundle read on stdin into RUN_DIR (files 0600,
                                          dirs 0700): scripts and secrets never go in a command line
  fleetrun_node.py start RUN_DIR [--stdin]
                                          start RUN_DIR/launch.sh detached (and the watchdog,
                                          fleetrun_guard.py, when RUN_DIR/guard.json exists);
                                          --stdin: receive the files first, in the same call
  fleetrun_node.py poll RUN_DIR OFFSET [--no-heartbeat]
                                          state, exit code, new metrics bytes since OFFSET, status
  fleetrun_node.py serve RUN_DIR          answer poll requests, a JSON line each, on stdin until EOF
                                          or 10 idle minutes (the watcher's persistent channel)
  fleetrun_node.py events RUN_DIR         answer wait requests, a JSON line each, the moment the job
                                          exits (or when the wait runs out): the watcher's event channel
  fleetrun_node.py guard RUN_DIR [--stdin]
                                          start only the watchdog (nodes whose ranks the head starts)
  fleetrun_node.py upload RUN_DIR REQUEST copy the run directory with the command in REQUEST (an
                                          UploadRequest computed on the laptop: no cloud logic here)
  fleetrun_node.py stop RUN_ID [GRACE [--only-if-stepping]]
                                          stop every process carrying FLEETRUN_RUN_ID=RUN_ID (the
                                          watchdog too), then remove the run's tmp (its TMPDIR);
                                          --only-if-stepping: no grace once no rank still steps

Everything it reads on the node was written by the job or can be overwritten by it (``rc``,
``pid``, ``status.json``, ``metrics.jsonl``), so it is read with a size bound and parsed through
the protocol; what does not parse is reported in the answer's ``malformed`` list. A node whose
files are garbage must still answer, or the watcher would take a healthy node for a lost one.

Processes are found by the ``FLEETRUN_RUN_ID`` variable in their environment, not by pid or
process group: torchrun starts its workers in sessions of their own, so killing torchrun alone
leaves them running (checked on the local fleet).
"""

from __future__ import annotations

import contextlib
import math
import os
import select
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, BinaryIO, TypeVar

if not __package__:  # on a node, beside the other files in ~/.fleetrun/lib (not as launch.nodelib)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
if TYPE_CHECKING or __package__:  # one module per file: launch.nodelib.X here, X on a node
    from launch.nodelib import (
        fleetrun_containers,
        fleetrun_gpu,
        fleetrun_procs,
        fleetrun_rankwatch,
        fleetrun_stepping,
    )
    from launch.nodelib import fleetrun_protocol as protocol
else:
    import fleetrun_containers  # noqa: E402 - beside this file in ~/.fleetrun/lib
    import fleetrun_gpu  # noqa: E402 - beside this file in ~/.fleetrun/lib
    import fleetrun_procs  # noqa: E402 - beside this file in ~/.fleetrun/lib
    import fleetrun_protocol as protocol  # noqa: E402 - beside this file in ~/.fleetrun/lib
    import fleetrun_rankwatch  # noqa: E402 - beside this file in ~/.fleetrun/lib
    import fleetrun_stepping  # noqa: E402 - beside this file in ~/.fleetrun/lib

RUN_TMP = "tmp"
"""The job's ``TMPDIR`` in its run dir (torchrun's ``torchelastic_*``): removed when the job ends."""
WRAPPER = f'sh ./launch.sh; rc=$?; rm -rf ./{RUN_TMP}; echo "$rc" > rc.tmp; mv rc.tmp rc; exit "$rc"'
MAX_CHUNK = protocol.MAX_CHUNK
SERVE_IDLE_S = 600.0
SMALL_FILE = 64
"""``rc`` and ``pid`` hold one number; more than this many bytes is not one."""
LOG_TAIL_BYTES = 2000
WRAPPER_WAIT_S = 5.0
"""After a stop, how long the run's wrapper may still take to write its exit code (launch.sh goes on
after its job ended) before its process group is killed, when the stop's grace is already over."""
GPU_READ_EVERY_S = 1.0
"""The GPU counters are read at most this often (nvidia-smi takes a few hundred ms on 8 GPUs);
polls in between get the last reading, so a fault shows within one poll of the next reading."""
_gpu_cache: dict[str, object] = {"at": 0.0, "reading": None, "background": False}


def _alive(pid: int) -> bool:
    """True when the process exists and is not a zombie (``kill -0`` says yes to zombies)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as fh:
            line = fh.read(4096)
    except OSError:
        return False
    fields = line.rsplit(")", 1)[-1].split()
    return bool(fields) and fields[0] not in ("Z", "X")


def _read_bounded(path: str, limit: int) -> bytes | None:
    """At most ``limit + 1`` bytes of a file (one more than allowed, so "too big" shows), or None.

    Only a regular file is read: the run folder is the job's to write in (its ``pace/`` files,
    its metrics), and a FIFO put where a file is expected would block a plain ``open`` until a
    writer came, hanging the agent's answer to every poll. Opened without blocking, then checked.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        with os.fdopen(fd, "rb") as fh:
            fd = -1
            return fh.read(limit + 1)
    except OSError:
        return None
    finally:
        if fd >= 0:
            os.close(fd)


def _read(path: str, limit: int = SMALL_FILE) -> str | None:
    data = _read_bounded(path, limit)
    return None if data is None else data.decode("utf-8", errors="replace")


def _shown(data: bytes | str) -> str:
    return repr(data[:40]) + ("..." if len(data) > 40 else "")


def read_guard_config(run_dir: str) -> protocol.GuardConfig:
    """``guard.json``, parsed; a missing or malformed file is a ``ProtocolError``."""
    data = _read_bounded(os.path.join(run_dir, "guard.json"), protocol.MAX_GUARD_CONFIG_BYTES)
    if data is None:
        raise protocol.ProtocolError("guard.json: cannot be read")
    return protocol.GuardConfig.from_json(data)


def start_guard(run_dir: str) -> tuple[int | None, str]:
    """Start the watchdog beside the job when the run directory has a ``guard.json``.

    Returns its pid and, when it could not be started (a malformed ``guard.json``), why.
    """
    if not os.path.exists(os.path.join(run_dir, "guard.json")):
        return None, ""
    try:
        config = read_guard_config(run_dir)
    except protocol.ProtocolError as exc:
        return None, str(exc)
    guard = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fleetrun_guard.py")
    env = {**os.environ, "FLEETRUN_RUN_ID": config.run_id, "FLEETRUN_GUARD": "1"}
    return _spawn([sys.executable, guard, run_dir], run_dir, "guard.log", env), ""


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


def private_dir(run_dir: str) -> None:
    """Create ``run_dir`` mode 0700, and make ``~/.fleetrun`` (and its ``runs``) 0700 too.

    Other users of a lab machine must not read a run's ``launch.sh`` (environment values) or
    its outputs; a directory they cannot enter protects every file in it, whatever its mode.
    """
    os.makedirs(run_dir, mode=0o700, exist_ok=True)
    root = os.path.realpath(os.path.expanduser("~/.fleetrun"))
    path = os.path.realpath(run_dir)
    dirs = [path]
    parent = os.path.dirname(path)
    while (parent == root or parent.startswith(root + os.sep)) and parent not in dirs:
        dirs.append(parent)
        parent = os.path.dirname(parent)
    for directory in dirs:
        os.chmod(directory, 0o700)


def write_private(path: str, content: str) -> None:
    """Write a file that is 0600 from its creation on (never readable by others, not even briefly)."""
    tmp = f"{path}.tmp{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(content)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def receive(run_dir: str, stream: BinaryIO | None = None) -> list[str]:
    """Write the ``FileBundle`` read from stdin into ``run_dir``; returns the names written."""
    source = sys.stdin.buffer if stream is None else stream
    data = source.read(protocol.MAX_BUNDLE_BYTES + 1)
    bundle = protocol.FileBundle.from_json(data)
    private_dir(run_dir)
    for name, content in sorted(bundle.files.items()):
        write_private(os.path.join(run_dir, name), content)
    return sorted(bundle.files)


def start(run_dir: str) -> protocol.StartAnswer:
    private_dir(run_dir)
    for name in ("rc", fleetrun_rankwatch.RANK_RC):  # an earlier start's: this one's has not run yet
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(run_dir, name))
    pid = _spawn(["sh", "-c", WRAPPER], run_dir, "node.log")
    write_private(os.path.join(run_dir, "pid"), str(pid))
    guard, error = start_guard(run_dir)
    return protocol.StartAnswer(pid=pid, guard=guard, guard_error=error)


def _tail(path: str, size: int) -> str:
    """The last ``size`` bytes of a file, without reading a long log whole at every poll."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - size))
            return fh.read(size).decode("utf-8", errors="replace")
    except OSError:
        return ""


def _touch(path: str) -> None:
    with open(path, "a", encoding="utf-8"):
        pass
    os.utime(path, None)


TOO_LONG = f"request longer than {protocol.MAX_REQUEST_BYTES} bytes; dropped"


class RequestLines:
    """Request lines of a channel (the poll channel, the event channel), read raw from its
    descriptor with a buffer of our own: select() cannot see lines a buffered reader already
    holds. A line longer than ``MAX_REQUEST_BYTES`` is dropped whole (``too_long``)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.pending = b""
        self.too_long = False

    def next(self, idle_s: float) -> bytes | None:
        """The next line; None at end of input or after ``idle_s`` with nothing to read."""
        self.too_long = False
        while b"\n" not in self.pending:
            if len(self.pending) > protocol.MAX_REQUEST_BYTES:
                self.too_long, self.pending = True, b""
            ready, _, _ = select.select([self.fd], [], [], idle_s)
            if not ready:
                return None
            chunk = os.read(self.fd, 65536)
            if not chunk:
                return None
            self.pending += chunk
        line, self.pending = self.pending.split(b"\n", 1)
        return line


def serve(run_dir: str, idle_s: float = SERVE_IDLE_S) -> int:
    """Answer poll requests until the watcher goes away.

    Starting Python on every node at every poll cost ~20 ms of CPU per node: 1.4 s a round at 64
    local-fleet nodes. One long-lived agent per node answers a request in well under a millisecond.
    Exits on EOF (the watcher closed its channel) or when no request came for ``idle_s``.
    A request line longer than ``MAX_REQUEST_BYTES`` is dropped and answered with an error; an
    error while answering is an error answer, never the end of the channel.
    """
    start_gpu_reader()
    requests = RequestLines(sys.stdin.fileno())
    out = sys.stdout
    while True:
        line = requests.next(idle_s)
        if line is None:
            return 0
        answer = protocol.PollAnswer(error=TOO_LONG) if requests.too_long else answer_request(run_dir, line)
        try:
            out.write(answer.to_json() + "\n")
            out.flush()
        except OSError:
            return 0  # the watcher is gone


WAIT_TICK_S = 0.05
"""Without a pidfd (Linux before 5.3, Python before 3.9) the job's state is read this often."""


def wait_for_change(
    run_dir: str, request: protocol.WaitRequest, stdin_fd: int | None = None
) -> protocol.WaitAnswer:
    """Hold until the job's state is no longer ``request.seen`` or ``request.wait_s`` ran out.

    The run's wrapper writes ``rc`` and then ends, so its end (a pidfd: no polling, no delay)
    is the moment the exit can be read; without a pidfd the state is read every ``WAIT_TICK_S``.
    A failed rank is seen earlier still (``fleetrun_rankwatch``): the node's state is then
    ``exited`` with the rank's exit code while torchrun is still shutting down. End of input on
    ``stdin_fd`` (the watcher went away) ends the wait too."""
    deadline = time.monotonic() + request.wait_s
    notes: list[str] = []
    wrapper = _wrapper_of(run_dir) if os.path.isdir(run_dir) else None
    pidfd = fleetrun_rankwatch.pidfd(wrapper)
    ranks = (
        fleetrun_rankwatch.RankWatch(run_dir, wrapper, _read, write_private)
        if wrapper is not None and request.seen == "running"
        else None
    )
    try:
        while True:
            now = time.monotonic()
            if ranks is not None and pidfd is not None:
                ranks.scan(now)
            state, rc, _at = (
                _process_state(run_dir, notes) if os.path.isdir(run_dir) else ("absent", None, None)
            )
            left = deadline - now
            if state != request.seen or left <= 0:
                return protocol.WaitAnswer(state=state, rc=rc)
            rank_fds = ranks.descriptors if ranks is not None and pidfd is not None else []
            watched = [fd for fd in (pidfd, stdin_fd) if fd is not None] + rank_fds
            tick = left if pidfd is not None else min(left, WAIT_TICK_S)
            if ranks is not None and pidfd is not None:
                tick = min(tick, max(0.0, ranks.next_scan - now), WAIT_TICK_S if ranks.polled else tick)
            ready, _, _ = select.select(watched, [], [], tick) if watched else ([], [], [])
            if not watched:
                time.sleep(tick)
            if stdin_fd is not None and stdin_fd in ready:
                return protocol.WaitAnswer(state=state, rc=rc)  # input or its end: answer now
            if ranks is not None and pidfd is not None:
                ranks.ready(ready)
            if pidfd is not None and pidfd in ready:
                os.close(pidfd)
                pidfd = None  # the wrapper ended: the next read finds its ``rc``
    finally:
        if pidfd is not None:
            os.close(pidfd)
        if ranks is not None:
            ranks.close()


def events(run_dir: str, idle_s: float = SERVE_IDLE_S) -> int:
    """Answer ``WaitRequest`` lines on stdin, each when the job's state changed or its wait ran
    out, until end of input or ``idle_s`` without a request: the watcher's event channel, so a
    rank's exit reaches the laptop the moment it happens instead of at the next poll."""
    requests = RequestLines(sys.stdin.fileno())
    while True:
        line = requests.next(idle_s)
        if line is None:
            return 0
        try:
            if requests.too_long:
                raise protocol.ProtocolError(TOO_LONG)
            request = protocol.WaitRequest.from_json(line)
            answer = wait_for_change(run_dir, request, None if requests.pending else requests.fd)
        except protocol.ProtocolError as exc:
            answer = protocol.WaitAnswer(error=f"unknown request: {exc}")
        except Exception as exc:  # noqa: BLE001 - the channel must outlive any one bad answer
            answer = protocol.WaitAnswer(error=f"the node agent failed to wait: {type(exc).__name__}: {exc}")
        try:
            sys.stdout.write(answer.to_json() + "\n")
            sys.stdout.flush()
        except OSError:
            return 0


def answer_request(run_dir: str, line: bytes) -> protocol.PollAnswer:
    """One request line of the poll channel, answered; whatever goes wrong becomes an error answer."""
    try:
        request = protocol.PollRequest.from_json(line)
    except protocol.ProtocolError as exc:
        return protocol.PollAnswer(error=f"unknown request: {exc}")
    try:
        return poll_answer(run_dir, request.offset, request.heartbeat)
    except Exception as exc:  # noqa: BLE001 - the channel must outlive any one bad answer
        return protocol.PollAnswer(error=f"the node agent failed to answer: {type(exc).__name__}: {exc}")


def _process_state(run_dir: str, notes: list[str]) -> tuple[str, int | None, float | None]:
    """(state, exit code, exit time) from ``rc`` and ``pid``; unreadable values become notes.

    An ``rc`` that is not a number is not an exit: the process state decides, and a process
    gone without a readable exit code is ``vanished`` (the watcher fails the run for that).
    """
    failed = fleetrun_rankwatch.rank_failure(run_dir, _read, notes)
    if failed is not None:
        return "exited", failed[0], failed[1]
    rc_path = os.path.join(run_dir, "rc")
    rc_text = _read(rc_path)
    if rc_text is not None and rc_text.strip():
        rc = protocol.parse_exit_code(rc_text)
        if rc is not None:
            try:
                exited_at: float | None = os.stat(rc_path).st_mtime
            except OSError:
                exited_at = None
            return "exited", rc, exited_at
        notes.append(f"rc: {_shown(rc_text)} is not an exit code")
    pid_text = _read(os.path.join(run_dir, "pid"))
    if pid_text is not None and pid_text.strip():
        pid = protocol.parse_pid(pid_text)
        if pid is None:
            notes.append(f"pid: {_shown(pid_text)} is not a process id")
            return "vanished", None, None
        return ("running" if _alive(pid) else "vanished"), None, None
    if rc_text is not None and rc_text.strip():
        return "vanished", None, None
    return "absent", None, None


_Record = TypeVar("_Record")


def _read_record(
    run_dir: str, name: str, limit: int, parse: Callable[[bytes], _Record], notes: list[str]
) -> _Record | None:
    """One small JSON record of the run directory parsed through the protocol, or None.

    ``status.json`` (the job's final record) and ``preempt.json`` (the watchdog's record of a
    preemption notice): absent is None, malformed is a note, never an exception.
    """
    data = _read_bounded(os.path.join(run_dir, name), limit)
    if not data:
        return None
    try:
        return parse(data)
    except protocol.ProtocolError as exc:
        notes.append(str(exc))
        return None


def poll_answer(run_dir: str, offset: int, heartbeat: bool = True) -> protocol.PollAnswer:
    """One short answer: process state, exit code, new metrics bytes, final status, log tail.

    Also refreshes ``watcher-heartbeat``: the on-node watchdog takes over when it goes stale.
    """
    if not os.path.isdir(run_dir):
        return protocol.PollAnswer(offset=offset)
    notes: list[str] = []
    state, rc, exited_at = _process_state(run_dir, notes)
    chunk = b""
    try:
        with open(os.path.join(run_dir, "metrics.jsonl"), "rb") as fh:
            fh.seek(offset)
            # raw bytes: a chunk may end inside a multi-byte character; the laptop reassembles lines
            chunk = fh.read(MAX_CHUNK)
    except OSError:
        pass
    if heartbeat:
        _touch(os.path.join(run_dir, "watcher-heartbeat"))
    limit = protocol.MAX_SMALL_ANSWER_BYTES
    gpu = gpu_reading()
    preempted = _read_record(run_dir, "preempt.json", limit, protocol.PreemptionNotice.from_json, notes)
    return protocol.PollAnswer(
        state=state,
        rc=rc,
        offset=offset + len(chunk),
        metrics=chunk,
        status=_read_record(
            run_dir, "status.json", protocol.MAX_STATUS_BYTES, protocol.StatusRecord.from_json, notes
        ),
        exited_at=exited_at,
        log_tail=_tail(os.path.join(run_dir, "node.log"), LOG_TAIL_BYTES),
        gpu_util=mean_utilization(gpu) if gpu is not None else fleetrun_gpu.smi_utilization(),
        gpu=gpu,
        pace=pace_reading(run_dir),
        malformed=tuple(notes[: protocol.MAX_NOTES]),
        preempted=preempted,
        stopped=stopped_processes(run_dir) if state == "running" else 0,
    )


def stopped_processes(run_dir: str) -> int:
    """How many processes of the job's tree (under its wrapper) are stopped by a signal
    (``fleetrun_procs.stopped_in_tree``): ranks that hold a collective forever while looking alive."""
    root = _wrapper_of(run_dir)
    return 0 if root is None else fleetrun_procs.stopped_in_tree(root)


def upload(run_dir: str, argv: Sequence[str], env: Mapping[str, str] | None = None) -> protocol.UploadAnswer:
    """Copy the run directory with ``argv`` (``{src}`` = the run directory), the node's own role;
    ``env`` is added to its environment (a key never goes on its command line).

    The command comes from the laptop (``bucket_upload_argv``), so the node knows no cloud.
    Used by the watchdog before a power-off and by the watcher for cloud fleets; a missing CLI or
    a failed copy is reported in the answer, never raised.
    """
    if not argv:
        return protocol.UploadAnswer("no bucket configured; artifacts stay on the node's disk", False)
    if shutil.which(argv[0]) is None:
        return protocol.UploadAnswer(
            f"no {argv[0]} CLI on this node; could not upload the run directory", False
        )
    command = [arg.replace("{src}", run_dir) for arg in argv]
    try:
        proc = subprocess.run(
            command,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=3600,
            check=False,
            env={**os.environ, **env} if env else None,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return protocol.UploadAnswer(f"upload to {command[-1]} failed: {exc}", False)
    if proc.returncode != 0:
        return protocol.UploadAnswer(f"upload to {command[-1]} failed: {proc.stderr.strip()[-300:]}", False)
    return protocol.UploadAnswer(f"uploaded to {command[-1]}", True)


def _read_gpus_forever() -> None:
    while True:
        try:
            _gpu_cache["reading"] = fleetrun_gpu.read_health(full=False)
        except Exception:  # noqa: BLE001 - no reading this round; the poll answers go on
            _gpu_cache["reading"] = None
        _gpu_cache["at"] = time.monotonic()
        time.sleep(GPU_READ_EVERY_S)


def start_gpu_reader() -> str | None:
    """In ``serve``: read the GPU counters in a thread of their own, so a slow or hung reader
    (a failing GPU can make nvidia-smi take seconds) never delays a poll answer: answers carry the
    latest reading. Started wherever ``fleetrun_gpu.reader_available`` finds NVML or nvidia-smi;
    None when it runs, else why it did not start (no reader on this node)."""
    if _gpu_cache["background"]:
        return None
    reader, why_not = fleetrun_gpu.reader_available()
    if reader is None:
        return why_not
    _gpu_cache["background"] = True
    threading.Thread(target=_read_gpus_forever, name="gpu-reader", daemon=True).start()
    return None


def gpu_reading(now: float | None = None) -> dict | None:
    """The GPU health counters (``fleetrun_gpu``, without its slow reads), at most every
    ``GPU_READ_EVERY_S``; None on a node with neither NVML nor nvidia-smi. A failing reader is
    no reading."""
    if _gpu_cache["background"]:
        reading = _gpu_cache["reading"]
        return reading if isinstance(reading, dict) else None
    if fleetrun_gpu.reader_available()[0] is None:
        return None
    now = time.monotonic() if now is None else now
    at = _gpu_cache["at"]
    if _gpu_cache["reading"] is None or not isinstance(at, float) or now - at >= GPU_READ_EVERY_S:
        try:
            _gpu_cache["reading"] = fleetrun_gpu.read_health(full=False)
        except Exception:  # noqa: BLE001 - the poll must be answered whatever nvidia-smi does
            _gpu_cache["reading"] = None
        _gpu_cache["at"] = now
    reading = _gpu_cache["reading"]
    return reading if isinstance(reading, dict) else None


PACE_MAX_RANKS = 64
PACE_MAX_AGE_S = 1e6
"""Ages are reported up to this (11 days); a stalled rank's report is kept, never dropped."""


def pace_reading(run_dir: str, now: float | None = None) -> dict | None:
    """This node's pace from its ranks' ``pace/<rank>.json`` (``fleetrun_metrics.Pace``): the
    slowest local rank's probe time and steps/s, and ``age_s``, how long ago the stalest rank
    wrote. A rank that stopped stepping keeps its last report, growing old: the watcher counts the
    node as stalled (``launch.rules.stragglers.stalled``) instead of losing sight of it. Reports
    older than this launch of the job (``pid``'s time) are an earlier attempt's and skipped. Files
    are the job's: read bounded, and what does not parse is skipped. None when no rank wrote one."""
    now = time.time() if now is None else now
    folder = os.path.join(run_dir, "pace")
    try:
        names = sorted(n for n in os.listdir(folder) if n.endswith(".json"))[:PACE_MAX_RANKS]
    except OSError:
        return None
    try:
        launched = os.stat(os.path.join(run_dir, "pid")).st_mtime - 1.0
    except OSError:
        launched = 0.0
    probes: list[float] = []
    rates: list[float] = []
    ages: list[float] = []
    for name in names:
        data = _read_bounded(os.path.join(folder, name), 1024)
        try:
            record = protocol.decode(data or b"", 1024, "pace")
        except protocol.ProtocolError:
            continue
        if not isinstance(record, dict):
            continue
        at, probe, rate = record.get("time"), record.get("probe_ms"), record.get("steps_per_s")
        if isinstance(at, bool) or not isinstance(at, (int, float)) or not math.isfinite(at):
            continue
        if at < launched or not isinstance(probe, (int, float)) or isinstance(probe, bool):
            continue
        if not (math.isfinite(probe) and 0 < probe < 1e6):
            continue
        probes.append(float(probe))
        ages.append(min(max(0.0, now - at), PACE_MAX_AGE_S))
        if isinstance(rate, (int, float)) and math.isfinite(rate) and 0 <= rate < 1e6:
            rates.append(float(rate))
    if not probes:
        return None
    return {
        "probe_ms": max(probes),
        "steps_per_s": min(rates) if rates else None,
        "ranks": len(probes),
        "age_s": round(max(ages), 2),
    }


def mean_utilization(reading: dict) -> float | None:
    values = [g.get("util") for g in reading.get("gpus", []) if isinstance(g, dict)]
    known = [float(v) for v in values if isinstance(v, (int, float)) and 0 <= v <= 100]
    return sum(known) / len(known) if known else None


def _run_pids(run_id: str, watchdogs: bool | None = None) -> list[int]:
    return fleetrun_procs.run_pids(run_id, watchdogs)


def _wrapper_of(run_dir: str) -> int | None:
    """The run's wrapper (``WRAPPER``, which ``start`` left in ``pid``) while it runs; None for a
    pid now of another process (cmdline and working directory are checked), or no wrapper."""
    pid = protocol.parse_pid(_read(os.path.join(run_dir, "pid")))
    if pid is None or not _alive(pid):
        return None
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            argv = fh.read(len(WRAPPER) + 64).split(b"\0")
        cwd = os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return None
    if argv[:3] != [b"sh", b"-c", WRAPPER.encode()] or cwd != os.path.realpath(run_dir):
        return None
    return pid


def _end_wrapper(pid: int, deadline: float) -> None:
    """Wait for the run's wrapper to write its exit code and end; past ``deadline`` (and at least
    ``WRAPPER_WAIT_S`` from now) kill its process group, launch.sh with it: then it writes nothing.

    The wrapper carries no ``FLEETRUN_RUN_ID`` (launch.sh exports it), so the stop does not find
    it, and it writes ``rc`` once launch.sh ends. Recovery moves an attempt's files away right
    after the stop and then starts the next attempt in the same directory: an exit code written
    after the stop returned would be read as the next attempt's."""
    until = max(deadline, time.time() + WRAPPER_WAIT_S)
    while _alive(pid) and time.time() < until:
        time.sleep(0.05)
    if not _alive(pid):
        return
    try:
        os.killpg(pid, signal.SIGKILL)  # a session of its own (``_spawn``): its group is the run's
    except OSError:
        return
    until = time.time() + 5.0
    while _alive(pid) and time.time() < until:
        time.sleep(0.02)


def stop_run(
    run_id: str, grace: float, spare: int | None = None, only_if_stepping: bool = False
) -> protocol.StopAnswer:
    """SIGTERM everything of the run, wait ``grace`` seconds, then SIGKILL what is left; then wait
    for the run's wrapper to end (``_end_wrapper``), so that nothing of this start writes into the
    run directory once the stop has returned.

    A run with ``container:`` also has its containers stopped by the runtime, with the same grace,
    and removed (``fleetrun_containers``); one that could not be removed counts in ``remaining``.

    ``spare`` is a pid not to touch (the watchdog stopping the run it belongs to).
    ``only_if_stepping`` (recovery): no more grace once no rank steps (``fleetrun_stepping``).
    Either way the grace ends once only launchers, shells and the watchdog are left
    (``fleetrun_procs.holds_nothing``): a killed rank's torchrun took a second or more to end after SIGTERM,
    every stop of a run whose ranks had already failed waited for it.
    """
    run_dir = os.path.join(os.path.expanduser("~"), ".fleetrun", "runs", run_id)
    wrapper = _wrapper_of(run_dir) if protocol.is_name(run_id) else None
    launched = fleetrun_stepping.launched_at(run_dir) if protocol.is_name(run_id) else 0.0
    runtime = fleetrun_containers.runtime_of(run_dir) if protocol.is_name(run_id) else None
    containers = fleetrun_containers.begin_stop(runtime, run_id, grace)
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
    ranks: fleetrun_stepping.Ranks | None = None
    cut_short = False
    ranks_gone = False
    while left and time.time() < deadline:
        if only_if_stepping and protocol.is_name(run_id):
            ranks = fleetrun_stepping.read_ranks(run_dir, time.time(), launched)
            if ranks.none_stepping:
                cut_short = True
                break
        if all(fleetrun_procs.holds_nothing(p, WRAPPER) for p in left):
            ranks_gone = True  # only launchers, shells, the watchdog: their shutdown saves nothing
            break
        time.sleep(0.1)
        left = [p for p in left if _alive(p)]
    killed = []
    for pid in _run_pids(run_id):
        if pid == spare or (ranks_gone and pid == wrapper):
            continue  # the wrapper writes the exit code once its child is gone (``_end_wrapper``)
        try:
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        except OSError:
            pass
    time.sleep(0.05)
    if wrapper is not None and wrapper != spare:
        _end_wrapper(wrapper, deadline)
    left_containers = fleetrun_containers.finish_stop(runtime, run_id, containers, hurry=cut_short)
    remaining = [p for p in _run_pids(run_id) if p != spare]
    tmp = os.path.join(run_dir, RUN_TMP)
    if not remaining and protocol.is_name(run_id) and os.path.isdir(tmp) and not os.path.islink(tmp):
        shutil.rmtree(tmp, ignore_errors=True)  # the killed wrapper never removed its TMPDIR
    return protocol.StopAnswer(
        terminated=len(set(found) - set(guards)),
        watchdogs=len(guards),
        killed=len(killed),
        remaining=len(remaining) + left_containers,
        stepping=len(ranks.stepping) if ranks is not None else 0,
        blocked=len(ranks.blocked) if ranks is not None else 0,
        grace_cut=cut_short,
    )


def _say(line: str) -> int:
    print(line, flush=True)
    return 0


def _fail(message: str) -> int:
    print(f"fleetrun_node.py: {message}", file=sys.stderr)
    return 2


def main(argv: list[str]) -> int:
    command, args = (argv[0], argv[1:]) if argv else ("", [])
    from_stdin = "--stdin" in args
    args = [a for a in args if a != "--stdin"]
    try:
        if command in ("start", "guard", "receive") and len(args) == 1:
            if from_stdin or command == "receive":
                receive(args[0])
            if command == "receive":
                return 0
            if command == "start":
                return _say(start(args[0]).to_json())
            private_dir(args[0])
            pid, error = start_guard(args[0])
            return _say(protocol.StartAnswer(guard=pid, guard_error=error).to_json())
        if command == "poll" and len(args) in (2, 3):
            if not args[1].isdigit() or int(args[1]) > protocol.MAX_OFFSET:
                return _fail(f"poll: OFFSET must be a byte offset, got {args[1][:40]!r}")
            return _say(poll_answer(args[0], int(args[1]), heartbeat="--no-heartbeat" not in args).to_json())
        if command == "serve" and len(args) == 1:
            return serve(args[0])
        if command == "events" and len(args) == 1:
            return events(args[0])
        if command == "upload" and len(args) == 2:
            request = protocol.UploadRequest.from_json(args[1])
            return _say(upload(args[0], request.argv).to_json())
        if command == "stop" and len(args) in (1, 2, 3) and args[2:] in ([], ["--only-if-stepping"]):
            try:
                grace = float(args[1]) if len(args) > 1 else 10.0
            except ValueError:
                return _fail(f"stop: GRACE must be a number of seconds, got {args[1][:40]!r}")
            grace = min(max(grace, 0.0), 3600.0) if math.isfinite(grace) else 10.0
            answer = stop_run(args[0], grace, only_if_stepping=args[2:] == ["--only-if-stepping"])
            _say(answer.to_json())
            return 0 if not answer.remaining else 1
    except protocol.ProtocolError as exc:
        return _fail(str(exc))
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
