"""The GCP cluster: VPC network, firewall, compact placement, service account, bucket, GPU VMs.

``BUILDER.build`` creates an explicit provider for ``fleet:project``/``fleet:zone`` and one
``GcpGpuCluster`` component holding child components (identity, network, bucket, nodes). Every
child has ``parent=self``; nothing is created inside an ``apply``.

Security choices, each enforced in tests/infra:
* a new VPC has no ingress rules (GCP denies ingress by default); fleetrun adds SSH from the
  operator CIDRs and all traffic between the cluster's VMs. Both rules target the cluster's
  service account, which (unlike a network tag) only IAM can attach to a VM.
* the service account's only role is ``roles/storage.objectUser`` on the job bucket.
* the bucket is versioned, uniformly private (public access prevention enforced), encrypted
  (Google-managed keys, always on) and retained by ``pulumi destroy``.
* VMs are Shielded VMs (vTPM, integrity monitoring), TERMINATE on host maintenance (required
  for GPUs), block project-wide SSH keys and OS Login, and take only the operator's key.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pulumi
import pulumi_gcp as gcp

from infra.bootstrap import CloudFile
from infra.clouds.base import ClusterArgs, ClusterOutputs, NodeOutputs, node_user_data
from infra.clouds.gcp_catalog import CLUSTER_LABEL, DLVM_FAMILY, DLVM_PROJECT, RANK_LABEL
from infra.settings import FleetSettings

CLOUD_PLATFORM_SCOPE = "https://www.googleapis.com/auth/cloud-platform"
BUCKET_ROLE = "roles/storage.objectUser"
"""Read, write, list and delete objects; no bucket settings, no IAM."""

# The guest agent regenerates SSH host keys on a new instance unless told not to; that would
# replace the pinned key cloud-init installed. cloud-init writes this before the agent starts.
GUEST_AGENT_CONFIG = CloudFile(
    path="/etc/default/instance_configs.cfg",
    content="[InstanceSetup]\nset_host_keys = false\n\n[Accounts]\ndeprovision_remove = false\n",
)


def cluster_labels(settings: FleetSettings, **extra: str) -> dict[str, str]:
    return {**settings.tags, CLUSTER_LABEL: settings.cluster_id, **extra}


# -- identity -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class GcpNodeIdentityArgs:
    cluster_id: str


class GcpNodeIdentity(pulumi.ComponentResource):
    """The service account the VMs run as; its bucket binding is made by ``GcpArtifactBucket``."""

    def __init__(
        self, name: str, args: GcpNodeIdentityArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("fleetrun:gcp:NodeIdentity", name, None, opts)
        account = gcp.serviceaccount.Account(
            f"{name}-sa",
            account_id=f"{args.cluster_id}-sa"[:30],
            display_name=f"fleetrun {args.cluster_id} nodes",
            description="Job bucket objects only (roles/storage.objectUser on that bucket)",
            opts=pulumi.ResourceOptions(parent=self),
        )
        self.email: pulumi.Output[str] = account.email
        self.member: pulumi.Output[str] = account.email.apply(lambda e: f"serviceAccount:{e}")
        self.register_outputs({"email": self.email})


# -- network ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GcpNetworkArgs:
    cluster_id: str
    region: str
    cidr: str
    ssh_cidrs: Sequence[str]
    service_account: pulumi.Input[str]
    """The nodes' service account email: firewall rules target it."""


