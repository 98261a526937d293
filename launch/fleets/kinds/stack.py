"""A Pulumi stack's cluster on AWS or GCP: the only module that knows how the two clouds differ
for a run (``launch.fleets.cloud_stack`` creates and destroys stacks).

Its inventory is fleetrun's own state: the stack's outputs (``--inventory stack:<name>``, read
through the Pulumi Automation API, or a ``.json`` of those outputs). Nodes power off with
``shutdown`` (instances are created with instance-initiated shutdown = terminate, so that ends
billing); run directories go to the stack's bucket with the node's own role; the teardown is
``pulumi destroy`` followed by asking the cloud that no instance of the cluster remains.

The per-cloud operations sit in ``_CLOUDS`` behind the small ``CloudOps`` protocol. When
``launch.fleets.clouds`` (one module per cloud) lands, ``_CLOUDS`` and the two ``_Aws``/``_Gcp``
classes are replaced by ``from launch.fleets.clouds import CLOUDS as _CLOUDS``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from pydantic import ValidationError

from launch.errors import SpecError
from launch.fleets.kinds.base import UPLOAD_SOURCE, Say, TeardownOutcome, TeardownState
from launch.fleets.kinds.refs import StackFleetRef
from launch.job.stack_outputs import StackOutputs
from launch.job.validation import describe_validation_error

if TYPE_CHECKING:
    from launch.job.inventory import Inventory

SELECTOR = "stack"
OUTPUTS_SUFFIX = ".json"

SHUTDOWN_HOOK = (
    "# cloud node: shutdown terminates the instance (instance-initiated shutdown = terminate)\n"
    "sudo -n /sbin/shutdown -h now || sudo -n /sbin/poweroff\n"
)


class CloudOps(Protocol):
    """What a run needs from one cloud (the shape of ``launch.fleets.clouds.CLOUDS[cloud]``)."""

    def upload_argv(self, bucket: str, dest: str) -> list[str]: ...

    def poweroff_hook(self) -> str: ...

    def cluster_tag(self) -> str: ...


class _Aws:
    def upload_argv(self, bucket: str, dest: str) -> list[str]:
        return ["aws", "s3", "sync", "--only-show-errors", UPLOAD_SOURCE, f"s3://{bucket}/{dest}"]

    def poweroff_hook(self) -> str:
        return SHUTDOWN_HOOK

    def cluster_tag(self) -> str:
        return "fleetrun:cluster"  # infra.clouds.aws_catalog.CLUSTER_TAG


class _Gcp:
    def upload_argv(self, bucket: str, dest: str) -> list[str]:
        return ["gcloud", "storage", "rsync", "--recursive", UPLOAD_SOURCE, f"gs://{bucket}/{dest}"]

    def poweroff_hook(self) -> str:
        return SHUTDOWN_HOOK

    def cluster_tag(self) -> str:
        return "fleetrun-cluster"  # infra.clouds.gcp_catalog.CLUSTER_LABEL


_CLOUDS: dict[str, CloudOps] = {"aws": _Aws(), "gcp": _Gcp()}


class StackKind:
    name: ClassVar[str] = "stack"
    can_power_off: ClassVar[bool] = True

    def __init__(self, ref: StackFleetRef) -> None:
        self.ref = ref
        self.cloud = _CLOUDS[ref.cloud]

    def describe(self) -> str:
        return f"stack {self.ref.stack or '(unnamed)'} (cluster {self.ref.cluster_id}, {self.ref.cloud})"

    def poweroff_hook(self) -> str:
        return self.cloud.poweroff_hook()

    def bucket_upload_argv(self, dest: str) -> list[str] | None:
        return self.cloud.upload_argv(self.ref.bucket, dest) if self.ref.bucket else None

    def tear_down(self, say: Say) -> TeardownOutcome:
        if not self.ref.stack:
            return TeardownOutcome(
                TeardownState.FAILED,
                f"cluster {self.ref.cluster_id} came from a stack outputs file without a stack name; "
                "tear it down with: fab down --stack <name>",
            )
        from launch.fleets import cloud_stack  # Pulumi, imported only by cloud users

        cloud_stack.stack_down(self.ref.stack, on_output=say)  # raises TeardownIncomplete on leftovers
        return TeardownOutcome(
            TeardownState.DONE,
            f"stack {self.ref.stack} destroyed (buckets retained); no instance of cluster "
            f"{self.ref.cluster_id} remains",
        )

    def legacy_guard_fields(self) -> dict[str, object]:
        # today's nodelib/fleetrun_node.upload picks the CLI from these; it moves to upload_argv
        return {"bucket": self.ref.bucket, "cloud": self.ref.cloud}

    def tags(self) -> dict[str, str]:
        return {self.cloud.cluster_tag(): self.ref.cluster_id}


def inventory_from_stack_outputs(
    data: dict[str, Any], key_path: Path | None = None, stack: str | None = None
) -> Inventory:
    """Hosts from ``pulumi stack output --json --show-secrets`` (see ``launch.job.stack_outputs``).

    ``key_path`` is the operator's private key; when the stack generated the key pair it is in
    the outputs (a secret) and the caller writes it to a 0600 file first.
    """
    from launch.job.inventory import Host, Inventory

    try:
        outputs = StackOutputs.model_validate(data)
        fleet = StackFleetRef(
            stack=stack, cluster_id=outputs.cluster_id, cloud=outputs.cloud, bucket=outputs.bucket or None
        )
    except ValidationError as exc:
        raise SpecError(describe_validation_error("stack outputs", exc)) from None
    nodes = sorted(outputs.nodes, key=lambda n: n.rank)
    hosts = [
        Host(
            name=n.name,
            address=n.public_ip or n.private_ip,
            private_address=n.private_ip,
            user=n.user or outputs.ssh_user,
            port=n.port,
            key=key_path,
            host_key=n.host_key,
            gpus=n.gpus,
            instance_type=n.instance_type,
        )
        for n in nodes
    ]
    return Inventory(
        hosts=hosts, source=f"stack {outputs.cluster_id} ({outputs.cloud} {outputs.region})", fleet=fleet
    )


def load_outputs_file(path: str | Path, key_path: Path | None = None) -> Inventory:
    """``--inventory outputs.json``: a stack's outputs saved by ``fab up --outputs``."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SpecError(f"{path}: cannot read stack outputs JSON: {exc}") from None
    if not isinstance(data, dict):
        raise SpecError(f"{path}: expected a JSON object of stack outputs")
    return inventory_from_stack_outputs(data, key_path)


def load_stack_inventory(stack: str | None) -> Inventory:
    """``--inventory stack:<name>``: the deployed stack's outputs, read from Pulumi."""
    if not stack:
        raise SpecError("inventory 'stack:': expected a stack name, e.g. stack:dev")
    from launch.fleets.cloud_stack import stack_inventory  # lazy: only cloud users need Pulumi

    return stack_inventory(stack)
