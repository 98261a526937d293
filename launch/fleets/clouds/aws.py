"""AWS on the laptop side: the leak audit (EC2), uploads (``aws s3 sync``), the power-off hook
(an OS shutdown terminates the instance), and what EC2's error codes mean for failover."""

from __future__ import annotations

import json
import os
import re
from typing import Any

from fleetrun_contract.cluster import AWS_CLUSTER_TAG as CLUSTER_TAG
from fleetrun_contract.cluster import AWS_RANK_TAG, aws_region_of
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
    instance = NodeInstance("aws:ec2/instance:Instance", "tags", AWS_RANK_TAG, None)
    """``aws.ec2.Instance`` named after the node, tagged with the cluster and the rank; its id is
    the instance id the outputs export."""

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

    def lifetime_note(self, warm_until: str) -> str:
        return (
            f"at {warm_until} an EventBridge Scheduler one-time schedule per node terminates its instance "
            "(ec2:TerminateInstances on that instance only)"
        )

    def leftovers(self, location: ClusterLocation) -> list[str]:
        try:
            import boto3  # type: ignore[import-not-found, unused-ignore]
        except ImportError:
            raise FleetrunError(missing_sdk("boto3", "aws")) from None
        ec2 = audit_session(boto3, location).client("ec2")
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


AUDIT_SESSION_NAME = "fleetrun-leak-audit"


def audit_session(boto3: Any, location: ClusterLocation) -> Any:
    """A boto3 session in the account the cluster was built in: the stack's provider credentials
    (``aws:profile``, ``aws:accessKey``...), then its web identity and every role of
    ``aws:assumeRole(s)`` in order, as the program's provider assumes them
    (``infra.clouds.aws.provider_arguments``). Without this, a cluster built with a role in
    another account is audited in the caller's own account, where nothing of it is found: a
    "confirmed: nothing remains" while it keeps billing. A role that cannot be assumed fails
    the audit (never a fallback to the caller's account)."""
    config = dict(location.provider_config)
    base: dict[str, Any] = {
        "profile_name": config.get("profile") or location.profile,
        "region_name": location.region,
    }
    for key, name in (
        ("accessKey", "aws_access_key_id"),
        ("secretKey", "aws_secret_access_key"),
        ("token", "aws_session_token"),
    ):
        if config.get(key):
            base[name] = config[key]
    session = boto3.Session(**base)
    sts_region = config.get("stsRegion") or location.region
    web = _role_list(config, "assumeRoleWithWebIdentity")
    for hop in web[:1]:
        token = str(hop.get("webIdentityToken") or "")
        if not token and hop.get("webIdentityTokenFile"):
            token = _read_token(str(hop["webIdentityTokenFile"]))
        answer = _sts(session, sts_region, "web identity", hop).assume_role_with_web_identity(
            RoleArn=str(hop.get("roleArn", "")),
            RoleSessionName=str(hop.get("sessionName") or AUDIT_SESSION_NAME),
            WebIdentityToken=token,
        )
        session = _assumed(boto3, answer, location.region)
    for hop in _role_list(config, "assumeRole") + _role_list(config, "assumeRoles"):
        call: dict[str, Any] = {
            "RoleArn": str(hop.get("roleArn", "")),
            "RoleSessionName": str(hop.get("sessionName") or AUDIT_SESSION_NAME),
        }
        if hop.get("externalId"):
            call["ExternalId"] = str(hop["externalId"])
        if hop.get("sourceIdentity"):
            call["SourceIdentity"] = str(hop["sourceIdentity"])
        session = _assumed(boto3, _sts(session, sts_region, "role", hop).assume_role(**call), location.region)
    return session


def _role_list(config: dict[str, str], key: str) -> list[dict[str, Any]]:
    """``aws:<key>`` as the provider reads it: one JSON object or a JSON list of them."""
    raw = (config.get(key) or "").strip()
    if not raw:
        return []
    try:
        parsed = json.loads(raw)
    except ValueError:
        raise FleetrunError(
            f"stack config aws:{key} is not JSON; cannot audit in the role's account"
        ) from None
    items = parsed if isinstance(parsed, list) else [parsed]
    if not all(isinstance(item, dict) and item.get("roleArn") for item in items):
        raise FleetrunError(
            f"stack config aws:{key}: every entry needs a roleArn; cannot audit in the role's account"
        )
    return items


def _sts(session: Any, region: str, what: str, hop: dict[str, Any]) -> Any:
    return _AssumeErrors(session.client("sts", region_name=region), f"{what} {str(hop.get('roleArn'))[:200]}")


class _AssumeErrors:
    """An STS client whose refusals become a FleetrunError naming the role (not a traceback)."""

    def __init__(self, client: Any, what: str) -> None:
        self.client, self.what = client, what

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.client, name)

        def call(**kwargs: Any) -> Any:
            try:
                return method(**kwargs)
            except Exception as exc:  # noqa: BLE001 - botocore's errors, without importing botocore
                raise FleetrunError(
                    f"cannot audit the cloud for leftovers: assuming the stack's {self.what} failed "
                    f"({type(exc).__name__}: {str(exc)[:300]}). Nothing was confirmed; check in the role's account."
                ) from None

        return call


def _assumed(boto3: Any, answer: dict[str, Any], region: str) -> Any:
    creds = answer["Credentials"]
    return boto3.Session(
        aws_access_key_id=creds["AccessKeyId"],
        aws_secret_access_key=creds["SecretAccessKey"],
        aws_session_token=creds["SessionToken"],
        region_name=region,
    )


def _read_token(path: str) -> str:
    try:
        with open(os.path.expanduser(path), encoding="utf-8") as handle:
            return handle.read(65536).strip()
    except OSError as exc:
        raise FleetrunError(f"cannot read aws:assumeRoleWithWebIdentity's token file: {exc}") from None


def _pages(client: Any, operation: str, **kwargs: Any) -> Any:
    return client.get_paginator(operation).paginate(**kwargs)


AWS = AwsOps()
