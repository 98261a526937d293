"""The GCP program under Pulumi's mocks: what it declares, and that it is locked down."""

from __future__ import annotations

from collections import Counter

import pytest
from infra_cases import OPERATOR_CIDR, evaluate

INSTANCE = "gcp:compute/instance:Instance"
FIREWALL = "gcp:compute/firewall:Firewall"
WORLD = {"0.0.0.0/0", "::/0"}


def expected_counts(nodes: int) -> dict[str, int]:
    """Every custom resource the program creates for an a2-highgpu-8g cluster of ``nodes`` nodes."""
    return {
        "tls:index/privateKey:PrivateKey": nodes + 1,
        "gcp:serviceaccount/account:Account": 1,
        "gcp:compute/network:Network": 1,
        "gcp:compute/subnetwork:Subnetwork": 1,
        FIREWALL: 2,
        "gcp:storage/bucket:Bucket": 1,
        "gcp:storage/bucketIAMMember:BucketIAMMember": 1,
        "gcp:compute/resourcePolicy:ResourcePolicy": 1 if nodes > 1 else 0,
        INSTANCE: nodes,
    }


@pytest.mark.parametrize("nodes", [1, 4, 64])
def test_resource_counts(nodes: int) -> None:
    snap = evaluate("gcp", node_count=str(nodes))
    expected = {t: c for t, c in expected_counts(nodes).items() if c}
    assert dict(Counter(r.typ for r in snap.custom_resources)) == expected
    assert len(snap.outputs["nodes"]) == nodes
    assert snap.counts()["pulumi:providers:gcp"] == 1


def test_no_inbound_rule_open_to_the_world_and_ssh_only_from_operator() -> None:
    snap = evaluate("gcp")
    firewalls = snap.of_type(FIREWALL)
    assert all(f.inputs["direction"] == "INGRESS" for f in firewalls)
    for f in firewalls:
        assert not WORLD & set(f.inputs.get("sourceRanges", [])), f.inputs
    (ssh,) = [f for f in firewalls if f.inputs.get("sourceRanges")]
    assert ssh.inputs["sourceRanges"] == [OPERATOR_CIDR]
    assert ssh.inputs["allows"] == [{"protocol": "tcp", "ports": ["22"]}]
    # The network is custom (no default-allow rules come with it).
    assert snap.one("gcp:compute/network:Network").inputs["autoCreateSubnetworks"] is False


def test_intra_cluster_rule_present_and_scoped_to_the_nodes() -> None:
    snap = evaluate("gcp")
    email = snap.one("gcp:serviceaccount/account:Account").outputs["email"]
    (internal,) = [f for f in snap.of_type(FIREWALL) if f.inputs.get("sourceServiceAccounts")]
    assert internal.inputs["allows"] == [{"protocol": "all"}]
    assert internal.inputs["sourceServiceAccounts"] == [email]
    assert internal.inputs["targetServiceAccounts"] == [email]
    for f in snap.of_type(FIREWALL):
        assert f.inputs["targetServiceAccounts"] == [email]  # only the cluster's VMs are opened


def test_service_account_has_a_bucket_scoped_binding_only() -> None:
    snap = evaluate("gcp")
    email = snap.one("gcp:serviceaccount/account:Account").outputs["email"]
    bucket = snap.one("gcp:storage/bucket:Bucket").outputs["name"]
    binding = snap.one("gcp:storage/bucketIAMMember:BucketIAMMember").inputs
    assert binding == {
        "bucket": bucket,
        "role": "roles/storage.objectUser",
        "member": f"serviceAccount:{email}",
    }
    broader = [
        r.typ
        for r in snap.custom_resources
        if "IAM" in r.typ and r.typ != "gcp:storage/bucketIAMMember:BucketIAMMember"
    ]
    assert broader == []  # no project, folder or organisation bindings


def test_bucket_is_retained_versioned_encrypted_and_private() -> None:
    bucket = evaluate("gcp").one("gcp:storage/bucket:Bucket")
    assert bucket.retain_on_delete and not bucket.protect
    i = bucket.inputs
    assert i["versioning"] == {"enabled": True}
    assert i["publicAccessPrevention"] == "enforced" and i["uniformBucketLevelAccess"] is True
    assert i["forceDestroy"] is False and i["location"] == "US-CENTRAL1"
    # Encryption at rest is always on in Cloud Storage (Google-managed keys); nothing turns it off.
    assert "encryption" not in i


