"""The stack config model: raw ``fleet:*`` values in, one validated ``FleetSettings`` out.

Pure (no Pulumi import): ``infra.config`` feeds it the stack's config, tests feed it dicts. Every
problem names its key (``fleet:machine_type: 'p9.huge' is not a known AWS instance type; ...``)
and all problems of a config are reported together, so a user fixes them in one pass. Per-cloud
knowledge (machine types, regions, naming rules) comes from the cloud's ``CloudRules``; nothing
here branches on the cloud's name.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from infra.clouds.rules import (
    ImageChoice,
    Location,
    MachineSpec,
    Problem,
)
from infra.presets import PRESETS

NAMESPACE = "fleet"
MAX_NODES = 2048
MIN_DISK_GB = 30
MAX_DISK_GB = 16384
DEFAULT_DISK_GB = 200
DEFAULT_NETWORK_CIDR = "10.0.0.0/16"
DOCUMENTATION_RANGES = tuple(
    ipaddress.IPv4Network(n) for n in ("192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24")
)
"""The example stack configs use 203.0.113.7/32: refuse it, so nobody deploys with the placeholder."""
WORLD_PREFIX_LIMIT = 8
"""CIDRs broader than /8 count as open to the world (0.0.0.0/1 + 128.0.0.0/1 is 0.0.0.0/0)."""

KEYS: dict[str, str] = {
    "cloud": "aws or gcp (required)",
    "preset": "a named tier that fills in node_count and machine_type: " + ", ".join(PRESETS),
    "region": "AWS region (required on AWS); on GCP derived from zone",
    "zone": "AWS availability zone (default: first zone offering the type); GCP zone (required unless zones)",
    "zones": "ordered zones `fab up` tries on a capacity error (AWS: one region; GCP: any regions)",
    "project": "GCP project id (or gcp:project)",
    "node_count": f"number of nodes, 1 to {MAX_NODES}",
    "machine_type": "instance / machine type, e.g. p4d.24xlarge or a2-highgpu-8g",
    "gpus_per_node": "GPUs per node: checked against the type, or the attached count on GCP N1",
    "accelerator_type": "GCP N1 only: accelerator to attach, e.g. nvidia-tesla-t4",
    "spot": "true for spot (AWS) / spot-preemptible (GCP) capacity; default false",
    "reservation": "capacity reservation (AWS cr-... id, GCP reservation name); not with spot",
    "capacity_block": "AWS: the reservation is an EC2 Capacity Block for ML (market type capacity-block)",
    "placement_group": "an existing placement group (AWS) / compact policy (GCP) to launch into, e.g. the reservation's",
    "disk_size_gb": f"root disk size in GB, default {DEFAULT_DISK_GB}",
    "image": "'auto' (the cloud's current deep-learning image) or an image id",
    "ssh_cidr": "operator CIDR(s) allowed to SSH, e.g. your.ip.address/32 (required)",
    "allow_ssh_from_anywhere": "explicit override to accept a world-open ssh_cidr; default false",
    "ssh_user": "login user on the nodes, default ubuntu",
    "ssh_public_key": "operator public key (OpenSSH); when unset, a key pair is generated (secret)",
    "bucket": "'auto' or a bucket name for data, checkpoints and metrics",
    "bucket_existing": "true: use an existing bucket (e.g. retained from an earlier stack) as is",
    "tags": "tags (AWS) / labels (GCP) added to every resource",
    "efa": "AWS: 'auto' (EFA, on every network card, when the type has it), true or false",
    "placement": "cluster placement group / compact placement when the type supports it; default true",
    "network_cidr": f"private CIDR of the cluster network, default {DEFAULT_NETWORK_CIDR}",
    "allow_unlisted": "accept machine types and regions missing from fleetrun's tables",
    "warm_until": "set by fleetrun while a run keeps the fleet warm (keep_warm_s): a UTC time, "
    "2026-11-28T21:05:00Z, at which the cloud itself ends the instances (AWS: an EventBridge Scheduler "
    "schedule terminates them; GCP: a Cloud Scheduler job per node deletes it); unset: no lifetime",
}


class ConfigError(ValueError):
    """A stack config that cannot become a cluster; the message names every bad key."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = list(problems)
        lines = [f"{NAMESPACE}:{key}: {message}" for key, message in self.problems]
        if len(lines) == 1:
            text = lines[0]
        else:
            text = f"{len(lines)} problems in the stack config:\n  " + "\n  ".join(lines)
        super().__init__(text)

    @property
    def keys(self) -> list[str]:
        return [key for key, _ in self.problems]


@dataclass(frozen=True)
class FleetSettings:
    """Everything the Pulumi program needs, validated. Built only by ``parse_settings``."""

    cloud: str
    cluster_id: str
    location: Location
    node_count: int
    machine: MachineSpec
    image: ImageChoice
    ssh_cidrs: tuple[str, ...]
    ssh_user: str
    disk_size_gb: int
    disk_type: str
    spot: bool = False
    reservation: str | None = None
    capacity_block: bool = False
    zones: tuple[str, ...] = ()
    """Ordered failover zones (``fab up`` sets ``fleet:zone`` to the one in use)."""
    bucket_region: str = ""
    """Where the bucket lives: the first failover zone's region, so failing over never moves it."""
    placement_group: str | None = None
    gcp_project: str | None = None
    ssh_public_key: str | None = None
    bucket_name: str | None = None
    """None: a name is generated (Pulumi auto-naming, globally unique)."""
    bucket_existing: bool = False
    tags: Mapping[str, str] = field(default_factory=dict)
    efa: bool = False
    placement: bool = False
    network_cidr: str = DEFAULT_NETWORK_CIDR
    preset: str | None = None
    warm_until: str | None = None
    """A kept-warm fleet's instance lifetime (``fleet:warm_until``, ``2026-11-28T21:05:00Z``): the
    cloud ends the instances then, whatever the laptop and the nodes do. None: no lifetime."""

    @property
    def region(self) -> str:
        return self.location.region

    @property
    def zone(self) -> str | None:
        return self.location.zone

    def node_name(self, rank: int) -> str:
        return f"{self.cluster_id}-node{rank}"


def image_disk_problem(disk_size_gb: int, image_size_gb: float | None, image: str) -> str | None:
    """Why the root disk cannot hold the image (the lookup's own size), or None.

    ``MIN_DISK_GB`` only catches nonsense; the deep-learning images are far bigger and grow, so
    the program compares with the size the image lookup returns before any node is created.
    """
    if image_size_gb is not None and disk_size_gb < image_size_gb:
        return (
            f"fleet:disk_size_gb: {disk_size_gb} GB is smaller than the image {image} "
            f"({image_size_gb:g} GB); set at least {int(-(-image_size_gb // 1))}"
        )
    return None


def parse_settings(raw: Mapping[str, Any], *, project: str, stack: str) -> FleetSettings:
    """Validate a stack config. ``raw`` maps keys without the ``fleet:`` prefix to values.

    Values may be strings as Pulumi stores them (``"4"``, ``"true"``, JSON for lists and maps)
    or already typed. Raises ``ConfigError`` naming every bad key.
    """
    from infra.settings_parser import SettingsParser  # the parser builds on this module's model

    return SettingsParser(raw).parse(project=project, stack=stack)
