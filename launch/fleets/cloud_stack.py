"""Drive a fleetrun Pulumi stack from Python: the engine behind ``fab up`` and ``fab down``.

``stack_up`` refreshes the stack (nodes that a watchdog or a spot interruption removed leave the
state, so ``up`` recreates them and the outputs list live addresses only), runs ``pulumi up``
for a stack whose config is in ``project_dir`` and
returns its outputs in the contract shape of ``fleetrun_contract.stack_outputs`` (what ``pulumi stack output
--json --show-secrets`` prints), ready for ``launch.fleets.kinds.stack.inventory_from_stack_outputs``. A new cluster with an
ordered ``fleet:zones`` list fails over: when the provider reports no capacity in a zone (or, for
a quota, in a region), the partial fleet is destroyed at once and the next zone is tried, the
whole group in one zone. ``stack_inventory`` returns the inventory directly (for ``--inventory
stack:<name>``). ``stack_down`` runs ``pulumi destroy`` and then *audits* the cloud itself: no
instance (running or stopped), disk, address or network interface of the cluster may remain;
the buckets are retained by design. ``project_dir`` is where the stack configs are (default
``$FLEETRUN_PROJECT_DIR``, else the current directory); which Pulumi project runs them, checkout or
installed, is ``launch.fleets.pulumi_project``'s rule.

Why ask the cloud rather than Pulumi: after ``destroy`` the Pulumi state is empty by definition,
so refreshing it proves nothing. Resources that Pulumi lost track of (an interrupted ``up``, a
node started by hand into the cluster, a stopped VM) are exactly the ones that keep billing.
Every fleetrun resource carries its cluster id as a tag (AWS) or label (GCP), so listing by it
finds them whatever the state says. The cluster id is derived from the project and stack names
(``fleetrun_contract.cluster.cluster_id_for``), so the audit works even when a failed ``up`` never exported
any output. Everything cloud-specific is behind ``launch.fleets.clouds.CLOUDS``.

Imports are lazy: ``pulumi.automation`` (which needs the ``pulumi`` CLI on PATH), boto3 and
google-cloud-compute load inside the functions that use them, so importing this module costs
nothing and works without any of them.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from fleetrun_contract.cluster import cluster_id_for
from fleetrun_contract.stack_outputs import StackOutputs
from launch.errors import FleetrunError
from launch.fleets import pulumi_project
from launch.fleets.clouds import CLOUDS, CloudOps, ClusterLocation, ErrorKind

if TYPE_CHECKING:
    from pulumi.automation import Stack

    from launch.job.inventory import Inventory

__all__ = ["ClusterLocation", "set_warm_until", "stack_down", "stack_inventory", "stack_outputs", "stack_up"]

PULUMI_INSTALL_URL = "https://www.pulumi.com/docs/install/"
PARTIAL_FLEET_LIMIT_S = 120.0
"""A failed attempt's nodes must be gone (destroy issued) within this long of the first one
coming up. ``pulumi up`` starts no new resource after the first failure, and the failover
destroys the rest the moment ``up`` returns. An ``up`` that has failed but does not return (a
create stalled in the provider) is cancelled ``CANCEL_MARGIN_S`` before that limit, so that the
destroy still starts in time; a longer life is reported as a warning."""
CANCEL_MARGIN_S = 30.0
"""Time kept, before the partial fleet's limit, for the cancel to stop ``up`` and the destroy to start."""
CANCEL_WAIT_S = 60.0
"""How long a cancelled ``up`` may take to stop before fleetrun gives up on it and says so."""
POLL_S = 0.5
"""How often a running ``up`` is checked against the partial fleet's deadline."""

OnOutput = Callable[[str], Any]
Leftovers = Callable[[ClusterLocation], list[str]]
Clock = Callable[[], float]
wall_clock: Clock = time.time
"""Unix time, for ``fleet:warm_until`` (a module attribute, so tests set it)."""


class TeardownIncomplete(FleetrunError):
    """``pulumi destroy`` finished, but the cloud still lists resources of the cluster."""

    def __init__(self, cluster_id: str, where: str, leftovers: list[str]) -> None:
        self.cluster_id = cluster_id
        self.leftovers = leftovers
        super().__init__(
            f"cluster {cluster_id} is not gone: {len(leftovers)} resource(s) still exist in {where}:\n  "
            + "\n  ".join(leftovers)
            + "\nThey are billing. Run `fab down` again, or delete them in the cloud console (they carry "
            "the cluster's tag/label)."
        )


