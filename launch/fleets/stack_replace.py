"""Replacing one node of a Pulumi stack's cluster, through the Automation API (no CLI call of our
own), in the two cases a run needs:

* a *lost* node (``replace_node``): ``refresh`` (the terminated or reclaimed instance leaves the
  state), then ``up`` (Pulumi creates what the program declares and the state lacks: only the
  missing instance; the survivors are unchanged);
* a *bad* node that still runs (``renew_node``: a ``gpu_fault``, a straggler ``exclude``): the
  node's instance is found in the stack's own state (``export_stack``) as the resource fleetrun's
  program created for that node (``node_instance_urn``), and ``up(replace=[that urn])`` makes a
  new instance in its place. A state without exactly one such resource is an error before any
  update: nothing fleetrun did not create is ever named.

Either way the new outputs give the node's address and host key, pinned again, and every other
node must come out of the update unchanged.

The whole update is bounded by the recovery's ``replace_timeout_s``: ``up`` runs in a worker
thread, and when it outlives the deadline the update is cancelled (``Stack.cancel``) and the
replacement gives up, so a cloud out of capacity cannot hold a run (and its surviving, billing
nodes) forever.

The stack object is passed in by tests (a fake with ``refresh``, ``up``, ``outputs``,
``export_stack`` and ``cancel``); in a real run it is opened from the project like ``fab up``
opens it.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from launch.errors import FleetrunError
from launch.fleets.cloud_stack import _open_stack, _run, is_node_urn, outputs_to_contract

if TYPE_CHECKING:
    from launch.fleets.clouds.base import CloudOps
    from launch.job.inventory import Host


class StackLike(Protocol):
    """The part of ``pulumi.automation.Stack`` a replacement uses."""

    def refresh(self, **kwargs: Any) -> Any: ...
    def up(self, **kwargs: Any) -> Any: ...
    def outputs(self) -> Any: ...
    def cancel(self) -> Any: ...
    def export_stack(self) -> Any: ...


def replace_node(
    stack_name: str,
    host: Host,
    *,
    stack: StackLike | None = None,
    project_dir: Path | None = None,
    on_output: Callable[[str], None] = print,
    timeout_s: float | None = None,
) -> Host | None:
    """Recreate ``host``'s instance and return it as a ``Host`` read from the new outputs (its new
    address and pinned host key), or None when the outputs no longer name the node.

    Survivors must come out of ``up`` unchanged: a survivor whose address or host key changed is
    a stack that replaced more than the lost node (a changed config, a drifted program), and the
    run must not go on against machines it did not plan for. None as well when refresh and up
    together take longer than ``timeout_s`` (the update is cancelled).
    """
    opened: Any = stack if stack is not None else _open_stack(stack_name, project_dir, create=False)
    before = _contract(opened, stack_name)

    def update() -> Any:
        _run(lambda: opened.refresh(on_output=on_output, show_secrets=False), "refresh")
        return _run(lambda: opened.up(on_output=on_output), "up")

    after = _bounded(opened, stack_name, f"replacing {host.name}", update, timeout_s, on_output)
    return None if after is None else _node_after(stack_name, host, before, after)


def renew_node(
    stack_name: str,
    host: Host,
    *,
    stack: StackLike | None = None,
    project_dir: Path | None = None,
    on_output: Callable[[str], None] = print,
    timeout_s: float | None = None,
) -> Host | None:
    """A new instance in place of ``host``'s, which still runs but must not be used again (a GPU
    fault, a straggler): ``up(replace=[urn])`` with the URN of that node's instance only, read
    from the stack's state (``node_instance_urn``). Returns the node as the new outputs give it
    (address, host key), or None when the update outlived ``timeout_s`` (it is cancelled).

    Refused with a ``FleetrunError`` before any update when the outputs do not name the node or
    the state holds no single instance that fleetrun's program created for it; after the update,
    when the node still has its old instance (nothing was replaced) or another node changed.

    The host key is the node's own, generated once at deploy time and kept in the state
    (``infra/identity.py``): the new instance boots with it, so it usually comes back unchanged;
    whatever the outputs say is pinned.
    """
    from fleetrun_contract.stack_outputs import StackOutputs
    from launch.fleets.clouds import CLOUDS

    opened: Any = stack if stack is not None else _open_stack(stack_name, project_dir, create=False)
    before = _contract(opened, stack_name)
    outputs = StackOutputs.model_validate(before)  # validated already by ``_contract``
    node = next((n for n in outputs.nodes if n.name == host.name), None)
    if node is None:
        raise FleetrunError(f"stack {stack_name}: its outputs name no node {host.name}; nothing was changed")
    deployment = _run(opened.export_stack, "stack export")
    state = getattr(deployment, "deployment", None)
    urn = node_instance_urn(
        state if isinstance(state, Mapping) else {},
        CLOUDS[outputs.cloud],
        cluster_id=outputs.cluster_id,
        node=node.name,
        rank=node.rank,
        instance_id=node.instance_id,
        stack_name=stack_name,
    )
    on_output(f"stack {stack_name}: a new instance for {host.name} in place of {node.instance_id}")

    def update() -> Any:
        return _run(
            lambda: opened.up(on_output=on_output, replace=[urn], show_secrets=False, suppress_outputs=True),
            "up",
        )

    after = _bounded(opened, stack_name, f"renewing {host.name}", update, timeout_s, on_output)
    if after is None:
        return None
    now = next((n for n in StackOutputs.model_validate(after).nodes if n.name == host.name), None)
    if now is not None and now.instance_id == node.instance_id:
        raise FleetrunError(
            f"stack {stack_name}: {host.name} still has instance {node.instance_id} after the update; "
            "nothing was replaced"
        )
    return _node_after(stack_name, host, before, after)


def node_instance_urn(
    state: Mapping[str, Any],
    cloud: CloudOps,
    *,
    cluster_id: str,
    node: str,
    rank: int,
    instance_id: str,
    stack_name: str,
) -> str:
    """The URN of the one resource of ``state`` (``Stack.export_stack().deployment``) that is
    ``node``'s instance as fleetrun's program creates it (``infra/clouds/<cloud>.py``): a live
    custom resource of the cloud's instance type, named after the node, under the cluster's nodes
    component, tagged (labelled) with the cluster id and the node's rank, and holding the
    instance id the outputs give. No other resource is ever named: none, or several, is an error
    that says what was looked for."""
    from fleetrun_contract.cluster import nodes_component_type

    spec = cloud.instance
    nodes_type = nodes_component_type(cloud.name)
    want = {cloud.cluster_tag: cluster_id, spec.rank_tag: str(rank)}
    found: list[str] = []
    near: list[str] = []
    resources = state.get("resources")
    for resource in resources if isinstance(resources, list) else []:
        if not isinstance(resource, Mapping):
            continue
        urn = resource.get("urn")
        if not isinstance(urn, str) or resource.get("type") != spec.type_token or not resource.get("custom"):
            continue
        parts = urn.split("::", 3)
        if len(parts) != 4 or parts[3] != node or resource.get("delete"):
            continue
        why = _not_the_node(resource, urn, nodes_type, spec.tags_property, want, spec.id_output, instance_id)
        if why is None:
            found.append(urn)
        else:
            near.append(why)
    if len(found) == 1:
        return found[0]
    looked_for = (
        f"a {spec.type_token} named {node} under {nodes_type}, "
        + ", ".join(f"{k}={v}" for k, v in want.items())
        + f", instance {instance_id}"
    )
    if found:
        raise FleetrunError(
            f"stack {stack_name}: its state holds {len(found)} instances of node {node} ({looked_for}); "
            "refusing to choose one, nothing was changed"
        )
    raise FleetrunError(
        f"stack {stack_name}: its state holds no instance of node {node} that fleetrun created ({looked_for})"
        + (f"; {near[0]}" if near else "")
        + "; nothing was changed (`fab up` brings the stack back in line with its outputs)"
    )


def _not_the_node(
    resource: Mapping[str, Any],
    urn: str,
    nodes_type: str,
    tags_property: str,
    want: Mapping[str, str],
    id_output: str | None,
    instance_id: str,
) -> str | None:
    """Why a resource of the right type and name is not the node's instance, or None when it is."""
    if not is_node_urn(urn, nodes_type):
        return f"{urn} is not under {nodes_type}"
    inputs = resource.get("inputs")
    tags = inputs.get(tags_property) if isinstance(inputs, Mapping) else None
    if not isinstance(tags, Mapping) or any(tags.get(k) != v for k, v in want.items()):
        return f"{urn} is not tagged {', '.join(f'{k}={v}' for k, v in want.items())}"
    outputs = resource.get("outputs")
    if id_output is None:
        held = resource.get("id")
    else:
        held = outputs.get(id_output) if isinstance(outputs, Mapping) else None
    if held != instance_id:
        return f"{urn} holds instance {held!r}, the outputs say {instance_id!r}"
    return None


