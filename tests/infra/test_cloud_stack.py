"""launch.fleets.cloud_stack without the Pulumi CLI: the clear error, output conversion, teardown
audit, refresh, and zone failover.

The Automation API calls themselves need the CLI and credentials (docs/cloud.md lists what was
checked only against real clouds). Here a fake ``Stack`` stands in for ``pulumi.automation``'s:
it keeps a state of resource URNs, fails ``up`` in chosen zones with real provider messages
(after some nodes came up, as a real partial failure does), and advances a fake clock, so the
flows of ``stack_up`` (refresh, failover) and ``stack_down`` (destroy, audit, report) run whole.
"""

from __future__ import annotations

import json
import stat
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from infra_cases import evaluate
from pulumi.automation import ConfigValue, Deployment, OutputValue
from pulumi.automation._cmd import CommandResult
from pulumi.automation.errors import CommandError
from pulumi.automation.events import EngineEvent, OpType

from launch.errors import FleetrunError
from launch.fleets import cloud_stack
from launch.fleets.cloud_stack import (
    ClusterLocation,
    TeardownIncomplete,
    outputs_to_contract,
    stack_down,
    stack_outputs,
    stack_up,
    write_outputs_json,
)
from launch.fleets.clouds import CLOUDS
from launch.fleets.kinds.refs import StackFleetRef
from launch.fleets.kinds.stack import inventory_from_stack_outputs, load_outputs_file

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def no_pulumi_on_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))


@pytest.mark.parametrize(
    "call",
    [
        lambda: stack_up("dev", REPO),
        lambda: stack_down("dev", REPO),
        lambda: stack_outputs("dev", REPO),
    ],
    ids=["up", "down", "outputs"],
)
def test_missing_cli_is_a_clear_error(no_pulumi_on_path: None, call: Any) -> None:
    with pytest.raises(
        FleetrunError, match=r"Pulumi CLI is not installed.*https://www\.pulumi\.com/docs/install/"
    ):
        call()