# -- public API -----------------------------------------------------------------------------------


def stack_up(
    stack_name: str,
    project_dir: Path | None = None,
    on_output: OnOutput = print,
    outputs_path: Path | None = None,
    clock: Clock = time.monotonic,
) -> dict[str, Any]:
    """Create or update the stack's cluster; return its outputs (contract shape).

    The stack's config is ``Pulumi.<stack_name>.yaml`` in ``project_dir`` (see docs/cloud.md).
    The state is refreshed first. A new cluster fails over along ``fleet:zones`` (``up_with_failover``).
    With ``outputs_path``, the outputs are also written there as JSON, mode 0600 (they may hold
    the generated operator private key, which is also saved by ``save_operator_key``).
    """
    stack = _open_stack(stack_name, project_dir, create=True)
    config = _config(stack)
    ops = cloud_ops(config, stack_name)
    drop_passed_lifetime(stack, config, on_output)
    # Nodes terminated by their watchdog or by a spot interruption are still in the state until
    # a refresh: without it `up` would recreate nothing and export dead addresses.
    _run(lambda: stack.refresh(on_output=on_output, show_secrets=False), "refresh")
    result = up_with_failover(stack, ops, failover_zones(config), config.get("fleet:zone"), on_output, clock)
    outputs = outputs_to_contract(result.outputs, source=f"stack {stack_name}")
    if outputs_path is not None:
        write_outputs_json(outputs, outputs_path)
    on_output(describe_cluster(outputs))
    key_path = save_operator_key(outputs)
    if key_path is not None:
        on_output(f"operator key (generated by the stack): {key_path}")
    return outputs


def stack_outputs(stack_name: str, project_dir: Path | None = None) -> dict[str, Any]:
    """The outputs of a deployed stack, as ``pulumi stack output --json --show-secrets``."""
    stack = _open_stack(stack_name, project_dir, create=False)
    return outputs_to_contract(_run(stack.outputs, "stack output"), source=f"stack {stack_name}")


def stack_down(
    stack_name: str,
    project_dir: Path | None = None,
    on_output: OnOutput = print,
    leftovers: Leftovers | None = None,
) -> None:
    """Destroy the stack's cluster, then audit the cloud: nothing of it may remain.

    Buckets survive (``retain_on_delete``): data, checkpoints and metrics are never lost by a
    teardown. Raises ``TeardownIncomplete`` naming every instance (running or stopped), disk,
    address and network interface the cloud still lists. ``leftovers`` replaces the cloud query
    (tests, or a custom check).
    """
    stack = _open_stack(stack_name, project_dir, create=False)
    location = cluster_location(stack, stack_name)
    bucket = _bucket_of(stack)
    _run(lambda: stack.destroy(on_output=on_output, show_secrets=False, suppress_outputs=True), "destroy")
    _forget_lifetime(stack)  # it was the destroyed cluster's: a later `fab up` must not inherit it
    confirm_nothing_left(location, leftovers or CLOUDS[location.cloud].leftovers)
    kept = f"; bucket {bucket} was kept (retained on purpose)" if bucket else ""
    on_output(
        f"confirmed: no instance, disk, address or network interface of cluster {location.cluster_id} "
        f"remains in {_where(location)}{kept}"
    )


def set_warm_until(
    stack_name: str, value: str | None, project_dir: Path | None = None, on_output: OnOutput = print
) -> None:
    """Set (or, with None, remove) the stack's ``fleet:warm_until`` and ``pulumi up`` it: the
    program arms (or removes) the cloud's schedule that ends the instances then
    (``launch.fleets.stack_lifetime``). No refresh first: it would drop nodes that already ended
    from the state, and this ``up`` would create them again."""
    from pulumi import automation as auto

    from fleetrun_contract.lifetime import WARM_UNTIL_KEY

    stack = _open_stack(stack_name, project_dir, create=False)
    if value is not None:
        _run(lambda: stack.set_config(WARM_UNTIL_KEY, auto.ConfigValue(value)), "config set")
    elif WARM_UNTIL_KEY in _config(stack):
        _run(lambda: stack.remove_config(WARM_UNTIL_KEY), "config rm")
    else:
        return  # nothing armed: no update
    _run(
        lambda: stack.up(on_output=on_output, show_secrets=False, suppress_outputs=True),
        "up (instance lifetime)",
    )


