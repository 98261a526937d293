"""Wire the cluster together and export the stack-outputs contract.

``build_fleet`` is the whole Pulumi program given validated settings: it is what
``infra/__main__.py`` runs under ``pulumi up`` and what the tests and the benchmark run under
Pulumi's mocks. The exported keys are exactly the fields of ``fleetrun_contract.stack_outputs.StackOutputs``,
which ``launch``'s inventory reads from ``pulumi stack output --json --show-secrets``.
"""

from __future__ import annotations

from typing import Any

import pulumi

from fleetrun_contract.stack_outputs import CONTRACT_VERSION
from infra.clouds.base import ClusterArgs, ClusterOutputs, builder_for
from infra.identity import SshIdentity, SshIdentityArgs
from infra.settings import FleetSettings


def build_fleet(settings: FleetSettings, *, export: bool = True) -> dict[str, Any]:
    """Declare the cluster of ``settings``; return (and export) the contract's outputs."""
    node_names = [settings.node_name(rank) for rank in range(settings.node_count)]
    identity = SshIdentity(f"{settings.cluster_id}-ssh", SshIdentityArgs(node_names, settings.ssh_public_key))
    cluster = builder_for(settings.cloud).build(
        ClusterArgs(settings=settings, host_keys=identity.host_keys, authorized_key=identity.authorized_key)
    )
    outputs = contract_outputs(settings, identity, cluster)
    if export:
        for key, value in outputs.items():
            pulumi.export(key, value)
    return outputs


def contract_outputs(
    settings: FleetSettings, identity: SshIdentity, cluster: ClusterOutputs
) -> dict[str, Any]:
    """The ``StackOutputs`` structure, with Outputs where values are known only after deploy."""
    outputs: dict[str, Any] = {
        "fleetrun_contract": CONTRACT_VERSION,
        "cluster_id": settings.cluster_id,
        "cloud": settings.cloud,
        "region": settings.region,
        "zone": cluster.zone,
        "bucket": cluster.bucket,
        "ssh_user": settings.ssh_user,
        "nodes": [
            {
                "name": node.name,
                "rank": node.rank,
                "public_ip": node.public_ip,
                "private_ip": node.private_ip,
                "user": settings.ssh_user,
                "port": 22,
                "gpus": settings.machine.gpus,
                "gpu_type": settings.machine.gpu_type,
                "instance_type": settings.machine.machine_type,
                "instance_id": node.instance_id,
                "host_key": key.public_key_openssh,
            }
            for node, key in zip(cluster.nodes, identity.host_keys, strict=True)
        ],
    }
    if identity.operator_private_key is not None:
        outputs["ssh_private_key"] = pulumi.Output.secret(identity.operator_private_key)
    return outputs
