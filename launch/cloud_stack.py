"""Drive a fleetrun Pulumi stack from Python: the engine behind ``fab up`` and ``fab down``.

``stack_up`` runs ``pulumi up`` for a stack of the project in ``project_dir`` (the repository,
where ``Pulumi.yaml`` is) and returns its outputs in the contract shape of
``launch.stack_outputs`` (what ``pulumi stack output --json --show-secrets`` prints), ready for
``Inventory.from_stack_outputs``. ``stack_down`` runs ``pulumi destroy`` and then *confirms*, by
asking the cloud itself, that no instance of the cluster remains; the buckets are retained by
design. ``stack_outputs`` reads the outputs of a deployed stack.

Why ask the cloud rather than Pulumi: after ``destroy`` the Pulumi state is empty by definition,
so refreshing it proves nothing. Instances that Pulumi lost track of (an interrupted ``up``, a
node started by hand into the cluster) are exactly the ones that keep billing. Every fleetrun
instance carries its cluster id as a tag (AWS ``fleetrun:cluster``) or label (GCP
``fleetrun-cluster``), so listing by it finds them whatever the state says. The cluster id is
derived from the project and stack names (``infra.settings.cluster_id_for``), so the check works
even when a failed ``up`` never exported any output.

Imports are lazy: ``pulumi.automation`` (which needs the ``pulumi`` CLI on PATH), boto3 and
google-cloud-compute load inside the functions that use them, so importing this module costs
nothing and works without any of them.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from launch.errors import FleetrunError
from launch.stack_outputs import StackOutputs

if TYPE_CHECKING:
    from pulumi.automation import Stack

PULUMI_INSTALL_URL = "https://www.pulumi.com/docs/install/"
AWS_CLUSTER_TAG = "fleetrun:cluster"  # infra.clouds.aws_catalog.CLUSTER_TAG
GCP_CLUSTER_LABEL = "fleetrun-cluster"  # infra.clouds.gcp_catalog.CLUSTER_LABEL
AWS_LIVE_STATES = ["pending", "running", "shutting-down", "stopping", "stopped"]

OnOutput = Callable[[str], Any]


class TeardownIncomplete(FleetrunError):
    """``pulumi destroy`` finished, but the cloud still lists instances of the cluster."""

    def __init__(self, cluster_id: str, where: str, leftovers: list[str]) -> None:
        self.cluster_id = cluster_id
        self.leftovers = leftovers
        super().__init__(
            f"cluster {cluster_id} is not gone: {len(leftovers)} instance(s) still exist in {where}: "
            f"{', '.join(leftovers)}. They are billing. Run `fab down` again, or terminate them in the "
            "cloud console (they carry the cluster's tag/label)."
        )


@dataclass(frozen=True)
class ClusterLocation:
    """Where to look for a cluster's instances, independent of the Pulumi state."""

    cloud: str
    cluster_id: str
    region: str
    project: str | None = None
    """GCP project id."""
    profile: str | None = None
    """AWS named profile (aws:profile in the stack config), if any."""


InstanceLister = Callable[[ClusterLocation], list[str]]


# -- public API -----------------------------------------------------------------------------------


def stack_up(
    stack_name: str,
    project_dir: Path,
    on_output: OnOutput = print,
    outputs_path: Path | None = None,
) -> dict[str, Any]:
    """Create or update the stack's cluster; return its outputs (contract shape).

    The stack's config is ``Pulumi.<stack_name>.yaml`` in ``project_dir`` (see docs/cloud.md).
    With ``outputs_path``, the outputs are also written there as JSON, mode 0600 (they may hold
    the generated operator private key).
    """
    stack = _open_stack(stack_name, project_dir, create=True)
    result = _run(lambda: stack.up(on_output=on_output, show_secrets=False, suppress_outputs=True), "up")
    outputs = outputs_to_contract(result.outputs, source=f"stack {stack_name}")
    if outputs_path is not None:
        write_outputs_json(outputs, outputs_path)
    on_output(describe_cluster(outputs))
    return outputs


def stack_outputs(stack_name: str, project_dir: Path) -> dict[str, Any]:
    """The outputs of a deployed stack, as ``pulumi stack output --json --show-secrets``."""
    stack = _open_stack(stack_name, project_dir, create=False)
    return outputs_to_contract(_run(stack.outputs, "stack output"), source=f"stack {stack_name}")


