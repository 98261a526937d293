"""launch.fleets.clouds: the per-cloud laptop side, without a cloud.

Error classification is checked against real provider messages (tests/infra/provider_errors.yaml,
each with the thread it came from); the leak audit against stand-ins for boto3 and
google-cloud-compute that answer like the real clients (pages, aggregated lists).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
import yaml

from infra.clouds import aws_catalog, gcp_catalog
from launch.errors import FleetrunError
from launch.fleets.clouds import CLOUDS, ClusterLocation, ErrorKind

CORPUS = yaml.safe_load((Path(__file__).parent / "provider_errors.yaml").read_text())
CASES = [(cloud, entry) for cloud, entries in CORPUS.items() for entry in entries]


@pytest.mark.parametrize(
    ("cloud", "entry"), CASES, ids=[f"{c}-{e['kind']}-{i}" for i, (c, e) in enumerate(CASES)]
)
def test_real_provider_errors_are_classified(cloud: str, entry: dict[str, str]) -> None:
    assert CLOUDS[cloud].classify_error(entry["message"]) is ErrorKind(entry["kind"]), entry["source"]


def test_the_corpus_covers_every_kind_on_both_clouds() -> None:
    for cloud, entries in CORPUS.items():
        kinds = {e["kind"] for e in entries}
        assert kinds - {"global-quota"} == {"capacity", "quota", "bad-config", "permission"}, cloud
        assert all(e["source"].startswith("https://github.com/") for e in entries)


def test_gcp_quotas_over_all_regions_are_global() -> None:
    """Issue 24, item 3: GPUS_ALL_REGIONS is a project-wide limit; a regional quota is not."""
    assert "global-quota" in {e["kind"] for e in CORPUS["gcp"]}
    assert (
        CLOUDS["gcp"].classify_error(
            "Error 403: QUOTA_EXCEEDED, metric name = compute.googleapis.com/gpus_all_regions"
        )
        is ErrorKind.GLOBAL_QUOTA
    )
    regional = "Quota 'NVIDIA_A100_GPUS' exceeded.  Limit: 8.0 in region us-central1."
    assert CLOUDS["gcp"].classify_error(regional) is ErrorKind.QUOTA


def test_pulumi_wraps_the_message_and_the_kind_holds() -> None:
    """What `pulumi up` prints around a provider error (diagnostics, resource URN)."""
    wrapped = (
        "Diagnostics:\n  aws:ec2:Instance (fr-dev-1a2b3c-node3):\n    error: 1 error occurred:\n"
        "\t* creating EC2 Instance: operation error EC2: RunInstances, https response error StatusCode: 500, "
        "RequestID: 2f9e, api error InsufficientInstanceCapacity: We currently do not have sufficient "
        "p5.48xlarge capacity in the Availability Zone you requested (us-east-1a).\n"
    )
    assert CLOUDS["aws"].classify_error(wrapped) is ErrorKind.CAPACITY
    assert CLOUDS["gcp"].classify_error("error: something unexpected happened") is ErrorKind.OTHER


def test_cluster_tag_is_the_one_the_programs_write() -> None:
    assert CLOUDS["aws"].cluster_tag == aws_catalog.CLUSTER_TAG == "fleetrun:cluster"
    assert CLOUDS["gcp"].cluster_tag == gcp_catalog.CLUSTER_LABEL == "fleetrun-cluster"


def test_upload_commands() -> None:
    assert CLOUDS["aws"].upload_argv("b1", "runs/r1/n0") == [
        "aws", "s3", "sync", "--only-show-errors", "{src}", "s3://b1/runs/r1/n0",
    ]  # fmt: skip
    assert CLOUDS["gcp"].upload_argv("b1", "runs/r1/n0") == [
        "gcloud", "storage", "rsync", "--recursive", "{src}", "gs://b1/runs/r1/n0",
    ]  # fmt: skip


def test_region_of_a_zone() -> None:
    assert CLOUDS["aws"].region_of("us-east-1a") == "us-east-1"
    assert CLOUDS["aws"].region_of("us-gov-west-1b") == "us-gov-west-1"
    assert CLOUDS["gcp"].region_of("europe-west4-b") == "europe-west4"


# -- the watchdog's power-off hooks -----------------------------------------------------------------


def _run_hook(cloud: str, tmp_path: Path, curl_script: str) -> tuple[str, list[str]]:
    """Run a hook with stand-ins for curl, sudo and sleep that log what they were asked."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "calls"
    (bin_dir / "curl").write_text(f'#!/bin/sh\necho "curl $*" >> {log}\n{curl_script}\n')
    (bin_dir / "sudo").write_text(f'#!/bin/sh\necho "sudo $*" >> {log}\n')
    (bin_dir / "sleep").write_text(f'#!/bin/sh\necho "sleep $*" >> {log}\n')
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    hook = tmp_path / "poweroff"
    hook.write_text(CLOUDS[cloud].poweroff_hook())
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin"}
    result = subprocess.run(
        ["sh", str(hook)], env=env, capture_output=True, text=True, timeout=30, check=False
    )
    return result.stdout, log.read_text().splitlines() if log.exists() else []


