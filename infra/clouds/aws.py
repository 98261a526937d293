"""The AWS cluster: VPC, security group, placement group, IAM, bucket and GPU instances.

``BUILDER.build`` creates an explicit provider for ``fleet:region`` and one ``AwsGpuCluster``
component holding four child components (network, bucket, node role, nodes). Every child
resource has ``parent=self``; nothing is created inside an ``apply`` (lookups are invokes whose
outputs feed resource inputs), so ``pulumi preview`` shows exactly what ``up`` will create.

Security choices, each enforced in tests/infra:
* inbound: SSH from the operator CIDRs and everything from the cluster's own security group
  (NCCL, rendezvous, EFA); nothing else. The VPC's default security group is emptied.
* the node role may read and write objects of the job bucket only (no permanent deletion of
  object versions); nothing else. The watchdog ends its node with an OS shutdown, which
  terminates the instance (instance-initiated shutdown = terminate), so no EC2 permission is
  needed at all.
* the bucket is versioned, encrypted, private, and retained by ``pulumi destroy``.
* instances require IMDSv2, encrypt their root volume, and terminate on OS shutdown.
* a kept-warm fleet (``fleet:warm_until``) gets one-time EventBridge Scheduler schedules that
  terminate its instances, run as a role allowed only that (``infra.clouds.aws_lifetime``).

Stable under scaling, each enforced by comparing the program at N and N+1 nodes: a node's inputs
(user data, launch template, placement group) never depend on the node count, since
``launch_template`` and ``placement_group`` force a new instance and a user-data change stops
and starts it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_aws as aws

from fleetrun_contract.cluster import nodes_component_type
from infra.bootstrap import AWS_USER_DATA_LIMIT
from infra.clouds.aws_catalog import DLAMI_NAME, DLAMI_OWNER, RANK_TAG, aws_provider_arguments
from infra.clouds.aws_lifetime import AwsNodeLifetime, AwsNodeLifetimeArgs
from infra.clouds.aws_support import (
    AwsArtifactBucket,
    AwsBucketArgs,
    AwsNetwork,
    AwsNetworkArgs,
    AwsNodeRole,
    AwsNodeRoleArgs,
    cluster_tags,
)
from infra.clouds.base import ClusterArgs, ClusterOutputs, NodeOutputs, node_user_data
from infra.settings import FleetSettings, image_disk_problem

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
    """The instances, and per node what belongs to it alone (its Elastic IP on multi-card types).

    ``fab up``'s zone failover destroys this component's subtree when a fleet comes up partial.
    """

    def __init__(self, name: str, args: AwsGpuNodesArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(nodes_component_type("aws"), name, None, opts)
        s = args.settings
        child = pulumi.ResourceOptions(parent=self)
        tags = cluster_tags(s)

        placement_group: pulumi.Input[str] | None = s.placement_group
        if s.placement:
            placement_group = aws.ec2.PlacementGroup(
                f"{name}-placement", strategy="cluster", tags=tags, opts=child
            ).name

        # EFA interfaces cannot be declared on the instance itself: a launch template carries one
        # EFA interface per network card (p4d: 4, p5: 32), so the instance gets all the inter-node
        # bandwidth it is billed for. AWS assigns no public IPv4 to an instance launched with
        # several interfaces, so on multi-card types each node gets an Elastic IP on its primary
        # interface (card 0, device 0) instead.
        cards = s.machine.efa_interfaces if s.efa else 0
        multi_card = cards > 1
        launch_template = None
        if s.efa:
            launch_template = aws.ec2.LaunchTemplate(
                f"{name}-efa",
                description=f"fleetrun {s.cluster_id}: EFA on each of the {cards} network card(s)",
                network_interfaces=[
                    aws.ec2.LaunchTemplateNetworkInterfaceArgs(
                        # AWS: the primary interface is device 0 on card 0; every other card's
                        # interface is device 1 on that card.
                        device_index=0 if card == 0 else 1,
                        network_card_index=card,
                        interface_type="efa",
                        subnet_id=args.subnet_id,
                        security_groups=[args.security_group_id],
                        associate_public_ip_address=None if multi_card else "true",
                        delete_on_termination="true",
                    )
                    for card in range(cards)
                ],
                # Interfaces made from the template carry the cluster tag: the leak audit finds them.
                tag_specifications=[
                    aws.ec2.LaunchTemplateTagSpecificationArgs(resource_type="network-interface", tags=tags)
                ],
                tags=tags,
                opts=child,
            )

        market = None
        if s.capacity_block:
            market = aws.ec2.InstanceInstanceMarketOptionsArgs(market_type="capacity-block")
        elif s.spot:
            market = aws.ec2.InstanceInstanceMarketOptionsArgs(
                market_type="spot",
                spot_options=aws.ec2.InstanceInstanceMarketOptionsSpotOptionsArgs(
                    spot_instance_type="one-time",
                    instance_interruption_behavior="terminate",
                ),
            )

        self.instances: list[aws.ec2.Instance] = []
        self.public_ips: list[pulumi.Output[str]] = []
        for rank, user_data in enumerate(args.user_data):
            node_name = s.node_name(rank)
            instance = aws.ec2.Instance(
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
                placement_group=placement_group,
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
                instance_market_options=market,
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
                    # cloud-init reads user data once, at first boot: an update could only stop
                    # and start the node (fatal to a one-time spot instance) for nothing.
                    # A newer Deep Learning AMI must not replace running nodes either; it applies
                    # to nodes created later. A pinned image id still does.
                    ignore_changes=["userData", "ami"] if s.image.lookup else ["userData"],
                ),
            )
            self.instances.append(instance)
            if multi_card:
                address = aws.ec2.Eip(
                    f"{node_name}-eip",
                    domain="vpc",
                    network_interface=instance.primary_network_interface_id,
                    tags={**tags, "Name": node_name},
                    opts=child,
                )
                self.public_ips.append(address.public_ip)
            else:
                self.public_ips.append(instance.public_ip)
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
        # The image is looked up in both cases (by name, or the pinned id) so that its root
        # volume size is known and a disk too small for it fails here, naming fleet:disk_size_gb.
        filters = (
            [
                aws.ec2.GetAmiFilterArgs(name="name", values=[DLAMI_NAME]),
                aws.ec2.GetAmiFilterArgs(name="architecture", values=["x86_64"]),
                aws.ec2.GetAmiFilterArgs(name="state", values=["available"]),
            ]
            if s.image.lookup
            else [aws.ec2.GetAmiFilterArgs(name="image-id", values=[s.image.image_id or ""])]
        )
        ami = aws.ec2.get_ami_output(
            most_recent=True,
            owners=[DLAMI_OWNER] if s.image.lookup else None,
            filters=filters,
            opts=invoke,
        )
        image_id: pulumi.Output[str] = pulumi.Output.all(
            ami.id, ami.root_device_name, ami.block_device_mappings
        ).apply(lambda v: _checked_image(s, v[0], v[1], v[2]))

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
        if s.warm_until:  # kept warm: the cloud ends the nodes then (infra.clouds.aws_lifetime)
            AwsNodeLifetime(
                f"{name}-lifetime",
                AwsNodeLifetimeArgs(
                    s.cluster_id,
                    s.warm_until,
                    [i.id for i in nodes.instances],
                    [i.arn for i in nodes.instances],
                    tags,
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
                    public_ip=public_ip,
                )
                for rank, (instance, public_ip) in enumerate(
                    zip(nodes.instances, nodes.public_ips, strict=True)
                )
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


def _checked_image(s: FleetSettings, image_id: str, root_device: str | None, mappings: Any) -> str:
    """The image id, once its root volume is known to fit in ``fleet:disk_size_gb``."""
    size: float | None = None
    for mapping in mappings or []:
        device = mapping.get("device_name") if isinstance(mapping, dict) else mapping.device_name
        ebs = mapping.get("ebs") if isinstance(mapping, dict) else mapping.ebs
        if device == root_device and ebs and ebs.get("volume_size"):
            size = float(ebs["volume_size"])
    problem = image_disk_problem(s.disk_size_gb, size, image_id)
    if problem:
        raise pulumi.RunError(problem)
    return image_id


def _check_user_data_size(text: str) -> str:
    if len(text.encode()) > AWS_USER_DATA_LIMIT:
        raise pulumi.RunError(
            f"cloud-init user data is {len(text.encode())} bytes; EC2 accepts {AWS_USER_DATA_LIMIT}"
        )
    return text


def provider_arguments(raw: Mapping[str, str]) -> dict[str, Any]:
    """The explicit provider's arguments from the stack's ``aws:*`` config (keys without the
    namespace). An explicit provider reads none of that config itself: assume-role, default
    tags, profile... are forwarded here, and a key fleetrun cannot forward is refused by name."""
    arguments, unknown = aws_provider_arguments(raw)
    if unknown:
        raise pulumi.RunError(
            f"aws:{', aws:'.join(unknown)}: set in the stack config, but fleetrun's AWS provider (pinned "
            "to fleet:region) does not forward it; remove it or add it to infra/clouds/aws_catalog.py"
        )
    structured: dict[str, Any] = {}
    if "assume_roles" in arguments:
        structured["assume_roles"] = [aws.ProviderAssumeRoleArgs(**r) for r in arguments.pop("assume_roles")]  # type: ignore[attr-defined]
    if "assume_role_with_web_identity" in arguments:
        structured["assume_role_with_web_identity"] = aws.ProviderAssumeRoleWithWebIdentityArgs(
            **arguments.pop("assume_role_with_web_identity")  # type: ignore[arg-type]
        )
    if "default_tags" in arguments:
        structured["default_tags"] = aws.ProviderDefaultTagsArgs(**arguments.pop("default_tags"))  # type: ignore[arg-type]
    if "ignore_tags" in arguments:
        structured["ignore_tags"] = aws.ProviderIgnoreTagsArgs(**arguments.pop("ignore_tags"))  # type: ignore[arg-type]
    return {**arguments, **structured}


def _aws_stack_config() -> dict[str, str]:
    from infra.config import all_config_keys

    prefix = "aws:"
    return {
        key[len(prefix) :]: str(pulumi.runtime.get_config(key))
        for key in all_config_keys()
        if key.startswith(prefix) and pulumi.runtime.get_config(key) is not None
    }


class AwsBuilder:
    name = "aws"

    def build(self, args: ClusterArgs, opts: pulumi.ResourceOptions | None = None) -> ClusterOutputs:
        s = args.settings
        # An explicit provider pins the region to fleet:region; everything else a user set under
        # aws:* (profile, assume-role, default tags...) is forwarded to it.
        provider = aws.Provider(
            f"{s.cluster_id}-aws",
            region=s.region,
            **provider_arguments(_aws_stack_config()),
            opts=opts,
        )
        cluster = AwsGpuCluster(
            s.cluster_id,
            args,
            opts=pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(providers=[provider])),
        )
        return cluster.outputs


BUILDER = AwsBuilder()