def stack_down(
    stack_name: str,
    project_dir: Path,
    on_output: OnOutput = print,
    list_instances: InstanceLister | None = None,
) -> None:
    """Destroy the stack's cluster, then confirm that no instance of it remains.

    Buckets survive (``retain_on_delete``): data, checkpoints and metrics are never lost by a
    teardown. Raises ``TeardownIncomplete`` naming every instance the cloud still lists.
    ``list_instances`` replaces the cloud query (tests, or a custom check).
    """
    stack = _open_stack(stack_name, project_dir, create=False)
    location = cluster_location(stack, stack_name)
    bucket = _bucket_of(stack)
    _run(lambda: stack.destroy(on_output=on_output, show_secrets=False, suppress_outputs=True), "destroy")
    confirm_no_instances(location, list_instances or INSTANCE_LISTERS[location.cloud])
    kept = f"; bucket {bucket} was kept (retained on purpose)" if bucket else ""
    on_output(f"confirmed: no instance of cluster {location.cluster_id} remains in {_where(location)}{kept}")


# -- pieces, usable on their own ------------------------------------------------------------------


def require_pulumi_cli() -> str:
    """The path of the ``pulumi`` CLI, or a FleetrunError saying how to install it."""
    path = shutil.which("pulumi")
    if path is None:
        raise FleetrunError(
            "the Pulumi CLI is not installed (no `pulumi` on PATH). `fab up` and `fab down` drive "
            f"Pulumi through its Automation API, which runs that CLI: install it from {PULUMI_INSTALL_URL}, "
            "then `pulumi login` (docs/cloud.md, step 1)."
        )
    return path


def outputs_to_contract(outputs: Mapping[str, Any], source: str = "stack outputs") -> dict[str, Any]:
    """Plain outputs in the contract shape, from the Automation API's ``OutputValue``s or plain values.

    Secret values (the generated operator key) come back in clear, as with ``--show-secrets``.
    """
    plain = {key: getattr(value, "value", value) for key, value in outputs.items()}
    try:
        StackOutputs.model_validate(plain)
    except ValidationError as exc:
        raise FleetrunError(
            f"{source}: outputs do not match the fleetrun contract (is it a fleetrun stack, deployed with "
            f"`fab up`?): {exc.error_count()} problem(s); first: {_first_error(exc)}"
        ) from None
    return plain


def write_outputs_json(outputs: Mapping[str, Any], path: Path) -> Path:
    """Write outputs as JSON, readable by the owner only (they may hold a private key)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump(outputs, handle, indent=2, sort_keys=True)
        handle.write("\n")
    os.chmod(tmp, 0o600)
    tmp.replace(path)
    return path


def describe_cluster(outputs: Mapping[str, Any]) -> str:
    nodes = outputs["nodes"]
    head = nodes[0]
    gpus = sum(int(n.get("gpus", 0)) for n in nodes)
    return (
        f"cluster {outputs['cluster_id']} ({outputs['cloud']} {outputs['region']}): {len(nodes)} x "
        f"{head['instance_type']}, {gpus} GPUs; head {head['name']} at {head.get('public_ip') or head['private_ip']}; "
        f"bucket {outputs['bucket']}"
    )


def cluster_location(stack: Stack, stack_name: str) -> ClusterLocation:
    """Cloud, region and cluster id from the stack's config and project name (not its state)."""
    config = {key: value.value for key, value in _run(stack.get_all_config, "config").items()}
    cloud = config.get("fleet:cloud")
    if cloud not in INSTANCE_LISTERS:
        raise FleetrunError(
            f"stack {stack_name}: fleet:cloud is {cloud!r}; expected one of {sorted(INSTANCE_LISTERS)}"
        )
    from infra.settings import cluster_id_for

    project_name = stack.workspace.project_settings().name
    zone = config.get("fleet:zone") or ""
    region = config.get("fleet:region") or zone.rsplit("-", 1)[0]
    return ClusterLocation(
        cloud=cloud,
        cluster_id=cluster_id_for(project_name, short_stack_name(stack_name)),
        region=region,
        project=config.get("fleet:project") or config.get("gcp:project"),
        profile=config.get("aws:profile"),
    )


def short_stack_name(stack_name: str) -> str:
    """``dev`` for ``dev``, ``org/dev`` or ``org/project/dev``: the name the program sees."""
    return stack_name.rsplit("/", 1)[-1]


def confirm_no_instances(location: ClusterLocation, list_instances: InstanceLister) -> None:
    leftovers = list_instances(location)
    if leftovers:
        raise TeardownIncomplete(location.cluster_id, _where(location), leftovers)


# -- cloud queries (lazy imports) -----------------------------------------------------------------


