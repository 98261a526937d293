"""A bad node of a stack gets a new instance (``stack_replace.renew_node``, ``StackKind.renew``).

The stack's state is the real program's (``infra.program`` under Pulumi's mocks, both clouds),
turned into what ``Stack.export_stack().deployment`` holds: each resource's URN, type, id,
inputs and outputs. A fake stack object stands in for the Automation API (no CLI, no cloud);
it records the keyword arguments of ``up``. What the tests show: the URN passed to
``up(replace=[...])`` is that node's instance and nothing else; a state without it, or with
something that only looks like it, is refused before any update; a slow update is cancelled.
"""

from __future__ import annotations

import copy
import threading
from typing import Any

import pytest
from infra_cases import evaluate
from pulumi.automation import Deployment, OutputValue

from infra.mocks import Snapshot
from launch.errors import FleetrunError
from launch.fleets import stack_replace
from launch.fleets.clouds import CLOUDS
from launch.fleets.kinds.refs import StackFleetRef
from launch.fleets.kinds.stack import StackKind, inventory_from_stack_outputs
from launch.job.inventory import Host

INSTANCE_TYPES = {"aws": "aws:ec2/instance:Instance", "gcp": "gcp:compute/instance:Instance"}


def exported_state(snap: Snapshot) -> dict[str, Any]:
    """The snapshot as ``export_stack().deployment``: URNs built from the parents' as Pulumi does."""
    resources = []
    for r in snap.resources:
        parent = r.parent
        chain = parent.split("::")[2] if parent.count("::") >= 3 else ""
        stem = parent.rsplit("::", 2)[0] if parent else "urn:pulumi:test::fleetrun"
        urn = f"{stem}::{chain + '$' if chain else ''}{r.typ}::{r.name}"
        resources.append(
            {
                "urn": urn,
                "custom": r.custom,
                "type": r.typ,
                "id": r.outputs.get("id", f"{r.name}-id"),
                "parent": parent,
                "inputs": copy.deepcopy(r.inputs),
                "outputs": copy.deepcopy(r.outputs),
            }
        )
    return {"manifest": {}, "resources": resources}


class FakeStack:
    """The part of the Automation API's ``Stack`` a renewal uses; ``up`` returns ``after``."""

    def __init__(self, state: dict[str, Any], before: dict[str, Any], after: dict[str, Any]) -> None:
        self.state, self.before, self.after = state, before, after
        self.calls: list[str] = []
        self.up_kwargs: dict[str, Any] = {}

    def outputs(self) -> dict[str, OutputValue]:
        self.calls.append("outputs")
        return {k: OutputValue(v, k == "ssh_private_key") for k, v in self.before.items()}

    def export_stack(self) -> Deployment:
        self.calls.append("export_stack")
        return Deployment(version=3, deployment=self.state)

    def refresh(self, **kwargs: Any) -> None:
        self.calls.append("refresh")

    def cancel(self) -> None:
        self.calls.append("cancel")

    def up(self, **kwargs: Any) -> Any:
        self.calls.append("up")
        self.up_kwargs = kwargs
        after = self.after

        class Result:
            outputs = {k: OutputValue(v, k == "ssh_private_key") for k, v in after.items()}

        return Result()


def renewed_outputs(before: dict[str, Any], node: str) -> dict[str, Any]:
    """The outputs after ``node`` got a new instance: new id and address, the same host key (the
    key lives in the state, ``infra/identity.py``)."""
    after = copy.deepcopy(before)
    entry = next(n for n in after["nodes"] if n["name"] == node)
    entry.update(instance_id=entry["instance_id"] + "0", public_ip="198.51.100.77", private_ip="10.0.9.9")
    return after


def setup(cloud: str) -> tuple[Snapshot, dict[str, Any], Host]:
    snap = evaluate(cloud, node_count="3")
    state = exported_state(snap)
    inventory = inventory_from_stack_outputs(snap.outputs, None, stack="dev")
    return snap, state, inventory.hosts[1]


