"""The Pulumi half of the per-cloud interface: settings and keys in, a running cluster out.

Each cloud module (``infra.clouds.aws``, ``infra.clouds.gcp``) exposes ``BUILDER``, a
``CloudBuilder`` whose ``build`` creates the network, bucket, identity and nodes as
ComponentResources and returns the ``ClusterOutputs`` that ``infra.program`` turns into the
stack-outputs contract. ``builder_for(name)`` imports the module on first use, so a stack on
one cloud never loads the other cloud's (large) SDK.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import pulumi

from infra.bootstrap import CloudFile, NodeBootstrap, render_user_data
from infra.settings import FleetSettings

CLOUD_BUILDERS: dict[str, str] = {
    "aws": "infra.clouds.aws",
    "gcp": "infra.clouds.gcp",
}


@dataclass(frozen=True)
class HostKey:
    """A node's SSH host key pair, generated at deploy time (pulumi-tls)."""

    private_key_openssh: pulumi.Output[str]
    public_key_openssh: pulumi.Output[str]


@dataclass(frozen=True)
class ClusterArgs:
    settings: FleetSettings
    host_keys: Sequence[HostKey]
    """One per node, in rank order."""
    authorized_key: pulumi.Input[str]
    """The operator's public key, installed for ``settings.ssh_user`` on every node."""


@dataclass(frozen=True)
class NodeOutputs:
    name: str
    rank: int
    instance_id: pulumi.Output[str]
    private_ip: pulumi.Output[str]
    public_ip: pulumi.Output[str]


@dataclass(frozen=True)
class ClusterOutputs:
    bucket: pulumi.Output[str]
    zone: pulumi.Output[str]
    nodes: Sequence[NodeOutputs]


class CloudBuilder(Protocol):
    name: str

    def build(self, args: ClusterArgs, opts: pulumi.ResourceOptions | None = None) -> ClusterOutputs:
        """Declare the cluster's resources (never inside an ``apply``) and return its outputs."""
        ...


def builder_for(cloud: str) -> CloudBuilder:
    module = importlib.import_module(CLOUD_BUILDERS[cloud])
    builder: CloudBuilder = module.BUILDER
    return builder


def node_user_data(
    settings: FleetSettings,
    rank: int,
    host_key: HostKey,
    authorized_key: pulumi.Input[str],
    bucket: pulumi.Input[str],
    bucket_scheme: str,
    extra_files: tuple[CloudFile, ...] = (),
) -> pulumi.Output[str]:
    """The cloud-init user data of one node; secret, since it carries the private host key.

    Depends on this node alone (never on the node count): see ``infra.bootstrap.node_env``.
    Rendering text inside ``apply`` is fine; no resource is created here.
    """

    def render(values: list[str]) -> str:
        private, public, authorized, bucket_name = values
        return render_user_data(
            NodeBootstrap(
                cluster_id=settings.cluster_id,
                cloud=settings.cloud,
                node_name=settings.node_name(rank),
                rank=rank,
                gpus=settings.machine.gpus,
                ssh_user=settings.ssh_user,
                authorized_key=authorized,
                host_private_key=private,
                host_public_key=public,
                bucket=bucket_name,
                bucket_url=f"{bucket_scheme}://{bucket_name}",
                extra_files=extra_files,
            )
        )

    rendered = pulumi.Output.all(
        host_key.private_key_openssh, host_key.public_key_openssh, authorized_key, bucket
    ).apply(render)
    return pulumi.Output.secret(rendered)
