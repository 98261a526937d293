"""The AWS program under Pulumi's mocks: what it declares, and that it is locked down."""

from __future__ import annotations

import json
from collections import Counter

import pulumi
import pytest
from infra_cases import OPERATOR_CIDR, evaluate

INSTANCE = "aws:ec2/instance:Instance"
SG = "aws:ec2/securityGroup:SecurityGroup"
WORLD = {"0.0.0.0/0", "::/0"}


def expected_counts(nodes: int) -> dict[str, int]:
    """Every custom resource the program creates for a p4d cluster of ``nodes`` nodes.

    The placement group and the EFA launch template exist at any size (one appearing at 2
    nodes would replace node0); p4d has 4 network cards, so each node gets an Elastic IP.
    """
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
        "aws:ec2/placementGroup:PlacementGroup": 1,
        "aws:ec2/launchTemplate:LaunchTemplate": 1,  # EFA on p4d's 4 cards
        "aws:ec2/eip:Eip": nodes,
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


def test_iam_policy_is_the_job_bucket_only() -> None:
    """No EC2 permission at all: the watchdog's shutdown terminates its own node, and the old
    grant (terminate any node of the cluster) let one node stop all the others."""
    snap = evaluate("aws")
    bucket_arn = snap.one("aws:s3/bucket:Bucket").outputs["arn"]
    policy = json.loads(snap.one("aws:iam/rolePolicy:RolePolicy").inputs["policy"])
    for statement in policy["Statement"]:
        assert statement["Effect"] == "Allow"
        actions = statement["Action"]
        assert all(not a.endswith("*") for a in actions), statement
        assert all(a.startswith("s3:") for a in actions), statement
        assert set(statement["Resource"]) <= {bucket_arn, f"{bucket_arn}/*"}
    assert "ec2:" not in json.dumps(policy)
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
        # user data is read once at first boot (an update would stop/start the node); a newer
        # DLAMI does not replace running nodes.
        assert sorted(instance.ignore_changes) == ["ami", "userData"]
    assert sorted(ranks) == [0, 1, 2, 3]


@pytest.mark.parametrize(("machine_type", "cards"), [("p4d.24xlarge", 4), ("p5.48xlarge", 32)])
def test_efa_on_every_network_card_and_an_elastic_ip_per_node(machine_type: str, cards: int) -> None:
    """One EFA interface per card (p4d: 4, p5: 32), not one in total: the inter-node bandwidth
    paid for. Several interfaces get no automatic public IPv4, so each node has an EIP on its
    primary interface, and that is the address exported for SSH."""
    snap = evaluate("aws", machine_type=machine_type, node_count="2")
    template = snap.one("aws:ec2/launchTemplate:LaunchTemplate").inputs
    nics = template["networkInterfaces"]
    assert [n["networkCardIndex"] for n in nics] == list(range(cards))
    assert [n["deviceIndex"] for n in nics] == [0] + [1] * (cards - 1)
    assert {n["interfaceType"] for n in nics} == {"efa"}
    assert not any("associatePublicIpAddress" in n for n in nics)  # refused with several interfaces
    assert template["tagSpecifications"][0]["resourceType"] == "network-interface"  # the leak audit sees them
    eips = {r.inputs["networkInterface"]: r for r in snap.of_type("aws:ec2/eip:Eip")}
    for instance, node in zip(
        sorted(snap.of_type(INSTANCE), key=lambda i: i.name), snap.outputs["nodes"], strict=True
    ):
        assert "subnetId" not in instance.inputs and instance.inputs["launchTemplate"]["version"] == "$Latest"
        eip = eips[instance.outputs["primaryNetworkInterfaceId"]]
        assert (
            eip.inputs["domain"] == "vpc"
            and eip.inputs["tags"]["fleetrun:cluster"] == snap.outputs["cluster_id"]
        )
        assert node["public_ip"] == eip.outputs["publicIp"] != instance.outputs["publicIp"]