def test_importing_the_module_loads_no_pulumi_or_cloud_sdk() -> None:
    code = (
        "import sys, launch.fleets.cloud_stack; "
        "bad = [m for m in ('pulumi', 'pulumi.automation', 'boto3', 'google.cloud') if m in sys.modules]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


def _as_output_values(outputs: dict[str, Any], secret: set[str]) -> dict[str, OutputValue]:
    return {k: OutputValue(v, k in secret) for k, v in outputs.items()}


def test_automation_outputs_convert_to_the_contract(cloud: str) -> None:
    snap = evaluate(cloud)
    # What `stack.up().outputs` / `stack.outputs()` return: OutputValue(value, secret).
    converted = outputs_to_contract(_as_output_values(snap.outputs, snap.secret_outputs))
    assert converted == snap.outputs
    assert converted["ssh_private_key"].startswith("-----BEGIN OPENSSH PRIVATE KEY-----")
    assert inventory_from_stack_outputs(converted).head.name == snap.outputs["nodes"][0]["name"]


def test_outputs_that_are_not_a_fleetrun_stack_are_refused() -> None:
    with pytest.raises(FleetrunError, match="do not match the fleetrun contract"):
        outputs_to_contract({"url": OutputValue("http://example.com", False)})


def test_outputs_json_is_private_and_loads_into_the_inventory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLEETRUN_HOME", str(tmp_path / "home"))
    snap = evaluate("aws")
    path = write_outputs_json(snap.outputs, tmp_path / "stack" / "outputs.json")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600  # holds the operator's private key
    assert json.loads(path.read_text()) == snap.outputs
    assert len(load_outputs_file(path, save_key=False).hosts) == 4


CAPACITY_AWS = (
    "creating EC2 Instance: operation error EC2: RunInstances, https response error StatusCode: 500, api error "
    "InsufficientInstanceCapacity: We currently do not have sufficient p4d.24xlarge capacity in the "
    "Availability Zone you requested (us-east-1a)."
)
QUOTA_GCP = "Error: Error waiting for instance to create: Quota 'NVIDIA_A100_GPUS' exceeded.  Limit: 8.0 in region us-central1."
BAD_CONFIG_AWS = (
    "Error: creating EC2 Instance: InvalidParameterValue: Value () for parameter groupId is invalid."
)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FakeStack:
    """The part of ``pulumi.automation.Stack`` that ``stack_up`` and ``stack_down`` use.

    ``fail`` maps a zone to the provider message its ``up`` fails with, after ``nodes_before_failure``
    nodes came up there (each taking ``node_seconds`` on the fake clock).
    """

    def __init__(
        self,
        config: dict[str, str],
        outputs: dict[str, Any],
        fail: dict[str, str] | None = None,
        existing_nodes: int = 0,
        clock: FakeClock | None = None,
        nodes_before_failure: int = 2,
        node_seconds: float = 20.0,
    ) -> None:
        self.config = dict(config)
        self._outputs = outputs
        self.fail = fail or {}
        self.clock = clock or FakeClock()
        self.nodes_before_failure = nodes_before_failure
        self.node_seconds = node_seconds
        self.destroyed = False
        self.calls: list[tuple[Any, ...]] = []
        self.resources: list[str] = []
        self.partial_lifetimes: list[float] = []
        self._first_node_at: float | None = None
        self.workspace = SimpleNamespace(project_settings=lambda: SimpleNamespace(name="fleetrun"))
        if existing_nodes:
            self.resources += [self.network_urn()] + [self.node_urn(r) for r in range(existing_nodes)]

    def cloud(self) -> str:
        return self.config["fleet:cloud"]

    def node_urn(self, rank: int, typ: str = "") -> str:
        cloud = self.cloud()
        typ = typ or {"aws": "aws:ec2/instance:Instance", "gcp": "gcp:compute/instance:Instance"}[cloud]
        return f"urn:pulumi:test::fleetrun::fleetrun:{cloud}:GpuCluster$fleetrun:{cloud}:GpuNodes${typ}::node{rank}"

    def network_urn(self) -> str:
        cloud = self.cloud()
        return (
            f"urn:pulumi:test::fleetrun::fleetrun:{cloud}:GpuCluster$fleetrun:{cloud}:Network$x:subnet::net"
        )

    def get_all_config(self) -> dict[str, ConfigValue]:
        return {k: ConfigValue(v) for k, v in self.config.items()}

    def set_config(self, key: str, value: ConfigValue) -> None:
        self.calls.append(("set_config", key, value.value))
        self.config[key] = value.value

    def remove_config(self, key: str) -> None:
        self.calls.append(("remove_config", key))
        del self.config[key]

    def refresh(self, **_: Any) -> None:
        self.calls.append(("refresh",))

    def export_stack(self) -> Deployment:
        return Deployment(version=3, deployment={"resources": [{"urn": u} for u in self.resources]})

    def up(self, on_event: Any = None, **_: Any) -> Any:
        zone = self.config.get("fleet:zone")
        self.calls.append(("up", zone))
        if self.network_urn() not in self.resources:
            self.resources.append(self.network_urn())
        count = self.nodes_before_failure if zone in self.fail else 4
        for rank in range(count):
            self.clock.now += self.node_seconds
            urn = self.node_urn(rank)
            if urn not in self.resources:
                self.resources += [urn, self.node_urn(rank, "aws:ec2/eip:Eip")]
                self._first_node_at = self._first_node_at or self.clock.now
                if on_event:
                    on_event(
                        SimpleNamespace(
                            res_outputs_event=SimpleNamespace(
                                metadata=SimpleNamespace(op=OpType.CREATE, urn=urn)
                            )
                        )
                    )
        if zone in self.fail:
            self.clock.now += 30  # in-flight creates finish; pulumi starts nothing new
            raise CommandError(CommandResult(stdout=f"error: {self.fail[zone]}", stderr="", code=255))
        return SimpleNamespace(outputs=_as_output_values(self._outputs, {"ssh_private_key"}))

    def outputs(self) -> dict[str, OutputValue]:
        return {} if self.destroyed else _as_output_values(self._outputs, set())

    def destroy(
        self, target: list[str] | None = None, target_dependents: bool | None = None, **_: Any
    ) -> None:
        self.calls.append(("destroy", tuple(target or ()), target_dependents))
        if target:
            assert self._first_node_at is not None
            self.partial_lifetimes.append(self.clock.now - self._first_node_at)
            self.resources = [r for r in self.resources if r not in target]
            self._first_node_at = None
        else:
            self.resources = []
            self.destroyed = True
        self.clock.now += 40


def _fake(monkeypatch: pytest.MonkeyPatch, stack: FakeStack) -> None:
    monkeypatch.setattr(cloud_stack, "_open_stack", lambda name, project_dir, create: stack)


def test_down_destroys_then_confirms_with_the_cloud(monkeypatch: pytest.MonkeyPatch) -> None:
    snap = evaluate("aws")
    stack = FakeStack({"fleet:cloud": "aws", "fleet:region": "us-east-1"}, snap.outputs)
    _fake(monkeypatch, stack)
    asked: list[ClusterLocation] = []

    def lister(location: ClusterLocation) -> list[str]:
        assert stack.destroyed, "the cloud must be asked after destroy"
        asked.append(location)
        return []

    said: list[str] = []
    stack_down("test", REPO, on_output=said.append, leftovers=lister)
    # The id is derived from project + stack name, and equals the one the program tags with.
    assert asked == [ClusterLocation("aws", snap.outputs["cluster_id"], "us-east-1")]
    assert said[-1].startswith(
        f"confirmed: no instance, disk, address or network interface of cluster {snap.outputs['cluster_id']} remains"
    )
    assert snap.outputs["bucket"] in said[-1]


def test_down_audits_with_the_stacks_provider_config(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 24, item 1: the audit gets the stack's aws:* config (its assumeRoles), so it lists the
    account the cluster was built in."""
    roles = '[{"roleArn": "arn:aws:iam::222:role/deploy"}]'
    stack = FakeStack(
        {"fleet:cloud": "aws", "fleet:region": "us-east-1", "aws:assumeRoles": roles, "aws:profile": "lab"},
        {},
    )
    _fake(monkeypatch, stack)
    asked: list[ClusterLocation] = []
    stack_down("test", REPO, on_output=lambda _m: None, leftovers=lambda loc: asked.append(loc) or [])
    assert dict(asked[0].provider_config) == {"assumeRoles": roles, "profile": "lab"}
    assert "fleet:cloud" not in dict(asked[0].provider_config)


def test_stack_inventory_saves_the_generated_key_and_names_the_stack(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("FLEETRUN_HOME", str(tmp_path / "home"))
    snap = evaluate("gcp")
    _fake(monkeypatch, FakeStack({"fleet:cloud": "gcp"}, snap.outputs))
    inventory = cloud_stack.stack_inventory("test")
    assert isinstance(inventory.fleet, StackFleetRef) and inventory.fleet.stack == "test"
    key = tmp_path / "home" / "keys" / snap.outputs["cluster_id"]
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert key.read_text().strip() == snap.outputs["ssh_private_key"].strip()
    assert all(h.key == key for h in inventory.hosts)


def test_own_operator_key_means_no_key_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("FLEETRUN_HOME", str(tmp_path / "home"))
    outputs = {k: v for k, v in evaluate("aws").outputs.items() if k != "ssh_private_key"}
    assert cloud_stack.save_operator_key(outputs) is None
    assert not (tmp_path / "home").exists()


def test_down_names_every_leftover(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake(
        monkeypatch,
        FakeStack({"fleet:cloud": "gcp", "fleet:zone": "us-central1-a", "fleet:project": "p-123456"}, {}),
    )

    def lister(location: ClusterLocation) -> list[str]:
        assert (location.region, location.project) == ("us-central1", "p-123456")
        return [
            "instance fr-test-868a60-node0 (RUNNING, us-central1-a)",
            "instance fr-test-868a60-node1 (TERMINATED, us-central1-a)",
            "disk fr-test-868a60-node1 (200 GB, us-central1-a)",
        ]

    with pytest.raises(TeardownIncomplete) as info:
        stack_down("org/test", REPO, on_output=lambda _m: None, leftovers=lister)
    message = str(info.value)
    assert "instance fr-test-868a60-node1 (TERMINATED" in message and "disk fr-test-868a60-node1" in message
    assert "3 resource(s)" in message and "billing" in message
    assert info.value.cluster_id == "fr-test-868a60"  # org/test -> the program sees stack "test"


def test_down_uses_the_clouds_own_audit_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake(monkeypatch, FakeStack({"fleet:cloud": "aws", "fleet:region": "us-east-1"}, {}))
    asked: list[ClusterLocation] = []
    monkeypatch.setattr(
        CLOUDS["aws"], "leftovers", lambda loc: asked.append(loc) or ["volume vol-1 (available)"]
    )
    with pytest.raises(TeardownIncomplete, match="volume vol-1"):
        stack_down("test", REPO, on_output=lambda _m: None)
    assert [loc.cloud for loc in asked] == ["aws"]


# -- refresh and zone failover ----------------------------------------------------------------------


def _up(monkeypatch: pytest.MonkeyPatch, stack: FakeStack) -> tuple[dict[str, Any], list[str]]:
    _fake(monkeypatch, stack)
    monkeypatch.setattr(cloud_stack, "save_operator_key", lambda outputs: None)
    said: list[str] = []
    outputs = stack_up("test", REPO, on_output=said.append, clock=stack.clock)
    return outputs, said


def test_up_refreshes_the_state_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nodes a watchdog or a spot interruption removed must leave the state before `up`."""
    snap = evaluate("aws")
    stack = FakeStack({"fleet:cloud": "aws", "fleet:region": "us-east-1"}, snap.outputs)
    outputs, _said = _up(monkeypatch, stack)
    assert stack.calls == [("refresh",), ("up", None)]
    assert outputs["cluster_id"] == snap.outputs["cluster_id"]


def test_no_capacity_fails_over_to_the_next_zone_destroying_the_partial_fleet(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    snap = evaluate("aws")
    zones = '["us-east-1a", "us-east-1b", "us-east-1c"]'
    stack = FakeStack(
        {"fleet:cloud": "aws", "fleet:region": "us-east-1", "fleet:zones": zones},
        snap.outputs,
        fail={"us-east-1a": CAPACITY_AWS},
    )
    outputs, said = _up(monkeypatch, stack)
    partial = (
        stack.node_urn(0),
        stack.node_urn(0, "aws:ec2/eip:Eip"),
        stack.node_urn(1),
        stack.node_urn(1, "aws:ec2/eip:Eip"),
    )
    assert stack.calls == [
        ("refresh",),
        ("set_config", "fleet:zone", "us-east-1a"),
        ("up", "us-east-1a"),
        ("destroy", partial, True),  # only the nodes and what hangs off them, before anything else
        ("set_config", "fleet:zone", "us-east-1b"),
        ("up", "us-east-1b"),
    ]
    assert stack.network_urn() in stack.resources  # network, bucket, IAM are kept and reused
    assert stack.config["fleet:zone"] == "us-east-1b"  # the zone in use is recorded
    assert stack.partial_lifetimes and max(stack.partial_lifetimes) <= cloud_stack.PARTIAL_FLEET_LIMIT_S
    assert any(
        "destroyed the partial fleet in us-east-1a (4 resources, destroy issued 50 s after its first node"
        in m
        for m in said
    )
    assert outputs["cluster_id"] == snap.outputs["cluster_id"]


def test_a_long_lived_partial_fleet_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    stack = FakeStack(
        {"fleet:cloud": "aws", "fleet:region": "us-east-1", "fleet:zones": "us-east-1a, us-east-1b"},
        evaluate("aws").outputs,
        fail={"us-east-1a": CAPACITY_AWS},
        nodes_before_failure=6,
        node_seconds=30,
    )
    _outputs, said = _up(monkeypatch, stack)
    assert max(stack.partial_lifetimes) > cloud_stack.PARTIAL_FLEET_LIMIT_S
    assert any("WARNING: that partial fleet lived" in m for m in said)


class StalledStack(FakeStack):
    """A zone whose ``up`` reports a failed node, then hangs (a create stalled in the provider)
    until the update is cancelled; the fake clock runs while it hangs."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.cancelled = threading.Event()

    def cancel(self) -> None:
        self.calls.append(("cancel",))
        self.cancelled.set()

    def up(self, on_event: Any = None, **kwargs: Any) -> Any:
        zone = self.config.get("fleet:zone")
        if zone not in self.fail:
            return super().up(on_event=on_event, **kwargs)
        self.calls.append(("up", zone))
        for rank in range(2):
            self.clock.now += 20
            urn = self.node_urn(rank)
            self.resources += [urn]
            self._first_node_at = self._first_node_at or self.clock.now
            on_event(
                SimpleNamespace(
                    res_outputs_event=SimpleNamespace(metadata=SimpleNamespace(op=OpType.CREATE, urn=urn))
                )
            )
        on_event(SimpleNamespace(diagnostic_event=SimpleNamespace(severity="error", message=self.fail[zone])))
        for _ in range(2000):  # without a cancel: hangs 2000 fake seconds, then fails anyway
            if self.cancelled.wait(0.002):
                break
            self.clock.now += 1
        raise CommandError(CommandResult(stdout=f"error: {self.fail[zone]}", stderr="", code=255))


def test_a_stalled_failed_up_is_cancelled_and_its_partial_fleet_destroyed_in_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 24, item 2: past the deadline `up` is cancelled and the partial fleet destroyed,
    rather than destroyed only when a stalled `up` returns."""
    monkeypatch.setattr(cloud_stack, "POLL_S", 0.001)
    stack = StalledStack(
        {"fleet:cloud": "aws", "fleet:region": "us-east-1", "fleet:zones": "us-east-1a, us-east-1b"},
        evaluate("aws").outputs,
        fail={"us-east-1a": CAPACITY_AWS},
    )
    outputs, said = _up(monkeypatch, stack)
    assert ("cancel",) in stack.calls
    names = [c[0] for c in stack.calls]
    assert names.index("cancel") < names.index("destroy") < names.index("up", names.index("destroy"))
    assert stack.partial_lifetimes and max(stack.partial_lifetimes) <= cloud_stack.PARTIAL_FLEET_LIMIT_S
    assert any("cancelling `pulumi up` now" in m for m in said), "a capacity error: cancelled at once"
    assert not any("WARNING" in m for m in said)
    assert stack.config["fleet:zone"] == "us-east-1b" and outputs["cluster_id"]


def test_a_stalled_up_failed_otherwise_is_cancelled_at_the_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    """A failure that does not doom the zone by itself (here a bad config) still gets the
    deadline's cancel, and its partial fleet is destroyed before the error is raised."""
    monkeypatch.setattr(cloud_stack, "POLL_S", 0.001)
    stack = StalledStack(
        {"fleet:cloud": "aws", "fleet:region": "us-east-1", "fleet:zones": "us-east-1a, us-east-1b"},
        evaluate("aws").outputs,
        fail={"us-east-1a": BAD_CONFIG_AWS},
    )
    with pytest.raises(FleetrunError, match="bad-config"):
        _up(monkeypatch, stack)
    names = [c[0] for c in stack.calls]
    assert names.index("cancel") < names.index("destroy")
    assert max(stack.partial_lifetimes) <= cloud_stack.PARTIAL_FLEET_LIMIT_S


def test_quota_skips_the_rest_of_its_region(monkeypatch: pytest.MonkeyPatch) -> None:
    stack = FakeStack(
        {
            "fleet:cloud": "gcp",
            "fleet:project": "p-123456",
            "fleet:zones": '["us-central1-a", "us-central1-b", "us-east4-b"]',
        },
        evaluate("gcp").outputs,
        fail={"us-central1-a": QUOTA_GCP},
    )
    _outputs, said = _up(monkeypatch, stack)
    ups = [c[1] for c in stack.calls if c[0] == "up"]
    assert ups == ["us-central1-a", "us-east4-b"]  # a regional quota: us-central1-b would refuse too
    assert stack.config["fleet:zone"] == "us-east4-b"


def test_a_global_quota_stops_the_failover_naming_the_quota(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 24, item 3: GPUS_ALL_REGIONS counts every region; no other zone is tried (each try
    would create and destroy another partial fleet)."""
    stack = FakeStack(
        {
            "fleet:cloud": "gcp",
            "fleet:project": "p-123456",
            "fleet:zones": '["us-central1-a", "us-east4-b", "europe-west4-a"]',
        },
        evaluate("gcp").outputs,
        fail={"us-central1-a": "Error: Quota 'GPUS_ALL_REGIONS' exceeded.  Limit: 16.0 globally."},
    )
    with pytest.raises(
        FleetrunError, match=r"us-central1-a: a global-quota error \(quota GPUS_ALL_REGIONS, counted"
    ):
        _up(monkeypatch, stack)
    assert [c[1] for c in stack.calls if c[0] == "up"] == ["us-central1-a"]
    assert not [r for r in stack.resources if "GpuNodes" in r]


def test_a_bad_config_stops_without_trying_other_zones(monkeypatch: pytest.MonkeyPatch) -> None:
    stack = FakeStack(
        {"fleet:cloud": "aws", "fleet:region": "us-east-1", "fleet:zones": "us-east-1a, us-east-1b"},
        evaluate("aws").outputs,
        fail={"us-east-1a": BAD_CONFIG_AWS},
    )
    with pytest.raises(
        FleetrunError, match=r"us-east-1a: a bad-config error, which another zone would not fix"
    ):
        _up(monkeypatch, stack)
    assert [c[1] for c in stack.calls if c[0] == "up"] == ["us-east-1a"]
    assert [c[0] for c in stack.calls][-1] == "destroy"  # the partial fleet does not stay up
    assert not [r for r in stack.resources if "GpuNodes" in r]


def test_every_zone_without_capacity_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    stack = FakeStack(
        {"fleet:cloud": "aws", "fleet:region": "us-east-1", "fleet:zones": "us-east-1a, us-east-1b"},
        evaluate("aws").outputs,
        fail={"us-east-1a": CAPACITY_AWS, "us-east-1b": CAPACITY_AWS},
    )
    with pytest.raises(
        FleetrunError, match=r"no zone of fleet:zones .*us-east-1a: capacity; us-east-1b: capacity"
    ):
        _up(monkeypatch, stack)
    assert not [r for r in stack.resources if "GpuNodes" in r]
    assert len(stack.partial_lifetimes) == 2


def test_a_running_cluster_is_never_moved(monkeypatch: pytest.MonkeyPatch) -> None:
    """Scaling a live cluster that hits a capacity error: its nodes stay, no other zone is tried."""
    stack = FakeStack(
        {
            "fleet:cloud": "aws",
            "fleet:region": "us-east-1",
            "fleet:zones": "us-east-1a, us-east-1b",
            "fleet:zone": "us-east-1b",
        },
        evaluate("aws").outputs,
        fail={"us-east-1b": CAPACITY_AWS},
        existing_nodes=2,
    )
    before = list(stack.resources)
    with pytest.raises(
        FleetrunError, match=r"updating the running cluster in us-east-1b; its nodes were left"
    ):
        _up(monkeypatch, stack)
    assert stack.calls == [("refresh",), ("up", "us-east-1b")]
    assert set(before) <= set(stack.resources)


def test_missing_stack_config_is_explained(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(cloud_stack, "require_pulumi_cli", lambda: "/usr/bin/pulumi")
    (tmp_path / "Pulumi.yaml").write_text("name: fleetrun\n")
    with pytest.raises(
        FleetrunError, match=r"no stack config .*Pulumi\.nope\.yaml: copy Pulumi\.aws-example\.yaml"
    ):
        stack_up("nope", tmp_path)


# -- issue 32 item 17: cancel on the engine's capacity error, not after every in-flight creation ----


def engine_event(sequence: int, **event: Any) -> EngineEvent:
    """An event as the Automation API hands it to ``on_event``: parsed from the engine's JSON."""
    return EngineEvent.from_json({"sequence": sequence, "timestamp": 0, **event})


class SixteenNodeStack(FakeStack):
    """``pulumi up`` of 16 nodes in a zone that has room for 15: every node's create starts at
    once; 15 come up, one by one on the fake clock; the 16th fails with the provider's capacity
    error; then the engine waits on its in-flight creations (the real one: minutes) and returns
    only when they end, here 200 fake seconds after the first node, unless the update is cancelled.
    The wait is on a threading.Event (bounded in real time only against a hang), so no real-time
    speed decides the outcome: only whether fleetrun cancels."""

    NODES = 16

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.cancelled = threading.Event()
        self.first_at: float | None = None
        self.cancelled_after: float | None = None
        self.hang_bound_s = 60.0

    def cancel(self) -> None:
        self.calls.append(("cancel",))
        if self.first_at is not None:
            self.cancelled_after = self.clock.now - self.first_at
        self.cancelled.set()

    def up(self, on_event: Any = None, **kwargs: Any) -> Any:
        zone = self.config.get("fleet:zone")
        if zone not in self.fail:
            return super().up(on_event=on_event, **kwargs)
        self.calls.append(("up", zone))
        seq = 0
        for rank in range(self.NODES):
            seq += 1
            on_event(
                engine_event(
                    seq,
                    resourcePreEvent={
                        "metadata": {
                            "op": "create",
                            "urn": self.node_urn(rank),
                            "type": "aws:ec2/instance:Instance",
                        }
                    },
                )
            )
        for rank in range(self.NODES - 1):
            self.clock.now += 3
            urn = self.node_urn(rank)
            self.resources.append(urn)
            self._first_node_at = self._first_node_at or self.clock.now
            self.first_at = self._first_node_at
            seq += 1
            on_event(
                engine_event(seq, resOutputsEvent={"metadata": {"op": "create", "urn": urn, "type": "x"}})
            )
        self.clock.now += 2
        failed = self.node_urn(self.NODES - 1)
        seq += 1
        on_event(
            engine_event(
                seq,
                diagnosticEvent={
                    "urn": failed,
                    "severity": "error",
                    "message": self.fail[zone],
                    "color": "never",
                },
            )
        )
        seq += 1
        on_event(
            engine_event(
                seq, resOpFailedEvent={"status": 1, "steps": 1, "metadata": {"op": "create", "urn": failed}}
            )
        )
        if self.cancelled.wait(timeout=self.hang_bound_s):  # a bound on a hang only
            self.clock.now += 5  # the engine stops at its next step
        else:
            assert self.first_at is not None
            self.clock.now = self.first_at + 200  # the in-flight creations end; then up returns
        raise CommandError(CommandResult(stdout=f"error: {self.fail[zone]}", stderr="", code=255))


def test_a_capacity_error_in_the_event_stream_cancels_up_and_destroys_the_partial_fleet_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stack = SixteenNodeStack(
        {"fleet:cloud": "aws", "fleet:region": "us-east-1", "fleet:zones": "us-east-1a, us-east-1b"},
        evaluate("aws").outputs,
        fail={"us-east-1a": CAPACITY_AWS},
    )
    outputs, said = _up(monkeypatch, stack)
    names = [c[0] for c in stack.calls]
    assert names[:4] == ["refresh", "set_config", "up", "cancel"], names
    assert names.index("cancel") < names.index("destroy") < names.index("up", names.index("destroy"))
    destroyed = next(c for c in stack.calls if c[0] == "destroy")[1]
    assert len(destroyed) == 15 and stack.node_urn(0) in destroyed, "the 15 nodes that came up"
    assert stack.cancelled_after == 15 * 3 - 3 + 2, "cancelled on the capacity error, not at a deadline"
    assert stack.partial_lifetimes == [15 * 3 - 3 + 2 + 5], "destroy issued 49 s after the first node"
    assert max(stack.partial_lifetimes) <= cloud_stack.PARTIAL_FLEET_LIMIT_S
    assert any("us-east-1a cannot hold the cluster (capacity" in m for m in said), said
    assert not any("WARNING" in m for m in said)
    assert stack.config["fleet:zone"] == "us-east-1b" and outputs["cluster_id"]


def test_a_running_clusters_update_is_not_cancelled(monkeypatch: pytest.MonkeyPatch) -> None:
    """Growing a running cluster: a capacity error fails the update, which is never cancelled
    (its nodes are kept, so nothing partial is destroyed)."""
    stack = SixteenNodeStack(
        {"fleet:cloud": "aws", "fleet:region": "us-east-1", "fleet:zone": "us-east-1a"},
        evaluate("aws").outputs,
        fail={"us-east-1a": CAPACITY_AWS},
        existing_nodes=2,
    )
    stack.hang_bound_s = 0.5  # nothing cancels it: the in-flight creations end, then up fails
    with pytest.raises(FleetrunError, match="nodes were left as they are"):
        _up(monkeypatch, stack)
    assert ("cancel",) not in stack.calls and not [c for c in stack.calls if c[0] == "destroy"]


def test_down_forgets_the_destroyed_clusters_lifetime(monkeypatch: pytest.MonkeyPatch) -> None:
    """A kept-warm cluster's ``fleet:warm_until`` goes with it: the next ``fab up`` must not give
    new nodes a lifetime in the past (AWS runs a one-time schedule of a past time at once)."""
    snap = evaluate("aws")
    config = {"fleet:cloud": "aws", "fleet:region": "us-east-1", "fleet:warm_until": "2026-11-28T21:05:00Z"}
    stack = FakeStack(config, snap.outputs)
    _fake(monkeypatch, stack)
    stack_down("test", REPO, on_output=lambda _: None, leftovers=lambda location: [])
    assert ("remove_config", "fleet:warm_until") in stack.calls and "fleet:warm_until" not in stack.config


@pytest.mark.parametrize(("now", "kept"), [(1_795_899_899.0, True), (1_795_899_900.0, False)])
def test_up_drops_a_lifetime_that_has_passed_and_keeps_a_future_one(
    monkeypatch: pytest.MonkeyPatch, now: float, kept: bool
) -> None:
    snap = evaluate("aws")  # 1_795_899_900 is 2026-11-28T21:05:00Z
    config = {"fleet:cloud": "aws", "fleet:region": "us-east-1", "fleet:warm_until": "2026-11-28T21:05:00Z"}
    stack = FakeStack(config, snap.outputs)
    monkeypatch.setattr(cloud_stack, "wall_clock", lambda: now)
    _outputs, said = _up(monkeypatch, stack)
    assert ("fleet:warm_until" in stack.config) is kept
    dropped = [("remove_config", "fleet:warm_until")] if not kept else []
    assert stack.calls == [*dropped, ("refresh",), ("up", None)]
    assert any("has passed; removed" in line for line in said) is not kept
