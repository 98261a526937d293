"""Cloud-neutral checks on both clouds: the outputs contract, pinned host keys, secrets, inventory."""

from __future__ import annotations

from pathlib import Path

import pulumi
import pytest
from cryptography.hazmat.primitives import serialization
from infra_cases import aws_config, evaluate, gcp_config

from fleetrun_contract.stack_outputs import StackOutputs
from infra.bootstrap import parse_user_data
from infra.mocks import Registered, Snapshot
from launch.fleets.kinds.refs import StackFleetRef
from launch.fleets.kinds.stack import inventory_from_stack_outputs

INSTANCE_TYPES = {"aws": "aws:ec2/instance:Instance", "gcp": "gcp:compute/instance:Instance"}
OPERATOR_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFakeOperatorKeyForTestsOnly0000000000000 ana@laptop"


def user_data(cloud: str, instance: Registered) -> dict:
    text = instance.inputs["userData"] if cloud == "aws" else instance.inputs["metadata"]["user-data"]
    return parse_user_data(text)


def rank_of(cloud: str, instance: Registered) -> int:
    return int(
        instance.inputs["tags"]["fleetrun:node-rank"]
        if cloud == "aws"
        else instance.inputs["labels"]["fleetrun-node-rank"]
    )


def instances(cloud: str, snap: Snapshot) -> list[Registered]:
    """The node instances in rank order (registration order is not guaranteed)."""
    return sorted(snap.of_type(INSTANCE_TYPES[cloud]), key=lambda i: rank_of(cloud, i))


def test_outputs_match_the_contract(cloud: str) -> None:
    snap = evaluate(cloud)
    outputs = StackOutputs.model_validate(snap.outputs)
    assert set(snap.outputs) == set(StackOutputs.model_fields)  # exactly the contract's keys
    assert outputs.cloud == cloud and outputs.fleetrun_contract == 1
    assert [n.rank for n in outputs.nodes] == [0, 1, 2, 3]
    ids = [i.outputs.get("id") if cloud == "aws" else i.outputs["instanceId"] for i in instances(cloud, snap)]
    assert [n.instance_id for n in outputs.nodes] == ids
    for node in outputs.nodes:
        assert node.name == f"{outputs.cluster_id}-node{node.rank}"
        assert node.public_ip and node.private_ip.startswith("10.0.")
        assert node.gpus == 8 and node.user == outputs.ssh_user == "ubuntu" and node.port == 22
    assert outputs.bucket and outputs.zone


def test_host_keys_exported_match_what_cloud_init_installs(cloud: str) -> None:
    snap = evaluate(cloud)
    exported = {n["name"]: n["host_key"] for n in snap.outputs["nodes"]}
    assert len(set(exported.values())) == len(exported)  # one key per node
    for instance in instances(cloud, snap):
        name = instance.inputs["tags"]["Name"] if cloud == "aws" else instance.inputs["name"]
        doc = user_data(cloud, instance)
        installed_public = doc["ssh_keys"]["ed25519_public"]
        assert installed_public == exported[name]
        # The private key cloud-init installs is the one behind the exported public key.
        private = serialization.load_ssh_private_key(
            doc["ssh_keys"]["ed25519_private"].encode(), password=None
        )
        derived = private.public_key().public_bytes(
            serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
        )
        assert derived.decode() == exported[name]
        pinned = {f["path"]: f["content"] for f in doc["write_files"]}["/etc/fleetrun/pinned_host_key.pub"]
        assert pinned.strip() == exported[name]


def test_generated_operator_key_is_a_secret_output_and_authorized(cloud: str) -> None:
    snap = evaluate(cloud)
    assert snap.secret_outputs == {"ssh_private_key"}
    private = serialization.load_ssh_private_key(snap.outputs["ssh_private_key"].encode(), password=None)
    public = private.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    )
    for instance in instances(cloud, snap):
        doc = user_data(cloud, instance)
        assert doc["users"][0]["ssh_authorized_keys"] == [public.decode()]
        assert "PRIVATE KEY" not in str(doc["users"])  # the operator's private key never goes to a node
        assert instance.secret_inputs  # the user data (with the host's private key) is a secret


def test_operator_public_key_given_means_nothing_secret_exported(cloud: str) -> None:
    snap = evaluate(cloud, ssh_public_key=OPERATOR_KEY)
    assert "ssh_private_key" not in snap.outputs
    assert len(snap.of_type("tls:index/privateKey:PrivateKey")) == 4  # host keys only
    doc = user_data(cloud, instances(cloud, snap)[0])
    assert doc["users"][0]["ssh_authorized_keys"] == [OPERATOR_KEY]