def list_aws_instances(location: ClusterLocation) -> list[str]:
    """Instances tagged with the cluster id that are not terminated, as ``id (state)``."""
    try:
        import boto3  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        raise FleetrunError(
            "cannot confirm the teardown: boto3 is not installed (pip install boto3, or the 'aws' extra). "
            "`pulumi destroy` itself finished."
        ) from None
    session = boto3.Session(profile_name=location.profile, region_name=location.region)
    pages = (
        session.client("ec2")
        .get_paginator("describe_instances")
        .paginate(
            Filters=[
                {"Name": f"tag:{AWS_CLUSTER_TAG}", "Values": [location.cluster_id]},
                {"Name": "instance-state-name", "Values": AWS_LIVE_STATES},
            ]
        )
    )
    return [
        f"{instance['InstanceId']} ({instance['State']['Name']})"
        for page in pages
        for reservation in page.get("Reservations", [])
        for instance in reservation.get("Instances", [])
    ]


def list_gcp_instances(location: ClusterLocation) -> list[str]:
    """Instances labelled with the cluster id in any zone of the project (stopped ones included:
    their disks still bill), as ``name (status, zone)``."""
    try:
        from google.cloud import compute_v1  # type: ignore[import-not-found, import-untyped, unused-ignore]
    except ImportError:
        raise FleetrunError(
            "cannot confirm the teardown: google-cloud-compute is not installed (pip install "
            "google-cloud-compute, or the 'gcp' extra). `pulumi destroy` itself finished."
        ) from None
    if not location.project:
        raise FleetrunError("cannot confirm the teardown: the stack config has no fleet:project")
    request = compute_v1.AggregatedListInstancesRequest(
        project=location.project, filter=f'labels.{GCP_CLUSTER_LABEL} = "{location.cluster_id}"'
    )
    leftovers: list[str] = []
    for zone, scoped in compute_v1.InstancesClient().aggregated_list(request=request):
        for instance in scoped.instances:
            leftovers.append(f"{instance.name} ({instance.status}, {zone.removeprefix('zones/')})")
    return leftovers


INSTANCE_LISTERS: dict[str, InstanceLister] = {"aws": list_aws_instances, "gcp": list_gcp_instances}


# -- helpers --------------------------------------------------------------------------------------


def _open_stack(stack_name: str, project_dir: Path, create: bool) -> Stack:
    require_pulumi_cli()
    from pulumi import automation as auto

    project_dir = Path(project_dir)
    if not (project_dir / "Pulumi.yaml").is_file():
        raise FleetrunError(f"{project_dir}: no Pulumi.yaml here; run from the fleetrun repository")
    config_file = project_dir / f"Pulumi.{short_stack_name(stack_name)}.yaml"
    if not config_file.is_file():
        raise FleetrunError(
            f"no stack config {config_file}: copy Pulumi.aws-example.yaml or "
            "Pulumi.gcp-example.yaml to it and set your cloud, region, machine type and ssh_cidr (docs/cloud.md)"
        )
    opener = auto.create_or_select_stack if create else auto.select_stack
    try:
        return opener(stack_name=stack_name, work_dir=str(project_dir))
    except FileNotFoundError as exc:  # the CLI vanished between the check and the call
        raise FleetrunError(
            f"cannot run the Pulumi CLI ({exc}); install it from {PULUMI_INSTALL_URL}"
        ) from None
    except auto.errors.StackNotFoundError:
        raise FleetrunError(f"stack {stack_name!r} does not exist (was it deployed with `fab up`?)") from None
    except auto.errors.CommandError as exc:
        raise FleetrunError(f"pulumi could not open stack {stack_name!r}: {_tail(exc)}") from None


def _run(call: Callable[[], Any], what: str) -> Any:
    from pulumi import automation as auto

    try:
        return call()
    except auto.errors.ConcurrentUpdateError:
        raise FleetrunError(f"pulumi {what}: another update of this stack is running; wait for it") from None
    except auto.errors.CommandError as exc:
        raise FleetrunError(f"pulumi {what} failed: {_tail(exc)}") from None


def _bucket_of(stack: Stack) -> str | None:
    try:
        value = _run(stack.outputs, "stack output").get("bucket")
    except FleetrunError:
        return None
    return getattr(value, "value", None) if value is not None else None


def _where(location: ClusterLocation) -> str:
    return f"{location.cloud} {location.project + ' ' if location.project else ''}{location.region}".strip()


def _tail(exc: Exception, lines: int = 15) -> str:
    return "\n".join(str(exc).strip().splitlines()[-lines:])


def _first_error(exc: ValidationError) -> str:
    first = exc.errors()[0]
    return f"{'.'.join(str(p) for p in first['loc'])}: {first['msg']}"