def drop_passed_lifetime(stack: Stack, config: Mapping[str, str], on_output: OnOutput) -> None:
    """A ``fleet:warm_until`` that already passed (its cluster's lifetime fired or its warm period
    is over) is removed before ``fab up``: kept, it would give the new nodes a lifetime in the past,
    and AWS runs a one-time schedule of a past time at once."""
    from fleetrun_contract.lifetime import WARM_UNTIL_KEY, parse_warm_until

    value = config.get(WARM_UNTIL_KEY)
    if not value:
        return
    try:
        passed = parse_warm_until(value).timestamp() <= wall_clock()
    except ValueError:
        return  # the program names the bad key
    if passed:
        on_output(
            f"fab up: {WARM_UNTIL_KEY} {value} has passed; removed (a kept-warm lifetime of earlier nodes)"
        )
        _forget_lifetime(stack)


def _forget_lifetime(stack: Stack) -> None:
    from fleetrun_contract.lifetime import WARM_UNTIL_KEY

    if WARM_UNTIL_KEY in _config(stack):
        _run(lambda: stack.remove_config(WARM_UNTIL_KEY), "config rm")


def stack_inventory(stack_name: str, project_dir: Path | None = None, save_key: bool = True) -> Inventory:
    """The deployed stack as an ``Inventory`` (``fab train --inventory stack:<name>``).

    When the stack generated the operator key, its private half is written to
    ``$FLEETRUN_HOME/keys/<cluster_id>`` (0600) and used for the hosts; not on a dry run
    (``save_key=False``), which writes nothing.
    """

    outputs = stack_outputs(stack_name, project_dir)
    key_path = save_operator_key(outputs) if save_key else None
    from launch.fleets.stack_outputs import inventory_from_stack_outputs

    return inventory_from_stack_outputs(outputs, key_path, stack=stack_name)


# -- pieces, usable on their own ------------------------------------------------------------------


def save_operator_key(outputs: Mapping[str, Any]) -> Path | None:
    """Write the generated operator private key (if the stack made one) to a 0600 file."""
    private_key = outputs.get("ssh_private_key")
    if not private_key:
        return None
    from launch.paths import fleetrun_home

    name = str(outputs["cluster_id"])
    if Path(name).name != name or name in (".", ".."):  # a file name, never a path out of keys/
        raise FleetrunError(f"stack outputs: cluster_id {name[:80]!r} is not a plain name")
    path = fleetrun_home() / "keys" / name
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(str(private_key).strip() + "\n")
    os.chmod(path, 0o600)
    return path


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
    """Write outputs as JSON, readable by the owner only (they may hold a private key), and record
    that fleetrun wrote them (``--inventory FILE`` trusts only such a file): the digest recorded
    is that of the bytes written, and the temporary file is made safely (``write_private_file``)."""
    from launch.fleets.stack_outputs import record_written_outputs
    from launch.private_files import write_private_file

    path.parent.mkdir(parents=True, exist_ok=True)
    data = (json.dumps(outputs, indent=2, sort_keys=True) + "\n").encode()
    write_private_file(path, data, "--outputs")
    record_written_outputs(path, data)
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
    config = _config(stack)
    cloud = cloud_ops(config, stack_name).name
    project_name = stack.workspace.project_settings().name
    zone = config.get("fleet:zone") or (failover_zones(config) or [""])[0]
    region = config.get("fleet:region") or (CLOUDS[cloud].region_of(zone) if zone else "")
    return ClusterLocation(
        cloud=cloud,
        cluster_id=cluster_id_for(project_name, short_stack_name(stack_name)),
        region=region,
        project=config.get("fleet:project") or config.get("gcp:project"),
        profile=config.get("aws:profile"),
        provider_config=tuple(
            sorted(
                (key[len(cloud) + 1 :], value) for key, value in config.items() if key.startswith(f"{cloud}:")
            )
        ),
    )


def short_stack_name(stack_name: str) -> str:
    """``dev`` for ``dev``, ``org/dev`` or ``org/project/dev``: the name the program sees."""
    return stack_name.rsplit("/", 1)[-1]


