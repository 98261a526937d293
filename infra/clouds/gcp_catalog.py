"""GCP as fleetrun sees it before any resource exists: machine types, accelerators, regions.

Pure data and checks (no Pulumi import); ``RULES`` is this cloud's ``CloudRules``. A2, A3 and
G2 types have their GPUs built in; N1 types take attached accelerators (``fleet:accelerator_type``
plus ``fleet:gpus_per_node``); other general-purpose families have none. The tables go stale as
GCP adds types: ``fleet:allow_unlisted: true`` accepts a type or region missing here.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from fleetrun_contract.cluster import GCP_CLUSTER_LABEL, GCP_RANK_LABEL, gcp_region_of
from infra.clouds.rules import ImageChoice, Location, MachineRequest, MachineSpec, Problem, Provisioning


@dataclass(frozen=True)
class GcpFamily:
    """What a machine family needs and allows; found by the type's prefix (``a3-megagpu``...)."""

    prefix: str
    compact_placement: bool
    """Compact placement policies are supported (N1, E2 and N4 are not)."""
    gvnic: bool = False
    """The family needs the gVNIC network interface (A3) or performs best with it (G2)."""
    boot_disk_type: str = "pd-balanced"
    attachable: dict[str, tuple[int, ...]] = field(default_factory=dict)
    """Accelerators that can be attached (N1 only): accelerator type -> allowed counts."""
    data_nics: int = 0
    """Extra gVNIC interfaces, each on its own VPC network, that GPUDirect-TCPX (A3 High: 4) and
    TCPXO (A3 Mega: 8) use for GPU-to-GPU traffic; without them NCCL shares the one host NIC."""


FAMILIES: tuple[GcpFamily, ...] = (
    # Longest prefixes first: the first match wins.
    GcpFamily("a3-ultragpu", compact_placement=True, gvnic=True, boot_disk_type="hyperdisk-balanced"),
    GcpFamily(
        "a3-megagpu", compact_placement=True, gvnic=True, boot_disk_type="hyperdisk-balanced", data_nics=8
    ),
    GcpFamily("a3-highgpu", compact_placement=True, gvnic=True, data_nics=4),
    GcpFamily("a2", compact_placement=True),
    GcpFamily("g2", compact_placement=True, gvnic=True),
    GcpFamily(
        "n1",
        compact_placement=False,
        attachable={
            "nvidia-tesla-t4": (1, 2, 4),
            "nvidia-tesla-v100": (1, 2, 4, 8),
            "nvidia-tesla-p100": (1, 2, 4),
            "nvidia-tesla-p4": (1, 2, 4),
        },
    ),
    GcpFamily("n2d", compact_placement=True),
    GcpFamily("n2", compact_placement=True),
    GcpFamily("n4", compact_placement=False, boot_disk_type="hyperdisk-balanced"),
    GcpFamily("c2d", compact_placement=True),
    GcpFamily("c2", compact_placement=True),
    GcpFamily("c3", compact_placement=True),
    GcpFamily("e2", compact_placement=False),
)


N1_MAX_VCPUS: dict[str, dict[int, int]] = {
    # Compute Engine's GPU table for N1: the most vCPUs a VM may have per attached GPU count.
    # n1-standard-96 with one V100 is refused by the API; here it is refused at preview.
    "nvidia-tesla-t4": {1: 48, 2: 48, 4: 96},
    "nvidia-tesla-p4": {1: 24, 2: 48, 4: 96},
    "nvidia-tesla-v100": {1: 12, 2: 24, 4: 48, 8: 96},
    "nvidia-tesla-p100": {1: 16, 2: 32, 4: 64},
}
SPOT_ONLY_TYPES = frozenset({"a3-highgpu-1g", "a3-highgpu-2g", "a3-highgpu-4g"})
"""A3 High with fewer than 8 GPUs is offered as Spot (or flex-start) capacity only."""
COMPACT_PLACEMENT_MAX_VMS = 150
"""Compute Engine documents at most 150 VMs per compact placement policy."""
DATA_NETWORK_MTU = 8244
"""The MTU Google documents for the GPUDirect-TCPX/TCPXO data networks."""


@dataclass(frozen=True)
class GpuMachineType:
    """A machine type with GPUs built in: the GPU count and model are fixed by the type."""

    name: str
    gpus: int
    gpu_type: str


def _series(template: str, counts: tuple[int, ...], gpu_type: str) -> dict[str, GpuMachineType]:
    return {template.format(n): GpuMachineType(template.format(n), n, gpu_type) for n in counts}