def test_the_nodes_own_instance_is_replaced_and_nothing_else(cloud: str) -> None:
    snap, state, host = setup(cloud)
    fake = FakeStack(state, snap.outputs, renewed_outputs(snap.outputs, host.name))
    said: list[str] = []
    new = stack_replace.renew_node("dev", host, stack=fake, on_output=said.append, timeout_s=30)
    assert fake.calls == ["outputs", "export_stack", "up"]  # no refresh: the instance is alive
    (urn,) = fake.up_kwargs["replace"]
    assert fake.up_kwargs["show_secrets"] is False
    chosen = [r for r in state["resources"] if r["urn"] == urn]
    assert len(chosen) == 1 and chosen[0]["type"] == INSTANCE_TYPES[cloud]
    assert urn.endswith(f"::{host.name}") and f"fleetrun:{cloud}:GpuNodes$" in urn
    # the node's other resources (its host key, its address or grant) are not named
    others = [r["urn"] for r in state["resources"] if host.name in r["urn"] and r["urn"] != urn]
    assert others and urn not in others  # e.g. its host key: in the state, never named
    assert new is not None and new.name == host.name and new.address == "198.51.100.77"
    assert new.host_key == host.host_key
    assert any("a new instance for" in m and host.name in m for m in said), said


def test_each_node_gets_its_own_urn(cloud: str) -> None:
    snap, state, _ = setup(cloud)
    inventory = inventory_from_stack_outputs(snap.outputs, None, stack="dev")
    urns = set()
    for host in inventory.hosts:
        node = next(n for n in snap.outputs["nodes"] if n["name"] == host.name)
        urns.add(
            stack_replace.node_instance_urn(
                state,
                CLOUDS[cloud],
                cluster_id=snap.outputs["cluster_id"],
                node=host.name,
                rank=node["rank"],
                instance_id=node["instance_id"],
                stack_name="dev",
            )
        )
    assert len(urns) == 3 and all(INSTANCE_TYPES[cloud] in u for u in urns)


def without_instance(state: dict[str, Any], host: Host, cloud: str) -> dict[str, Any]:
    state = copy.deepcopy(state)
    state["resources"] = [
        r
        for r in state["resources"]
        if not (r["type"] == INSTANCE_TYPES[cloud] and r["urn"].endswith(f"::{host.name}"))
    ]
    return state


def test_a_state_without_the_nodes_instance_is_refused_before_any_update(cloud: str) -> None:
    snap, state, host = setup(cloud)
    fake = FakeStack(without_instance(state, host, cloud), snap.outputs, snap.outputs)
    with pytest.raises(FleetrunError, match=f"no instance of node {host.name} that fleetrun created") as err:
        stack_replace.renew_node("dev", host, stack=fake, on_output=lambda _m: None, timeout_s=30)
    assert "nothing was changed" in str(err.value)
    assert "up" not in fake.calls and "cancel" not in fake.calls