METADATA = """
case "$*" in
  *instance/name) echo fr-dev-1a2b3c-node2 ;;
  *instance/zone) echo projects/123456789/zones/us-central1-a ;;
  *project/project-id) echo my-gcp-project ;;
  *token) echo '{"access_token":"ya29.test-token","expires_in":3599,"token_type":"Bearer"}' ;;
  *"-X DELETE"*) DELETE_RESULT ;;
esac
"""


def test_gcp_node_deletes_its_own_instance(tmp_path: Path) -> None:
    out, calls = _run_hook(
        "gcp", tmp_path, METADATA.replace("DELETE_RESULT", 'echo "{\\"kind\\": \\"operation\\"}"')
    )
    (delete,) = [c for c in calls if "-X DELETE" in c]
    assert "Authorization: Bearer ya29.test-token" in delete
    assert delete.endswith(
        "https://compute.googleapis.com/compute/v1/projects/my-gcp-project/zones/us-central1-a/instances/fr-dev-1a2b3c-node2"
    )
    assert "deleting instance fr-dev-1a2b3c-node2" in out
    # Shutdown only after the grace period, as a backstop (the delete goes on server-side).
    assert calls.index("sleep 60") < calls.index("sudo -n /sbin/shutdown -h now")


def test_gcp_node_shuts_down_when_the_delete_is_refused(tmp_path: Path) -> None:
    _out, calls = _run_hook("gcp", tmp_path, METADATA.replace("DELETE_RESULT", "exit 22"))  # curl -f on a 403
    assert any("-X DELETE" in c for c in calls) and "sleep 60" not in calls
    assert calls[-1] == "sudo -n /sbin/shutdown -h now"


def test_aws_node_shuts_down_which_terminates(tmp_path: Path) -> None:
    _out, calls = _run_hook("aws", tmp_path, "")
    assert calls == ["sudo -n /sbin/shutdown -h now"]
    assert "terminate" in CLOUDS["aws"].poweroff_hook()


# -- the leak audit ----------------------------------------------------------------------------------


class _Paginator:
    def __init__(self, pages: list[dict[str, Any]], seen: list[dict[str, Any]]) -> None:
        self.pages, self.seen = pages, seen

    def paginate(self, **kwargs: Any) -> list[dict[str, Any]]:
        self.seen.append(kwargs)
        return self.pages


class _Ec2:
    def __init__(self) -> None:
        self.filters: list[dict[str, Any]] = []
        self.pages = {
            "describe_instances": [
                {"Reservations": [{"Instances": [
                    {"InstanceId": "i-0aaa", "State": {"Name": "running"}, "InstanceType": "p4d.24xlarge",
                     "Placement": {"AvailabilityZone": "us-east-1a"}},
                ]}]},
                {"Reservations": [{"Instances": [
                    {"InstanceId": "i-0bbb", "State": {"Name": "stopped"}, "InstanceType": "p4d.24xlarge",
                     "Placement": {"AvailabilityZone": "us-east-1a"}},
                ]}]},
            ],
            "describe_volumes": [{"Volumes": [
                {"VolumeId": "vol-0ccc", "State": "available", "Size": 200, "AvailabilityZone": "us-east-1a"},
            ]}],
            "describe_network_interfaces": [{"NetworkInterfaces": [
                {"NetworkInterfaceId": "eni-0ddd", "Status": "available", "InterfaceType": "efa"},
            ]}],
        }  # fmt: skip

    def get_paginator(self, operation: str) -> _Paginator:
        return _Paginator(self.pages[operation], self.filters)

    def describe_addresses(self, **kwargs: Any) -> dict[str, Any]:
        self.filters.append(kwargs)
        return {"Addresses": [{"PublicIp": "3.4.5.6", "AllocationId": "eipalloc-0eee"}]}


