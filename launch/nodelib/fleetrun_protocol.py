"""The node protocol: every message between the laptop and a node, as typed, validated records.

Why one module: the laptop's watcher, the node agent, the on-node watchdog, the sync relay and
the metrics helper used to read each other's JSON with ``json.loads`` and ``dict[...]`` on both
ends. The two ends drifted (the watchdog read a key nothing wrote), and every reader trusted the
shape of what came in, so one odd line written by a training job (a 200 KB run of ``[``, which
makes ``json.loads`` raise ``RecursionError``) killed the watcher and the watchdog alike.

Here each message has one writer (``to_json``) and one reader (``from_json``) shared by both ends:
the laptop imports this file as ``launch.nodelib.fleetrun_protocol``, nodes as
``fleetrun_protocol`` from ``~/.fleetrun/lib`` next to the agent. (The ``fleetrun_`` prefix,
like the other shipped modules': ``~/.fleetrun/lib`` is first on the job's ``PYTHONPATH``, so a
plain ``protocol`` would shadow any module of that name the job imports.) Everything that comes from a node, a job or a file on a node
is untrusted, so ``from_json``:

* bounds the input before parsing it (bytes, JSON nesting depth found by a cheap scan *before*
  ``json.loads`` recurses, digits of an integer: Python 3.8 parses long digit runs in quadratic
  time), and bounds every string, list and number after;
* checks every field's type and range (a boolean is not a number, NaN is not a time);
* raises nothing but :class:`ProtocolError`, which callers count and report: a malformed message
  is never fatal to the process reading it.

Unknown keys are ignored (a newer laptop may add some); missing required keys are errors.
Free text (a status message, a log tail, an error) is truncated to its bound, not refused,
because losing a whole "failed" status over a long message would hide the failure itself.

Standard library only, and Python 3.8 at run time (nodes run whatever ``python3`` they have):
no ``X | Y`` outside annotations, no ``match``.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

# Wire rules and the relay's messages live in their own modules; everything is re-exported here,
# so callers import one module. Laptop: as ``launch.nodelib.*``; node: beside this file.
if TYPE_CHECKING or __package__:
    from launch.nodelib.fleetrun_bucket_messages import *  # noqa: F403
    from launch.nodelib.fleetrun_relay_messages import *  # noqa: F403
    from launch.nodelib.fleetrun_wire import *  # noqa: F403
else:  # pragma: no cover - the node side
    from fleetrun_bucket_messages import *  # type: ignore[no-redef]  # noqa: F403
    from fleetrun_relay_messages import *  # type: ignore[no-redef]  # noqa: F403
    from fleetrun_wire import *  # type: ignore[no-redef]  # noqa: F403


# -- messages -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GuardConfig:
    """``<run dir>/guard.json``: what the on-node watchdog (``fleetrun_guard.py``) enforces.

    Written by the laptop (``WatchTarget.guard_config``), read by the node agent (to start the
    watchdog with the run id) and the watchdog. Limits in seconds; None switches a rule off.
    ``expects_metrics``: this node should see the job's metrics appear (the startup-timeout
    rule); ``upload_argv``: the command that copies the run directory to the bucket, with
    ``{src}`` for the directory (empty: no bucket), and ``upload_env`` what it needs in its
    environment (the local fleet's S3 key): kept out of the argv, which every user of the node
    can read in ``ps``; this file is the run directory's (0700). The cloud-specific part of an upload is
    decided on the laptop, so nodes need no per-cloud logic. ``bucket``: the run's checkpoint
    storage commands (``fleetrun_checkpoint``; None: checkpoints stay on the node);
    ``preemption``: which notice poller the watchdog runs (one of ``POLLERS``, "" for none),
    against ``metadata_address``; ``notice_window_s``: how long the cloud gives after a notice
    (None: the poller's own, 120 s for EC2 spot, 30 s for GCE).
    """

    run_id: str
    node: str
    started_at: float
    peers: tuple[str, ...] = ()
    peer_port: int = 22
    starts_processes: bool = True
    expects_metrics: bool = True
    watcher_lost_after_s: float = 120.0
    nan_loss: bool = True
    stall_timeout_s: float | None = None
    startup_timeout_s: float | None = None
    max_wall_time_s: float | None = None
    unreachable_timeout_s: float | None = None
    upload_argv: tuple[str, ...] = ()
    upload_env: Mapping[str, str] = field(default_factory=dict)
    bucket: BucketCommands | None = None  # noqa: F405
    preemption: str = ""
    metadata_address: str = "169.254.169.254"
    notice_window_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": VERSION,
            "run_id": self.run_id,
            "node": self.node,
            "started_at": self.started_at,
            "peers": list(self.peers),
            "peer_port": self.peer_port,
            "starts_processes": self.starts_processes,
            "expects_metrics": self.expects_metrics,
            "watcher_lost_after_s": self.watcher_lost_after_s,
            "nan_loss": self.nan_loss,
            "stall_timeout_s": self.stall_timeout_s,
            "startup_timeout_s": self.startup_timeout_s,
            "max_wall_time_s": self.max_wall_time_s,
            "unreachable_timeout_s": self.unreachable_timeout_s,
            "upload_argv": list(self.upload_argv),
            "upload_env": dict(self.upload_env),
            "bucket": None if self.bucket is None else self.bucket.to_dict(),
            "preemption": self.preemption,
            "metadata_address": self.metadata_address,
            "notice_window_s": self.notice_window_s,
        }

    def to_json(self) -> str:
        return encode(self.to_dict())

    @classmethod
    def from_json(cls, data: bytes | bytearray | str) -> GuardConfig:
        f = _json_object(data, MAX_GUARD_CONFIG_BYTES, "guard.json")
        upload_argv = f.strings("upload_argv", MAX_ARGV, _arg)
        if upload_argv and not any("{src}" in arg for arg in upload_argv):
            raise ProtocolError(
                "guard.json: field 'upload_argv': no '{src}' placeholder for the run directory"
            )
        lost = f.positive("watcher_lost_after_s")
        bucket = f.data.get("bucket")
        poller = f.data.get("preemption") or ""
        if poller and poller not in POLLERS:  # noqa: F405
            raise f._fail("preemption", " / ".join(POLLERS), poller)  # noqa: F405
        window = f.positive("notice_window_s", 3600.0)
        started = f.number("started_at", 0.0, MAX_TIMESTAMP, required=True)
        assert started is not None
        return cls(
            run_id=f.name("run_id"),
            node=f.name("node"),
            started_at=started,
            peers=f.strings("peers", MAX_PEERS, f.address),
            peer_port=f.integer("peer_port", 1, 65535, required=False, default=22),
            starts_processes=f.boolean("starts_processes", True),
            expects_metrics=f.boolean("expects_metrics", True),
            watcher_lost_after_s=120.0 if lost is None else lost,
            nan_loss=f.boolean("nan_loss", True),
            stall_timeout_s=f.positive("stall_timeout_s"),
            startup_timeout_s=f.positive("startup_timeout_s"),
            max_wall_time_s=f.positive("max_wall_time_s"),
            unreachable_timeout_s=f.positive("unreachable_timeout_s"),
            upload_argv=upload_argv,
            upload_env=env_field(f, "upload_env"),  # noqa: F405
            bucket=None if bucket is None else BucketCommands.from_dict(bucket, "guard.json: bucket"),  # noqa: F405
            preemption=str(poller),
            metadata_address=f.address(f.data.get("metadata_address", "169.254.169.254"), "metadata_address"),
            notice_window_s=window,
        )


@dataclass(frozen=True)
class PollRequest:
    """One request on the watcher's poll channel: metrics from ``offset`` on; refresh the heartbeat?"""

    offset: int = 0
    heartbeat: bool = True

    def to_json(self) -> str:
        return encode({"op": "poll", "offset": self.offset, "heartbeat": self.heartbeat})

    @classmethod
    def from_json(cls, data: bytes | bytearray | str) -> PollRequest:
        f = _json_object(data, MAX_REQUEST_BYTES, "poll request")
        if f.data.get("op") != "poll":
            raise ProtocolError(f"poll request: field 'op': expected 'poll', got {_shown(f.data.get('op'))}")
        return cls(offset=f.integer("offset", 0, MAX_OFFSET), heartbeat=f.boolean("heartbeat", True))


MAX_STOPPED = 1 << 16
"""The most stopped processes a poll answer may report (``PollAnswer.stopped``)."""
MAX_WAIT_S = 60.0
"""The longest a node agent holds a ``WaitRequest`` before answering that nothing changed."""


@dataclass(frozen=True)
class WaitRequest:
    """One request on the watcher's event channel: answer once this node's job is no longer in
    state ``seen`` (its wrapper wrote ``rc``, or its process is gone), or after ``wait_s``.

    How a rank's exit reaches the laptop without waiting for a poll: the agent holds the request
    and answers the moment the exit happens (``fleetrun_node.wait_for_change``)."""

    wait_s: float = 30.0
    seen: str = "running"

    def to_json(self) -> str:
        return encode({"op": "wait", "wait_s": self.wait_s, "seen": self.seen})

    @classmethod
    def from_json(cls, data: bytes | bytearray | str) -> WaitRequest:
        f = _json_object(data, MAX_REQUEST_BYTES, "wait request")
        if f.data.get("op") != "wait":
            raise ProtocolError(f"wait request: field 'op': expected 'wait', got {_shown(f.data.get('op'))}")
        seen = f.data.get("seen", "running")
        if seen not in STATES:
            raise f._fail("seen", " / ".join(STATES), seen)
        wait_s = f.number("wait_s", 0.0, MAX_WAIT_S)
        return cls(wait_s=30.0 if wait_s is None else wait_s, seen=str(seen))


@dataclass(frozen=True)
class WaitAnswer:
    """The answer to a ``WaitRequest``: the job's state now (still ``seen`` when the wait ran
    out), its exit code once exited; ``error`` when the agent could not answer."""

    state: str = "absent"
    rc: int | None = None
    error: str = ""

    def to_json(self) -> str:
        return encode({"state": self.state, "rc": self.rc, "error": self.error})

    @classmethod
    def from_json(cls, data: bytes | bytearray | str) -> WaitAnswer:
        f = _json_object(data, MAX_SMALL_ANSWER_BYTES, "wait answer")
        error = f.text("error", MAX_ERROR)
        if error:
            return cls(error=error)
        state = f.data.get("state")
        if state not in STATES:
            raise f._fail("state", " / ".join(STATES), state)
        return cls(state=str(state), rc=f.optional_integer("rc", -(2**31), 2**31 - 1))


@dataclass(frozen=True)
class StatusRecord:
    """``<run dir>/status.json``: the final record the metrics helper writes (``Metrics.finish``).

    ``status`` is a short word ("succeeded", "failed"); ``fields`` keeps the job's extra
    scalar fields (non-scalars are dropped; at most ``MAX_STATUS_FIELDS``).
    """

    status: str
    time: float | None = None
    step: int | None = None
    message: str = ""
    fields: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.fields,
            "status": self.status,
            "time": self.time,
            "step": self.step,
            "message": self.message,
        }

    def to_json(self) -> str:
        return encode(self.to_dict(), allow_nan=True)

    @classmethod
    def from_json(cls, data: bytes | bytearray | str) -> StatusRecord:
        return cls.from_dict(decode(data, MAX_STATUS_BYTES, "status.json"))

    @classmethod
    def from_dict(cls, data: object) -> StatusRecord:
        f = _Fields(data, "status.json")
        status = f.data.get("status")
        if not isinstance(status, str) or not _STATUS_WORD_RE.fullmatch(status):
            raise f._fail("status", "a short word such as 'succeeded' or 'failed'", status)
        extra: dict[str, Any] = {}
        for key, value in f.data.items():
            if key in ("status", "time", "step", "message") or len(extra) >= MAX_STATUS_FIELDS:
                continue
            if not isinstance(key, str) or len(key) > 128:
                continue
            if isinstance(value, str):
                extra[key] = _clip(value, MAX_ERROR)
            elif isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_INT:
                continue
            elif value is None or isinstance(value, (bool, int, float)):
                extra[key] = value
        return cls(
            status=status,
            time=f.number("time", 0.0, MAX_TIMESTAMP),
            step=f.optional_integer("step", -MAX_INT, MAX_INT),
            message=f.text("message", MAX_TEXT),
            fields=extra,
        )


@dataclass(frozen=True)
class PollAnswer:
    """The node agent's answer to one poll.

    ``metrics`` are the raw bytes of ``metrics.jsonl`` from the requested offset (base64 on the
    wire; a chunk may end inside a line), and ``offset`` is where the next poll starts.
    ``malformed`` names what the agent found unreadable on the node this time (an ``rc`` that is
    not a number, a ``status.json`` nested too deep): reported, never fatal. ``error`` is set
    when the agent could not answer the request at all.
    """

    state: str = "absent"
    rc: int | None = None
    offset: int = 0
    metrics: bytes = b""
    status: StatusRecord | None = None
    exited_at: float | None = None
    log_tail: str = ""
    gpu_util: float | None = None
    malformed: tuple[str, ...] = ()
    error: str = ""
    preempted: PreemptionNotice | None = None  # noqa: F405
    """Set once the cloud announced this node's end (``preempt.json``, written by the watchdog)."""
    gpu: dict | None = None
    """The node's GPU health reading (``fleetrun_gpu.read_health``), as read: untrusted, parsed on
    the laptop by ``launch.rules.gpu_health.parse_gpu_health``; None without nvidia-smi."""

    pace: dict | None = None
    """The node's pace (``fleetrun_node.pace_reading``: its slowest rank's probe time in ms,
    steps/s and the age of its stalest rank's report), as read: untrusted, parsed on the laptop (``launch.rules.stragglers``)."""
    stopped: int = 0
    """Processes of the job on this node stopped by a signal (state T: SIGSTOP, a debugger):
    they hold their peers' collectives, so this node is the cause of a stall, not its victim."""

    def to_json(self) -> str:
        return encode(
            {
                "state": self.state,
                "rc": self.rc,
                "offset": self.offset,
                "metrics_b64": base64.b64encode(self.metrics).decode("ascii"),
                "status": None if self.status is None else self.status.to_dict(),
                "exited_at": self.exited_at,
                "log_tail": self.log_tail,
                "gpu_util": self.gpu_util,
                "malformed": list(self.malformed),
                "error": self.error,
                "preempted": None if self.preempted is None else self.preempted.to_dict(),
                "gpu": self.gpu,
                "pace": self.pace,
                "stopped": self.stopped,
            },
            allow_nan=True,  # a status field may be NaN (finish(loss=nan)); Python reads it back
        )

    @classmethod
    def from_json(cls, data: bytes | bytearray | str) -> PollAnswer:
        f = _json_object(data, MAX_POLL_ANSWER_BYTES, "poll answer")
        error = f.text("error", MAX_ERROR)
        if error:
            return cls(error=error)
        state = f.data.get("state")
        if state not in STATES:
            raise f._fail("state", " / ".join(STATES), state)
        encoded = f.data.get("metrics_b64", "")
        if encoded is None:
            encoded = ""
        if not isinstance(encoded, str) or len(encoded) > 4 * (MAX_CHUNK // 3 + 1):
            raise f._fail("metrics_b64", f"base64 of at most {MAX_CHUNK} bytes", encoded)
        try:
            metrics = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            raise f._fail("metrics_b64", "base64", encoded) from None
        status = f.data.get("status")
        preempted = f.data.get("preempted")
        gpu = f.data.get("gpu")
        if gpu is not None and not isinstance(gpu, dict):
            raise f._fail("gpu", "an object or null", gpu)
        pace = f.data.get("pace")
        if pace is not None and not isinstance(pace, dict):
            raise f._fail("pace", "an object or null", pace)
        return cls(
            state=str(state),
            rc=f.optional_integer("rc", -(2**31), 2**31 - 1),
            offset=f.integer("offset", 0, MAX_OFFSET),
            metrics=metrics,
            status=None if status is None else StatusRecord.from_dict(status),
            exited_at=f.number("exited_at", 0.0, MAX_TIMESTAMP),
            log_tail=f.text("log_tail", MAX_LOG_TAIL, tail=True),
            gpu_util=f.number("gpu_util", 0.0, 100.0),
            malformed=f.strings("malformed", MAX_NOTES, _note),
            preempted=None
            if preempted is None
            else PreemptionNotice.from_dict(preempted, "poll answer: preempted"),  # noqa: F405
            gpu=gpu,
            pace=pace,
            stopped=f.integer("stopped", 0, MAX_STOPPED, required=False, default=0),
        )


@dataclass(frozen=True)
class StartAnswer:
    """``fleetrun_node.py start|guard``: the job's wrapper pid (None for ``guard``), the watchdog's."""

    pid: int | None = None
    guard: int | None = None
    guard_error: str = ""

    def to_json(self) -> str:
        return encode({"pid": self.pid, "guard": self.guard, "guard_error": self.guard_error})

    @classmethod
    def from_json(cls, data: bytes | bytearray | str) -> StartAnswer:
        f = _json_object(data, MAX_SMALL_ANSWER_BYTES, "start answer")
        return cls(
            pid=f.optional_integer("pid", 1, 2**31 - 1),
            guard=f.optional_integer("guard", 1, 2**31 - 1),
            guard_error=f.text("guard_error", MAX_ERROR),
        )


@dataclass(frozen=True)
class StopAnswer:
    """``fleetrun_node.py stop``: processes of the run terminated, watchdogs among them, killed, left;
    with ``--only-if-stepping``, the ranks found still stepping and blocked at the last look, and
    whether the grace was cut short because none stepped (``fleetrun_stepping``)."""

    terminated: int = 0
    watchdogs: int = 0
    killed: int = 0
    remaining: int = 0
    stepping: int = 0
    blocked: int = 0
    grace_cut: bool = False

    def to_dict(self) -> dict[str, int | bool]:
        return {
            "terminated": self.terminated,
            "watchdogs": self.watchdogs,
            "killed": self.killed,
            "remaining": self.remaining,
            "stepping": self.stepping,
            "blocked": self.blocked,
            "grace_cut": self.grace_cut,
        }

    def to_json(self) -> str:
        return encode(self.to_dict())

    @classmethod
    def from_json(cls, data: bytes | bytearray | str) -> StopAnswer:
        return cls.from_dict(decode(data, MAX_SMALL_ANSWER_BYTES, "stop answer"), "stop answer")

    @classmethod
    def from_dict(cls, data: object, what: str) -> StopAnswer:
        f = _Fields(data, what)
        return cls(
            terminated=f.integer("terminated", 0, MAX_COUNT),
            watchdogs=f.integer("watchdogs", 0, MAX_COUNT, required=False, default=0),
            killed=f.integer("killed", 0, MAX_COUNT, required=False, default=0),
            remaining=f.integer("remaining", 0, MAX_COUNT),
            stepping=f.integer("stepping", 0, MAX_COUNT, required=False, default=0),
            blocked=f.integer("blocked", 0, MAX_COUNT, required=False, default=0),
            grace_cut=f.boolean("grace_cut", False),
        )


@dataclass(frozen=True)
class UploadRequest:
    """``fleetrun_node.py upload RUN_DIR REQUEST``: the command that copies the run directory.

    ``argv`` holds ``{src}`` where the run directory goes; empty means no bucket is configured.
    """

    argv: tuple[str, ...] = ()

    def to_json(self) -> str:
        return encode({"argv": list(self.argv)})

    @classmethod
    def from_json(cls, data: bytes | bytearray | str) -> UploadRequest:
        f = _json_object(data, MAX_SMALL_ANSWER_BYTES, "upload request")
        argv = f.strings("argv", MAX_ARGV, _arg)
        if argv and not any("{src}" in arg for arg in argv):
            raise ProtocolError("upload request: field 'argv': no '{src}' placeholder for the run directory")
        return cls(argv=argv)


@dataclass(frozen=True)
class UploadAnswer:
    """``fleetrun_node.py upload``: one sentence saying what happened, and whether it worked."""

    upload: str
    ok: bool = False

    def to_json(self) -> str:
        return encode({"upload": self.upload, "ok": self.ok})

    @classmethod
    def from_json(cls, data: bytes | bytearray | str) -> UploadAnswer:
        f = _json_object(data, MAX_SMALL_ANSWER_BYTES, "upload answer")
        if not isinstance(f.data.get("upload"), str):
            raise f._fail("upload", "a sentence", f.data.get("upload"))
        return cls(upload=f.text("upload", MAX_ERROR), ok=f.boolean("ok", False))


@dataclass(frozen=True)
class GuardOutcome:
    """``<run dir>/guard-outcome.json``: the watchdog's summary of a takeover.

    ``rule`` is the stop rule it enforced, or ``guard_error`` when its own code failed and it
    fell back to stopping the run.
    """

    rule: str
    reason: str
    time: float
    stopped: StopAnswer | None = None
    upload: str = ""
    malformed_lines: int = 0

    def to_json(self) -> str:
        return encode(
            {
                "rule": self.rule,
                "reason": self.reason,
                "time": self.time,
                "stopped": None if self.stopped is None else self.stopped.to_dict(),
                "upload": self.upload,
                "malformed_lines": self.malformed_lines,
            }
        )

    @classmethod
    def from_json(cls, data: bytes | bytearray | str) -> GuardOutcome:
        f = _json_object(data, MAX_SMALL_ANSWER_BYTES, "guard-outcome.json")
        stopped = f.data.get("stopped")
        time_ = f.number("time", 0.0, MAX_TIMESTAMP, required=True)
        assert time_ is not None
        return cls(
            rule=f.name("rule"),
            reason=f.text("reason", MAX_ERROR),
            time=time_,
            stopped=None if stopped is None else StopAnswer.from_dict(stopped, "guard-outcome.json: stopped"),
            upload=f.text("upload", MAX_ERROR),
            malformed_lines=f.integer("malformed_lines", 0, MAX_OFFSET, required=False, default=0),
        )


@dataclass(frozen=True)
class FileBundle:
    """Files the laptop sends on a command's stdin (``launch.sh``, ``guard.json``, ``setup.sh``).

    Secrets (environment values in ``launch.sh``) never travel in a command line, where other
    users of the machine read them in ``ps``. Names are plain file names inside the run directory.
    """

    files: Mapping[str, str]

    def to_json(self) -> str:
        return encode({"files": dict(self.files)})

    @classmethod
    def from_json(cls, data: bytes | bytearray | str) -> FileBundle:
        f = _json_object(data, MAX_BUNDLE_BYTES, "file bundle")
        files = f.data.get("files")
        if not isinstance(files, dict) or len(files) > MAX_BUNDLE_FILES:
            raise f._fail("files", f"an object of at most {MAX_BUNDLE_FILES} files", files)
        out: dict[str, str] = {}
        for name, content in files.items():
            if not _FILE_NAME_RE.fullmatch(name) or name.startswith("."):
                raise f._fail("files", "plain file names", name)
            if not isinstance(content, str) or len(content) > MAX_BUNDLE_FILE_BYTES:
                raise f._fail(f"files.{name}", f"text of at most {MAX_BUNDLE_FILE_BYTES} characters", content)
            out[name] = content
        return cls(files=out)