def test_lookalikes_fleetrun_did_not_create_are_never_chosen(cloud: str) -> None:
    """An instance of the same name outside the nodes component, one of another cluster, one
    holding another instance id: each is refused, and the error says why."""
    snap, state, host = setup(cloud)
    real = next(
        r
        for r in state["resources"]
        if r["type"] == INSTANCE_TYPES[cloud] and r["urn"].endswith(f"::{host.name}")
    )
    tags = CLOUDS[cloud].instance.tags_property
    elsewhere = copy.deepcopy(real)
    elsewhere["urn"] = f"urn:pulumi:test::fleetrun::{INSTANCE_TYPES[cloud]}::{host.name}"
    other_cluster = copy.deepcopy(real)
    other_cluster["inputs"][tags][CLOUDS[cloud].cluster_tag] = "fr-someone-else"
    stale = copy.deepcopy(real)
    if CLOUDS[cloud].instance.id_output is None:
        stale["id"] = "i-0000000000000dead"
    else:
        stale["outputs"][CLOUDS[cloud].instance.id_output] = "1"
    for lookalike, why in (
        (elsewhere, "is not under"),
        (other_cluster, "is not tagged"),
        (stale, "holds instance"),
    ):
        bare = without_instance(state, host, cloud)
        bare["resources"].append(lookalike)
        fake = FakeStack(bare, snap.outputs, snap.outputs)
        with pytest.raises(FleetrunError, match=why):
            stack_replace.renew_node("dev", host, stack=fake, on_output=lambda _m: None)
        assert "up" not in fake.calls
    twice = copy.deepcopy(state)
    twice["resources"].append(copy.deepcopy(real))
    fake = FakeStack(twice, snap.outputs, snap.outputs)
    with pytest.raises(FleetrunError, match="refusing to choose"):
        stack_replace.renew_node("dev", host, stack=fake, on_output=lambda _m: None)
    assert "up" not in fake.calls


def test_a_renewal_that_outlives_its_timeout_is_cancelled() -> None:
    snap, state, host = setup("aws")
    release = threading.Event()

    class StuckStack(FakeStack):
        def up(self, **kwargs: Any) -> Any:
            self.calls.append("up")
            release.wait(30)
            raise RuntimeError("cancelled")

    stuck = StuckStack(state, snap.outputs, snap.outputs)
    said: list[str] = []
    try:
        assert (
            stack_replace.renew_node("dev", host, stack=stuck, on_output=said.append, timeout_s=0.2) is None
        )
    finally:
        release.set()
    assert stuck.calls == ["outputs", "export_stack", "up", "cancel"]
    assert any(f"renewing {host.name} took longer than 0 s" in m and "cancelling" in m for m in said), said


def test_an_update_that_kept_the_old_instance_or_changed_another_node_is_an_error() -> None:
    snap, state, host = setup("aws")
    fake = FakeStack(state, snap.outputs, snap.outputs)  # up replaced nothing
    with pytest.raises(FleetrunError, match="still has instance"):
        stack_replace.renew_node("dev", host, stack=fake, on_output=lambda _m: None)
    drifted = renewed_outputs(snap.outputs, host.name)
    drifted["nodes"][0]["public_ip"] = "198.51.100.1"
    with pytest.raises(FleetrunError, match=f"replacing {host.name} also changed"):
        stack_replace.renew_node("dev", host, stack=FakeStack(state, snap.outputs, drifted), on_output=print)


def test_stack_kind_renews_through_the_stack_and_awaits_the_new_sshd(monkeypatch: pytest.MonkeyPatch) -> None:
    snap, state, host = setup("aws")
    fake = FakeStack(state, snap.outputs, renewed_outputs(snap.outputs, host.name))
    opened: list[str] = []

    def open_stack(name: str, project_dir: Any, create: bool) -> FakeStack:
        opened.append(name)
        return fake

    monkeypatch.setattr(stack_replace, "_open_stack", open_stack)
    kind = StackKind(StackFleetRef(stack="dev", cluster_id=snap.outputs["cluster_id"], cloud="aws"))
    asked: list[str] = []
    said: list[str] = []
    new = kind.renew(host, said.append, 30, probe=lambda h, _t: asked.append(h.address) or True)
    assert opened == ["dev"] and fake.calls[-1] == "up" and len(fake.up_kwargs["replace"]) == 1
    assert new is not None and new.address == "198.51.100.77" and asked == ["198.51.100.77"]
    assert any("instance renewed at 198.51.100.77" in m for m in said), said
    no_stack = StackKind(StackFleetRef(stack=None, cluster_id=snap.outputs["cluster_id"], cloud="aws"))
    assert no_stack.renew(host, said.append, 30) is None and "cannot give it a new instance" in said[-1]