def test_instances_shielded_terminate_on_maintenance_and_labelled() -> None:
    snap = evaluate("gcp")
    cluster_id = snap.outputs["cluster_id"]
    email = snap.one("gcp:serviceaccount/account:Account").outputs["email"]
    policy_link = snap.one("gcp:compute/resourcePolicy:ResourcePolicy").outputs["selfLink"]
    ranks = []
    for instance in snap.of_type(INSTANCE):
        i = instance.inputs
        rank = int(i["labels"]["fleetrun-node-rank"])
        ranks.append(rank)
        assert i["name"] == f"{cluster_id}-node{rank}" and i["zone"] == "us-central1-a"
        assert i["scheduling"]["onHostMaintenance"] == "TERMINATE"
        assert i["scheduling"]["provisioningModel"] == "STANDARD" and i["scheduling"]["preemptible"] is False
        shielded = i["shieldedInstanceConfig"]
        assert shielded["enableVtpm"] and shielded["enableIntegrityMonitoring"]
        assert i["labels"]["fleetrun-cluster"] == cluster_id
        assert i["serviceAccount"]["email"] == email
        assert i["resourcePolicies"] == policy_link
        assert (
            i["metadata"]["block-project-ssh-keys"] == "TRUE" and i["metadata"]["enable-oslogin"] == "FALSE"
        )
        assert i["metadata"]["install-nvidia-driver"] == "True"
        assert i["bootDisk"]["initializeParams"]["size"] == 200
        assert "guestAccelerators" not in i  # A2 types have their GPUs built in
        assert instance.secret_inputs == ["metadata"] and instance.delete_before_replace
        assert instance.ignore_changes == ["bootDisk.initializeParams.image"]
    assert sorted(ranks) == [0, 1, 2, 3]
    placement = snap.one("gcp:compute/resourcePolicy:ResourcePolicy").inputs
    assert placement["groupPlacementPolicy"]["collocation"] == "COLLOCATED"


def test_spot_preemptible_and_attached_gpus() -> None:
    snap = evaluate(
        "gcp",
        machine_type="n1-standard-16",
        accelerator_type="nvidia-tesla-t4",
        gpus_per_node="4",
        spot="true",
    )
    i = snap.of_type(INSTANCE)[0].inputs
    assert i["scheduling"]["provisioningModel"] == "SPOT" and i["scheduling"]["preemptible"] is True
    assert (
        i["scheduling"]["automaticRestart"] is False and i["scheduling"]["onHostMaintenance"] == "TERMINATE"
    )
    assert i["guestAccelerators"] == [{"type": "nvidia-tesla-t4", "count": 4}]
    assert not snap.of_type("gcp:compute/resourcePolicy:ResourcePolicy")  # N1: no compact placement
    assert snap.outputs["nodes"][0]["gpus"] == 4 and snap.outputs["nodes"][0]["gpu_type"] == "nvidia-tesla-t4"


def test_reservation_affinity() -> None:
    i = evaluate("gcp", reservation="my-a100-block").of_type(INSTANCE)[0].inputs
    assert i["reservationAffinity"]["type"] == "SPECIFIC_RESERVATION"
    assert i["reservationAffinity"]["specificReservation"]["values"] == ["my-a100-block"]


def test_image_lookup_and_gvnic() -> None:
    snap = evaluate("gcp", machine_type="a3-highgpu-8g", node_count="2")
    assert "gcp:compute/getImage:getImage" in snap.invokes
    i = snap.of_type(INSTANCE)[0].inputs
    assert "deeplearning-platform-release" in i["bootDisk"]["initializeParams"]["image"]
    assert i["networkInterfaces"][0]["nicType"] == "GVNIC"
    pinned = evaluate("gcp", image="projects/my-proj/global/images/family/my-baked-image")
    assert "gcp:compute/getImage:getImage" not in pinned.invokes
    assert pinned.of_type(INSTANCE)[0].ignore_changes == []


def test_guest_agent_told_to_keep_the_pinned_host_key() -> None:
    from infra.bootstrap import parse_user_data

    i = evaluate("gcp").of_type(INSTANCE)[0].inputs
    files = {f["path"]: f["content"] for f in parse_user_data(i["metadata"]["user-data"])["write_files"]}
    assert "set_host_keys = false" in files["/etc/default/instance_configs.cfg"]


def test_existing_bucket_is_bound_not_created() -> None:
    snap = evaluate("gcp", bucket="team-datasets", bucket_existing="true")
    assert not snap.of_type("gcp:storage/bucket:Bucket")
    assert snap.one("gcp:storage/bucketIAMMember:BucketIAMMember").inputs["bucket"] == "team-datasets"
    assert snap.outputs["bucket"] == "team-datasets"
