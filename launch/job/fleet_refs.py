"""What an inventory says about where its machines came from: pure, typed, frozen data.

An ``Inventory`` carries one of these as ``fleet``. Only fleetrun's own state can produce a
``LocalFleetRef`` or a ``StackFleetRef`` (the local fleet's inventory file, a stack's outputs);
a lab inventory file always loads as ``LabFleet`` (``launch.fleets.kinds.lab``). The field
``kind`` is the discriminator and the registry key (``launch.fleets.kinds.registry``).

Imports only ``launch.job.endpoints`` (a Slurm cluster's pinned login host and nodes), so
``launch.job.inventory`` can import it without a cycle.
"""

from __future__ import annotations

import re
import shlex
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, Strict, field_validator

from launch.job.endpoints import Host, JumpHost

PREFIX_PATTERN = r"^[a-z][a-z0-9]{0,5}\z"
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}\z"
BUCKET_PATTERN = r"^[a-z0-9][a-z0-9._-]{1,221}[a-z0-9]\z"
_OCTET = r"(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
LOCAL_ENDPOINT_PATTERN = rf"^http://(127\.{_OCTET}|198\.1[89])\.{_OCTET}\.{_OCTET}:[1-9][0-9]{{0,4}}\z"
"""A local fleet's S3 endpoint: http on loopback or 198.18.0.0/15 (the range reserved for network
tests, where local fleets live), with a port: never an address outside this machine's tests."""


class _Ref(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    def rank_launch_lines(self, host_name: str) -> tuple[str, str]:
        """How a node's launch script starts its ranks on this fleet: (shell lines run before,
        the words put before the launcher's command). Nothing by default: the node's own
        shell starts them; a scheduler's fleet may start them as one of its job steps."""
        return "", ""


class LabFleet(_Ref):
    """A lab's own machines (a hosts.yaml): fleetrun stops its processes, never the machines."""

    kind: Literal["lab"] = "lab"


class LocalFleetRef(_Ref):
    """The local fleet (network-namespace nodes on this machine) named by ``prefix``.

    ``bucket`` and ``s3_endpoint``: an S3-compatible server on this machine that the nodes use as
    their bucket (``fab local.up --bucket`` starts the fleet's own: the bucket path without a
    cloud); the endpoint must be a plain http URL on loopback or the local fleets' test range
    198.18.0.0/15, so a local fleet never sends its runs anywhere else. ``preemption_poller``: the
    watchdog polls that notice (``fab local.up --spot``: a metadata endpoint at 169.254.169.254
    inside every node, ``launch.fleets.local.spot``); "" (the default) for none.
    """

    kind: Literal["local"] = "local"
    prefix: str = Field(pattern=PREFIX_PATTERN)
    bucket: str | None = Field(default=None, pattern=BUCKET_PATTERN)
    s3_endpoint: str | None = Field(default=None, pattern=LOCAL_ENDPOINT_PATTERN)
    preemption_poller: Literal["", "ec2-imdsv2", "gce-metadata"] = ""


class StackFleetRef(_Ref):
    """A Pulumi stack's cluster. ``stack`` is None when the inventory came from an outputs file
    (then fleetrun cannot destroy it: ``fab down --stack NAME`` can)."""

    kind: Literal["stack"] = "stack"
    stack: str | None = Field(default=None, pattern=NAME_PATTERN)
    cluster_id: str = Field(pattern=NAME_PATTERN)
    cloud: Literal["aws", "gcp"]
    bucket: str | None = Field(default=None, pattern=BUCKET_PATTERN)


SLURM_NAME_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}\z"
"""A Slurm partition, account or QOS name: what ``sinfo``/``sacctmgr`` show, nothing a shell reads."""
GRES_PATTERN = r"^[A-Za-z0-9_]{1,32}(:[A-Za-z0-9_.-]{1,64})?:[0-9]{1,4}\z"
"""``gpu:8`` or ``gpu:a100:8``: one generic resource per node, with its count."""
CONSTRAINT_PATTERN = r"^[A-Za-z0-9_.&|,*()\[\]-]{1,256}\z"
"""Slurm's ``--constraint`` expression: feature names joined by ``&``, ``|``, ``,``, brackets, counts."""
SLURM_HOST_PATTERN = r"^[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?\z"
MAX_JOB_ID = 2**32 - 1
TIME_LIMIT_RE = re.compile(
    r"(?:(?P<days>[0-9]{1,3})-(?P<dh>[0-9]{1,2})(?::(?P<dm>[0-9]{2})(?::(?P<ds>[0-9]{2}))?)?"
    r"|(?P<a>[0-9]{1,6})(?::(?P<b>[0-9]{2})(?::(?P<c>[0-9]{2}))?)?)"
)


def time_limit_seconds(value: str) -> int:
    """Seconds of a Slurm time limit (``MM``, ``MM:SS``, ``HH:MM:SS``, ``D-HH[:MM[:SS]]``);
    ValueError for anything else, and for 0, which Slurm reads as no limit at all."""
    match = TIME_LIMIT_RE.fullmatch(value)
    if match is None:
        raise ValueError("expected a Slurm time limit: MM, HH:MM:SS or D-HH:MM:SS (e.g. 04:00:00)")
    g = {k: int(v) for k, v in match.groupdict().items() if v is not None}
    if "days" in g:
        seconds = g["days"] * 86400 + g["dh"] * 3600 + g.get("dm", 0) * 60 + g.get("ds", 0)
    elif "c" in g:
        seconds = g["a"] * 3600 + g["b"] * 60 + g["c"]
    else:
        seconds = g["a"] * 60 + g.get("b", 0)
    if seconds <= 0:
        raise ValueError("a time limit of 0 is no limit in Slurm; give a finite one (e.g. 04:00:00)")
    return seconds


