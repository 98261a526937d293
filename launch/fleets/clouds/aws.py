"""AWS on the laptop side: the leak audit (EC2), uploads (``aws s3 sync``), the power-off hook
(an OS shutdown terminates the instance), and what EC2's error codes mean for failover."""

from __future__ import annotations

import re
from typing import Any

from fleetrun_contract.cluster import AWS_CLUSTER_TAG as CLUSTER_TAG
from fleetrun_contract.cluster import aws_region_of
from launch.errors import FleetrunError
from launch.fleets.clouds.base import ClusterLocation, ErrorKind, Rules, classify, fill, missing_sdk
from launch.nodelib.fleetrun_protocol import BucketCommands

# The one S3 uploader: the run directory's copy, checkpoints up and down, old checkpoints removed.
COPY = ("aws", "s3", "cp", "--only-show-errors", "{src}", "{dest}")
SYNC = ("aws", "s3", "sync", "--only-show-errors", "{src}", "{dest}")
REMOVE = ("aws", "s3", "rm", "--recursive", "--only-show-errors", "{dest}")
LIVE_STATES = ["pending", "running", "shutting-down", "stopping", "stopped"]
"""Every state but terminated: a stopped instance still bills for its volumes (and its EIP)."""

POWEROFF_HOOK = """\
#!/bin/sh
# fleetrun watchdog, AWS node: an OS shutdown terminates this instance (fleetrun's Pulumi program
# sets instance-initiated shutdown behaviour = terminate), so compute, the root volume (delete on
# termination) and, with it, the billing end. No EC2 permission is needed for this.
sudo -n /sbin/shutdown -h now || sudo -n /sbin/poweroff
"""

ERROR_RULES: Rules = [
    (
        ErrorKind.CAPACITY,
        re.compile(r"InsufficientInstanceCapacity|InsufficientHostCapacity|InsufficientCapacityOnHost"),
    ),
    (ErrorKind.CAPACITY, re.compile(r"InsufficientReservedInstanceCapacity|ReservationCapacityExceeded")),
    (ErrorKind.CAPACITY, re.compile(r"There is no Spot capacity available|capacity-not-available")),
    # "Unsupported" also means a bad configuration; only the zone form is worth another zone.
    (ErrorKind.CAPACITY, re.compile(r"is not supported in your requested Availability Zone")),
    (ErrorKind.QUOTA, re.compile(r"VcpuLimitExceeded|InstanceLimitExceeded|MaxSpotInstanceCountExceeded")),
    (ErrorKind.QUOTA, re.compile(r"AddressLimitExceeded|VolumeLimitExceeded|\bLimitExceeded\b|quota allows")),
    (ErrorKind.PERMISSION, re.compile(r"UnauthorizedOperation|AccessDenied|AuthFailure|OptInRequired")),
    (ErrorKind.PERMISSION, re.compile(r"not authorized to perform|ExpiredToken|InvalidClientTokenId")),
    (
        ErrorKind.BAD_CONFIG,
        re.compile(r"InvalidParameter\w*|Invalid[A-Z]\w*\.(NotFound|Malformed)|MissingParameter"),
    ),
    (
        ErrorKind.BAD_CONFIG,
        re.compile(r"Unsupported|InsufficientFreeAddressesInSubnet|InvalidBlockDeviceMapping"),
    ),
]


class AwsOps:
    name = "aws"
    cluster_tag = CLUSTER_TAG

    def region_of(self, zone: str) -> str:
        return aws_region_of(zone)

    def classify_error(self, message: str) -> ErrorKind:
        return classify(message, ERROR_RULES)

    def upload_argv(self, bucket: str, dest: str) -> list[str]:
        return fill(SYNC, dest=f"s3://{bucket}/{dest}")

    def bucket_commands(self, bucket: str, prefix: str) -> BucketCommands:
        return BucketCommands(url=f"s3://{bucket}/{prefix}", copy=COPY, sync=SYNC, remove=REMOVE)

    def preemption_poller(self) -> str:
        return "ec2-imdsv2"

    def download_argv(self, bucket: str, src: str) -> list[str]:
        return fill(SYNC, src=f"s3://{bucket}/{src}")

    def poweroff_hook(self) -> str:
        return POWEROFF_HOOK

    def leftovers(self, location: ClusterLocation) -> list[str]:
        try:
            import boto3  # type: ignore[import-not-found, unused-ignore]
        except ImportError:
            raise FleetrunError(missing_sdk("boto3", "aws")) from None
        session = boto3.Session(profile_name=location.profile, region_name=location.region)
        ec2 = session.client("ec2")
        tagged = {"Name": f"tag:{CLUSTER_TAG}", "Values": [location.cluster_id]}
        lines: list[str] = []
        live = {"Name": "instance-state-name", "Values": LIVE_STATES}
        for page in _pages(ec2, "describe_instances", Filters=[tagged, live]):
            for reservation in page.get("Reservations", []):
                for i in reservation.get("Instances", []):
                    zone = i.get("Placement", {}).get("AvailabilityZone", "?")
                    lines.append(
                        f"instance {i['InstanceId']} ({i['State']['Name']}, {i.get('InstanceType', '?')}, {zone})"
                    )
        for page in _pages(ec2, "describe_volumes", Filters=[tagged]):
            for v in page.get("Volumes", []):
                lines.append(
                    f"volume {v['VolumeId']} ({v.get('State', '?')}, {v.get('Size', '?')} GB, {v.get('AvailabilityZone', '?')})"
                )
        for a in ec2.describe_addresses(Filters=[tagged]).get("Addresses", []):
            where = f"on {a['NetworkInterfaceId']}" if a.get("NetworkInterfaceId") else "unattached"
            lines.append(f"address {a.get('PublicIp', '?')} ({a.get('AllocationId', '?')}, {where})")
        for page in _pages(ec2, "describe_network_interfaces", Filters=[tagged]):
            for n in page.get("NetworkInterfaces", []):
                lines.append(
                    f"network interface {n['NetworkInterfaceId']} ({n.get('Status', '?')}, {n.get('InterfaceType', '?')})"
                )
        return lines


def _pages(client: Any, operation: str, **kwargs: Any) -> Any:
    return client.get_paginator(operation).paginate(**kwargs)


AWS = AwsOps()