GPU_MACHINE_TYPES: dict[str, GpuMachineType] = {
    **_series("a3-ultragpu-{}g", (8,), "nvidia-h200-141gb"),
    **_series("a3-megagpu-{}g", (8,), "nvidia-h100-mega-80gb"),
    **_series("a3-highgpu-{}g", (1, 2, 4, 8), "nvidia-h100-80gb"),
    **_series("a2-highgpu-{}g", (1, 2, 4, 8), "nvidia-tesla-a100"),
    **_series("a2-megagpu-{}g", (16,), "nvidia-tesla-a100"),
    **_series("a2-ultragpu-{}g", (1, 2, 4, 8), "nvidia-a100-80gb"),
    **{f"g2-standard-{n}": GpuMachineType(f"g2-standard-{n}", 1, "nvidia-l4") for n in (4, 8, 12, 16, 32)},
    "g2-standard-24": GpuMachineType("g2-standard-24", 2, "nvidia-l4"),
    "g2-standard-48": GpuMachineType("g2-standard-48", 4, "nvidia-l4"),
    "g2-standard-96": GpuMachineType("g2-standard-96", 8, "nvidia-l4"),
}

# General-purpose types are recognised by pattern: no GPUs, except N1 which takes attached ones.
GENERAL_TYPE_RE = re.compile(r"^(n1|n2|n2d|n4|c2|c2d|c3|e2)-(standard|highmem|highcpu)-(\d+)$")
MACHINE_TYPE_RE = re.compile(r"^[a-z][a-z0-9]*-[a-z0-9-]+$")

_REGION_NAMES = """
    us-central1 us-east1 us-east4 us-east5 us-south1 us-west1 us-west2 us-west3 us-west4
    northamerica-northeast1 northamerica-northeast2 northamerica-south1
    southamerica-east1 southamerica-west1
    europe-west1 europe-west2 europe-west3 europe-west4 europe-west6 europe-west8 europe-west9
    europe-west10 europe-west12 europe-central2 europe-north1 europe-north2 europe-southwest1
    asia-east1 asia-east2 asia-northeast1 asia-northeast2 asia-northeast3 asia-south1 asia-south2
    asia-southeast1 asia-southeast2 australia-southeast1 australia-southeast2
    me-central1 me-central2 me-west1 africa-south1
    """
REGIONS: frozenset[str] = frozenset(_REGION_NAMES.split())
REGION_RE = re.compile(r"^[a-z]+-[a-z]+\d+$")
ZONE_RE = re.compile(r"^([a-z]+-[a-z]+\d+)-([a-z])$")

# Deep Learning VM image: Ubuntu 22.04 with cloud-init, PyTorch and NVIDIA driver 570.
DLVM_PROJECT = "deeplearning-platform-release"
DLVM_FAMILY = "pytorch-2-7-cu128-ubuntu-2204-nvidia-570"
IMAGE_RE = re.compile(
    r"^((https://www\.googleapis\.com/compute/v1/)?projects/[a-z][-a-z0-9.:]*/global/images/"
    r"(family/)?[a-z]([-a-z0-9]*[a-z0-9])?|[a-z]([-a-z0-9]*[a-z0-9])?)$"
)
PROJECT_RE = re.compile(r"^[a-z][a-z0-9-]{4,28}[a-z0-9]$")

# Labels fleetrun puts on every resource; the teardown check lists instances by the first.
CLUSTER_LABEL = GCP_CLUSTER_LABEL
RANK_LABEL = GCP_RANK_LABEL

LABEL_KEY_RE = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
LABEL_VALUE_RE = re.compile(r"^[a-z0-9_-]{0,63}$")
MAX_USER_LABELS = 60  # GCP allows 64 per resource; fleetrun sets a few of its own.


def family_of(machine_type: str) -> GcpFamily | None:
    for family in FAMILIES:
        if machine_type.startswith(family.prefix + "-"):
            return family
    return None


def gpu_type_names() -> list[str]:
    """GPU types in table order (grouped by GPU model, biggest first)."""
    return list(GPU_MACHINE_TYPES) + ["n1-standard-N with fleet:accelerator_type"]