class SlurmFleetRef(_Ref):
    """A Slurm cluster reached through its login host: the nodes come from an allocation.

    Loaded from the user's file (``launch.fleets.kinds.slurm``), which is untrusted: it says how
    to ask Slurm for machines and how to reach them (every hop with a pinned host key), never what
    to destroy. What fleetrun ends is only ``job_ids``, the allocations it made itself, which the
    file cannot set (the loader refuses the key); nothing is ever powered off. ``time_limit`` is
    required and finite: with the laptop gone, it is what ends the allocation at the latest.
    """

    kind: Literal["slurm"] = "slurm"
    login: JumpHost
    """The login host fleetrun runs ``sbatch``, ``squeue``, ``scancel`` on, with its pinned key."""
    partition: str = Field(pattern=SLURM_NAME_PATTERN)
    """The partition the allocations are asked in (``--partition``); ``fab doctor`` checks it in ``sinfo``."""
    account: str | None = Field(default=None, pattern=SLURM_NAME_PATTERN)
    """The account the allocations are charged to (``--account``); default: the user's default account."""
    qos: str | None = Field(default=None, pattern=SLURM_NAME_PATTERN)
    """The quality of service (``--qos``); default: the account's default."""
    gres: str | None = Field(default=None, pattern=GRES_PATTERN)
    """Generic resources per node (``--gres``), e.g. ``gpu:8``."""
    time_limit: str
    """The allocation's time limit (``--time``): ``HH:MM:SS`` or ``D-HH:MM:SS``; required, finite."""
    constraint: str | None = Field(default=None, pattern=CONSTRAINT_PATTERN)
    """Node features every node must have (``--constraint``), e.g. ``a100&ib``."""
    exclude: tuple[Annotated[str, Field(pattern=SLURM_HOST_PATTERN)], ...] = Field(
        default=(), max_length=1024
    )
    """Nodes never to ask for (``--exclude``); a run adds the nodes it lost."""
    nodes: tuple[Host, ...] = Field(min_length=1, max_length=4096)
    """The cluster's nodes fleetrun may be given, each with its pinned host key (Slurm's node
    name is the host's ``name``): an allocated node not listed here is refused, never trusted."""
    drain_on_fault: bool = False
    """On a ``gpu_fault``, also drain the node for the site (``scontrol update state=drain``):
    only where this user may; otherwise the node is only excluded from the next allocation."""
    job_ids: tuple[Annotated[int, Strict(), Field(ge=1, le=MAX_JOB_ID)], ...] = Field(
        default=(), max_length=64
    )
    """The allocations fleetrun made for this run (set by fleetrun only; the first is the run's)."""
    ranks_via: Literal["ssh", "srun"] = "ssh"
    """How each node's ranks start: ``ssh``, by the node agent over SSH (the site lets users into
    the nodes of their allocation); ``srun``, as a step of the allocation (``srun --overlap`` run on
    the node by the same agent), so Slurm's accounting, cgroups and cleanup hold for them."""

    def rank_launch_lines(self, host_name: str) -> tuple[str, str]:
        """With ``ranks_via: srun``: the allocation holding this node, found among this run's own
        allocations only (``job_ids``: the first and each replacement's, each ``--exclusive``,
        so exactly one of them holds it; never another job of the same user that happens to run
        there), and ``srun`` of a one-task step on this node only, sharing the holding job's
        resources (``--overlap``), the environment and working directory passed on; the
        launcher's command runs under ``sh -c``."""
        if self.ranks_via != "srun":
            return "", ""
        node = shlex.quote(host_name)
        if len(self.job_ids) == 1:  # the run's one allocation holds every node: nothing to look up
            find = f"FLEETRUN_SLURM_JOB={self.job_ids[0]}"
        elif not self.job_ids:  # planned before an allocation was made (a dry run): none to join
            find = 'echo "fleetrun: this run holds no Slurm allocation" >&2; exit 3'
        else:
            jobs = ",".join(map(str, self.job_ids))
            find = (
                f"FLEETRUN_SLURM_JOB=$(squeue -h -t RUNNING -j {jobs} -w {node} -o %i | head -n 1); "
                f'[ -n "$FLEETRUN_SLURM_JOB" ] || {{ echo "fleetrun: none of the Slurm allocations of this run '
                f'({jobs}) runs on this node" >&2; exit 3; }}'
            )
        words = (
            'srun --jobid="$FLEETRUN_SLURM_JOB" --overlap --nodes=1 --ntasks=1 --kill-on-bad-exit=1 '
            f"--nodelist={node} --export=ALL --quiet sh -c "
        )
        return find, words

    @field_validator("time_limit")
    @classmethod
    def _time_limit(cls, value: str) -> str:
        time_limit_seconds(value)
        return value

    @property
    def job_id(self) -> int | None:
        """The run's first allocation, None before one was made."""
        return self.job_ids[0] if self.job_ids else None


FleetRef = Annotated[LabFleet | LocalFleetRef | StackFleetRef | SlurmFleetRef, Field(discriminator="kind")]
