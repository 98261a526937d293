"""What Slurm's commands print, parsed into typed, validated values. Pure: no I/O.

Everything here comes from the cluster (another user may name a job, a site may name a node or a
reason): it is data, bounded in size and checked field by field, never passed to a shell, and a
line that does not parse is an error that names the command, never a crash of the watcher. The
formats are the ones ``launch.fleets.slurm.commands`` asks for (``-o`` with ``|`` separators), so
a field cannot hold the separator unless Slurm printed something else than asked: then the line is
refused. Captured real output is in ``tests/slurm_captures/``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from launch.errors import FleetrunError
from launch.job.fleet_refs import MAX_JOB_ID, SLURM_HOST_PATTERN

MAX_ANSWER_BYTES = 1 << 20
"""The most of one command's output read (a partition of 10 000 nodes fits many times)."""
MAX_LINE_CHARS = 4096
MAX_LINES = 100_000
HOST_RE = re.compile(SLURM_HOST_PATTERN.removeprefix("^").removesuffix(r"\z"))
JOB_ID_RE = re.compile(r"([0-9]{1,10})(?:;[A-Za-z0-9_.-]{1,64})?")
STATE_RE = re.compile(r"[A-Z_]{1,32}")
REASON_RE = re.compile(r"[A-Za-z0-9_(),.:= /\[\]-]{0,4000}")
"""Slurm's reasons are words, and node lists in its compressed form: ``ReqNodeNotAvail,
UnavailableNodes:node[1-2]`` (captured)."""
REASON_CHARS = 200
"""A longer reason (a long list of unavailable nodes) is shown cut, ending in ``...``."""
NODE_STATE_RE = re.compile(r"[a-z_]{1,24}[*~#!%$@^-]{0,3}(\+[a-z_+]{1,64})?")

JOB_ENDED = frozenset(
    {
        "BOOT_FAIL",
        "CANCELLED",
        "COMPLETED",
        "DEADLINE",
        "FAILED",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "TIMEOUT",
        "REVOKED",
        "SPECIAL_EXIT",
    }
)
"""Job states after which the allocation is gone (``squeue`` keeps a job a few minutes after)."""
NODE_LOST = ("down", "drain", "drained", "draining", "fail", "failing", "maint", "unknown", "not_responding")
"""``sinfo -N -o %T`` states (their first word) under which a node of the run counts as lost."""


class SlurmAnswerError(FleetrunError):
    """Slurm printed something that is not what fleetrun asked for (one line, escaped)."""


def _lines(command: str, text: str) -> list[str]:
    if len(text) > MAX_ANSWER_BYTES:
        raise SlurmAnswerError(f"{command}: answer over {MAX_ANSWER_BYTES} bytes; refused")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if len(lines) > MAX_LINES:
        raise SlurmAnswerError(f"{command}: answer over {MAX_LINES} lines; refused")
    for line in lines:
        if len(line) > MAX_LINE_CHARS:
            raise SlurmAnswerError(f"{command}: a line of {len(line)} characters; refused")
    return lines


def _shown(line: str) -> str:
    return ascii(line[:120])


def job_id_of_sbatch(text: str) -> int:
    """``sbatch --parsable``: ``ID`` or ``ID;cluster`` on the last line."""
    lines = _lines("sbatch", text)
    match = JOB_ID_RE.fullmatch(lines[-1]) if lines else None
    if match is None or not 1 <= int(match.group(1)) <= MAX_JOB_ID:
        raise SlurmAnswerError(f"sbatch: expected a job id, got {_shown(lines[-1] if lines else '')}")
    return int(match.group(1))


