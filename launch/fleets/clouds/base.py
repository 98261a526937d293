"""What every cloud module shares (``CloudOps``, ``ErrorKind``, ``ClusterLocation``, the argv
helpers); the package (``launch.fleets.clouds``) re-exports it with the ``CLOUDS`` table, and the
cloud modules import it from here, so the package and its modules do not import each other."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from launch.nodelib.fleetrun_protocol import BucketCommands


class ErrorKind(str, Enum):
    """What a failed ``pulumi up`` means for the next attempt (``fab up``'s zone failover)."""

    CAPACITY = "capacity"
    """The zone has no capacity for the type now, or does not offer it: another zone may work."""
    QUOTA = "quota"
    """An account or project limit: the same region will refuse again; another region may not."""
    GLOBAL_QUOTA = "global-quota"
    """A limit over all regions (GCP's ``GPUS_ALL_REGIONS``): no zone or region will take it."""
    BAD_CONFIG = "bad-config"
    """The request itself is wrong: no zone will take it; fix the stack config."""
    PERMISSION = "permission"
    """The credentials may not do this: no zone will take it; fix IAM."""
    OTHER = "other"


@dataclass(frozen=True)
class ClusterLocation:
    """Where to look for a cluster's resources, independent of the Pulumi state."""

    cloud: str
    cluster_id: str
    region: str
    project: str | None = None
    """GCP project id."""
    profile: str | None = None
    """AWS named profile (aws:profile in the stack config), if any."""
    provider_config: tuple[tuple[str, str], ...] = ()
    """The stack's own ``<cloud>:*`` config (namespace stripped, sorted): how the program's
    provider authenticates (AWS: ``assumeRoles``, keys), so that the audit asks the account the
    cluster was built in, not the caller's own."""


@dataclass(frozen=True)
class NodeInstance:
    """How fleetrun's Pulumi program (``infra/clouds/<cloud>.py``) records one node's instance in
    the stack's state: what ``launch.fleets.stack_replace.node_instance_urn`` matches, so that a
    renewal replaces that node's instance and nothing fleetrun did not create."""

    type_token: str
    """The Pulumi type of the instance resource (``aws:ec2/instance:Instance``)."""
    tags_property: str
    """The input holding its tags (AWS) or labels (GCP)."""
    rank_tag: str
    """The tag / label whose value is the node's rank (the cluster tag is ``CloudOps.cluster_tag``)."""
    id_output: str | None
    """The output the stack exports as the node's ``instance_id``; None: the resource's own id."""


class CloudOps(Protocol):
    name: str
    """``aws`` or ``gcp``: the value of ``fleet:cloud``."""
    cluster_tag: str
    """The tag (AWS) / label (GCP) key whose value is the cluster id on every resource."""
    instance: NodeInstance
    """How a node's instance looks in the stack's state (a renewal replaces exactly it)."""

    def region_of(self, zone: str) -> str:
        """The region a zone belongs to (quota failover skips zones of an exhausted region)."""
        ...

    def leftovers(self, location: ClusterLocation) -> list[str]:
        """The cost and leak audit: every instance (running or stopped), disk, address and
        network interface carrying the cluster's tag that still exists, one readable line each."""
        ...

    def upload_argv(self, bucket: str, dest: str) -> list[str]:
        """The command a node runs to copy a run directory to ``<bucket>/<dest>`` with its own
        role; ``{src}`` stands for the local directory."""
        ...

    def download_argv(self, bucket: str, src: str) -> list[str]:
        """The command a node runs to copy ``<bucket>/<src>`` into a local folder (``{dest}``)."""
        ...

    def bucket_commands(self, bucket: str, prefix: str) -> BucketCommands:
        """How a node copies checkpoints to and from ``<bucket>/<prefix>`` (the checkpoint helper
        and the watchdog run these; the same CLI as ``upload_argv``)."""
        ...

    def preemption_poller(self) -> str:
        """Which preemption-notice poller the on-node watchdog runs (``fleetrun_protocol.POLLERS``)."""
        ...

    def poweroff_hook(self) -> str:
        """The shell script the on-node watchdog runs to end its own node's billing."""
        ...

    def classify_error(self, message: str) -> ErrorKind:
        """What a provider error (as ``pulumi up`` prints it) means for failover."""
        ...

    def lifetime_note(self, warm_until: str) -> str:
        """What the cloud does at ``fleet:warm_until`` (``infra.clouds.<cloud>_lifetime``), one
        line for the run's record: who ends the instances, and how."""
        ...


Rules = Sequence[tuple[ErrorKind, re.Pattern[str]]]


def classify(message: str, rules: Rules) -> ErrorKind:
    """The kind of the first rule whose pattern occurs in ``message``; rules are ordered from
    the most specific (a capacity code) to the most general (a 400), since one message often
    matches several (GCP's "machine type does not exist in zone" is also an "Invalid value").
    Whitespace is normalised first: CLIs and YAML dumps wrap long messages mid-sentence."""
    flat = " ".join(message.split())
    for kind, pattern in rules:
        if pattern.search(flat):
            return kind
    return ErrorKind.OTHER


def fill(argv: Sequence[str], **values: str) -> list[str]:
    """``argv`` (a ``COPY``/``SYNC``/``REMOVE`` template) with the ``{src}``/``{dest}`` placeholders
    named in ``values`` filled in; the others stay for the node to fill (upload and download are
    the one ``SYNC``, with the bucket on either side)."""
    return [values.get(arg[1:-1], arg) if arg in ("{src}", "{dest}") else arg for arg in argv]


def missing_sdk(package: str, extra: str) -> str:
    return (
        f"cannot audit the cloud for leftovers: {package} is not installed (pip install {package}, or "
        f"the '{extra}' extra). The Pulumi operation itself finished."
    )
