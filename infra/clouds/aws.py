"""The AWS cluster: VPC, security group, placement group, IAM, bucket and GPU instances.

``BUILDER.build`` creates an explicit provider for ``fleet:region`` and one ``AwsGpuCluster``
component holding four child components (network, bucket, node role, nodes). Every child
resource has ``parent=self``; nothing is created inside an ``apply`` (lookups are invokes whose
outputs feed resource inputs), so ``pulumi preview`` shows exactly what ``up`` will create.

Security choices, each enforced in tests/infra:
* inbound: SSH from the operator CIDRs and everything from the cluster's own security group
  (NCCL, rendezvous, EFA); nothing else. The VPC's default security group is emptied.
* the node role may read and write objects of the job bucket only (no permanent deletion of
  object versions), and terminate or stop instances tagged with this cluster's id (the
  on-cluster watchdog); nothing broader.
* the bucket is versioned, encrypted, private, and retained by ``pulumi destroy``.
* instances require IMDSv2, encrypt their root volume, and terminate on OS shutdown.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_aws as aws

from infra.bootstrap import AWS_USER_DATA_LIMIT
from infra.clouds.aws_catalog import CLUSTER_TAG, DLAMI_NAME, DLAMI_OWNER, RANK_TAG
from infra.clouds.base import ClusterArgs, ClusterOutputs, NodeOutputs, node_user_data
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
            opts=child,
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


def node_policy(
    bucket_arn: str, partition: str, account_id: str, region: str, cluster_id: str
) -> dict[str, Any]:
    """The nodes' only permissions: the job bucket, and stopping their own cluster."""
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
            {
                "Sid": "WatchdogStopsOwnCluster",
                "Effect": "Allow",
                "Action": ["ec2:TerminateInstances", "ec2:StopInstances"],
                "Resource": [f"arn:{partition}:ec2:{region}:{account_id}:instance/*"],
                "Condition": {"StringEquals": {f"aws:ResourceTag/{CLUSTER_TAG}": cluster_id}},
            },
        ],
    }