def test_outputs_load_into_launchs_inventory(cloud: str, tmp_path: Path) -> None:
    snap = evaluate(cloud)
    inventory = inventory_from_stack_outputs(snap.outputs, key_path=tmp_path / "id_ed25519")
    nodes = snap.outputs["nodes"]
    assert [h.name for h in inventory.hosts] == [n["name"] for n in nodes]
    assert inventory.head.name == nodes[0]["name"]
    fleet = inventory.fleet
    assert isinstance(fleet, StackFleetRef)
    assert fleet.cluster_id == snap.outputs["cluster_id"] and fleet.bucket == snap.outputs["bucket"]
    for host, node in zip(inventory.hosts, nodes, strict=True):
        assert host.address == node["public_ip"] and host.private_address == node["private_ip"]
        assert host.user == "ubuntu" and host.gpus == 8
    known_hosts = inventory.write_known_hosts(tmp_path / "known_hosts").read_text().splitlines()
    assert known_hosts == [f"{n['public_ip']} {n['host_key']}" for n in nodes]


def test_every_resource_names_its_cluster(cloud: str) -> None:
    snap = evaluate(cloud)
    cluster_id = snap.outputs["cluster_id"]
    tag_key = "tags" if cloud == "aws" else "labels"
    cluster_key = "fleetrun:cluster" if cloud == "aws" else "fleetrun-cluster"
    tagged = [r for r in snap.custom_resources if isinstance(r.inputs.get(tag_key), dict)]
    assert len(tagged) >= len(instances(cloud, snap))
    for r in tagged:
        assert r.inputs[tag_key][cluster_key] == cluster_id, r.typ


def test_components_parent_their_children(cloud: str) -> None:
    snap = evaluate(cloud)
    top = [r.typ for r in snap.resources if r.parent.split("::")[2:3] == ["pulumi:pulumi:Stack"]]
    # Only the provider and the two top-level components hang off the stack; every other
    # resource has a component parent (parent=self all the way down).
    assert sorted(top) == sorted(
        ["fleetrun:index:SshIdentity", f"fleetrun:{cloud}:GpuCluster", f"pulumi:providers:{cloud}"]
    )
    assert all(r.parent for r in snap.resources)


def test_bad_config_fails_the_program_with_the_key_named() -> None:
    """What `pulumi preview` shows: the config loader turns a ConfigError into a clean RunError."""
    from infra import config

    raw = {f"fleet:{k}": str(v) for k, v in aws_config(machine_type="p9.huge").items()}
    pulumi.runtime.set_all_config(raw)
    try:
        with pytest.raises(
            pulumi.RunError, match=r"^fleet:machine_type: 'p9.huge' is not a known AWS instance type"
        ):
            config.load_settings()
        pulumi.runtime.set_all_config({**raw, "fleet:machine_type": "p5.48xlarge", "fleet:nodecount": "2"})
        with pytest.raises(
            pulumi.RunError, match="fleet:nodecount: unknown key; did you mean fleet:node_count"
        ):
            config.load_settings()
    finally:
        pulumi.runtime.set_all_config({})


def test_config_loader_reads_gcp_project_fallback() -> None:
    from infra import config

    raw = {f"fleet:{k}": str(v) for k, v in gcp_config().items() if k != "project"}
    pulumi.runtime.set_all_config({**raw, "gcp:project": "fallback-project"})
    try:
        assert config.load_settings().gcp_project == "fallback-project"
    finally:
        pulumi.runtime.set_all_config({})


def test_pulumi_entry_point_runs_and_exports_the_contract(monkeypatch: pytest.MonkeyPatch) -> None:
    """infra/__main__.py as the Python language host runs it: the directory as a script, with
    infra/ as the working directory and first on sys.path; config from the stack."""
    import runpy
    import sys

    from infra.mocks import FleetMocks, RecordingMonitor

    repo = Path(__file__).resolve().parents[2]
    monkeypatch.chdir(repo / "infra")
    monkeypatch.setattr(sys, "path", [str(repo / "infra"), *sys.path])
    mocks = FleetMocks()
    pulumi.runtime.set_mocks(
        mocks, project="fleetrun", stack="entry", preview=False, monitor=RecordingMonitor(mocks)
    )
    pulumi.runtime.set_all_config({f"fleet:{k}": str(v) for k, v in aws_config(node_count="2").items()})
    try:

        @pulumi.runtime.test
        def run() -> None:
            runpy.run_path(str(repo / "infra"), run_name="__main__")

        run()
    finally:
        pulumi.runtime.set_all_config({})
    root = pulumi.runtime.get_root_resource()
    assert root is not None
    assert set(root.outputs) == set(StackOutputs.model_fields)  # type: ignore[attr-defined]
    # Nothing of infra/ was imported by its bare name (``config``, ``settings``...) although the
    # directory came first on sys.path: the program imports ``infra.*`` and needs no sys.path edits.
    bare = [
        name
        for name, module in list(sys.modules.items())
        if not name.startswith("infra")
        and Path(getattr(module, "__file__", None) or "/").resolve().is_relative_to(repo / "infra")
    ]
    assert bare == []