@dataclass(frozen=True)
class JobState:
    """One job as ``squeue -h -j ID -o %i|%T|%r|%N|%Q`` shows it."""

    job_id: int
    state: str
    """RUNNING, PENDING, CONFIGURING, COMPLETING, ... (Slurm's long state name)."""
    reason: str
    """Why it waits (Priority, Resources, QOSMaxJobsPerUserLimit, ...) or ``None``."""
    nodelist: str
    """The allocated nodes in Slurm's compressed form (``node[1-3]``), "" while pending."""
    priority: int

    @property
    def running(self) -> bool:
        return self.state == "RUNNING"

    @property
    def pending(self) -> bool:
        return self.state in ("PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "RESV_DEL_HOLD")

    @property
    def ended(self) -> bool:
        return self.state in JOB_ENDED or self.state == "COMPLETING"


NODELIST_RE = re.compile(r"[A-Za-z0-9.,\[\]-]{0,4000}")


def job_state(text: str, job_id: int) -> JobState | None:
    """The job's line of ``squeue -h -j ID -o %i|%T|%r|%N|%Q``; None when squeue no longer knows
    it (an ended job leaves ``squeue`` after ``MinJobAge``)."""
    for line in _lines("squeue", text):
        fields = line.split("|")
        if len(fields) != 5:
            raise SlurmAnswerError(f"squeue: expected 5 '|'-separated fields, got {_shown(line)}")
        ident, state, reason, nodelist, priority = fields
        if not ident.isdigit() or int(ident) != job_id:
            continue
        state = state.split()[0] if state else ""
        if not STATE_RE.fullmatch(state):
            raise SlurmAnswerError(f"squeue: job {job_id}: state {_shown(state)} is not a Slurm state")
        if not REASON_RE.fullmatch(reason):
            reason = "(unreadable reason)"
        elif len(reason) > REASON_CHARS:
            reason = reason[: REASON_CHARS - 3] + "..."
        if not NODELIST_RE.fullmatch(nodelist):
            raise SlurmAnswerError(f"squeue: job {job_id}: node list {_shown(nodelist)} refused")
        prio = int(priority) if priority.isdigit() and len(priority) <= 12 else 0
        return JobState(job_id, state, reason, nodelist, prio)
    return None


def queue_position(text: str, job_id: int) -> tuple[int, int] | None:
    """Where ``job_id`` stands among the partition's pending jobs (``squeue -h -p P -t PENDING
    -o %i|%Q``): (position from 1, how many pend), by priority then submission (the job id),
    as Slurm's main scheduler orders them; None when the job is not among them."""
    jobs: list[tuple[int, int]] = []
    for line in _lines("squeue", text):
        ident, _, priority = line.partition("|")
        if not ident.isdigit() or len(ident) > 10:
            raise SlurmAnswerError(f"squeue: expected 'JOBID|PRIORITY', got {_shown(line)}")
        prio = int(priority) if priority.isdigit() and len(priority) <= 12 else 0
        jobs.append((-prio, int(ident)))
    jobs.sort()
    ids = [ident for _, ident in jobs]
    return (ids.index(job_id) + 1, len(ids)) if job_id in ids else None


def hostnames(text: str) -> list[str]:
    """``scontrol show hostnames LIST``: one node name a line, each a plain host name."""
    names = _lines("scontrol show hostnames", text)
    for name in names:
        if not HOST_RE.fullmatch(name):
            raise SlurmAnswerError(f"scontrol show hostnames: {_shown(name)} is not a node name; refused")
    if len(set(names)) != len(names):
        raise SlurmAnswerError("scontrol show hostnames: a node named twice; refused")
    return names


@dataclass(frozen=True)
class NodeState:
    """One node as ``sinfo -h -N -o %N|%T|%G|%P`` shows it."""

    name: str
    state: str
    """Slurm's long state (``idle``, ``allocated``, ``mixed``, ``down*``, ``drained``, ...)."""
    gres: str
    partition: str

    @property
    def lost(self) -> bool:
        """DOWN, DRAIN, FAIL and their kin (any flag suffix: ``down*`` is down and not responding)."""
        base = self.state.rstrip("*~#!%$@^-").split("+")[0]
        return base in NODE_LOST or "+drain" in self.state


GRES_FIELD_RE = re.compile(r"[A-Za-z0-9_:().,=-]{0,512}")
PARTITION_FIELD_RE = re.compile(r"[A-Za-z0-9_.-]{1,64}\*?")


def node_states(text: str) -> dict[str, NodeState]:
    """``sinfo -h -N -o %N|%T|%G|%P`` (a node in several partitions shows once per partition; the
    first line of each node is kept)."""
    found: dict[str, NodeState] = {}
    for line in _lines("sinfo", text):
        fields = line.split("|")
        if len(fields) != 4:
            raise SlurmAnswerError(f"sinfo: expected 4 '|'-separated fields, got {_shown(line)}")
        name, state, gres, partition = fields
        if not HOST_RE.fullmatch(name):
            raise SlurmAnswerError(f"sinfo: {_shown(name)} is not a node name; refused")
        if not NODE_STATE_RE.fullmatch(state):
            raise SlurmAnswerError(f"sinfo: node {name}: state {_shown(state)} refused")
        if not GRES_FIELD_RE.fullmatch(gres):
            raise SlurmAnswerError(f"sinfo: node {name}: gres {_shown(gres)} refused")
        if not PARTITION_FIELD_RE.fullmatch(partition):
            raise SlurmAnswerError(f"sinfo: node {name}: partition {_shown(partition)} refused")
        found.setdefault(name, NodeState(name, state, gres, partition.rstrip("*")))
    return found