class AwsNodeRole(pulumi.ComponentResource):
    def __init__(self, name: str, args: AwsNodeRoleArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("fleetrun:aws:NodeRole", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        invoke = pulumi.InvokeOutputOptions(parent=self)
        role = aws.iam.Role(
            f"{name}-role",
            description=f"fleetrun {args.cluster_id} nodes: job bucket, and stopping this cluster only",
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
        partition = aws.get_partition_output(opts=invoke).partition
        account_id = aws.get_caller_identity_output(opts=invoke).account_id
        aws.iam.RolePolicy(
            f"{name}-policy",
            role=role.id,
            policy=pulumi.Output.all(args.bucket_arn, partition, account_id).apply(
                lambda v: json.dumps(node_policy(v[0], v[1], v[2], args.region, args.cluster_id))
            ),
            opts=child,
        )
        profile = aws.iam.InstanceProfile(f"{name}-profile", role=role.name, tags=dict(args.tags), opts=child)
        self.instance_profile_name: pulumi.Output[str] = profile.name
        self.register_outputs({"role_arn": role.arn, "instance_profile": profile.name})


# -- nodes --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AwsGpuNodesArgs:
    settings: FleetSettings
    subnet_id: pulumi.Input[str]
    security_group_id: pulumi.Input[str]
    instance_profile: pulumi.Input[str]
    image_id: pulumi.Input[str]
    user_data: Sequence[pulumi.Output[str]]
    """One per node, in rank order."""


class AwsGpuNodes(pulumi.ComponentResource):
    def __init__(self, name: str, args: AwsGpuNodesArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("fleetrun:aws:GpuNodes", name, None, opts)
        s = args.settings
        child = pulumi.ResourceOptions(parent=self)
        tags = cluster_tags(s)

        placement_group = None
        if s.placement:
            placement_group = aws.ec2.PlacementGroup(
                f"{name}-placement", strategy="cluster", tags=tags, opts=child
            )

        # EFA interfaces cannot be declared on the instance itself; a launch template carries the
        # primary interface as EFA (with the public address the launcher connects to). Only card 0:
        # AWS assigns no public IPv4 to an instance launched with several network interfaces.
        launch_template = None
        if s.efa:
            launch_template = aws.ec2.LaunchTemplate(
                f"{name}-efa",
                description=f"fleetrun {s.cluster_id}: EFA on the primary network interface",
                network_interfaces=[
                    aws.ec2.LaunchTemplateNetworkInterfaceArgs(
                        device_index=0,
                        network_card_index=0,
                        interface_type="efa",
                        subnet_id=args.subnet_id,
                        security_groups=[args.security_group_id],
                        associate_public_ip_address="true",
                        delete_on_termination="true",
                    )
                ],
                tags=tags,
                opts=child,
            )

        self.instances: list[aws.ec2.Instance] = []
        for rank, user_data in enumerate(args.user_data):
            node_name = s.node_name(rank)
            self.instances.append(
                aws.ec2.Instance(
                    node_name,
                    ami=args.image_id,
                    instance_type=s.machine.machine_type,
                    iam_instance_profile=args.instance_profile,
                    subnet_id=None if launch_template else args.subnet_id,
                    vpc_security_group_ids=None if launch_template else [args.security_group_id],
                    associate_public_ip_address=None if launch_template else True,
                    launch_template=(
                        aws.ec2.InstanceLaunchTemplateArgs(id=launch_template.id, version="$Latest")
                        if launch_template
                        else None
                    ),
                    placement_group=placement_group.name if placement_group else None,
                    metadata_options=aws.ec2.InstanceMetadataOptionsArgs(
                        http_endpoint="enabled",
                        http_tokens="required",  # IMDSv2 only
                        http_put_response_hop_limit=2,  # containers on the node can reach IMDS
                    ),
                    root_block_device=aws.ec2.InstanceRootBlockDeviceArgs(
                        encrypted=True,
                        volume_type="gp3",
                        volume_size=s.disk_size_gb,
                        delete_on_termination=True,
                    ),
                    instance_initiated_shutdown_behavior="terminate",
                    instance_market_options=(
                        aws.ec2.InstanceInstanceMarketOptionsArgs(
                            market_type="spot",
                            spot_options=aws.ec2.InstanceInstanceMarketOptionsSpotOptionsArgs(
                                spot_instance_type="one-time",
                                instance_interruption_behavior="terminate",
                            ),
                        )
                        if s.spot
                        else None
                    ),
                    capacity_reservation_specification=(
                        aws.ec2.InstanceCapacityReservationSpecificationArgs(
                            capacity_reservation_target=aws.ec2.InstanceCapacityReservationSpecificationCapacityReservationTargetArgs(
                                capacity_reservation_id=s.reservation
                            )
                        )
                        if s.reservation
                        else None
                    ),
                    user_data=user_data,
                    user_data_replace_on_change=False,
                    tags={**tags, "Name": node_name, RANK_TAG: str(rank)},
                    volume_tags={**tags, "Name": node_name},
                    opts=pulumi.ResourceOptions(
                        parent=self,
                        additional_secret_outputs=["user_data"],
                        # A newer Deep Learning AMI must not replace running nodes at the next
                        # `up`; it applies to nodes created later. A pinned image id still does.
                        ignore_changes=["ami"] if s.image.lookup else None,
                    ),
                )
            )
        self.register_outputs({"instance_ids": [i.id for i in self.instances]})


# -- the cluster --------------------------------------------------------------------------------


class AwsGpuCluster(pulumi.ComponentResource):
    def __init__(self, name: str, args: ClusterArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("fleetrun:aws:GpuCluster", name, None, opts)
        s = args.settings
        child = pulumi.ResourceOptions(parent=self)
        invoke = pulumi.InvokeOutputOptions(parent=self)
        tags = cluster_tags(s)

        zone: pulumi.Output[str] = (
            pulumi.Output.from_input(s.zone) if s.zone else _first_zone_offering(s, invoke)
        )
        network = AwsNetwork(
            f"{name}-net", AwsNetworkArgs(s.cluster_id, s.network_cidr, zone, s.ssh_cidrs, tags), opts=child
        )
        bucket = AwsArtifactBucket(
            f"{name}-artifacts", AwsBucketArgs(s.bucket_name, s.bucket_existing, tags), opts=child
        )
        role = AwsNodeRole(
            f"{name}-node", AwsNodeRoleArgs(s.cluster_id, s.region, bucket.bucket_arn, tags), opts=child
        )
        image_id: pulumi.Input[str]
        if s.image.lookup:
            image_id = aws.ec2.get_ami_output(
                most_recent=True,
                owners=[DLAMI_OWNER],
                filters=[
                    aws.ec2.GetAmiFilterArgs(name="name", values=[DLAMI_NAME]),
                    aws.ec2.GetAmiFilterArgs(name="architecture", values=["x86_64"]),
                    aws.ec2.GetAmiFilterArgs(name="state", values=["available"]),
                ],
                opts=invoke,
            ).id
        else:
            image_id = s.image.image_id or ""

        user_data = [
            node_user_data(s, rank, key, args.authorized_key, bucket.bucket_name, "s3").apply(
                _check_user_data_size
            )
            for rank, key in enumerate(args.host_keys)
        ]
        nodes = AwsGpuNodes(
            f"{name}-nodes",
            AwsGpuNodesArgs(
                s,
                network.subnet_id,
                network.security_group_id,
                role.instance_profile_name,
                image_id,
                user_data,
            ),
            opts=child,
        )
        self.outputs = ClusterOutputs(
            bucket=bucket.bucket_name,
            zone=network.zone,
            nodes=[
                NodeOutputs(
                    name=s.node_name(rank),
                    rank=rank,
                    instance_id=instance.id,
                    private_ip=instance.private_ip,
                    public_ip=instance.public_ip,
                )
                for rank, instance in enumerate(nodes.instances)
            ],
        )
        self.register_outputs({"bucket": bucket.bucket_name, "zone": network.zone})


def _first_zone_offering(s: FleetSettings, invoke: pulumi.InvokeOutputOptions) -> pulumi.Output[str]:
    """The first availability zone (by name) of the region that offers the instance type."""
    offerings = aws.ec2.get_instance_type_offerings_output(
        location_type="availability-zone",
        filters=[
            aws.ec2.GetInstanceTypeOfferingsFilterArgs(name="instance-type", values=[s.machine.machine_type])
        ],
        opts=invoke,
    )

    def first(locations: list[str]) -> str:
        if not locations:
            raise pulumi.RunError(
                f"fleet:machine_type: {s.machine.machine_type} is not offered in any zone of {s.region}; "
                "pick another region or type"
            )
        return sorted(locations)[0]

    return offerings.locations.apply(first)


def _check_user_data_size(text: str) -> str:
    if len(text.encode()) > AWS_USER_DATA_LIMIT:
        raise pulumi.RunError(
            f"cloud-init user data is {len(text.encode())} bytes; EC2 accepts {AWS_USER_DATA_LIMIT}"
        )
    return text


class AwsBuilder:
    name = "aws"

    def build(self, args: ClusterArgs, opts: pulumi.ResourceOptions | None = None) -> ClusterOutputs:
        s = args.settings
        # An explicit provider pins the region to fleet:region. It does not read aws:* stack
        # config, so the one setting users commonly put there (a named profile) is passed on.
        provider = aws.Provider(
            f"{s.cluster_id}-aws",
            region=s.region,
            profile=pulumi.Config("aws").get("profile"),
            opts=opts,
        )
        cluster = AwsGpuCluster(
            s.cluster_id,
            args,
            opts=pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(providers=[provider])),
        )
        return cluster.outputs


BUILDER = AwsBuilder()