def confirm_nothing_left(location: ClusterLocation, leftovers: Leftovers) -> None:
    found = leftovers(location)
    if found:
        raise TeardownIncomplete(location.cluster_id, _where(location), found)


def cloud_ops(config: Mapping[str, str], stack_name: str) -> CloudOps:
    cloud = config.get("fleet:cloud")
    if cloud not in CLOUDS:
        raise FleetrunError(f"stack {stack_name}: fleet:cloud is {cloud!r}; expected one of {sorted(CLOUDS)}")
    return CLOUDS[cloud]


def failover_zones(config: Mapping[str, str]) -> list[str]:
    """``fleet:zones`` as stored by Pulumi (a JSON list, or text with commas)."""
    raw = (config.get("fleet:zones") or "").strip()
    if not raw:
        return []
    if raw.startswith("["):
        return [str(z).strip() for z in json.loads(raw)]
    return [z.strip() for z in raw.split(",") if z.strip()]


# -- zone failover --------------------------------------------------------------------------------


CERTAIN_FAILURES = frozenset({ErrorKind.CAPACITY, ErrorKind.QUOTA, ErrorKind.GLOBAL_QUOTA})
"""Provider errors that doom a zone's attempt whatever its other creations do: one node the zone
cannot hold (or the quota cannot) is enough for the whole group to move."""


@dataclass
class UpEvents:
    """Engine events of one ``up`` (the Automation API's ``on_event`` stream): when the attempt's
    first node resource came into being, the error diagnostics, and the first of them that makes
    the attempt certain to fail (``CERTAIN_FAILURES``, by the cloud's ``classify``)."""

    nodes_type: str
    clock: Clock
    classify: Callable[[str], ErrorKind] | None = None
    first_node_at: float | None = None
    failures: list[str] = field(default_factory=list)
    certain: ErrorKind | None = None
    certain_at: float | None = None

    def __call__(self, event: Any) -> None:
        created = getattr(getattr(event, "res_outputs_event", None), "metadata", None)
        if (
            created is not None
            and getattr(getattr(created, "op", None), "value", None) == "create"
            and is_node_urn(str(created.urn), self.nodes_type)
            and self.first_node_at is None
        ):
            self.first_node_at = self.clock()
        diagnostic = getattr(event, "diagnostic_event", None)
        if diagnostic is not None and getattr(diagnostic, "severity", "") == "error":
            message = str(diagnostic.message)
            self.failures.append(message)
            if self.certain is None and self.classify is not None:
                kind = self.classify(message)
                if kind in CERTAIN_FAILURES:
                    self.certain, self.certain_at = kind, self.clock()


def is_node_urn(urn: str, nodes_type: str) -> bool:
    """A resource under the nodes component (``...$fleetrun:aws:GpuNodes$aws:ec2/instance:...``)."""
    parts = urn.split("::")
    chain = parts[2].split("$") if len(parts) > 3 else []
    return nodes_type in chain[:-1]


def node_urns(stack: Stack, nodes_type: str) -> list[str]:
    """The node resources (instances, their addresses and grants) in the stack's state."""
    deployment = stack.export_stack().deployment or {}
    return [
        str(r["urn"])
        for r in deployment.get("resources", [])
        if is_node_urn(str(r.get("urn", "")), nodes_type)
    ]


