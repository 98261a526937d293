"""GCP on the laptop side: the leak audit (Compute Engine), uploads (``gcloud storage rsync``),
the power-off hook (the node deletes its own VM), and what Compute Engine's errors mean."""

from __future__ import annotations

import re

from fleetrun_contract.cluster import GCP_CLUSTER_LABEL as CLUSTER_LABEL
from fleetrun_contract.cluster import GCP_RANK_LABEL, gcp_region_of
from launch.errors import FleetrunError
from launch.fleets.clouds.base import (
    ClusterLocation,
    ErrorKind,
    NodeInstance,
    Rules,
    classify,
    fill,
    missing_sdk,
)
from launch.nodelib.fleetrun_protocol import BucketCommands

# The one Cloud Storage uploader: the run directory's copy, checkpoints up and down, removal.
COPY = ("gcloud", "storage", "cp", "{src}", "{dest}")
SYNC = ("gcloud", "storage", "rsync", "--recursive", "{src}", "{dest}")
REMOVE = ("gcloud", "storage", "rm", "--recursive", "{dest}")

POWEROFF_HOOK = """\
#!/bin/sh
# fleetrun watchdog, GCP node. A guest shutdown only STOPS a Compute Engine VM: its disk keeps
# billing and its ephemeral address is released. So the node deletes its own instance (the boot
# disk is auto-deleted with it) using its service account's token from the metadata server; the
# account holds compute.instances.delete on the cluster's instances only (fleetrun's Pulumi
# program binds it per instance). If the delete is refused, the node at least shuts down.
# The watchdog gives this script 120 s.
md=http://metadata.google.internal/computeMetadata/v1
get() { curl -sf -m 10 -H 'Metadata-Flavor: Google' "$md/$1"; }
# A name, zone or project id fit for the URL path: GCE's own alphabet, no traversal.
ok() { case "$1" in '' | *[!a-z0-9.:-]* | *..*) return 1 ;; esac; }
name=$(get instance/name) && zone=$(get instance/zone) && project=$(get project/project-id) &&
  ok "$name" && ok "${zone##*/}" && ok "$project" &&
  token=$(get instance/service-accounts/default/token | sed -n 's/.*"access_token" *: *"\\([^"]*\\)".*/\\1/p') &&
  [ -n "$token" ] &&
  curl -sf -m 30 -X DELETE -H "Authorization: Bearer $token" \\
    "https://compute.googleapis.com/compute/v1/projects/$project/zones/${zone##*/}/instances/$name" > /dev/null &&
  echo "fleetrun: deleting instance $name" && sleep 60
# Refused, or the VM is still up a minute after the delete was accepted (the operation goes on
# server-side either way): shut down so that at least compute stops billing.
sudo -n /sbin/shutdown -h now || sudo -n /sbin/poweroff
"""

ERROR_RULES: Rules = [
    (
        ErrorKind.CAPACITY,
        re.compile(r"ZONE_RESOURCE_POOL_EXHAUSTED|does not have enough resources available"),
    ),
    (
        ErrorKind.CAPACITY,
        re.compile(r"is currently unavailable in the \S+ zone|STOCKOUT|resource_availability"),
    ),
    # Not offered in this zone (machine type or GPU): the next zone may have it.
    (ErrorKind.CAPACITY, re.compile(r"does not exist in zone|/acceleratorTypes/\S+' was not found")),
    # A project-wide limit over every region (GPUS_ALL_REGIONS, CPUS_ALL_REGIONS, or any quota the
    # message says is counted "globally"): failing over to another region only repeats the refusal.
    (
        ErrorKind.GLOBAL_QUOTA,
        re.compile(r"[A-Z0-9_]+_ALL_REGIONS|[a-z0-9_]+_all_regions|Limit: [\d.]+ globally"),
    ),
    (
        ErrorKind.QUOTA,
        re.compile(r"QUOTA_EXCEEDED|Quota '[A-Z0-9_]+' exceeded|quotaExceeded|Insufficient \w+ quota"),
    ),
    (
        ErrorKind.PERMISSION,
        re.compile(r"Required '[\w.]+' permission|PERMISSION_DENIED|[Pp]ermission denied"),
    ),
    (ErrorKind.PERMISSION, re.compile(r"does not have permission|has not been used in project|, forbidden")),
    (
        ErrorKind.BAD_CONFIG,
        re.compile(r"Invalid value for field|INVALID_ARGUMENT|cannot be smaller than|, invalid\b"),
    ),
    (ErrorKind.BAD_CONFIG, re.compile(r"Error 400|badRequest|Unknown zone")),
]


