"""The AWS cluster's supporting resources: network, artifact bucket and node role.

Split from ``infra.clouds.aws`` (nodes and the cluster component) to keep each module small; the
security choices listed there are implemented here for the network (SSH from the operator only,
cluster-internal traffic, the default security group emptied), the bucket (versioned, encrypted,
private, retained by ``pulumi destroy``) and the role (the job bucket's objects only).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_aws as aws

from infra.clouds.aws_catalog import CLUSTER_TAG
from infra.settings import FleetSettings

ANYWHERE = "0.0.0.0/0"


def cluster_tags(settings: FleetSettings, **extra: str) -> dict[str, str]:
    """User tags plus fleetrun's own: every resource names its cluster."""
    return {**settings.tags, CLUSTER_TAG: settings.cluster_id, **extra}


# -- network ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AwsNetworkArgs:
    cluster_id: str
    cidr: str
    zone: pulumi.Input[str]
    ssh_cidrs: Sequence[str]
    tags: Mapping[str, str]


class AwsNetwork(pulumi.ComponentResource):
    """One public subnet in one zone (a cluster placement group lives in a single zone)."""

    def __init__(self, name: str, args: AwsNetworkArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("fleetrun:aws:Network", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        tags = dict(args.tags)

        vpc = aws.ec2.Vpc(
            f"{name}-vpc",
            cidr_block=args.cidr,
            enable_dns_support=True,
            enable_dns_hostnames=True,
            tags={**tags, "Name": args.cluster_id},
            opts=child,
        )
        # The default security group of a new VPC admits all traffic from its members; nothing
        # uses it, and emptying it keeps "nothing else inbound" true for anything launched by hand.
        aws.ec2.DefaultSecurityGroup(f"{name}-default-sg", vpc_id=vpc.id, tags=tags, opts=child)
        gateway = aws.ec2.InternetGateway(f"{name}-igw", vpc_id=vpc.id, tags=tags, opts=child)
        subnet = aws.ec2.Subnet(
            f"{name}-subnet",
            vpc_id=vpc.id,
            cidr_block=args.cidr,
            availability_zone=args.zone,
            map_public_ip_on_launch=True,
            tags={**tags, "Name": f"{args.cluster_id}-public"},
            # Zone failover moves the subnet to the next zone. It spans the whole VPC range, so
            # a replacement created first would overlap it; the nodes are gone by then.
            opts=pulumi.ResourceOptions(parent=self, delete_before_replace=True),
        )
        routes = aws.ec2.RouteTable(
            f"{name}-routes",
            vpc_id=vpc.id,
            routes=[aws.ec2.RouteTableRouteArgs(cidr_block=ANYWHERE, gateway_id=gateway.id)],
            tags=tags,
            opts=child,
        )
        aws.ec2.RouteTableAssociation(
            f"{name}-routes-assoc", subnet_id=subnet.id, route_table_id=routes.id, opts=child
        )
        self.security_group = aws.ec2.SecurityGroup(
            f"{name}-sg",
            vpc_id=vpc.id,
            description=f"fleetrun {args.cluster_id}: SSH from the operator, all traffic between nodes",
            ingress=[
                aws.ec2.SecurityGroupIngressArgs(
                    description="SSH from the operator",
                    protocol="tcp",
                    from_port=22,
                    to_port=22,
                    cidr_blocks=list(args.ssh_cidrs),
                ),
                aws.ec2.SecurityGroupIngressArgs(
                    description="all traffic between cluster nodes (NCCL, rendezvous, EFA)",
                    protocol="-1",
                    from_port=0,
                    to_port=0,
                    self=True,
                ),
            ],
            egress=[
                aws.ec2.SecurityGroupEgressArgs(
                    description="outbound (packages, bucket)",
                    protocol="-1",
                    from_port=0,
                    to_port=0,
                    cidr_blocks=[ANYWHERE],
                ),
                # EFA needs an explicit rule to its own security group, besides the CIDR rule.
                aws.ec2.SecurityGroupEgressArgs(
                    description="all traffic between cluster nodes (EFA)",
                    protocol="-1",
                    from_port=0,
                    to_port=0,
                    self=True,
                ),
            ],
            tags={**tags, "Name": args.cluster_id},
            opts=child,
        )
        self.subnet_id: pulumi.Output[str] = subnet.id
        self.zone: pulumi.Output[str] = subnet.availability_zone
        self.security_group_id: pulumi.Output[str] = self.security_group.id
        self.register_outputs({"subnet_id": self.subnet_id, "security_group_id": self.security_group_id})


# -- bucket -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AwsBucketArgs:
    bucket_name: str | None
    """None: auto-named (Pulumi appends a random suffix, so the name is globally unique)."""
    existing: bool
    tags: Mapping[str, str]


class AwsArtifactBucket(pulumi.ComponentResource):
    """Data, checkpoints and metrics. Every resource here survives ``pulumi destroy``.

    ``retain_on_delete`` rather than ``protect``: a protected resource makes ``destroy`` fail,
    which would stop ``fab down`` from removing the (billing) instances. The settings resources
    are retained too: deleting them would suspend versioning or lift the public access block.
    """

    def __init__(self, name: str, args: AwsBucketArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("fleetrun:aws:ArtifactBucket", name, None, opts)
        if args.existing and args.bucket_name:
            # Brought by the user (e.g. retained from an earlier stack): looked up, not managed.
            found = aws.s3.get_bucket_output(
                bucket=args.bucket_name, opts=pulumi.InvokeOutputOptions(parent=self)
            )
            self.bucket_name: pulumi.Output[str] = found.id
            self.bucket_arn: pulumi.Output[str] = found.arn
            self.register_outputs({"bucket_name": self.bucket_name})
            return

        keep = pulumi.ResourceOptions(parent=self, retain_on_delete=True)
        bucket = aws.s3.Bucket(
            name, bucket=args.bucket_name, force_destroy=False, tags=dict(args.tags), opts=keep
        )
        aws.s3.BucketOwnershipControls(
            f"{name}-ownership",
            bucket=bucket.id,
            rule=aws.s3.BucketOwnershipControlsRuleArgs(object_ownership="BucketOwnerEnforced"),
            opts=keep,
        )
        aws.s3.BucketPublicAccessBlock(
            f"{name}-public-access",
            bucket=bucket.id,
            block_public_acls=True,
            block_public_policy=True,
            ignore_public_acls=True,
            restrict_public_buckets=True,
            opts=keep,
        )
        aws.s3.BucketVersioning(
            f"{name}-versioning",
            bucket=bucket.id,
            versioning_configuration=aws.s3.BucketVersioningVersioningConfigurationArgs(status="Enabled"),
            opts=keep,
        )
        aws.s3.BucketServerSideEncryptionConfiguration(
            f"{name}-encryption",
            bucket=bucket.id,
            rules=[
                aws.s3.BucketServerSideEncryptionConfigurationRuleArgs(
                    apply_server_side_encryption_by_default=aws.s3.BucketServerSideEncryptionConfigurationRuleApplyServerSideEncryptionByDefaultArgs(
                        sse_algorithm="AES256"
                    ),
                    bucket_key_enabled=True,
                )
            ],
            opts=keep,
        )
        aws.s3.BucketPolicy(
            f"{name}-tls-only",
            bucket=bucket.id,
            policy=bucket.arn.apply(_deny_insecure_transport),
            opts=keep,
        )
        self.bucket_name = bucket.id
        self.bucket_arn = bucket.arn
        self.register_outputs({"bucket_name": self.bucket_name, "bucket_arn": self.bucket_arn})


def _deny_insecure_transport(bucket_arn: str) -> str:
    return json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Sid": "DenyInsecureTransport",
                    "Effect": "Deny",
                    "Principal": "*",
                    "Action": "s3:*",
                    "Resource": [bucket_arn, f"{bucket_arn}/*"],
                    "Condition": {"Bool": {"aws:SecureTransport": "false"}},
                }
            ],
        }
    )


