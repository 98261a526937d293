"""AWS as fleetrun sees it before any resource exists: instance types, regions, naming rules.

Pure data and checks (no Pulumi import); ``RULES`` is this cloud's ``CloudRules``. The tables
turn a typo into a clear error at ``pulumi preview`` rather than a provider error minutes into
``pulumi up``. They go stale as AWS adds types and regions: ``fleet:allow_unlisted: true``
accepts a type or region missing here (then ``fleet:gpus_per_node`` must be given); adding the
row is the real fix. GPU type names follow GCP's accelerator names so ``gpu_type`` in the stack
outputs means the same on both clouds.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass

from fleetrun_contract.cluster import AWS_CLUSTER_TAG, AWS_RANK_TAG, aws_region_of
from infra.clouds.rules import ImageChoice, Location, MachineRequest, MachineSpec, Problem, Provisioning


@dataclass(frozen=True)
class AwsInstanceType:
    """One EC2 instance type. Its GPUs are fixed by the type (nothing can be attached)."""

    name: str
    gpus: int
    gpu_type: str | None = None
    efa_interfaces: int = 0
    """Network cards that can carry an EFA interface (0: no EFA on this type)."""
    cluster_placement: bool = True
    """Burstable (T) types cannot join a cluster placement group."""
    current_dlami: bool = True
    """The current Deep Learning AMI supports this type. Its release notes list G4dn, G5, G6,
    G6e, P4, P4de, P5, P5e, P5en: not P3, whose V100 (Volta) the newer drivers dropped."""


def _types(
    names: str, gpus: int, gpu_type: str | None, efa: int = 0, cluster: bool = True, dlami: bool = True
) -> dict:
    return {n: AwsInstanceType(n, gpus, gpu_type, efa, cluster, dlami) for n in names.split()}


INSTANCE_TYPES: dict[str, AwsInstanceType] = {
    # H100 / H200 / A100: the multi-node training machines (EFA on several network cards).
    **_types("p5.48xlarge", 8, "nvidia-h100-80gb", efa=32),
    **_types("p5e.48xlarge", 8, "nvidia-h200-141gb", efa=32),
    **_types("p5en.48xlarge", 8, "nvidia-h200-141gb", efa=16),
    **_types("p4d.24xlarge", 8, "nvidia-a100-40gb", efa=4),
    **_types("p4de.24xlarge", 8, "nvidia-a100-80gb", efa=4),
    # V100
    **_types("p3.2xlarge", 1, "nvidia-tesla-v100", dlami=False),
    **_types("p3.8xlarge", 4, "nvidia-tesla-v100", dlami=False),
    **_types("p3.16xlarge", 8, "nvidia-tesla-v100", dlami=False),
    **_types("p3dn.24xlarge", 8, "nvidia-tesla-v100", efa=1, dlami=False),
    # L40S
    **_types("g6e.xlarge g6e.2xlarge g6e.4xlarge", 1, "nvidia-l40s"),
    **_types("g6e.8xlarge g6e.16xlarge", 1, "nvidia-l40s", efa=1),
    **_types("g6e.12xlarge", 4, "nvidia-l40s", efa=1),
    **_types("g6e.24xlarge", 4, "nvidia-l40s", efa=2),
    **_types("g6e.48xlarge", 8, "nvidia-l40s", efa=4),
    # L4
    **_types("g6.xlarge g6.2xlarge g6.4xlarge", 1, "nvidia-l4"),
    **_types("g6.8xlarge g6.16xlarge", 1, "nvidia-l4", efa=1),
    **_types("g6.12xlarge g6.24xlarge", 4, "nvidia-l4", efa=1),
    **_types("g6.48xlarge", 8, "nvidia-l4", efa=1),
    # A10G
    **_types("g5.xlarge g5.2xlarge g5.4xlarge", 1, "nvidia-a10g"),
    **_types("g5.8xlarge g5.16xlarge", 1, "nvidia-a10g", efa=1),
    **_types("g5.12xlarge g5.24xlarge", 4, "nvidia-a10g", efa=1),
    **_types("g5.48xlarge", 8, "nvidia-a10g", efa=1),
    # T4
    **_types("g4dn.xlarge g4dn.2xlarge g4dn.4xlarge", 1, "nvidia-tesla-t4"),
    **_types("g4dn.8xlarge g4dn.16xlarge", 1, "nvidia-tesla-t4", efa=1),
    **_types("g4dn.12xlarge", 4, "nvidia-tesla-t4", efa=1),
    **_types("g4dn.metal", 8, "nvidia-tesla-t4", efa=1),
    # CPU only: cheap smoke tests of the whole pipeline (the ``cpu-smoke`` preset).
    **_types("t3.large t3.xlarge t3.2xlarge", 0, None, cluster=False),
    **_types(
        "m5.xlarge m5.2xlarge m6i.xlarge m6i.2xlarge c5.xlarge c5.2xlarge c6i.xlarge c6i.2xlarge", 0, None
    ),
}

_REGION_NAMES = """
    us-east-1 us-east-2 us-west-1 us-west-2 ca-central-1 ca-west-1 mx-central-1 sa-east-1
    eu-west-1 eu-west-2 eu-west-3 eu-central-1 eu-central-2 eu-north-1 eu-south-1 eu-south-2
    ap-south-1 ap-south-2 ap-east-1 ap-northeast-1 ap-northeast-2 ap-northeast-3
    ap-southeast-1 ap-southeast-2 ap-southeast-3 ap-southeast-4 ap-southeast-5 ap-southeast-7
    me-south-1 me-central-1 il-central-1 af-south-1
    us-gov-west-1 us-gov-east-1 cn-north-1 cn-northwest-1
    """
REGIONS: frozenset[str] = frozenset(_REGION_NAMES.split())
REGION_RE = re.compile(r"^[a-z]{2}(-gov)?-[a-z]+-\d$")
INSTANCE_TYPE_RE = re.compile(r"^[a-z][a-z0-9-]*\.[a-z0-9-]+$")

# The Deep Learning AMI: Ubuntu with cloud-init, PyTorch, NVIDIA driver, EFA and aws-ofi-nccl.
# Looked up with ``most_recent`` at deploy time; ``fleet:image: ami-...`` pins one instead.
DLAMI_OWNER = "amazon"
DLAMI_NAME = "Deep Learning OSS Nvidia Driver AMI GPU PyTorch * (Ubuntu *)"
AMI_RE = re.compile(r"^ami-([0-9a-f]{8}|[0-9a-f]{17})$")

# Tags fleetrun puts on every resource (their one definition is the shared contract); the leak
# audit of `fab down` (launch.fleets.clouds.aws) lists what is left by the first.
CLUSTER_TAG = AWS_CLUSTER_TAG
RANK_TAG = AWS_RANK_TAG

TAG_CHARS_RE = re.compile(r"^[\w .:/=+\-@]*$")
RESERVED_TAG_PREFIXES = ("aws:", "fleetrun:")
MAX_USER_TAGS = 40  # AWS allows 50 per resource; fleetrun sets a few of its own.

# The explicit provider (pinned to fleet:region) reads no aws:* stack config by itself, so every
# aws:* key a user may set is forwarded here, by its Pulumi config name -> provider argument.
# Structured keys are JSON in the config; a key missing from this table is refused by name
# rather than silently dropped (an ignored assume-role would deploy into the wrong account).
AWS_PROVIDER_SCALARS: dict[str, str] = {
    "profile": "profile",
    "sharedConfigFiles": "shared_config_files",
    "sharedCredentialsFiles": "shared_credentials_files",
    "allowedAccountIds": "allowed_account_ids",
    "forbiddenAccountIds": "forbidden_account_ids",
    "accessKey": "access_key",
    "secretKey": "secret_key",
    "token": "token",
    "maxRetries": "max_retries",
    "retryMode": "retry_mode",
    "stsRegion": "sts_region",
    "skipCredentialsValidation": "skip_credentials_validation",
    "skipMetadataApiCheck": "skip_metadata_api_check",
    "skipRegionValidation": "skip_region_validation",
    "skipRequestingAccountId": "skip_requesting_account_id",
}
AWS_PROVIDER_STRUCTURED = (
    "assumeRole",
    "assumeRoles",
    "assumeRoleWithWebIdentity",
    "defaultTags",
    "ignoreTags",
)
AWS_PROVIDER_IGNORED = ("region",)
"""fleet:region wins: the cluster's region is part of fleetrun's own config."""


_BOOL_ARGS = {
    "skip_credentials_validation",
    "skip_metadata_api_check",
    "skip_region_validation",
    "skip_requesting_account_id",
}
_LIST_ARGS = {
    "shared_config_files",
    "shared_credentials_files",
    "allowed_account_ids",
    "forbidden_account_ids",
}


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def _json_or_text(value: str) -> object:
    import json

    text = value.strip()
    if text[:1] in "[{":
        return json.loads(text)
    return text


def aws_provider_arguments(raw: Mapping[str, str]) -> tuple[dict[str, object], list[str]]:
    """``aws:*`` stack config (keys without the namespace) -> provider keyword arguments.

    Structured values come back as plain dicts with snake_case field names (the caller wraps
    them in the SDK's ``Provider*Args``); keys of user maps (tags) are left as written. The
    second value names every key that would be dropped, so the program can refuse it.
    """
    arguments: dict[str, object] = {}
    unknown: list[str] = []
    for key, value in raw.items():
        if key in AWS_PROVIDER_IGNORED:
            continue
        if key in AWS_PROVIDER_SCALARS:
            name = AWS_PROVIDER_SCALARS[key]
            parsed = _json_or_text(value)
            if name in _BOOL_ARGS:
                parsed = str(parsed).lower() == "true"
            elif name == "max_retries":
                parsed = int(str(parsed))
            elif name in _LIST_ARGS and isinstance(parsed, str):
                parsed = [part.strip() for part in parsed.split(",") if part.strip()]
            arguments[name] = parsed
        elif key in AWS_PROVIDER_STRUCTURED:
            parsed = _json_or_text(value)
            items = parsed if isinstance(parsed, list) else [parsed]
            converted = [
                {_snake(k): v for k, v in item.items()} if isinstance(item, dict) else item for item in items
            ]
            if key in ("assumeRole", "assumeRoles"):
                existing = arguments.get("assume_roles")
                arguments["assume_roles"] = [*(existing if isinstance(existing, list) else []), *converted]
            else:
                arguments[_snake(key)] = converted[0]
        else:
            unknown.append(key)
    return arguments, sorted(unknown)


def gpu_type_names() -> list[str]:
    """GPU types in table order (grouped by GPU model, biggest first)."""
    return [t.name for t in INSTANCE_TYPES.values() if t.gpus]


class AwsRules:
    """``CloudRules`` for AWS."""

    name = "aws"
    display_name = "AWS"
    only_keys = frozenset({"efa", "capacity_block"})
    default_ssh_user = "ubuntu"
    default_disk_type = "gp3"

    def location(
        self, region: str | None, zone: str | None, allow_unlisted: bool
    ) -> Location | list[Problem]:
        if not region:
            return [("region", "required on AWS: the region to deploy into, e.g. us-east-1")]
        problems: list[Problem] = []
        if region not in REGIONS and not (allow_unlisted and REGION_RE.match(region)):
            hint = ""
            if re.match(r"^[a-z]+-[a-z]+\d+$", region):
                hint = " (that looks like a GCP region; set fleet:cloud: gcp)"
            problems.append(
                (
                    "region",
                    f"{region!r} is not a known AWS region{hint}; e.g. us-east-1, us-west-2, eu-west-1 "
                    "(a region newer than fleetrun's table needs fleet:allow_unlisted: true)",
                )
            )
        if zone is not None and not re.match(rf"^{re.escape(region)}(-[a-z0-9]+-)?[a-z0-9]+$", zone):
            problems.append(
                (
                    "zone",
                    f"{zone!r} is not an availability zone of {region} (e.g. {region}a); leave it unset "
                    "to use the first zone that offers the instance type",
                )
            )
        return problems or Location(region, zone)

    def machine(self, request: MachineRequest) -> MachineSpec | list[Problem]:
        name = request.machine_type
        known = INSTANCE_TYPES.get(name)
        if known is None:
            if request.allow_unlisted and INSTANCE_TYPE_RE.match(name):
                if request.gpus_per_node is None:
                    return [("gpus_per_node", f"required for {name!r}, which is not in fleetrun's AWS table")]
                return MachineSpec(
                    name, request.gpus_per_node, None, compact_placement=True, boot_disk_type="gp3"
                )
            hint = " (that looks like a GCP machine type; set fleet:cloud: gcp)" if "." not in name else ""
            return [
                (
                    "machine_type",
                    f"{name!r} is not a known AWS instance type{hint}; known GPU types: "
                    f"{', '.join(gpu_type_names())} (a type newer than fleetrun's table needs "
                    "fleet:allow_unlisted: true and fleet:gpus_per_node)",
                )
            ]
        if request.gpus_per_node is not None and request.gpus_per_node != known.gpus:
            if known.gpus == 0:
                message = (
                    f"{name} has no GPUs, but {request.gpus_per_node} were asked for; pick a GPU type "
                    "(e.g. g6.xlarge, p4d.24xlarge, p5.48xlarge) or remove fleet:gpus_per_node"
                )
            else:
                message = (
                    f"{name} has {known.gpus} GPUs ({known.gpu_type}), fixed by the type; set "
                    f"{known.gpus} or pick another instance type"
                )
            return [("gpus_per_node", message)]
        return MachineSpec(
            machine_type=name,
            gpus=known.gpus,
            gpu_type=known.gpu_type,
            efa_interfaces=known.efa_interfaces,
            compact_placement=known.cluster_placement,
            boot_disk_type="gp3",
        )

    def image(self, value: str) -> ImageChoice | list[Problem]:
        if value == "auto":
            return ImageChoice(lookup=True)
        if AMI_RE.match(value):
            return ImageChoice(lookup=False, image_id=value)
        return [
            (
                "image",
                f"{value!r} is not an AMI id (ami-0123456789abcdef0); use 'auto' for the Deep Learning AMI",
            )
        ]

    def bucket_name_problem(self, name: str) -> str | None:
        return s3_bucket_name_problem(name)

    def reservation_problem(self, reservation: str) -> str | None:
        if not re.match(r"^cr-[0-9a-f]{17}$", reservation):
            return f"{reservation!r} is not a capacity reservation id (cr- and 17 hex digits)"
        return None

    def tag_problems(self, tags: Mapping[str, str]) -> list[Problem]:
        problems: list[Problem] = []
        if len(tags) > MAX_USER_TAGS:
            problems.append(("tags", f"{len(tags)} tags given; at most {MAX_USER_TAGS}"))
        for key, value in tags.items():
            if not 1 <= len(key) <= 128 or not TAG_CHARS_RE.match(key):
                problems.append(("tags", f"tag key {key!r}: 1-128 letters, digits, spaces and _.:/=+-@"))
            elif key.lower().startswith(RESERVED_TAG_PREFIXES):
                problems.append(("tags", f"tag key {key!r}: the prefixes aws: and fleetrun: are reserved"))
            if len(value) > 256 or not TAG_CHARS_RE.match(value):
                problems.append(
                    ("tags", f"tag {key!r}: value must be at most 256 letters, digits, spaces, _.:/=+-@")
                )
        return problems

    def project_problem(self, project: str | None) -> str | None:
        return None  # the AWS account comes from the credentials

    def region_of(self, zone: str) -> str:
        return aws_region_of(zone)

    def failover_zones(self, region: str | None, zones: list[str], allow_unlisted: bool) -> list[Problem]:
        problems: list[Problem] = []
        for zone in zones:
            if not region or self.region_of(zone) != region or zone == region:
                problems.append(
                    (
                        "zones",
                        f"{zone!r} is not an availability zone of {region}; on AWS every zone of "
                        "fleet:zones must be in fleet:region (the VPC, the bucket and the provider are "
                        "regional); use another stack for another region",
                    )
                )
        return problems

    def combination_problems(self, p: Provisioning) -> list[Problem]:
        problems: list[Problem] = []
        known = INSTANCE_TYPES.get(p.machine.machine_type)
        if known is not None and not known.current_dlami and p.image.lookup:
            problems.append(
                (
                    "image",
                    f"{p.machine.machine_type} has V100 (Volta) GPUs, which the current Deep Learning AMI "
                    "no longer supports (its driver would not see them); pin an AMI whose driver "
                    "supports Volta with fleet:image: ami-..., or pick a newer type (g5, g6, p4d)",
                )
            )
        if p.reservation and (not p.zone or len(p.zones) > 1):
            problems.append(
                (
                    "zone",
                    "a capacity reservation lives in one availability zone: set fleet:zone to the "
                    "reservation's zone (and no fleet:zones failover); otherwise instances launch "
                    "elsewhere and the reservation is not used",
                )
            )
        if p.capacity_block and not p.reservation:
            problems.append(
                ("capacity_block", "needs fleet:reservation: the Capacity Block's reservation id (cr-...)")
            )
        if p.capacity_block and p.spot:
            problems.append(
                ("capacity_block", "a Capacity Block is not spot capacity; set fleet:spot: false")
            )
        return problems


def s3_bucket_name_problem(name: str) -> str | None:
    """S3's general-purpose bucket naming rules (docs: "Bucket naming rules")."""
    if not 3 <= len(name) <= 63:
        return f"{name!r}: an S3 bucket name has 3 to 63 characters"
    if not re.match(r"^[a-z0-9][a-z0-9.-]*[a-z0-9]$", name):
        return f"{name!r}: use lowercase letters, digits, '-' and '.', starting and ending with a letter or digit"
    if ".." in name or ".-" in name or "-." in name:
        return f"{name!r}: no two adjacent periods, and no period next to a hyphen"
    try:
        ipaddress.IPv4Address(name)
        return f"{name!r}: a bucket name must not look like an IP address"
    except ValueError:
        pass
    for prefix in ("xn--", "sthree-", "amzn-s3-demo-"):
        if name.startswith(prefix):
            return f"{name!r}: the prefix {prefix!r} is reserved by S3"
    for suffix in ("-s3alias", "--ol-s3", ".mrap", "--x-s3", "--table-s3"):
        if name.endswith(suffix):
            return f"{name!r}: the suffix {suffix!r} is reserved by S3"
    return None


RULES = AwsRules()