def test_single_card_efa_keeps_the_automatic_public_address() -> None:
    snap = evaluate("aws", machine_type="g6.12xlarge", node_count="2")
    (nic,) = snap.one("aws:ec2/launchTemplate:LaunchTemplate").inputs["networkInterfaces"]
    assert (nic["interfaceType"], nic["deviceIndex"], nic["associatePublicIpAddress"]) == ("efa", 0, "true")
    assert not snap.of_type("aws:ec2/eip:Eip")
    plain = evaluate("aws", machine_type="g6.xlarge", node_count="2")
    assert not plain.of_type("aws:ec2/launchTemplate:LaunchTemplate")
    assert plain.of_type(INSTANCE)[0].inputs["subnetId"]


def test_spot_and_reservation_options() -> None:
    spot = evaluate("aws", spot="true").of_type(INSTANCE)[0].inputs
    assert spot["instanceMarketOptions"]["marketType"] == "spot"
    assert spot["instanceMarketOptions"]["spotOptions"]["instanceInterruptionBehavior"] == "terminate"
    reserved_snap = evaluate("aws", reservation="cr-0123456789abcdef0", zone="us-east-1b")
    reserved = reserved_snap.of_type(INSTANCE)[0].inputs
    target = reserved["capacityReservationSpecification"]["capacityReservationTarget"]
    assert target["capacityReservationId"] == "cr-0123456789abcdef0"
    # The reservation's capacity has its own placement: no fleetrun placement group to clash with.
    assert (
        not reserved_snap.of_type("aws:ec2/placementGroup:PlacementGroup")
        and "placementGroup" not in reserved
    )
    in_group = evaluate(
        "aws", reservation="cr-0123456789abcdef0", zone="us-east-1b", placement_group="team-p4d-cluster"
    ).of_type(INSTANCE)[0]
    assert in_group.inputs["placementGroup"] == "team-p4d-cluster"
    block = evaluate(
        "aws", reservation="cr-0123456789abcdef0", zone="us-east-1b", capacity_block="true"
    ).of_type(INSTANCE)[0]
    assert block.inputs["instanceMarketOptions"] == {"marketType": "capacity-block"}


def test_image_lookup_and_pinned_image() -> None:
    looked_up = evaluate("aws")
    assert "aws:ec2/getAmi:getAmi" in looked_up.invokes
    pinned = evaluate("aws", image="ami-0fedcba9876543210")
    instance = pinned.of_type(INSTANCE)[0]
    assert instance.inputs["ami"] == "ami-0fedcba9876543210" and instance.ignore_changes == ["userData"]


@pytest.mark.parametrize("image", ["auto", "ami-0fedcba9876543210"])
def test_a_disk_smaller_than_the_image_fails_naming_the_key(image: str) -> None:
    """The lookup reports the image's root volume (mocks: 100 GB); 30 GB passed the old check."""
    with pytest.raises(
        pulumi.RunError, match=r"^fleet:disk_size_gb: 60 GB is smaller than the image .*100 GB"
    ):
        evaluate("aws", disk_size_gb="60", image=image)
    assert evaluate("aws", disk_size_gb="100", image=image).of_type(INSTANCE)


def test_aws_stack_config_reaches_the_explicit_provider() -> None:
    """assume-role and default tags were silently dropped (only aws:profile was forwarded)."""
    from infra.clouds.aws import provider_arguments

    arguments = provider_arguments(
        {
            "profile": "lab",
            "assumeRoles": '[{"roleArn": "arn:aws:iam::210987654321:role/deployer", "sessionName": "fr"}]',
            "defaultTags": '{"tags": {"CostCenter": "ml-42"}}',
            "skipMetadataApiCheck": "true",
            "region": "eu-west-1",  # fleet:region wins
        }
    )
    assert arguments["profile"] == "lab" and arguments["skip_metadata_api_check"] is True
    (role,) = arguments["assume_roles"]
    assert role.role_arn == "arn:aws:iam::210987654321:role/deployer" and role.session_name == "fr"
    assert arguments["default_tags"].tags == {"CostCenter": "ml-42"}
    assert "region" not in arguments
    with pytest.raises(pulumi.RunError, match=r"aws:useFipsEndpoint: set in the stack config, but"):
        provider_arguments({"useFipsEndpoint": "true"})


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
