"""launch.fleets.cloud_stack without the Pulumi CLI: the clear error, output conversion, teardown check.

The Automation API calls themselves need the CLI and credentials (docs/cloud.md lists what was
checked only against real clouds). Here a fake ``Stack`` stands in for ``pulumi.automation``'s,
so the flow of ``stack_down`` (destroy, then ask the cloud, then report) is exercised.
"""

from __future__ import annotations

import json
import stat
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from infra_cases import evaluate
from pulumi.automation import ConfigValue, OutputValue

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
from launch.fleets.kinds.refs import StackFleetRef
from launch.job.inventory import Inventory

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
    assert Inventory.from_stack_outputs(converted).head.name == snap.outputs["nodes"][0]["name"]


def test_outputs_that_are_not_a_fleetrun_stack_are_refused() -> None:
    with pytest.raises(FleetrunError, match="do not match the fleetrun contract"):
        outputs_to_contract({"url": OutputValue("http://example.com", False)})


def test_outputs_json_is_private_and_loads_into_the_inventory(tmp_path: Path) -> None:
    snap = evaluate("aws")
    path = write_outputs_json(snap.outputs, tmp_path / "stack" / "outputs.json")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600  # holds the operator's private key
    assert json.loads(path.read_text()) == snap.outputs
    assert len(Inventory.from_stack_outputs_file(path).hosts) == 4


class FakeStack:
    """The part of ``pulumi.automation.Stack`` that ``stack_down`` uses."""

    def __init__(self, config: dict[str, str], outputs: dict[str, Any]) -> None:
        self.config = config
        self._outputs = outputs
        self.destroyed = False
        self.workspace = SimpleNamespace(project_settings=lambda: SimpleNamespace(name="fleetrun"))

    def get_all_config(self) -> dict[str, ConfigValue]:
        return {k: ConfigValue(v) for k, v in self.config.items()}

    def outputs(self) -> dict[str, OutputValue]:
        return {} if self.destroyed else _as_output_values(self._outputs, set())

    def destroy(self, **_: Any) -> None:
        self.destroyed = True


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
    stack_down("test", REPO, on_output=said.append, list_instances=lister)
    # The id is derived from project + stack name, and equals the one the program tags with.
    assert asked == [ClusterLocation("aws", snap.outputs["cluster_id"], "us-east-1")]
    assert said[-1].startswith(f"confirmed: no instance of cluster {snap.outputs['cluster_id']} remains")
    assert snap.outputs["bucket"] in said[-1]


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
            "fr-test-868a60-node0 (RUNNING, us-central1-a)",
            "fr-test-868a60-node1 (TERMINATED, us-central1-a)",
        ]

    with pytest.raises(TeardownIncomplete) as info:
        stack_down("org/test", REPO, on_output=lambda _m: None, list_instances=lister)
    message = str(info.value)
    assert "fr-test-868a60-node0" in message and "fr-test-868a60-node1" in message and "billing" in message
    assert info.value.cluster_id == "fr-test-868a60"  # org/test -> the program sees stack "test"


def test_cloud_queries_explain_a_missing_sdk(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "boto3", None)
    monkeypatch.setitem(sys.modules, "google.cloud", None)
    with pytest.raises(FleetrunError, match="boto3 is not installed"):
        cloud_stack.list_aws_instances(ClusterLocation("aws", "fr-x-1", "us-east-1"))
    with pytest.raises(FleetrunError, match="google-cloud-compute is not installed"):
        cloud_stack.list_gcp_instances(ClusterLocation("gcp", "fr-x-1", "us-central1", "p-123456"))


def test_missing_stack_config_is_explained(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(cloud_stack, "require_pulumi_cli", lambda: "/usr/bin/pulumi")
    (tmp_path / "Pulumi.yaml").write_text("name: fleetrun\n")
    with pytest.raises(
        FleetrunError, match=r"no stack config .*Pulumi\.nope\.yaml: copy Pulumi\.aws-example\.yaml"
    ):
        stack_up("nope", tmp_path)
