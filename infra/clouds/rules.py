"""The pure half of the per-cloud interface: what a cloud accepts in a stack config.

Each cloud has a ``<cloud>_catalog`` module (tables and rules, no Pulumi import) exposing
``RULES``, an object satisfying ``CloudRules``, and a ``<cloud>`` module (Pulumi resources)
exposing ``BUILDER`` (see ``infra.clouds.base``). ``infra.settings`` asks the rules; nothing
outside the cloud modules branches on the cloud's name.

A rule method returns either a value or a list of ``(key, message)`` problems; the settings
parser collects every problem of a config before failing, so a user fixes them in one pass.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

Problem = tuple[str, str]
"""``(config key without namespace, message)``: e.g. ``("machine_type", "'p9.huge' is not ...")``."""


@dataclass(frozen=True)
class Location:
    region: str
    zone: str | None
    """None when the cloud picks it at deploy time (AWS: first zone offering the type)."""


@dataclass(frozen=True)
class MachineSpec:
    """What a node is, once the machine type and GPU keys are reconciled with the catalog."""

    machine_type: str
    gpus: int
    gpu_type: str | None
    attach_accelerators: bool = False
    """GCP N1: GPUs are attached as ``guest_accelerators`` rather than built into the type."""
    efa_interfaces: int = 0
    """AWS: network cards that can carry EFA (0 when the type has no EFA)."""
    compact_placement: bool = True
    """The type supports a cluster placement group / compact placement policy."""
    gvnic: bool = False
    boot_disk_type: str = ""
    data_nics: int = 0
    """GCP A3: extra gVNIC interfaces, one per GPU-to-GPU data network (GPUDirect-TCPX/TCPXO)."""
    placement_max_nodes: int | None = None
    """Most VMs one compact placement policy / cluster placement group may hold (None: no limit known)."""


@dataclass(frozen=True)
class ImageChoice:
    """``lookup`` True: find the cloud's current deep-learning image at deploy time."""

    lookup: bool
    image_id: str | None = None


@dataclass(frozen=True)
class Provisioning:
    """The already parsed keys whose combination only the cloud can judge (``combination_problems``)."""

    machine: MachineSpec
    image: ImageChoice
    node_count: int
    spot: bool
    reservation: str | None
    capacity_block: bool
    zone: str | None
    zones: tuple[str, ...]
    placement: bool
    placement_group: str | None


@dataclass(frozen=True)
class MachineRequest:
    """The raw machine keys of a stack config (after the preset is applied)."""

    machine_type: str
    gpus_per_node: int | None
    accelerator_type: str | None
    allow_unlisted: bool


class CloudRules(Protocol):
    """What ``infra.settings`` needs to know about one cloud. Implementations are pure."""

    name: str
    """Registry key and the value of ``fleet:cloud`` (``aws``, ``gcp``)."""
    display_name: str
    only_keys: frozenset[str]
    """Config keys that only this cloud understands; another cloud rejects them by name."""
    default_ssh_user: str
    default_disk_type: str

    def location(
        self, region: str | None, zone: str | None, allow_unlisted: bool
    ) -> Location | list[Problem]:
        """Check the region and zone keys; fill in what can be derived."""
        ...

    def machine(self, request: MachineRequest) -> MachineSpec | list[Problem]:
        """Reconcile ``machine_type``, ``gpus_per_node`` and ``accelerator_type``."""
        ...

    def image(self, value: str) -> ImageChoice | list[Problem]:
        """``auto`` (look up the deep-learning image) or an image id in this cloud's format."""
        ...

    def bucket_name_problem(self, name: str) -> str | None:
        """Why ``name`` is not a valid bucket name on this cloud, or None."""
        ...

    def reservation_problem(self, reservation: str) -> str | None:
        """Why ``reservation`` is not a capacity reservation reference on this cloud, or None."""
        ...

    def tag_problems(self, tags: Mapping[str, str]) -> list[Problem]:
        """Tag (AWS) or label (GCP) keys and values this cloud would refuse."""
        ...

    def project_problem(self, project: str | None) -> str | None:
        """Why the cloud project/account key is missing or malformed, or None."""
        ...

    def failover_zones(self, region: str | None, zones: list[str], allow_unlisted: bool) -> list[Problem]:
        """Problems with ``fleet:zones`` (the ordered zones ``fab up`` tries); [] when usable.

        Each cloud decides how far a failover may move: AWS keeps one region (the provider, the
        bucket and the VPC are regional), GCP may cross regions (the network is global).
        """
        ...

    def region_of(self, zone: str) -> str:
        """The region a zone belongs to."""
        ...

    def combination_problems(self, p: Provisioning) -> list[Problem]:
        """Combinations of otherwise valid keys that this cloud refuses (or silently mishandles)."""
        ...


# Module paths, imported on first use: the pure rules and the Pulumi builders of each cloud.
CLOUD_CATALOGS: dict[str, str] = {
    "aws": "infra.clouds.aws_catalog",
    "gcp": "infra.clouds.gcp_catalog",
}


def known_clouds() -> list[str]:
    return sorted(CLOUD_CATALOGS)


def rules_for(cloud: str) -> CloudRules:
    """The rules of ``cloud``; KeyError when it is not registered (callers check first)."""
    module = importlib.import_module(CLOUD_CATALOGS[cloud])
    rules: CloudRules = module.RULES
    return rules
