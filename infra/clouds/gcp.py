"""The GCP cluster: VPC network, firewall, compact placement, service account, bucket, GPU VMs.

``BUILDER.build`` creates an explicit provider for ``fleet:project``/``fleet:zone`` and one
``GcpGpuCluster`` component holding child components (identity, network, bucket, nodes). Every
child has ``parent=self``; nothing is created inside an ``apply``.

Security choices, each enforced in tests/infra:
* a new VPC has no ingress rules (GCP denies ingress by default); fleetrun adds SSH from the
  operator CIDRs and all traffic between the cluster's VMs. Both rules target the cluster's
  service account, which (unlike a network tag) only IAM can attach to a VM.
* the service account's roles: ``roles/storage.objectUser`` on the job bucket, and a custom role
  holding only ``compute.instances.delete``, granted on each node's own instance (never on the
  project): the watchdog ends billing by deleting its node (a guest shutdown only stops a GCP
  VM, whose disk keeps billing). All nodes share one service account (firewall rules target it),
  and GCP IAM has no condition on the calling instance, so a node can delete itself or a sibling
  node of its cluster, and nothing else.
* the bucket is versioned, uniformly private (public access prevention enforced), encrypted
  (Google-managed keys, always on) and retained by ``pulumi destroy``.
* VMs are Shielded VMs (vTPM, integrity monitoring), TERMINATE on host maintenance (required
  for GPUs), block project-wide SSH keys and OS Login, and take only the operator's key.
* a kept-warm fleet (``fleet:warm_until``) gets a Cloud Scheduler job per VM that deletes it,
  as an account allowed only that on the cluster's VMs (``infra.clouds.gcp_lifetime``).
* a preempted spot VM is deleted, not stopped: a stopped VM keeps billing for its disk, loses its
  ephemeral address (the exported ``public_ip`` goes stale) and nothing restarts it. The next
  ``fab up`` refreshes the state and recreates it with the same pinned host key.

Stable under scaling (tests compare the program at N and N+1 nodes): a node's inputs, its
``resource_policies`` included ("modifying this list will cause the instance to recreate"),
never depend on the node count.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pulumi
import pulumi_gcp as gcp

from fleetrun_contract.cluster import nodes_component_type
from infra.bootstrap import CloudFile
from infra.clouds.base import ClusterArgs, ClusterOutputs, NodeOutputs, node_user_data
from infra.clouds.gcp_catalog import CLUSTER_LABEL, DATA_NETWORK_MTU, DLVM_FAMILY, DLVM_PROJECT, RANK_LABEL
from infra.clouds.gcp_lifetime import GcpNodeLifetime, GcpNodeLifetimeArgs
from infra.settings import FleetSettings, image_disk_problem

CLOUD_PLATFORM_SCOPE = "https://www.googleapis.com/auth/cloud-platform"
BUCKET_ROLE = "roles/storage.objectUser"
"""Read, write, list and delete objects; no bucket settings, no IAM."""
SELF_DELETE_PERMISSIONS = ["compute.instances.delete"]
"""The watchdog's power-off on GCP: the node deletes its own instance (boot disk auto-deleted)."""


DATA_SUBNET_POOL = tuple(f"172.{second}.0.0/16" for second in range(16, 32))
"""Where the GPU data networks' ranges come from: the /16s of 172.16.0.0/12, in order."""


def data_subnet_cidrs(network_cidr: str, count: int) -> list[str]:
    """The ranges of the ``count`` GPU data networks (A3: 4 or 8), in order, none overlapping
    ``fleet:network_cidr``.

    Each data network is its own VPC, but all of them and the primary subnet are NICs of the same
    VM: two NICs on one range give the guest two routes to the same addresses, and NCCL traffic
    leaves by the wrong one. ``fleet:network_cidr`` is at most a /16, so it overlaps at most one
    /16 of the pool; that one is skipped. With the default 10.0.0.0/16 the ranges are 172.16,
    172.17, ... as before (a deployed cluster's data subnets are not replaced).
    """
    primary = ipaddress.ip_network(network_cidr)
    free = [c for c in DATA_SUBNET_POOL if not ipaddress.ip_network(c).overlaps(primary)]
    if count > len(free):
        raise ValueError(f"{count} GPU data networks wanted; the pool has {len(free)} ranges")
    return free[:count]


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
    project: str | None


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
        # Granted per instance by GcpGpuNodes. The role id is left to Pulumi's auto-naming (a
        # random suffix): GCP keeps a deleted custom role's id reserved for weeks, so a fixed id
        # would make the `fab up` after a `fab down` fail.
        self.self_delete_role = gcp.projects.IAMCustomRole(
            args.cluster_id.replace("-", "_") + "_self_delete",
            title=f"fleetrun {args.cluster_id}: a node deletes its own VM",
            description="Only compute.instances.delete; bound on each node's instance, never the project",
            permissions=SELF_DELETE_PERMISSIONS,
            project=args.project,
            opts=pulumi.ResourceOptions(parent=self),
        )
        self.register_outputs({"email": self.email, "self_delete_role": self.self_delete_role.name})