class GcpOps:
    name = "gcp"
    cluster_tag = CLUSTER_LABEL
    instance = NodeInstance("gcp:compute/instance:Instance", "labels", GCP_RANK_LABEL, "instanceId")
    """``gcp.compute.Instance`` named after the node, labelled with the cluster and the rank; the
    outputs export its numeric ``instanceId`` (the resource's own id is its path)."""

    def region_of(self, zone: str) -> str:
        return gcp_region_of(zone)

    def classify_error(self, message: str) -> ErrorKind:
        return classify(message, ERROR_RULES)

    def upload_argv(self, bucket: str, dest: str) -> list[str]:
        return fill(SYNC, dest=f"gs://{bucket}/{dest}")

    def bucket_commands(self, bucket: str, prefix: str) -> BucketCommands:
        return BucketCommands(url=f"gs://{bucket}/{prefix}", copy=COPY, sync=SYNC, remove=REMOVE)

    def preemption_poller(self) -> str:
        return "gce-metadata"

    def download_argv(self, bucket: str, src: str) -> list[str]:
        return fill(SYNC, src=f"gs://{bucket}/{src}")

    def poweroff_hook(self) -> str:
        return POWEROFF_HOOK

    def lifetime_note(self, warm_until: str) -> str:
        return (
            f"at {warm_until} a Cloud Scheduler job per node deletes its instance (instances.delete, "
            "as an account that may delete only the cluster's instances)"
        )

    def leftovers(self, location: ClusterLocation) -> list[str]:
        """Instances in every status (a TERMINATED, i.e. stopped, VM still bills for its disk),
        disks and addresses labelled with the cluster, in every zone and region of the project.
        (Network interfaces are part of a GCP instance, not resources of their own.)"""
        try:
            from google.cloud import compute_v1  # type: ignore[import-not-found, import-untyped, unused-ignore]
        except ImportError:
            raise FleetrunError(missing_sdk("google-cloud-compute", "gcp")) from None
        if not location.project:
            raise FleetrunError("cannot audit the cloud for leftovers: the stack config has no fleet:project")
        label = f'labels.{CLUSTER_LABEL} = "{location.cluster_id}"'
        lines: list[str] = []
        instances = compute_v1.AggregatedListInstancesRequest(project=location.project, filter=label)
        for scope, scoped in compute_v1.InstancesClient().aggregated_list(request=instances):
            for i in scoped.instances:
                lines.append(f"instance {i.name} ({i.status}, {_short(scope)})")
        disks = compute_v1.AggregatedListDisksRequest(project=location.project, filter=label)
        for scope, scoped in compute_v1.DisksClient().aggregated_list(request=disks):
            for d in scoped.disks:
                lines.append(f"disk {d.name} ({d.size_gb} GB, {_short(scope)})")
        addresses = compute_v1.AggregatedListAddressesRequest(project=location.project, filter=label)
        for scope, scoped in compute_v1.AddressesClient().aggregated_list(request=addresses):
            for a in scoped.addresses:
                lines.append(f"address {a.name} {a.address} ({a.status}, {_short(scope)})")
        return lines


def _short(scope: str) -> str:
    """``zones/us-central1-a`` -> ``us-central1-a``."""
    return scope.rsplit("/", 1)[-1]


GCP = GcpOps()
