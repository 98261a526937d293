"""The GCP program under Pulumi's mocks: what it declares, and that it is locked down."""

from __future__ import annotations

from collections import Counter

import pytest
from infra_cases import OPERATOR_CIDR, evaluate

INSTANCE = "gcp:compute/instance:Instance"
FIREWALL = "gcp:compute/firewall:Firewall"
WORLD = {"0.0.0.0/0", "::/0"}


SELF_DELETE = "gcp:compute/instanceIAMMember:InstanceIAMMember"
CUSTOM_ROLE = "gcp:projects/iAMCustomRole:IAMCustomRole"


def expected_counts(nodes: int) -> dict[str, int]:
    """Every custom resource the program creates for an a2-highgpu-8g cluster of ``nodes`` nodes.

    The compact placement policy exists at any size: added at 2 nodes, it would recreate node0.
    """
    return {
        "tls:index/privateKey:PrivateKey": nodes + 1,
        "gcp:serviceaccount/account:Account": 1,
        CUSTOM_ROLE: 1,
        SELF_DELETE: nodes,
        "gcp:compute/network:Network": 1,
        "gcp:compute/subnetwork:Subnetwork": 1,
        FIREWALL: 2,
        "gcp:storage/bucket:Bucket": 1,
        "gcp:storage/bucketIAMMember:BucketIAMMember": 1,
        "gcp:compute/resourcePolicy:ResourcePolicy": 1,
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
        if "IAM" in r.typ
        and r.typ not in ("gcp:storage/bucketIAMMember:BucketIAMMember", SELF_DELETE, CUSTOM_ROLE)
    ]
    assert broader == []  # no project, folder or organisation bindings


def test_each_node_may_delete_its_own_instance_and_nothing_else() -> None:
    """A guest shutdown only stops a GCP VM (its disk keeps billing): the watchdog deletes its
    node instead, with a role holding delete alone, bound on each node's instance."""
    snap = evaluate("gcp")
    email = snap.one("gcp:serviceaccount/account:Account").outputs["email"]
    role = snap.one(CUSTOM_ROLE)
    assert role.inputs["permissions"] == ["compute.instances.delete"]
    assert "roleId" not in role.inputs  # auto-named: a deleted role's id stays reserved for weeks
    grants = {g.inputs["instanceName"]: g.inputs for g in snap.of_type(SELF_DELETE)}
    assert set(grants) == {i.inputs["name"] for i in snap.of_type(INSTANCE)}
    for grant in grants.values():
        assert grant["role"] == role.outputs["name"] and grant["member"] == f"serviceAccount:{email}"
        assert grant["zone"] == "us-central1-a" and grant["project"] == "my-gcp-project"


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
    # Preempted: deleted, not stopped (a stopped VM's disk bills and its address goes stale).
    assert i["scheduling"]["instanceTerminationAction"] == "DELETE"
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


@pytest.mark.parametrize(("machine_type", "data_nics"), [("a3-highgpu-8g", 4), ("a3-megagpu-8g", 8)])
def test_a3_gets_a_gvnic_per_gpu_data_network(machine_type: str, data_nics: int) -> None:
    """GPUDirect-TCPX (A3 High) / TCPXO (A3 Mega) need one extra gVNIC per data network; with
    a single NIC, NCCL shares the host NIC (a fraction of the bandwidth paid for)."""
    snap = evaluate("gcp", machine_type=machine_type, node_count="2")
    networks = [n for n in snap.of_type("gcp:compute/network:Network") if "-data" in n.name]
    assert len(networks) == data_nics and {n.inputs["mtu"] for n in networks} == {8244}
    subnets = {
        s.outputs.get("id", f"{s.name}-id"): s for s in snap.of_type("gcp:compute/subnetwork:Subnetwork")
    }
    email = snap.one("gcp:serviceaccount/account:Account").outputs["email"]
    data_firewalls = [f for f in snap.of_type(FIREWALL) if "-data" in f.name]
    assert len(data_firewalls) == data_nics
    assert all(
        f.inputs["sourceServiceAccounts"] == [email] == f.inputs["targetServiceAccounts"]
        for f in data_firewalls
    )
    for instance in snap.of_type(INSTANCE):
        nics = instance.inputs["networkInterfaces"]
        assert len(nics) == 1 + data_nics and all(n["nicType"] == "GVNIC" for n in nics)
        assert all("accessConfigs" not in n for n in nics[1:])  # data NICs have no public address
        data_ranges = sorted(subnets[n["subnetwork"]].inputs["ipCidrRange"] for n in nics[1:])
        assert len(set(data_ranges)) == data_nics
    assert not [n for n in evaluate("gcp").of_type("gcp:compute/network:Network") if "-data" in n.name]


@pytest.mark.parametrize("network_cidr", ["10.0.0.0/16", "172.17.0.0/16", "172.16.4.0/24", "172.23.0.0/16"])
def test_a3_data_subnets_never_overlap_the_primary_range(network_cidr: str) -> None:
    """Every NIC of a VM on its own range: a network_cidr inside 172.16.0.0/12 (valid) must not
    give a data NIC the primary subnet's range."""
    import ipaddress

    snap = evaluate("gcp", machine_type="a3-megagpu-8g", node_count="2", network_cidr=network_cidr)
    ranges = [
        ipaddress.ip_network(s.inputs["ipCidrRange"])
        for s in snap.of_type("gcp:compute/subnetwork:Subnetwork")
    ]
    assert len(ranges) == 1 + 8
    assert ipaddress.ip_network(network_cidr) in ranges
    for i, a in enumerate(ranges):
        for b in ranges[i + 1 :]:
            assert not a.overlaps(b), (str(a), str(b))


def test_a_disk_smaller_than_the_image_fails_naming_the_key() -> None:
    import pulumi

    with pytest.raises(pulumi.RunError, match=r"^fleet:disk_size_gb: 50 GB is smaller than the image"):
        evaluate("gcp", disk_size_gb="50")


def test_failover_across_regions_keeps_the_bucket_home() -> None:
    """GCP zones may span regions; the bucket stays in the first zone's region (moving it would
    create a new, empty bucket) while the subnet and placement policy follow the zone in use."""
    snap = evaluate("gcp", zones='["us-central1-a", "us-east4-b"]', zone="us-east4-b")
    assert snap.one("gcp:storage/bucket:Bucket").inputs["location"] == "US-CENTRAL1"
    subnet = [s for s in snap.of_type("gcp:compute/subnetwork:Subnetwork") if s.name.endswith("-net-subnet")][
        0
    ]
    assert subnet.inputs["region"] == "us-east4" and subnet.delete_before_replace
    assert {i.inputs["zone"] for i in snap.of_type(INSTANCE)} == {"us-east4-b"}
    assert snap.outputs["zone"] == "us-east4-b"
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
