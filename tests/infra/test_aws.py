"""The AWS program under Pulumi's mocks: what it declares, and that it is locked down."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from infra_cases import OPERATOR_CIDR, evaluate

INSTANCE = "aws:ec2/instance:Instance"
SG = "aws:ec2/securityGroup:SecurityGroup"
WORLD = {"0.0.0.0/0", "::/0"}


def expected_counts(nodes: int) -> dict[str, int]:
    """Every custom resource the program creates for a p4d cluster of ``nodes`` nodes."""
    multi = 1 if nodes > 1 else 0
    return {
        "tls:index/privateKey:PrivateKey": nodes + 1,  # a host key per node + the operator key
        "aws:ec2/vpc:Vpc": 1,
        "aws:ec2/defaultSecurityGroup:DefaultSecurityGroup": 1,
        "aws:ec2/internetGateway:InternetGateway": 1,
        "aws:ec2/subnet:Subnet": 1,
        "aws:ec2/routeTable:RouteTable": 1,
        "aws:ec2/routeTableAssociation:RouteTableAssociation": 1,
        SG: 1,
        "aws:s3/bucket:Bucket": 1,
        "aws:s3/bucketOwnershipControls:BucketOwnershipControls": 1,
        "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock": 1,
        "aws:s3/bucketVersioning:BucketVersioning": 1,
        "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration": 1,
        "aws:s3/bucketPolicy:BucketPolicy": 1,
        "aws:iam/role:Role": 1,
        "aws:iam/rolePolicy:RolePolicy": 1,
        "aws:iam/instanceProfile:InstanceProfile": 1,
        "aws:ec2/placementGroup:PlacementGroup": multi,
        "aws:ec2/launchTemplate:LaunchTemplate": multi,  # EFA on p4d, multi-node only
        INSTANCE: nodes,
    }


@pytest.mark.parametrize("nodes", [1, 4, 64])
def test_resource_counts(nodes: int) -> None:
    snap = evaluate("aws", node_count=str(nodes))
    expected = {t: c for t, c in expected_counts(nodes).items() if c}
    assert dict(Counter(r.typ for r in snap.custom_resources)) == expected
    assert len(snap.outputs["nodes"]) == nodes
    assert snap.counts()["pulumi:providers:aws"] == 1


def test_no_inbound_rule_open_to_the_world_and_ssh_only_from_operator() -> None:
    snap = evaluate("aws")
    sg = snap.one(SG).inputs
    for rule in sg["ingress"]:
        assert not WORLD & set(rule.get("cidrBlocks", [])), rule
        assert not rule.get("ipv6CidrBlocks"), rule
        if rule.get("cidrBlocks"):
            assert rule["cidrBlocks"] == [OPERATOR_CIDR]
            assert (rule["protocol"], rule["fromPort"], rule["toPort"]) == ("tcp", 22, 22)
    # No other way in: no standalone ingress rules, and the VPC's default group is emptied.
    assert not snap.of_type("aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule")
    assert not snap.of_type("aws:ec2/securityGroupRule:SecurityGroupRule")
    default = snap.one("aws:ec2/defaultSecurityGroup:DefaultSecurityGroup").inputs
    assert not default.get("ingress") and not default.get("egress")


def test_intra_cluster_rule_present() -> None:
    sg = evaluate("aws").one(SG).inputs
    cluster_rules = [r for r in sg["ingress"] if r.get("self")]
    assert cluster_rules and cluster_rules[0]["protocol"] == "-1"  # all traffic (NCCL, rendezvous, EFA)
    assert any(r.get("self") and r["protocol"] == "-1" for r in sg["egress"])  # EFA needs it outbound too


def test_iam_policy_is_scoped_to_the_bucket_and_the_cluster() -> None:
    snap = evaluate("aws")
    bucket_arn = snap.one("aws:s3/bucket:Bucket").outputs["arn"]
    policy = json.loads(snap.one("aws:iam/rolePolicy:RolePolicy").inputs["policy"])
    cluster_id = snap.outputs["cluster_id"]
    for statement in policy["Statement"]:
        assert statement["Effect"] == "Allow"
        actions = statement["Action"]
        assert all(not a.endswith("*") for a in actions), statement
        resources = statement["Resource"]
        assert "*" not in resources
        if all(a.startswith("s3:") for a in actions):
            assert set(resources) <= {bucket_arn, f"{bucket_arn}/*"}
        else:
            assert set(actions) <= {"ec2:TerminateInstances", "ec2:StopInstances"}
            assert statement["Condition"] == {
                "StringEquals": {"aws:ResourceTag/fleetrun:cluster": cluster_id}
            }
    assert "s3:DeleteObjectVersion" not in json.dumps(policy)  # nothing on the cluster can purge data
    # Nothing else is attached to the role.
    assert not snap.of_type("aws:iam/rolePolicyAttachment:RolePolicyAttachment")
    assert not snap.of_type("aws:iam/policy:Policy")
    trust = json.loads(snap.one("aws:iam/role:Role").inputs["assumeRolePolicy"])
    assert trust["Statement"][0]["Principal"] == {"Service": "ec2.amazonaws.com"}


def test_bucket_is_retained_versioned_encrypted_and_private() -> None:
    snap = evaluate("aws")
    bucket_resources = [r for r in snap.custom_resources if r.typ.startswith("aws:s3/")]
    assert len(bucket_resources) == 6
    for r in bucket_resources:
        assert r.retain_on_delete, f"{r.typ} would be deleted by pulumi destroy"
        assert not r.protect  # protect would make `pulumi destroy` (fab down) fail
    assert snap.one("aws:s3/bucket:Bucket").inputs.get("forceDestroy") is False
    versioning = snap.one("aws:s3/bucketVersioning:BucketVersioning").inputs
    assert versioning["versioningConfiguration"]["status"] == "Enabled"
    sse = snap.one("aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration")
    assert sse.inputs["rules"][0]["applyServerSideEncryptionByDefault"]["sseAlgorithm"] == "AES256"
    block = snap.one("aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock").inputs
    assert all(
        block[k]
        for k in ("blockPublicAcls", "blockPublicPolicy", "ignorePublicAcls", "restrictPublicBuckets")
    )
    ownership = snap.one("aws:s3/bucketOwnershipControls:BucketOwnershipControls").inputs
    assert ownership["rule"]["objectOwnership"] == "BucketOwnerEnforced"
    policy = json.loads(snap.one("aws:s3/bucketPolicy:BucketPolicy").inputs["policy"])
    assert policy["Statement"][0]["Effect"] == "Deny"
    assert policy["Statement"][0]["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}


def test_instances_require_imdsv2_and_encrypt_their_volumes() -> None:
    snap = evaluate("aws")
    cluster_id = snap.outputs["cluster_id"]
    ranks = []
    for instance in snap.of_type(INSTANCE):
        i = instance.inputs
        rank = int(i["tags"]["fleetrun:node-rank"])
        ranks.append(rank)
        assert i["metadataOptions"]["httpTokens"] == "required"
        assert i["metadataOptions"]["httpEndpoint"] == "enabled"
        assert i["rootBlockDevice"]["encrypted"] is True
        assert i["rootBlockDevice"]["volumeSize"] == 200
        assert i["instanceInitiatedShutdownBehavior"] == "terminate"
        assert i["tags"]["fleetrun:cluster"] == cluster_id
        assert i["tags"]["Name"] == f"{cluster_id}-node{rank}"
        assert i["placementGroup"]  # 4 nodes: cluster placement group
        assert "instanceMarketOptions" not in i  # on-demand unless fleet:spot
        assert instance.secret_inputs == ["userData"] and "userData" in instance.additional_secret_outputs
        assert instance.ignore_changes == ["ami"]  # a newer DLAMI does not replace running nodes
    assert sorted(ranks) == [0, 1, 2, 3]


def test_efa_rides_on_the_primary_interface_via_a_launch_template() -> None:
    snap = evaluate("aws")
    template = snap.one("aws:ec2/launchTemplate:LaunchTemplate").inputs
    (nic,) = template["networkInterfaces"]
    assert (nic["interfaceType"], nic["deviceIndex"], nic["associatePublicIpAddress"]) == ("efa", 0, "true")
    instance = snap.of_type(INSTANCE)[0].inputs
    assert "subnetId" not in instance and instance["launchTemplate"]["version"] == "$Latest"
    plain = evaluate("aws", machine_type="g6.xlarge", node_count="2")
    assert not plain.of_type("aws:ec2/launchTemplate:LaunchTemplate")
    assert plain.of_type(INSTANCE)[0].inputs["subnetId"]


def test_spot_and_reservation_options() -> None:
    spot = evaluate("aws", spot="true").of_type(INSTANCE)[0].inputs
    assert spot["instanceMarketOptions"]["marketType"] == "spot"
    assert spot["instanceMarketOptions"]["spotOptions"]["instanceInterruptionBehavior"] == "terminate"
    reserved = evaluate("aws", reservation="cr-0123456789abcdef0").of_type(INSTANCE)[0].inputs
    target = reserved["capacityReservationSpecification"]["capacityReservationTarget"]
    assert target["capacityReservationId"] == "cr-0123456789abcdef0"


def test_image_lookup_and_pinned_image() -> None:
    looked_up = evaluate("aws")
    assert "aws:ec2/getAmi:getAmi" in looked_up.invokes
    pinned = evaluate("aws", image="ami-0fedcba9876543210")
    assert "aws:ec2/getAmi:getAmi" not in pinned.invokes
    instance = pinned.of_type(INSTANCE)[0]
    assert instance.inputs["ami"] == "ami-0fedcba9876543210" and instance.ignore_changes == []


def test_zone_is_looked_up_or_taken_from_config() -> None:
    assert evaluate("aws").outputs["zone"] == "us-east-1a"  # first offering zone by name
    fixed = evaluate("aws", zone="us-east-1d")
    assert fixed.outputs["zone"] == "us-east-1d"
    assert "aws:ec2/getInstanceTypeOfferings:getInstanceTypeOfferings" not in fixed.invokes


def test_existing_bucket_is_used_not_managed() -> None:
    snap = evaluate("aws", bucket="my-team-data", bucket_existing="true")
    assert not [r for r in snap.custom_resources if r.typ.startswith("aws:s3/")]
    assert snap.outputs["bucket"] == "my-team-data"
    policy = json.loads(snap.one("aws:iam/rolePolicy:RolePolicy").inputs["policy"])
    assert policy["Statement"][0]["Resource"] == ["arn:aws:s3:::my-team-data"]


def test_named_bucket_and_user_tags() -> None:
    snap = evaluate("aws", bucket="my-run-artifacts", tags='{"project": "llm", "owner": "ana"}')
    assert snap.one("aws:s3/bucket:Bucket").inputs["bucket"] == "my-run-artifacts"
    for r in snap.custom_resources:
        if "tags" in r.inputs:
            assert r.inputs["tags"]["project"] == "llm" and r.inputs["tags"]["fleetrun:cluster"]