# -- IAM ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AwsNodeRoleArgs:
    cluster_id: str
    region: str
    bucket_arn: pulumi.Input[str]
    tags: Mapping[str, str]


def node_policy(bucket_arn: str) -> dict[str, Any]:
    """The nodes' only permissions: the job bucket's objects.

    No EC2 action: the watchdog powers its node off with ``shutdown``, which terminates it
    (instance-initiated shutdown = terminate), so a compromised node cannot stop its siblings.
    """
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "ListJobBucket",
                "Effect": "Allow",
                "Action": ["s3:ListBucket", "s3:GetBucketLocation", "s3:ListBucketMultipartUploads"],
                "Resource": [bucket_arn],
            },
            {
                # No s3:DeleteObjectVersion: a job can replace or delete a checkpoint, but the
                # versioned bucket keeps the old version; nothing on the cluster can purge data.
                "Sid": "ReadWriteJobObjects",
                "Effect": "Allow",
                "Action": [
                    "s3:GetObject",
                    "s3:GetObjectVersion",
                    "s3:PutObject",
                    "s3:DeleteObject",
                    "s3:AbortMultipartUpload",
                    "s3:ListMultipartUploadParts",
                ],
                "Resource": [f"{bucket_arn}/*"],
            },
        ],
    }


class AwsNodeRole(pulumi.ComponentResource):
    def __init__(self, name: str, args: AwsNodeRoleArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("fleetrun:aws:NodeRole", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        role = aws.iam.Role(
            f"{name}-role",
            description=f"fleetrun {args.cluster_id} nodes: job bucket objects only",
            assume_role_policy=json.dumps(
                {
                    "Version": "2012-10-17",
                    "Statement": [
                        {
                            "Effect": "Allow",
                            "Principal": {"Service": "ec2.amazonaws.com"},
                            "Action": "sts:AssumeRole",
                        }
                    ],
                }
            ),
            tags=dict(args.tags),
            opts=child,
        )
        aws.iam.RolePolicy(
            f"{name}-policy",
            role=role.id,
            policy=pulumi.Output.from_input(args.bucket_arn).apply(lambda arn: json.dumps(node_policy(arn))),
            opts=child,
        )
        profile = aws.iam.InstanceProfile(f"{name}-profile", role=role.name, tags=dict(args.tags), opts=child)
        self.instance_profile_name: pulumi.Output[str] = profile.name
        self.register_outputs({"role_arn": role.arn, "instance_profile": profile.name})