class GcpNetwork(pulumi.ComponentResource):
    def __init__(self, name: str, args: GcpNetworkArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("fleetrun:gcp:Network", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        network = gcp.compute.Network(
            f"{name}-vpc",
            auto_create_subnetworks=False,
            routing_mode="REGIONAL",
            mtu=8896,  # jumbo frames for NCCL over TCP between GPU VMs
            description=f"fleetrun {args.cluster_id}",
            opts=child,
        )
        subnet = gcp.compute.Subnetwork(
            f"{name}-subnet",
            network=network.id,
            region=args.region,
            ip_cidr_range=args.cidr,
            private_ip_google_access=True,
            opts=child,
        )
        self.ssh_firewall = gcp.compute.Firewall(
            f"{name}-ssh",
            network=network.id,
            description=f"fleetrun {args.cluster_id}: SSH from the operator only",
            direction="INGRESS",
            allows=[gcp.compute.FirewallAllowArgs(protocol="tcp", ports=["22"])],
            source_ranges=list(args.ssh_cidrs),
            target_service_accounts=[args.service_account],
            opts=child,
        )
        self.internal_firewall = gcp.compute.Firewall(
            f"{name}-internal",
            network=network.id,
            description=f"fleetrun {args.cluster_id}: all traffic between cluster VMs (NCCL, rendezvous)",
            direction="INGRESS",
            allows=[gcp.compute.FirewallAllowArgs(protocol="all")],
            source_service_accounts=[args.service_account],
            target_service_accounts=[args.service_account],
            opts=child,
        )
        self.subnet_id: pulumi.Output[str] = subnet.id
        self.register_outputs({"network": network.id, "subnet": subnet.id})


# -- bucket -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GcpBucketArgs:
    bucket_name: str | None
    existing: bool
    location: str
    labels: Mapping[str, str]
    member: pulumi.Input[str]
    """``serviceAccount:...`` granted object access on this bucket only."""


class GcpArtifactBucket(pulumi.ComponentResource):
    """Data, checkpoints and metrics; retained by ``pulumi destroy`` (not protected, so that
    ``destroy`` can still remove the instances)."""

    def __init__(self, name: str, args: GcpBucketArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("fleetrun:gcp:ArtifactBucket", name, None, opts)
        if args.existing and args.bucket_name:
            found = gcp.storage.get_bucket_output(
                name=args.bucket_name, opts=pulumi.InvokeOutputOptions(parent=self)
            )
            self.bucket_name: pulumi.Output[str] = found.name
        else:
            bucket = gcp.storage.Bucket(
                name,
                name=args.bucket_name,
                location=args.location.upper(),
                uniform_bucket_level_access=True,
                public_access_prevention="enforced",
                versioning=gcp.storage.BucketVersioningArgs(enabled=True),
                force_destroy=False,
                labels=dict(args.labels),
                opts=pulumi.ResourceOptions(parent=self, retain_on_delete=True),
            )
            self.bucket_name = bucket.name
        # The binding goes with the cluster (its service account is deleted too); the data stays.
        gcp.storage.BucketIAMMember(
            f"{name}-node-access",
            bucket=self.bucket_name,
            role=BUCKET_ROLE,
            member=args.member,
            opts=pulumi.ResourceOptions(parent=self),
        )
        self.register_outputs({"bucket_name": self.bucket_name})


# -- nodes --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GcpGpuNodesArgs:
    settings: FleetSettings
    subnet_id: pulumi.Input[str]
    service_account: pulumi.Input[str]
    image: pulumi.Input[str]
    user_data: Sequence[pulumi.Output[str]]
    """One per node, in rank order."""


class GcpGpuNodes(pulumi.ComponentResource):
    def __init__(self, name: str, args: GcpGpuNodesArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("fleetrun:gcp:GpuNodes", name, None, opts)
        s = args.settings
        zone = s.zone or ""
        placement = None
        if s.placement:
            placement = gcp.compute.ResourcePolicy(
                f"{name}-compact",
                region=s.region,
                description=f"fleetrun {s.cluster_id}: VMs close together for NCCL",
                group_placement_policy=gcp.compute.ResourcePolicyGroupPlacementPolicyArgs(
                    collocation="COLLOCATED"
                ),
                opts=pulumi.ResourceOptions(parent=self),
            )

        accelerators = (
            [gcp.compute.InstanceGuestAcceleratorArgs(type=s.machine.gpu_type or "", count=s.machine.gpus)]
            if s.machine.attach_accelerators
            else None
        )
        reservation = (
            gcp.compute.InstanceReservationAffinityArgs(
                type="SPECIFIC_RESERVATION",
                specific_reservation=gcp.compute.InstanceReservationAffinitySpecificReservationArgs(
                    key="compute.googleapis.com/reservation-name", values=[s.reservation]
                ),
            )
            if s.reservation
            else None
        )
        self.instances: list[gcp.compute.Instance] = []
        for rank, user_data in enumerate(args.user_data):
            node_name = s.node_name(rank)
            metadata: dict[str, pulumi.Input[str]] = {
                "user-data": user_data,
                "block-project-ssh-keys": "TRUE",
                "enable-oslogin": "FALSE",
            }
            if s.machine.gpus:
                metadata["install-nvidia-driver"] = "True"
            self.instances.append(
                gcp.compute.Instance(
                    node_name,
                    name=node_name,
                    zone=zone,
                    machine_type=s.machine.machine_type,
                    boot_disk=gcp.compute.InstanceBootDiskArgs(
                        auto_delete=True,
                        initialize_params=gcp.compute.InstanceBootDiskInitializeParamsArgs(
                            image=args.image,
                            size=s.disk_size_gb,
                            type=s.disk_type,
                            labels=cluster_labels(s),
                        ),
                    ),
                    network_interfaces=[
                        gcp.compute.InstanceNetworkInterfaceArgs(
                            subnetwork=args.subnet_id,
                            nic_type="GVNIC" if s.machine.gvnic else None,
                            access_configs=[gcp.compute.InstanceNetworkInterfaceAccessConfigArgs()],
                        )
                    ],
                    guest_accelerators=accelerators,
                    scheduling=gcp.compute.InstanceSchedulingArgs(
                        on_host_maintenance="TERMINATE",  # GPUs cannot live-migrate
                        automatic_restart=not s.spot,
                        preemptible=s.spot,
                        provisioning_model="SPOT" if s.spot else "STANDARD",
                        # A preempted node stops (disk, IP and host key kept) and can be restarted.
                        instance_termination_action="STOP" if s.spot else None,
                    ),
                    shielded_instance_config=gcp.compute.InstanceShieldedInstanceConfigArgs(
                        # Secure Boot refuses unsigned kernel modules, which first-boot GPU driver
                        # installs produce; vTPM and integrity monitoring still apply.
                        enable_secure_boot=False,
                        enable_vtpm=True,
                        enable_integrity_monitoring=True,
                    ),
                    service_account=gcp.compute.InstanceServiceAccountArgs(
                        email=args.service_account, scopes=[CLOUD_PLATFORM_SCOPE]
                    ),
                    resource_policies=placement.self_link if placement else None,  # one policy max
                    reservation_affinity=reservation,
                    metadata=metadata,
                    tags=[s.cluster_id],
                    labels=cluster_labels(s, **{RANK_LABEL: str(rank)}),
                    allow_stopping_for_update=True,
                    deletion_protection=False,
                    opts=pulumi.ResourceOptions(
                        parent=self,
                        # The name is fixed (it is the node's name in the stack outputs), so a
                        # replacement must delete the old VM first.
                        delete_before_replace=True,
                        additional_secret_outputs=["metadata"],
                        ignore_changes=["bootDisk.initializeParams.image"] if s.image.lookup else None,
                    ),
                )
            )
        self.register_outputs({"instance_ids": [i.instance_id for i in self.instances]})


# -- the cluster --------------------------------------------------------------------------------


class GcpGpuCluster(pulumi.ComponentResource):
    def __init__(self, name: str, args: ClusterArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("fleetrun:gcp:GpuCluster", name, None, opts)
        s = args.settings
        child = pulumi.ResourceOptions(parent=self)
        identity = GcpNodeIdentity(f"{name}-node", GcpNodeIdentityArgs(s.cluster_id), opts=child)
        network = GcpNetwork(
            f"{name}-net",
            GcpNetworkArgs(s.cluster_id, s.region, s.network_cidr, s.ssh_cidrs, identity.email),
            opts=child,
        )
        bucket = GcpArtifactBucket(
            f"{name}-artifacts",
            GcpBucketArgs(s.bucket_name, s.bucket_existing, s.region, cluster_labels(s), identity.member),
            opts=child,
        )
        image: pulumi.Input[str]
        if s.image.lookup:
            image = gcp.compute.get_image_output(
                family=DLVM_FAMILY, project=DLVM_PROJECT, opts=pulumi.InvokeOutputOptions(parent=self)
            ).self_link
        else:
            image = s.image.image_id or ""
        user_data = [
            node_user_data(s, rank, key, args.authorized_key, bucket.bucket_name, "gs", (GUEST_AGENT_CONFIG,))
            for rank, key in enumerate(args.host_keys)
        ]
        nodes = GcpGpuNodes(
            f"{name}-nodes",
            GcpGpuNodesArgs(s, network.subnet_id, identity.email, image, user_data),
            opts=child,
        )
        self.outputs = ClusterOutputs(
            bucket=bucket.bucket_name,
            zone=pulumi.Output.from_input(s.zone or ""),
            nodes=[
                NodeOutputs(
                    name=s.node_name(rank),
                    rank=rank,
                    instance_id=instance.instance_id,
                    private_ip=instance.network_interfaces[0].network_ip,
                    public_ip=instance.network_interfaces[0].access_configs.apply(_nat_ip),
                )
                for rank, instance in enumerate(nodes.instances)
            ],
        )
        self.register_outputs({"bucket": bucket.bucket_name})


def _nat_ip(access_configs: Sequence[gcp.compute.outputs.InstanceNetworkInterfaceAccessConfig] | None) -> str:
    if not access_configs:
        return ""
    return access_configs[0].nat_ip or ""


class GcpBuilder:
    name = "gcp"

    def build(self, args: ClusterArgs, opts: pulumi.ResourceOptions | None = None) -> ClusterOutputs:
        s = args.settings
        provider = gcp.Provider(
            f"{s.cluster_id}-gcp", project=s.gcp_project, region=s.region, zone=s.zone, opts=opts
        )
        cluster = GcpGpuCluster(
            s.cluster_id,
            args,
            opts=pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(providers=[provider])),
        )
        return cluster.outputs


BUILDER = GcpBuilder()