def up_with_failover(
    stack: Stack,
    ops: CloudOps,
    zones: list[str],
    current_zone: str | None,
    on_output: OnOutput = print,
    clock: Clock = time.monotonic,
) -> Any:
    """``pulumi up``, trying ``zones`` in order while the provider reports no capacity.

    Only for a cluster with no live node (after the refresh): an existing cluster is updated in
    its zone, never moved (that would destroy running nodes). After a failed attempt its partial
    fleet (every resource under the nodes component) is destroyed before anything else happens,
    so nodes of a failed zone never wait for the next zone's attempt. CAPACITY tries the next
    zone; QUOTA the next zone in another region (the limit is regional); anything else, a
    GLOBAL_QUOTA (a limit over all regions) included, stops.
    ``fab up`` records the zone in use in the stack config (``fleet:zone``).
    """
    from pulumi import automation as auto

    from fleetrun_contract.cluster import nodes_component_type

    nodes_type = nodes_component_type(ops.name)
    existing = node_urns(stack, nodes_type)
    if existing or not zones:
        candidates: list[str | None] = [current_zone or (zones[0] if zones else None)]
    else:
        candidates = list(zones)
    fail_over = len(candidates) > 1
    tried: list[str] = []
    exhausted_regions: set[str] = set()
    for zone in candidates:
        if zone and ops.region_of(zone) in exhausted_regions:
            tried.append(f"{zone}: skipped (quota exhausted in {ops.region_of(zone)})")
            continue
        if zones and zone and zone != current_zone:
            stack.set_config("fleet:zone", auto.ConfigValue(zone))
            current_zone = zone
        if fail_over:
            on_output(f"fab up: trying zone {zone}")
        watch = UpEvents(nodes_type, clock, ops.classify_error)
        try:
            # a running cluster's update is never cancelled: it is not destroyed either
            return _bounded_up(stack, watch, zone or "the configured zone", on_output, clock, not existing)
        except auto.errors.ConcurrentUpdateError:
            raise FleetrunError("pulumi up: another update of this stack is running; wait for it") from None
        except auto.errors.CommandError as exc:
            message = "\n".join([*watch.failures, str(exc)])
            kind = ops.classify_error(message)
        where = zone or "the configured zone"
        if existing:
            raise FleetrunError(
                f"pulumi up failed ({kind.value}) while updating the running cluster in {where}; its "
                f"nodes were left as they are (a running cluster is never moved): {_tail_text(message)}"
            )
        _destroy_partial(stack, nodes_type, watch, where, on_output, clock)
        tried.append(f"{where}: {kind.value}")
        if kind is ErrorKind.CAPACITY and fail_over:
            continue
        if kind is ErrorKind.QUOTA and fail_over and zone:
            exhausted_regions.add(ops.region_of(zone))
            continue
        quota = quota_named(message) if kind is ErrorKind.GLOBAL_QUOTA else None
        raise FleetrunError(
            f"pulumi up failed in {where}: a {kind.value} error"
            + (f" (quota {quota}, counted over all regions)" if quota else "")
            + (", which another zone would not fix" if fail_over else "")
            + f"; the partial fleet was destroyed. {_advice(kind)}\n{_tail_text(message)}"
        )
    raise FleetrunError(
        "pulumi up: no zone of fleet:zones could hold the cluster ("
        + "; ".join(tried)
        + "); each partial fleet was destroyed. Add zones, lower fleet:node_count, use a reservation, "
        "or try again later."
    )


def _bounded_up(
    stack: Stack, watch: UpEvents, where: str, on_output: OnOutput, clock: Clock, cancel_early: bool = True
) -> Any:
    """``stack.up``, cancelled as soon as it is certain to fail, or when it would keep its partial
    fleet too long.

    ``up`` runs in a worker thread; this thread watches its engine events (``watch``). A provider
    error that dooms the zone (no capacity, a quota: ``UpEvents.certain``) cancels the update at
    once (``Stack.cancel``, with ``cancel_early``): ``pulumi up`` would otherwise wait for every
    in-flight creation (15 nodes of 16 coming up, and billing, for minutes) before it returns.
    Another failure cancels it when it has not returned ``CANCEL_MARGIN_S`` before the partial
    fleet's limit. The cancelled ``up`` raises its ``CommandError`` and the caller destroys what
    exists. An ``up`` that does not stop within ``CANCEL_WAIT_S`` of the cancel is given up on
    with an error that says the partial fleet may still bill."""
    box: dict[str, Any] = {}

    def work() -> None:
        try:
            box["result"] = stack.up(
                on_output=on_output, on_event=watch, show_secrets=False, suppress_outputs=True
            )
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            box["error"] = exc

    worker = threading.Thread(target=work, name="pulumi-up", daemon=True)
    worker.start()
    cancelled_at: float | None = None
    while True:
        worker.join(POLL_S)
        if not worker.is_alive():
            break
        first = watch.first_node_at
        if cancelled_at is None and cancel_early and watch.certain is not None:
            on_output(
                f"fab up: {where} cannot hold the cluster ({watch.certain.value}: "
                f"{_tail_text(watch.failures[-1], 1)[:300]}); cancelling `pulumi up` now instead of waiting "
                "for its in-flight creations, to destroy the partial fleet"
            )
            with contextlib.suppress(Exception):  # the update may have ended meanwhile
                stack.cancel()
            cancelled_at = clock()
        elif cancelled_at is None and watch.failures and first is not None:
            age = clock() - first
            if age >= PARTIAL_FLEET_LIMIT_S - CANCEL_MARGIN_S:
                on_output(
                    f"fab up: the attempt in {where} failed and `pulumi up` is still running {age:.0f} s "
                    f"after its first node came up; cancelling it to destroy the partial fleet within "
                    f"{PARTIAL_FLEET_LIMIT_S:.0f} s"
                )
                with contextlib.suppress(Exception):  # the update may have ended meanwhile
                    stack.cancel()
                cancelled_at = clock()
        elif cancelled_at is not None and clock() - cancelled_at > CANCEL_WAIT_S:
            raise FleetrunError(
                f"pulumi up in {where} failed and did not stop {CANCEL_WAIT_S:.0f} s after its cancel; its "
                "partial fleet may still be billing. Run `fab down` (it destroys and audits the cloud). "
                + _tail_text("\n".join(watch.failures))
            )
    if "error" in box:
        raise box["error"]
    return box.get("result")


