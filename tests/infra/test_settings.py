"""The stack config model: presets, defaults, and bad configs failing with the key named.

Pure: no Pulumi import, no mocks. Each bad config must fail ``parse_settings`` (and therefore
``pulumi preview``) with a ``ConfigError`` whose message starts with the offending ``fleet:`` key.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from infra_cases import OPERATOR_CIDR, aws_config, gcp_config

from fleetrun_contract.cluster import cluster_id_for
from infra.presets import PRESETS
from infra.settings import KEYS, ConfigError, parse_settings

REPO = Path(__file__).resolve().parents[2]


def parse(raw: dict[str, Any]):  # noqa: ANN201 (FleetSettings)
    return parse_settings(raw, project="fleetrun", stack="dev")


def problem_for(raw: dict[str, Any]) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        parse(raw)
    return info.value


# -- the eight (and more) bad configs the issue lists, each a clear error naming its key --------

BAD_CONFIGS = {
    "unknown machine type": (
        aws_config(machine_type="p9.huge"),
        "machine_type",
        "not a known AWS instance type",
    ),
    "unknown GCP machine type": (gcp_config(machine_type="a9-megagpu-8g"), "machine_type", "not a known GCP"),
    "GPUs on a type without (AWS)": (
        aws_config(machine_type="c5.xlarge", gpus_per_node="8"),
        "gpus_per_node",
        "has no GPUs",
    ),
    "GPUs on a type without (GCP)": (
        gcp_config(machine_type="e2-standard-8", accelerator_type="nvidia-tesla-t4", gpus_per_node="1"),
        "accelerator_type",
        "cannot have GPUs",
    ),
    "wrong GPU count for a fixed type": (aws_config(gpus_per_node="4"), "gpus_per_node", "has 8 GPUs"),
    "N1 attachable count not allowed": (
        gcp_config(machine_type="n1-standard-8", accelerator_type="nvidia-tesla-t4", gpus_per_node="3"),
        "gpus_per_node",
        "takes 1, 2, 4",
    ),
    "zero nodes": (aws_config(node_count="0"), "node_count", "between 1 and"),
    "node count not a number": (aws_config(node_count="four"), "node_count", "whole number"),
    "world-open SSH": (aws_config(ssh_cidr="0.0.0.0/0"), "ssh_cidr", "whole internet"),
    "world-open SSH in two halves": (
        gcp_config(ssh_cidr='["0.0.0.0/1", "128.0.0.0/1"]'),
        "ssh_cidr",
        "whole internet",
    ),
    "SSH CIDR missing": (aws_config(ssh_cidr=None), "ssh_cidr", "required"),
    "SSH CIDR is the example placeholder": (
        aws_config(ssh_cidr="203.0.113.7/32"),
        "ssh_cidr",
        "documentation",
    ),
    "SSH CIDR with host bits": (aws_config(ssh_cidr="81.2.69.142/24"), "ssh_cidr", "not a CIDR"),
    "bad region": (aws_config(region="us-east-9"), "region", "not a known AWS region"),
    "GCP region given to AWS": (aws_config(region="us-central1"), "region", "looks like a GCP region"),
    "bad GCP zone": (gcp_config(zone="us-central1"), "zone", "not a GCP zone"),
    "zone outside the region": (
        aws_config(zone="us-west-2a"),
        "zone",
        "not an availability zone of us-east-1",
    ),
    "bucket name invalid (AWS)": (aws_config(bucket="My_Bucket"), "bucket", "lowercase"),
    "bucket name invalid (GCP)": (gcp_config(bucket="google-data"), "bucket", "reserved"),
    "bucket name like an IP": (aws_config(bucket="192.168.1.1"), "bucket", "IP address"),
    "negative disk": (aws_config(disk_size_gb="-5"), "disk_size_gb", "positive"),
    "disk too small": (gcp_config(disk_size_gb="10"), "disk_size_gb", "between 30 and"),
    "spot + reservation conflict": (
        aws_config(spot="true", reservation="cr-0123456789abcdef0"),
        "reservation",
        "spot capacity cannot",
    ),
    "unknown key (typo)": (
        aws_config(machinetype="p5.48xlarge"),
        "machinetype",
        "did you mean fleet:machine_type",
    ),
    "GCP-only key on AWS": (
        aws_config(accelerator_type="nvidia-tesla-t4"),
        "accelerator_type",
        "only used on GCP",
    ),
    "AWS-only key on GCP": (gcp_config(efa="true"), "efa", "only used on AWS"),
    "unknown cloud": (aws_config(cloud="azure"), "cloud", "not supported"),
    "unknown preset": (aws_config(preset="huge"), "preset", "not a preset"),
    "GCP project missing": (gcp_config(project=None), "project", "required on GCP"),
    "bad GCP label": (gcp_config(tags='{"Team": "ml"}'), "tags", "lowercase"),
    "reserved AWS tag": (aws_config(tags={"aws:owner": "me"}), "tags", "reserved"),
    "private key pasted as public": (
        aws_config(ssh_public_key="-----BEGIN OPENSSH PRIVATE KEY-----\nabc\n"),
        "ssh_public_key",
        "private key",
    ),
    "EFA asked on a type without": (aws_config(machine_type="g6.xlarge", efa="true"), "efa", "has no EFA"),
    "bad image id": (aws_config(image="ubuntu-22.04"), "image", "not an AMI id"),
    "AMI on GCP": (gcp_config(image="ami-0123456789abcdef0"), "image", "AWS image"),
    "existing bucket without a name": (
        aws_config(bucket_existing="true"),
        "bucket_existing",
        "needs fleet:bucket",
    ),
    "public network CIDR": (aws_config(network_cidr="8.8.0.0/16"), "network_cidr", "private"),
    # issue 24, item 4: each p5 node takes 32 addresses (one per EFA interface): 8 need 256 > 251
    "8 x p5 in a /24": (
        aws_config(machine_type="p5.48xlarge", node_count="8", network_cidr="10.0.0.0/24"),
        "network_cidr",
        "8 nodes need 256 (32 each: one per EFA interface)",
    ),
    "root login": (gcp_config(ssh_user="root"), "ssh_user", "not a valid login"),
    # -- issue 13, item 7: combinations the provider refuses (or mishandles) minutes into `up`
    "N1 with more vCPUs than one V100 allows": (
        gcp_config(machine_type="n1-standard-96", accelerator_type="nvidia-tesla-v100", gpus_per_node="1"),
        "machine_type",
        "at most 12",
    ),
    "A3 High below 8 GPUs on demand": (
        gcp_config(machine_type="a3-highgpu-4g"),
        "machine_type",
        "only as Spot",
    ),
    "more VMs than one compact placement policy holds": (
        gcp_config(node_count="151"),
        "placement",
        "at most 150 VMs",
    ),
    "AWS reservation without its zone": (
        aws_config(reservation="cr-0123456789abcdef0"),
        "zone",
        "one availability zone",
    ),
    "Capacity Block without its reservation": (
        aws_config(capacity_block="true"),
        "capacity_block",
        "needs fleet:reservation",
    ),
    "P3 (Volta) with the current Deep Learning AMI": (
        aws_config(machine_type="p3.16xlarge"),
        "image",
        "Volta",
    ),
    "failover zone in another AWS region": (
        aws_config(zones='["us-east-1a", "us-west-2a"]'),
        "zones",
        "not an availability zone of us-east-1",
    ),
    "zone not among the failover zones": (
        aws_config(zone="us-east-1c", zones="us-east-1a, us-east-1b"),
        "zone",
        "not one of fleet:zones",
    ),
    "GCP reservation with failover zones": (
        gcp_config(reservation="a100-block", zones='["us-central1-a", "us-central1-b"]', zone=None),
        "zones",
        "a reservation lives in one zone",
    ),
    "bad GCP failover zone": (gcp_config(zones='["us-central1-a", "mars-1x"]'), "zones", "not a GCP zone"),
}


@pytest.mark.parametrize("case", list(BAD_CONFIGS), ids=list(BAD_CONFIGS))
def test_bad_config_fails_naming_the_key(case: str) -> None:
    raw, key, fragment = BAD_CONFIGS[case]
    raw = {k: v for k, v in raw.items() if v is not None}
    error = problem_for(raw)
    assert key in error.keys, f"{case}: expected fleet:{key} in {error}"
    text = str(error)
    assert f"fleet:{key}:" in text
    assert fragment in text, f"{case}: {fragment!r} not in {text!r}"


def test_node_resources_do_not_depend_on_the_node_count() -> None:
    """EFA and placement are decided by the type, not the size: appearing at 2 nodes, they
    replaced node0 (a launch template or placement group forces a new instance)."""
    for nodes in ("1", "2", "64"):
        aws = parse(aws_config(node_count=nodes))
        assert aws.efa and aws.placement
        gcp = parse(gcp_config(node_count=nodes))
        assert gcp.placement and not gcp.efa
    reserved = parse(aws_config(reservation="cr-0123456789abcdef0", zone="us-east-1b"))
    assert not reserved.placement  # the reservation's own placement (fleet:placement_group) applies


def test_failover_zones_and_the_zone_in_use() -> None:
    aws = parse(aws_config(zones='["us-east-1b", "us-east-1a"]'))
    assert aws.zones == ("us-east-1b", "us-east-1a") and aws.zone == "us-east-1b"
    assert aws.bucket_region == "us-east-1"
    moved = parse(gcp_config(zone="europe-west4-a", zones="us-central1-a, europe-west4-a"))
    assert (moved.zone, moved.region, moved.bucket_region) == (
        "europe-west4-a",
        "europe-west4",
        "us-central1",
    )
    assert parse(gcp_config(zone=None, zones='["us-east4-c"]')).zone == "us-east4-c"


def test_p3_with_a_pinned_image_and_a3_small_on_spot_are_accepted() -> None:
    assert parse(aws_config(machine_type="p3.16xlarge", image="ami-0123456789abcdef0")).machine.gpus == 8
    assert parse(gcp_config(machine_type="a3-highgpu-4g", spot="true")).machine.gpus == 4
    n1 = parse(
        gcp_config(machine_type="n1-standard-8", accelerator_type="nvidia-tesla-v100", gpus_per_node="1")
    )
    assert n1.machine.attach_accelerators


def test_message_example_from_the_brief() -> None:
    text = str(problem_for(aws_config(machine_type="p9.huge")))
    assert text.startswith(
        "fleet:machine_type: 'p9.huge' is not a known AWS instance type; known GPU types: "
    )
    assert "p5.48xlarge" in text


def test_every_problem_is_reported_at_once() -> None:
    error = problem_for(aws_config(node_count="0", ssh_cidr="0.0.0.0/0", disk_size_gb="-1", bucket="BAD"))
    assert {"node_count", "ssh_cidr", "disk_size_gb", "bucket"} <= set(error.keys)
    assert str(error).startswith("4 problems in the stack config:")


def test_world_open_ssh_needs_the_explicit_override() -> None:
    settings = parse(aws_config(ssh_cidr="0.0.0.0/0", allow_ssh_from_anywhere="true"))
    assert settings.ssh_cidrs == ("0.0.0.0/0",)


def test_ssh_cidr_forms() -> None:
    assert parse(aws_config(ssh_cidr="81.2.69.142")).ssh_cidrs == ("81.2.69.142/32",)
    assert parse(aws_config(ssh_cidr="81.2.69.142/32, 10.8.0.0/16")).ssh_cidrs == (
        "81.2.69.142/32",
        "10.8.0.0/16",
    )
    assert parse(aws_config(ssh_cidr=json.dumps(["81.2.69.142/32"]))).ssh_cidrs == ("81.2.69.142/32",)


def test_aws_defaults_and_derived_settings() -> None:
    s = parse(aws_config())
    assert (s.machine.gpus, s.machine.gpu_type) == (8, "nvidia-a100-40gb")
    assert s.efa and s.placement  # p4d has EFA and joins a cluster placement group
    assert s.image.lookup and s.bucket_name is None and s.zone is None
    assert (s.disk_size_gb, s.disk_type, s.ssh_user) == (200, "gp3", "ubuntu")
    single = parse(aws_config(node_count="1"))
    assert single.efa and single.placement  # at any size, so growing replaces nothing
    assert not parse(aws_config(machine_type="t3.xlarge", node_count="2")).placement  # T types: no cluster PG
    # 7 x p5 fit a /24 (224 of 251 addresses); without EFA a p5 node takes one address
    assert parse(aws_config(machine_type="p5.48xlarge", node_count="7", network_cidr="10.0.0.0/24")).efa
    p5_no_efa = aws_config(
        machine_type="p5.48xlarge", node_count="200", network_cidr="10.0.0.0/24", efa="false"
    )
    assert not parse(p5_no_efa).efa


def test_gcp_attached_and_built_in_gpus() -> None:
    n1 = parse(
        gcp_config(machine_type="n1-standard-16", accelerator_type="nvidia-tesla-t4", gpus_per_node="4")
    )
    assert n1.machine.attach_accelerators and n1.machine.gpus == 4 and not n1.placement
    a3 = parse(gcp_config(machine_type="a3-highgpu-8g"))
    assert not a3.machine.attach_accelerators and a3.machine.gpus == 8 and a3.machine.gvnic
    assert a3.region == "us-central1" and a3.placement


def test_presets_expand_and_explicit_keys_win() -> None:
    for name, preset in PRESETS.items():
        for cloud, make in (("aws", aws_config), ("gcp", gcp_config)):
            raw = {k: v for k, v in make(preset=name).items() if k not in ("node_count", "machine_type")}
            s = parse(raw)
            assert s.node_count == preset.common["node_count"]
            assert s.machine.machine_type == preset.per_cloud[cloud]["machine_type"]
    s = parse(
        {k: v for k, v in aws_config(preset="multi-node", node_count="16").items() if k != "machine_type"}
    )
    assert s.node_count == 16 and s.machine.machine_type == "p4d.24xlarge"


def test_unlisted_types_need_the_override_and_a_gpu_count() -> None:
    problem_for(aws_config(machine_type="p6.48xlarge"))
    error = problem_for(aws_config(machine_type="p6.48xlarge", allow_unlisted="true"))
    assert error.keys == ["gpus_per_node"]
    s = parse(aws_config(machine_type="p6.48xlarge", allow_unlisted="true", gpus_per_node="8"))
    assert s.machine.gpus == 8


def test_cluster_id_is_stable_short_and_a_valid_label() -> None:
    cid = cluster_id_for("fleetrun", "My Big_Stack.2024")
    assert cid == cluster_id_for("fleetrun", "My Big_Stack.2024")
    assert cid != cluster_id_for("fleetrun", "My Big_Stack.2025")
    assert len(cid) <= 26 and cid.startswith("fr-my-big-stack-")
    assert all(c.islower() or c.isdigit() or c == "-" for c in cid)


def test_pulumi_yaml_documents_every_key() -> None:
    project = yaml.safe_load((REPO / "Pulumi.yaml").read_text())
    documented = {k.split(":", 1)[1] for k in project["template"]["config"]}
    assert documented == set(KEYS)
    assert project["main"] == "infra/"


def _as_pulumi_strings(config: dict[str, Any]) -> dict[str, Any]:
    """Stack YAML values as the Pulumi engine hands them to a program: strings, JSON for objects."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, bool):
            out[key] = "true" if value else "false"
        elif isinstance(value, (dict, list)):
            out[key] = json.dumps(value)
        else:
            out[key] = str(value)
    return out


@pytest.mark.parametrize("example", ["Pulumi.aws-example.yaml", "Pulumi.gcp-example.yaml"])
def test_example_stack_configs(example: str) -> None:
    config = yaml.safe_load((REPO / example).read_text())["config"]
    raw = {k.split(":", 1)[1]: v for k, v in _as_pulumi_strings(config).items() if k.startswith("fleet:")}
    # As shipped, the placeholder address is refused, naming the key...
    error = problem_for(raw)
    assert error.keys == ["ssh_cidr"]
    # ...and with the user's own address the example is a valid cluster.
    s = parse({**raw, "ssh_cidr": OPERATOR_CIDR})
    assert s.node_count == 2 and s.machine.gpus > 0