def test_aws_audit_lists_instances_in_any_live_state_volumes_addresses_and_interfaces(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ec2 = _Ec2()
    sessions: list[dict[str, Any]] = []
    boto3 = ModuleType("boto3")

    def session(**kwargs: Any) -> Any:
        sessions.append(kwargs)
        return SimpleNamespace(client=lambda name: ec2)

    boto3.Session = session  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "boto3", boto3)
    found = CLOUDS["aws"].leftovers(ClusterLocation("aws", "fr-dev-1a2b3c", "us-east-1", profile="lab"))
    assert found == [
        "instance i-0aaa (running, p4d.24xlarge, us-east-1a)",
        "instance i-0bbb (stopped, p4d.24xlarge, us-east-1a)",
        "volume vol-0ccc (available, 200 GB, us-east-1a)",
        "address 3.4.5.6 (eipalloc-0eee, unattached)",
        "network interface eni-0ddd (available, efa)",
    ]
    assert sessions == [{"profile_name": "lab", "region_name": "us-east-1"}]
    tag = {"Name": "tag:fleetrun:cluster", "Values": ["fr-dev-1a2b3c"]}
    assert all(tag in call["Filters"] for call in ec2.filters) and len(ec2.filters) == 4
    states = [f for f in ec2.filters[0]["Filters"] if f["Name"] == "instance-state-name"][0]["Values"]
    assert "stopped" in states and "terminated" not in states


def test_aws_audit_asks_the_account_of_the_stacks_assumed_roles(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 24, item 1: a cluster built through aws:assumeRoles lives in the role's account; the
    audit must list that account, not the caller's (where it would find nothing)."""
    accounts: dict[str, _Ec2] = {"caller": _Ec2(), "222": _Ec2()}
    accounts["caller"].pages = {k: [{}] for k in accounts["caller"].pages}  # nothing in the caller's account
    sessions: list[dict[str, Any]] = []
    assumed: list[tuple[str, dict[str, Any]]] = []

    def session(**kwargs: Any) -> Any:
        sessions.append(kwargs)
        who = kwargs.get("aws_access_key_id") or "caller"

        def client(name: str, region_name: str | None = None) -> Any:
            if name == "sts":

                def assume_role(**call: Any) -> dict[str, Any]:
                    assumed.append((who, call))
                    account = call["RoleArn"].split(":")[4]
                    return {
                        "Credentials": {"AccessKeyId": account, "SecretAccessKey": "s", "SessionToken": "t"}
                    }

                return SimpleNamespace(assume_role=assume_role)
            return accounts[who] if who in accounts else _Ec2()

        return SimpleNamespace(client=client)

    boto3 = ModuleType("boto3")
    boto3.Session = session  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "boto3", boto3)
    roles = '[{"roleArn": "arn:aws:iam::111:role/hop"}, {"roleArn": "arn:aws:iam::222:role/deploy", "externalId": "x1"}]'
    location = ClusterLocation(
        "aws",
        "fr-dev-1a2b3c",
        "us-east-1",
        profile="lab",
        provider_config=(("assumeRoles", roles), ("profile", "lab")),
    )
    found = CLOUDS["aws"].leftovers(location)
    assert "instance i-0aaa (running, p4d.24xlarge, us-east-1a)" in found, "the role's account was listed"
    # the chain in order: the caller assumes the first role, that role the second
    assert [(who, call["RoleArn"]) for who, call in assumed] == [
        ("caller", "arn:aws:iam::111:role/hop"),
        ("111", "arn:aws:iam::222:role/deploy"),
    ]
    assert assumed[1][1]["ExternalId"] == "x1"
    assert sessions[0] == {"profile_name": "lab", "region_name": "us-east-1"}
    assert sessions[-1]["aws_access_key_id"] == "222" and sessions[-1]["region_name"] == "us-east-1"