def _contract(opened: Any, stack_name: str) -> dict[str, Any]:
    """The stack's outputs now, as the contract's dict, validated (a broken one raises)."""
    from launch.fleets.stack_outputs import inventory_from_stack_outputs

    outputs = outputs_to_contract(_run(opened.outputs, "stack output"), source=f"stack {stack_name}")
    inventory_from_stack_outputs(outputs, None, stack=stack_name)
    return outputs


def _bounded(
    opened: Any,
    stack_name: str,
    doing: str,
    update: Callable[[], Any],
    timeout_s: float | None,
    on_output: Callable[[str], None],
) -> dict[str, Any] | None:
    """The outputs after ``update``, or None when it outlived ``timeout_s`` (then cancelled)."""
    finished, result = _within(update, timeout_s)
    if not finished:
        on_output(
            f"stack {stack_name}: {doing} took longer than {timeout_s:.0f} s; "
            "cancelling the update (run `fab up` later to bring the stack back in line)"
        )
        with contextlib.suppress(Exception):
            opened.cancel()
        return None
    return outputs_to_contract(result.outputs, source=f"stack {stack_name}")


def _node_after(stack_name: str, host: Host, before: dict[str, Any], after: dict[str, Any]) -> Host | None:
    """``host`` as the outputs after the update give it; every other node must be unchanged."""
    from launch.fleets.stack_outputs import inventory_from_stack_outputs

    old = {h.name: h for h in inventory_from_stack_outputs(before, host.key, stack=stack_name).hosts}
    new = inventory_from_stack_outputs(after, host.key, stack=stack_name).hosts
    for survivor in new:
        was = old.get(survivor.name)
        if survivor.name == host.name or was is None:
            continue
        if (was.address, was.host_key) != (survivor.address, survivor.host_key):
            raise FleetrunError(
                f"stack {stack_name}: replacing {host.name} also changed {survivor.name} "
                "(address or host key); refusing to go on"
            )
    return next((h for h in new if h.name == host.name), None)


def _within(call: Callable[[], Any], timeout_s: float | None) -> tuple[bool, Any]:
    """``(True, call())``, or ``(False, None)`` when ``call`` is still running after ``timeout_s``
    (it goes on in a daemon thread until cancelled); ``call``'s exception is raised here."""
    if timeout_s is None:
        return True, call()
    box: dict[str, Any] = {}

    def work() -> None:
        try:
            box["result"] = call()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            box["error"] = exc

    worker = threading.Thread(target=work, name="stack-replace", daemon=True)
    worker.start()
    worker.join(max(0.0, timeout_s))
    if worker.is_alive():
        return False, None
    if "error" in box:
        raise box["error"]
    return True, box.get("result")