# -- network ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GcpNetworkArgs:
    cluster_id: str
    region: str
    cidr: str
    ssh_cidrs: Sequence[str]
    service_account: pulumi.Input[str]
    """The nodes' service account email: firewall rules target it."""
    data_nics: int = 0
    """GPU data networks to create (A3: one VPC per extra gVNIC, GPUDirect-TCPX/TCPXO)."""


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
        # Region failover moves the subnet; a replacement created first would overlap it.
        replace_first = pulumi.ResourceOptions(parent=self, delete_before_replace=True)
        subnet = gcp.compute.Subnetwork(
            f"{name}-subnet",
            network=network.id,
            region=args.region,
            ip_cidr_range=args.cidr,
            private_ip_google_access=True,
            opts=replace_first,
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
        self.internal_firewall = _cluster_only_firewall(
            f"{name}-internal",
            network.id,
            f"fleetrun {args.cluster_id}: all traffic between cluster VMs (NCCL, rendezvous)",
            args.service_account,
            child,
        )
        # A3: GPUDirect-TCPX(O) needs one more gVNIC per GPU pair, each on its own VPC network,
        # open only between the cluster's VMs. Without them NCCL shares the single host NIC.
        self.data_subnet_ids: list[pulumi.Output[str]] = []
        for index, data_cidr in enumerate(data_subnet_cidrs(args.cidr, args.data_nics)):
            data_network = gcp.compute.Network(
                f"{name}-data{index}",
                auto_create_subnetworks=False,
                mtu=DATA_NETWORK_MTU,
                description=f"fleetrun {args.cluster_id}: GPU data network {index}",
                opts=child,
            )
            data_subnet = gcp.compute.Subnetwork(
                f"{name}-data{index}-subnet",
                network=data_network.id,
                region=args.region,
                ip_cidr_range=data_cidr,
                opts=replace_first,
            )
            _cluster_only_firewall(
                f"{name}-data{index}-internal",
                data_network.id,
                f"fleetrun {args.cluster_id}: GPU data network {index}, cluster VMs only",
                args.service_account,
                child,
            )
            self.data_subnet_ids.append(data_subnet.id)
        self.subnet_id: pulumi.Output[str] = subnet.id
        self.register_outputs({"network": network.id, "subnet": subnet.id})


def _cluster_only_firewall(
    name: str,
    network: pulumi.Input[str],
    description: str,
    service_account: pulumi.Input[str],
    opts: pulumi.ResourceOptions,
) -> gcp.compute.Firewall:
    """All traffic on ``network``, from the cluster's VMs (its service account) to them only."""
    return gcp.compute.Firewall(
        name,
        network=network,
        description=description,
        direction="INGRESS",
        allows=[gcp.compute.FirewallAllowArgs(protocol="all")],
        source_service_accounts=[service_account],
        target_service_accounts=[service_account],
        opts=opts,
    )


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
    member: pulumi.Input[str]
    """``serviceAccount:...``: granted delete on each node's own instance."""
    self_delete_role: pulumi.Input[str]
    image: pulumi.Input[str]
    user_data: Sequence[pulumi.Output[str]]
    """One per node, in rank order."""
    data_subnet_ids: Sequence[pulumi.Input[str]] = ()


class GcpGpuNodes(pulumi.ComponentResource):
    """The VMs and, per VM, the grant that lets it delete itself.

    ``fab up``'s zone failover destroys this component's subtree when a fleet comes up partial.
    """

    def __init__(self, name: str, args: GcpGpuNodesArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(nodes_component_type("gcp"), name, None, opts)
        s = args.settings
        zone = s.zone or ""
        placement_policy: pulumi.Input[str] | None = s.placement_group
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
            placement_policy = placement.self_link

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
                        ),
                        *(
                            gcp.compute.InstanceNetworkInterfaceArgs(subnetwork=data_subnet, nic_type="GVNIC")
                            for data_subnet in args.data_subnet_ids
                        ),
                    ],
                    guest_accelerators=accelerators,
                    scheduling=gcp.compute.InstanceSchedulingArgs(
                        on_host_maintenance="TERMINATE",  # GPUs cannot live-migrate
                        automatic_restart=not s.spot,
                        preemptible=s.spot,
                        provisioning_model="SPOT" if s.spot else "STANDARD",
                        # A preempted node is deleted: stopped, its disk would bill and its address
                        # change; `fab up` (which refreshes) recreates it with its pinned key.
                        instance_termination_action="DELETE" if s.spot else None,
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
                    resource_policies=placement_policy,  # one policy max
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
            gcp.compute.InstanceIAMMember(
                f"{node_name}-self-delete",
                instance_name=self.instances[-1].name,
                zone=zone,
                project=s.gcp_project,
                role=args.self_delete_role,
                member=args.member,
                opts=pulumi.ResourceOptions(parent=self),
            )
        self.register_outputs({"instance_ids": [i.instance_id for i in self.instances]})


# -- the cluster --------------------------------------------------------------------------------


class GcpGpuCluster(pulumi.ComponentResource):
    def __init__(self, name: str, args: ClusterArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("fleetrun:gcp:GpuCluster", name, None, opts)
        s = args.settings
        child = pulumi.ResourceOptions(parent=self)
        identity = GcpNodeIdentity(
            f"{name}-node", GcpNodeIdentityArgs(s.cluster_id, s.gcp_project), opts=child
        )
        network = GcpNetwork(
            f"{name}-net",
            GcpNetworkArgs(
                s.cluster_id, s.region, s.network_cidr, s.ssh_cidrs, identity.email, s.machine.data_nics
            ),
            opts=child,
        )
        bucket = GcpArtifactBucket(
            f"{name}-artifacts",
            # The first failover zone's region: failing over to another region never moves data.
            GcpBucketArgs(
                s.bucket_name, s.bucket_existing, s.bucket_region, cluster_labels(s), identity.member
            ),
            opts=child,
        )
        image: pulumi.Input[str]
        if s.image.lookup:
            found = gcp.compute.get_image_output(
                family=DLVM_FAMILY, project=DLVM_PROJECT, opts=pulumi.InvokeOutputOptions(parent=self)
            )
            # The lookup knows the image's size: a disk too small fails here, naming the key.
            image = pulumi.Output.all(found.self_link, found.disk_size_gb).apply(
                lambda v: _checked_image(s, v[0], v[1])
            )
        else:
            image = s.image.image_id or ""
        user_data = [
            node_user_data(s, rank, key, args.authorized_key, bucket.bucket_name, "gs", (GUEST_AGENT_CONFIG,))
            for rank, key in enumerate(args.host_keys)
        ]
        nodes = GcpGpuNodes(
            f"{name}-nodes",
            GcpGpuNodesArgs(
                s,
                network.subnet_id,
                identity.email,
                identity.member,
                identity.self_delete_role.name,
                image,
                user_data,
                network.data_subnet_ids,
            ),
            opts=child,
        )
        if s.warm_until:  # kept warm: the cloud ends the nodes then (infra.clouds.gcp_lifetime)
            GcpNodeLifetime(
                f"{name}-lifetime",
                GcpNodeLifetimeArgs(
                    s.cluster_id,
                    s.warm_until,
                    s.gcp_project or "",
                    s.region,
                    s.zone or "",
                    [i.name for i in nodes.instances],
                    identity.self_delete_role.name,
                ),
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


def _checked_image(s: FleetSettings, self_link: str, size_gb: int | None) -> str:
    problem = image_disk_problem(s.disk_size_gb, float(size_gb) if size_gb else None, self_link)
    if problem:
        raise pulumi.RunError(problem)
    return self_link


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