class GcpRules:
    """``CloudRules`` for GCP."""

    name = "gcp"
    display_name = "GCP"
    only_keys = frozenset({"project", "accelerator_type"})
    default_ssh_user = "ubuntu"
    default_disk_type = "pd-balanced"

    def location(
        self, region: str | None, zone: str | None, allow_unlisted: bool
    ) -> Location | list[Problem]:
        if not zone:
            example = f"{region}-a" if region else "us-central1-a"
            return [
                (
                    "zone",
                    f"required on GCP (GPU types differ per zone), e.g. {example}; list them with "
                    "`gcloud compute accelerator-types list`",
                )
            ]
        match = ZONE_RE.match(zone)
        if not match:
            return [("zone", f"{zone!r} is not a GCP zone name such as us-central1-a")]
        zone_region = match.group(1)
        if region and region != zone_region:
            return [("zone", f"{zone!r} is not in fleet:region {region!r}; use a zone like {region}-a")]
        if zone_region not in REGIONS and not (allow_unlisted and REGION_RE.match(zone_region)):
            key = "region" if region else "zone"
            return [
                (
                    key,
                    f"{zone_region!r} is not a known GCP region; e.g. us-central1, us-east4, europe-west4 "
                    "(a region newer than fleetrun's table needs fleet:allow_unlisted: true)",
                )
            ]
        return Location(zone_region, zone)

    def machine(self, request: MachineRequest) -> MachineSpec | list[Problem]:
        name = request.machine_type
        accel = request.accelerator_type
        count = request.gpus_per_node
        family = family_of(name)
        built_in = GPU_MACHINE_TYPES.get(name)
        if built_in is not None:
            problems: list[Problem] = []
            if count is not None and count != built_in.gpus:
                problems.append(
                    (
                        "gpus_per_node",
                        f"{name} has {built_in.gpus} GPUs built in; set {built_in.gpus} or pick another type",
                    )
                )
            if accel is not None and accel != built_in.gpu_type:
                problems.append(
                    (
                        "accelerator_type",
                        f"{name} comes with {built_in.gpu_type}; remove fleet:accelerator_type or pick a type with {accel}",
                    )
                )
            return problems or self._spec(name, built_in.gpus, built_in.gpu_type, False, family)
        if GENERAL_TYPE_RE.match(name):
            attachable = family.attachable if family else {}
            if not attachable:
                if accel is not None or (count or 0) > 0:
                    key = "accelerator_type" if accel is not None else "gpus_per_node"
                    return [
                        (
                            key,
                            f"{name} cannot have GPUs; pick a GPU type ({', '.join(gpu_type_names())}) "
                            "or remove the GPU keys",
                        )
                    ]
                return self._spec(name, 0, None, False, family)
            if accel is None:
                if (count or 0) > 0:
                    return [
                        (
                            "accelerator_type",
                            f"{name} takes attached GPUs: set fleet:accelerator_type to one of {', '.join(attachable)}",
                        )
                    ]
                return self._spec(name, 0, None, False, family)
            if accel not in attachable:
                return [
                    (
                        "accelerator_type",
                        f"{accel!r} cannot be attached to {name}; one of {', '.join(attachable)}",
                    )
                ]
            counts = attachable[accel]
            if count is None or count not in counts:
                return [
                    (
                        "gpus_per_node",
                        f"{name} with {accel} takes {', '.join(map(str, counts))} GPUs; got {count}",
                    )
                ]
            vcpus = int(name.rsplit("-", 1)[1])
            most = N1_MAX_VCPUS.get(accel, {}).get(count)
            if most is not None and vcpus > most:
                return [
                    (
                        "machine_type",
                        f"{name} has {vcpus} vCPUs; with {count} x {accel} an N1 VM may have at most "
                        f"{most}; pick a smaller N1 type or attach more GPUs",
                    )
                ]
            return self._spec(name, count, accel, True, family)
        if request.allow_unlisted and MACHINE_TYPE_RE.match(name):
            if count is None:
                return [("gpus_per_node", f"required for {name!r}, which is not in fleetrun's GCP table")]
            attach = accel is not None and family is not None and bool(family.attachable)
            return self._spec(name, count, accel, attach, family)
        hint = " (that looks like an AWS instance type; set fleet:cloud: aws)" if "." in name else ""
        return [
            (
                "machine_type",
                f"{name!r} is not a known GCP machine type{hint}; known GPU types: {', '.join(gpu_type_names())} "
                "(a type newer than fleetrun's table needs fleet:allow_unlisted: true and fleet:gpus_per_node)",
            )
        ]

    @staticmethod
    def _spec(
        name: str, gpus: int, gpu_type: str | None, attach: bool, family: GcpFamily | None
    ) -> MachineSpec:
        return MachineSpec(
            machine_type=name,
            gpus=gpus,
            gpu_type=gpu_type,
            attach_accelerators=attach,
            compact_placement=family.compact_placement if family else False,
            gvnic=family.gvnic if family else False,
            boot_disk_type=family.boot_disk_type if family else "pd-balanced",
            data_nics=family.data_nics if family else 0,
            placement_max_nodes=COMPACT_PLACEMENT_MAX_VMS,
        )

    def image(self, value: str) -> ImageChoice | list[Problem]:
        if value == "auto":
            return ImageChoice(lookup=True)
        is_ami = re.match(r"^ami-[0-9a-f]+$", value) is not None
        if IMAGE_RE.match(value) and not is_ami:
            return ImageChoice(lookup=False, image_id=value)
        hint = " (an AMI id is an AWS image)" if is_ami else ""
        return [
            (
                "image",
                f"{value!r} is not a GCP image{hint}; use 'auto' for the Deep Learning VM image, or "
                "projects/PROJECT/global/images/NAME or projects/PROJECT/global/images/family/FAMILY",
            )
        ]

    def bucket_name_problem(self, name: str) -> str | None:
        return gcs_bucket_name_problem(name)

    def reservation_problem(self, reservation: str) -> str | None:
        if not re.match(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$", reservation):
            return f"{reservation!r} is not a reservation name (lowercase letters, digits and -)"
        return None

    def tag_problems(self, tags: Mapping[str, str]) -> list[Problem]:
        problems: list[Problem] = []
        if len(tags) > MAX_USER_LABELS:
            problems.append(("tags", f"{len(tags)} labels given; at most {MAX_USER_LABELS}"))
        for key, value in tags.items():
            if not LABEL_KEY_RE.match(key):
                problems.append(
                    (
                        "tags",
                        f"label key {key!r}: GCP labels start with a lowercase letter; a-z, 0-9, _ and -",
                    )
                )
            elif key.startswith("fleetrun-"):
                problems.append(("tags", f"label key {key!r}: the prefix fleetrun- is reserved"))
            if not LABEL_VALUE_RE.match(value):
                problems.append(
                    ("tags", f"label {key!r}: value {value!r} must be at most 63 of a-z, 0-9, _ and -")
                )
        return problems

    def region_of(self, zone: str) -> str:
        return gcp_region_of(zone)

    def failover_zones(self, region: str | None, zones: list[str], allow_unlisted: bool) -> list[Problem]:
        """GCP zones may span regions (the network is global; the bucket stays in the first
        zone's region, the subnet and placement policy follow the zone in use)."""
        problems: list[Problem] = []
        for zone in zones:
            found = self.location(None, zone, allow_unlisted)
            if isinstance(found, list):
                problems.extend(("zones", message) for _key, message in found)
        return problems

    def combination_problems(self, p: Provisioning) -> list[Problem]:
        problems: list[Problem] = []
        if p.machine.machine_type in SPOT_ONLY_TYPES and not p.spot:
            problems.append(
                (
                    "machine_type",
                    f"{p.machine.machine_type} is offered only as Spot (or flex-start) capacity; set "
                    "fleet:spot: true, or use a3-highgpu-8g for standard provisioning",
                )
            )
        limit = p.machine.placement_max_nodes
        if p.placement and limit is not None and p.node_count > limit:
            problems.append(
                (
                    "placement",
                    f"one compact placement policy holds at most {limit} VMs; {p.node_count} nodes need "
                    "fleet:placement: false (or fewer nodes)",
                )
            )
        if p.reservation and len(p.zones) > 1:
            problems.append(
                (
                    "zones",
                    "a reservation lives in one zone: remove fleet:zones (failover) when using "
                    "fleet:reservation, and set fleet:zone to the reservation's zone",
                )
            )
        return problems

    def project_problem(self, project: str | None) -> str | None:
        if not project:
            return "required on GCP: the project id to deploy into (or set gcp:project)"
        if not PROJECT_RE.match(project):
            return f"{project!r} is not a GCP project id (6-30 of a-z, 0-9 and -, starting with a letter)"
        return None


def gcs_bucket_name_problem(name: str) -> str | None:
    """Cloud Storage bucket naming rules (docs: "Bucket names")."""
    if not re.match(r"^[a-z0-9][a-z0-9._-]*[a-z0-9]$", name):
        return f"{name!r}: use lowercase letters, digits, '-', '_' and '.', starting and ending with a letter or digit"
    if len(name) < 3 or len(name) > 222 or ("." not in name and len(name) > 63):
        return (
            f"{name!r}: a bucket name has 3 to 63 characters (up to 222 with dots, 63 per dot-separated part)"
        )
    if any(len(part) > 63 for part in name.split(".")):
        return f"{name!r}: each dot-separated part has at most 63 characters"
    try:
        ipaddress.IPv4Address(name)
        return f"{name!r}: a bucket name must not look like an IP address"
    except ValueError:
        pass
    if name.startswith("goog") or "google" in name or "g00gle" in name:
        return f"{name!r}: names starting with 'goog' or containing 'google' are reserved"
    return None


RULES = GcpRules()