def test_aws_audit_fails_when_the_role_cannot_be_assumed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Never a fallback to the caller's account: that would confirm an empty account."""

    def refuse(**_: Any) -> Any:
        raise RuntimeError("AccessDenied: not authorized to perform sts:AssumeRole")

    boto3 = ModuleType("boto3")
    boto3.Session = lambda **_: SimpleNamespace(  # type: ignore[attr-defined]
        client=lambda name, region_name=None: SimpleNamespace(assume_role=refuse) if name == "sts" else _Ec2()
    )
    monkeypatch.setitem(sys.modules, "boto3", boto3)
    location = ClusterLocation(
        "aws",
        "fr-x-1",
        "us-east-1",
        provider_config=(("assumeRole", '{"roleArn": "arn:aws:iam::222:role/d"}'),),
    )
    with pytest.raises(
        FleetrunError, match=r"assuming the stack's role arn:aws:iam::222:role/d failed.*AccessDenied"
    ):
        CLOUDS["aws"].leftovers(location)


def test_gcp_audit_lists_instances_in_any_status_disks_and_addresses(monkeypatch: pytest.MonkeyPatch) -> None:
    requests: list[Any] = []

    def client(attribute: str, items: dict[str, list[Any]]) -> Any:
        def aggregated_list(request: Any) -> list[tuple[str, Any]]:
            requests.append(request)
            return [(scope, SimpleNamespace(**{attribute: found})) for scope, found in items.items()]

        return lambda: SimpleNamespace(aggregated_list=aggregated_list)

    compute_v1 = ModuleType("google.cloud.compute_v1")
    for name in (
        "AggregatedListInstancesRequest",
        "AggregatedListDisksRequest",
        "AggregatedListAddressesRequest",
    ):
        setattr(compute_v1, name, lambda **kwargs: SimpleNamespace(**kwargs))
    compute_v1.InstancesClient = client("instances", {  # type: ignore[attr-defined]
        "zones/us-central1-a": [SimpleNamespace(name="fr-dev-1a2b3c-node0", status="TERMINATED")],
        "zones/us-central1-b": [],
    })  # fmt: skip
    compute_v1.DisksClient = client("disks", {  # type: ignore[attr-defined]
        "zones/us-central1-a": [SimpleNamespace(name="fr-dev-1a2b3c-node0", size_gb=200)],
    })  # fmt: skip
    compute_v1.AddressesClient = client("addresses", {  # type: ignore[attr-defined]
        "regions/us-central1": [SimpleNamespace(name="spare", address="34.1.2.3", status="RESERVED")],
    })  # fmt: skip
    google = ModuleType("google")
    cloud = ModuleType("google.cloud")
    cloud.compute_v1 = compute_v1  # type: ignore[attr-defined]
    google.cloud = cloud  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "google", google)
    monkeypatch.setitem(sys.modules, "google.cloud", cloud)
    monkeypatch.setitem(sys.modules, "google.cloud.compute_v1", compute_v1)
    found = CLOUDS["gcp"].leftovers(
        ClusterLocation("gcp", "fr-dev-1a2b3c", "us-central1", project="p-123456")
    )
    assert found == [
        "instance fr-dev-1a2b3c-node0 (TERMINATED, us-central1-a)",  # stopped: its disk still bills
        "disk fr-dev-1a2b3c-node0 (200 GB, us-central1-a)",
        "address spare 34.1.2.3 (RESERVED, us-central1)",
    ]
    assert {r.filter for r in requests} == {'labels.fleetrun-cluster = "fr-dev-1a2b3c"'}
    assert {r.project for r in requests} == {"p-123456"}


def test_audits_explain_a_missing_sdk(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "boto3", None)
    monkeypatch.setitem(sys.modules, "google.cloud", None)
    with pytest.raises(FleetrunError, match="boto3 is not installed"):
        CLOUDS["aws"].leftovers(ClusterLocation("aws", "fr-x-1", "us-east-1"))
    with pytest.raises(FleetrunError, match="google-cloud-compute is not installed"):
        CLOUDS["gcp"].leftovers(ClusterLocation("gcp", "fr-x-1", "us-central1", "p-123456"))


def test_importing_the_clouds_loads_no_cloud_sdk_or_pulumi() -> None:
    code = (
        "import sys, launch.fleets.clouds; "
        "bad = [m for m in ('pulumi', 'boto3', 'google.cloud') if m in sys.modules]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[2])


def test_gcp_node_refuses_odd_metadata_in_the_delete_url(tmp_path: Path) -> None:
    odd = METADATA.replace("echo my-gcp-project", "echo '../../x?y'").replace("DELETE_RESULT", "true")
    _out, calls = _run_hook("gcp", tmp_path, odd)
    assert not any("-X DELETE" in c for c in calls)
    assert calls[-1] == "sudo -n /sbin/shutdown -h now"
