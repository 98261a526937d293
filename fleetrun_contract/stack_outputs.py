"""The stack-outputs contract between ``infra`` (which writes it) and ``launch`` (which reads it).

``pulumi stack output --json --show-secrets`` on a fleetrun stack prints one JSON object.
``infra.program`` exports exactly these top-level keys, and
``launch.fleets.kinds.stack.inventory_from_stack_outputs`` reads them with no hand edits::

    {
      "fleetrun_contract": 1,
      "cluster_id": "fr-3f9c2a",              # unique per stack; tags every resource
      "cloud": "aws" | "gcp",
      "region": "us-east-1",
      "zone": "us-east-1a",                   # optional
      "bucket": "fr-3f9c2a-artifacts",        # data, checkpoints, metrics; survives destroy
      "ssh_user": "ubuntu",
      "ssh_private_key": "-----BEGIN ...",    # secret; only when Pulumi generated the key
      "nodes": [
        {
          "name": "fr-3f9c2a-node0",
          "rank": 0,                           # node 0 is the head (rendezvous endpoint)
          "public_ip": "54.1.2.3",
          "private_ip": "10.0.1.10",
          "user": "ubuntu",
          "port": 22,
          "gpus": 8,
          "gpu_type": "nvidia-h100-80gb",      # optional
          "instance_type": "p5.48xlarge",
          "instance_id": "i-0abc...",          # used to confirm teardown
          "host_key": "ssh-ed25519 AAAA..."    # pinned before the first connection
        }
      ]
    }

The models here are pure data (pydantic), so ``infra`` tests can validate their mocked outputs
against the same definition that ``launch`` parses, and the two sides cannot drift.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

CONTRACT_VERSION = 1


class StackNode(BaseModel):
    """One machine of a cloud fleet as exported by the Pulumi program."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    rank: int = Field(ge=0)
    public_ip: str | None = None
    private_ip: str
    user: str = "ubuntu"
    port: int = Field(default=22, ge=1, le=65535)
    gpus: int = Field(default=0, ge=0)
    gpu_type: str | None = None
    instance_type: str
    instance_id: str
    host_key: str = Field(description="OpenSSH public host key, e.g. 'ssh-ed25519 AAAA...'")


class StackOutputs(BaseModel):
    """Top-level structure of ``pulumi stack output --json --show-secrets``."""

    model_config = ConfigDict(extra="allow")

    fleetrun_contract: Literal[1] = 1
    cluster_id: str = Field(min_length=1)
    cloud: Literal["aws", "gcp"]
    region: str
    zone: str | None = None
    bucket: str
    ssh_user: str = "ubuntu"
    ssh_private_key: str | None = None
    nodes: list[StackNode] = Field(min_length=1)