def _destroy_partial(
    stack: Stack, nodes_type: str, watch: UpEvents, where: str, on_output: OnOutput, clock: Clock
) -> None:
    partial = node_urns(stack, nodes_type)
    if not partial:
        return
    age = None if watch.first_node_at is None else clock() - watch.first_node_at
    _run(
        lambda: stack.destroy(
            target=partial,
            target_dependents=True,
            on_output=on_output,
            show_secrets=False,
            suppress_outputs=True,
        ),
        "destroy (partial fleet)",
    )
    lived = "" if age is None else f", destroy issued {age:.0f} s after its first node came up"
    on_output(f"fab up: destroyed the partial fleet in {where} ({len(partial)} resources{lived})")
    if age is not None and age > PARTIAL_FLEET_LIMIT_S:
        on_output(
            f"fab up: WARNING: that partial fleet lived {age:.0f} s before its destroy (limit "
            f"{PARTIAL_FLEET_LIMIT_S:.0f} s); check the cloud console for anything still billing"
        )


def _advice(kind: ErrorKind) -> str:
    return {
        ErrorKind.CAPACITY: "Add zones to fleet:zones, lower fleet:node_count, or use a reservation.",
        ErrorKind.QUOTA: "Request more quota (docs/cloud.md, step 2), or add zones in another region (GCP).",
        ErrorKind.GLOBAL_QUOTA: "Request more of that quota (docs/cloud.md, step 2); no other zone or region helps.",
        ErrorKind.BAD_CONFIG: "Fix the stack config (see the provider's message below).",
        ErrorKind.PERMISSION: "Grant the deploying identity the roles listed in docs/cloud.md, step 2.",
        ErrorKind.OTHER: "",
    }[kind]


def quota_named(message: str) -> str | None:
    """The quota a provider message names (``Quota 'GPUS_ALL_REGIONS' exceeded``, or the metric
    ``compute.googleapis.com/gpus_all_regions``), cleaned for the terminal, or None."""
    import re

    found = re.search(r"Quota '([A-Za-z0-9_]{1,64})'", message) or re.search(
        r"\b([A-Za-z0-9_]{1,64}_(?:ALL_REGIONS|all_regions))\b", message
    )
    return found.group(1).upper() if found else None


def _tail_text(text: str, lines: int = 15) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


# -- helpers --------------------------------------------------------------------------------------


def _open_stack(stack_name: str, project_dir: Path | None, create: bool) -> Stack:
    require_pulumi_cli()
    from pulumi import automation as auto

    project = pulumi_project.resolve(project_dir)
    config_file = project.stack_config(short_stack_name(stack_name))
    if not config_file.is_file():
        raise FleetrunError(
            f"no stack config {config_file}: copy Pulumi.aws-example.yaml or "
            "Pulumi.gcp-example.yaml to it and set your cloud, region, machine type and ssh_cidr (docs/cloud.md)"
        )
    opener = auto.create_or_select_stack if create else auto.select_stack
    try:
        return opener(stack_name=stack_name, work_dir=str(project.work_dir))
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


def _config(stack: Stack) -> dict[str, str]:
    return {key: value.value for key, value in _run(stack.get_all_config, "config").items()}


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
