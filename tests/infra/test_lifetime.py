"""A kept-warm fleet's instance lifetime (``fleet:warm_until``) under Pulumi's mocks: exactly
what each cloud's program declares for it, that it reaches only the cluster's instances, and that
arming it changes no node (the ``pulumi up`` that arms it must not touch a running node)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from infra_cases import evaluate, settings_for
from pulumi.automation import ConfigValue

from fleetrun_contract.lifetime import parse_warm_until, warm_until_text
from infra.settings import ConfigError
from launch.fleets import cloud_stack

UNTIL = "2026-11-28T21:05:00Z"
NODE_TYPES = {"aws": "aws:ec2/instance:Instance", "gcp": "gcp:compute/instance:Instance"}


def test_aws_one_time_schedules_terminate_exactly_the_clusters_instances() -> None:
    snap = evaluate("aws", node_count="2", warm_until=UNTIL)
    ids = sorted(n["instance_id"] for n in snap.outputs["nodes"])
    arns = sorted(r.outputs["arn"] for r in snap.of_type(NODE_TYPES["aws"]))
    schedules = sorted(snap.of_type("aws:scheduler/schedule:Schedule"), key=lambda r: r.name)
    (role,) = [r for r in snap.of_type("aws:iam/role:Role") if r.name.endswith("-lifetime-role")]
    targeted = []
    for schedule in (r.inputs for r in schedules):
        assert schedule["scheduleExpression"] == "at(2026-11-28T21:05:00)"
        assert schedule["scheduleExpressionTimezone"] == "UTC"
        assert schedule["flexibleTimeWindow"] == {"mode": "OFF"}
        target = schedule["target"]
        assert target["arn"] == "arn:aws:scheduler:::aws-sdk:ec2:terminateInstances"
        assert target["roleArn"] == role.outputs["arn"]
        targeted += json.loads(target["input"])["InstanceIds"]
    assert sorted(targeted) == ids and len(ids) == 2  # one schedule per node, each its own instance
    trust = json.loads(role.inputs["assumeRolePolicy"])["Statement"]
    assert trust == [
        {
            "Effect": "Allow",
            "Principal": {"Service": "scheduler.amazonaws.com"},
            "Action": "sts:AssumeRole",
            "Condition": {"StringEquals": {"aws:SourceAccount": "123456789012"}},
        }
    ]
    (policy,) = [
        r for r in snap.of_type("aws:iam/rolePolicy:RolePolicy") if r.name.endswith("-lifetime-terminate")
    ]
    statements = json.loads(policy.inputs["policy"])["Statement"]
    assert [(s["Effect"], s["Action"], s["Resource"]) for s in statements] == [
        ("Allow", ["ec2:TerminateInstances"], arns)
    ]
    assert not any("*" in arn for arn in statements[0]["Resource"])
    assert policy.inputs["role"] == role.outputs.get("id", f"{role.name}-id")


def test_gcp_a_job_per_node_deletes_it_as_an_account_that_may_delete_only_those_nodes() -> None:
    snap = evaluate("gcp", node_count="2", warm_until=UNTIL)
    names = sorted(n["name"] for n in snap.outputs["nodes"])
    (account,) = [
        r for r in snap.of_type("gcp:serviceaccount/account:Account") if r.name.endswith("-lifetime-sa")
    ]
    email = account.outputs["email"]
    jobs = sorted(snap.of_type("gcp:cloudscheduler/job:Job"), key=lambda r: r.name)
    assert len(jobs) == 2
    for name, job in zip(names, jobs, strict=True):
        assert job.inputs["schedule"] == "5 21 28 11 *" and job.inputs["timeZone"] == "Etc/UTC"
        assert job.inputs["region"] == "us-central1" and job.inputs["project"] == "my-gcp-project"
        assert job.inputs["httpTarget"] == {
            "uri": f"https://compute.googleapis.com/compute/v1/projects/my-gcp-project/zones/us-central1-a/instances/{name}",
            "httpMethod": "DELETE",
            "oauthToken": {
                "serviceAccountEmail": email,
                "scope": "https://www.googleapis.com/auth/cloud-platform",
            },
        }
    grants = [
        r for r in snap.of_type("gcp:compute/instanceIAMMember:InstanceIAMMember") if "-lifetime-" in r.name
    ]
    role = snap.one("gcp:projects/iAMCustomRole:IAMCustomRole")
    assert sorted(g.inputs["instanceName"] for g in grants) == names
    assert {(g.inputs["member"], g.inputs["role"]) for g in grants} == {
        (f"serviceAccount:{email}", role.outputs["name"])
    }
    assert role.inputs["permissions"] == ["compute.instances.delete"]
    # granted per instance only: no project-wide binding for the lifetime's account
    assert not [r for r in snap.resources if r.typ.startswith("gcp:projects/iAM") and "Member" in r.typ]


@pytest.mark.parametrize("cloud", ["aws", "gcp"])
def test_no_lifetime_unless_warm_until_is_set(cloud: str) -> None:
    snap = evaluate(cloud, node_count="2")
    assert not [r for r in snap.resources if "-lifetime" in r.name]
    assert not {r.typ for r in snap.resources} & {
        "aws:scheduler/schedule:Schedule",
        "gcp:cloudscheduler/job:Job",
    }


@pytest.mark.parametrize("cloud", ["aws", "gcp"])
def test_arming_the_lifetime_changes_no_node_and_keeps_the_bucket(cloud: str) -> None:
    """The ``pulumi up`` that arms or disarms the lifetime updates no running node, and the
    data bucket is still retained by ``pulumi destroy``."""
    plain = evaluate(cloud, node_count="2")
    armed = evaluate(cloud, node_count="2", warm_until=UNTIL)
    nodes = {r.name: r.inputs for r in plain.of_type(NODE_TYPES[cloud])}
    assert nodes == {r.name: r.inputs for r in armed.of_type(NODE_TYPES[cloud])} and len(nodes) == 2
    declared = {(r.typ, r.name): r.inputs for r in plain.resources}
    assert set(declared) < {(r.typ, r.name) for r in armed.resources}
    assert all(declared[r.typ, r.name] == r.inputs for r in armed.resources if (r.typ, r.name) in declared)
    bucket = "aws:s3/bucket:Bucket" if cloud == "aws" else "gcp:storage/bucket:Bucket"
    assert armed.one(bucket).retain_on_delete


@pytest.mark.parametrize("cloud", ["aws", "gcp"])
def test_a_bad_warm_until_names_the_key(cloud: str) -> None:
    with pytest.raises(ConfigError) as caught:
        settings_for(cloud, warm_until="tomorrow at nine")
    assert caught.value.keys == ["warm_until"] and "2026-11-28T21:05:00Z" in str(caught.value)


def test_the_laptops_time_is_rounded_up_to_a_minute_the_program_reads() -> None:
    unix = parse_warm_until(UNTIL).timestamp()
    assert warm_until_text(unix) == UNTIL
    assert warm_until_text(unix - 59.5) == UNTIL  # never earlier than asked
    assert settings_for("aws", warm_until=warm_until_text(unix + 1)).warm_until == "2026-11-28T21:06:00Z"


class FakeStack:
    """The part of ``pulumi.automation.Stack`` that arming and disarming the lifetime uses."""

    def __init__(self, config: dict[str, str]) -> None:
        self.config = dict(config)
        self.calls: list[tuple[str, ...]] = []

    def get_all_config(self) -> dict[str, Any]:
        return {k: ConfigValue(v) for k, v in self.config.items()}

    def set_config(self, key: str, value: ConfigValue) -> None:
        self.calls.append(("set_config", key, value.value))
        self.config[key] = value.value

    def remove_config(self, key: str) -> None:
        self.calls.append(("remove_config", key))
        del self.config[key]

    def refresh(self, **_: Any) -> None:
        self.calls.append(("refresh",))

    def up(self, **_: Any) -> None:
        self.calls.append(("up",))


def test_the_laptop_arms_and_disarms_through_the_stack_config_without_a_refresh(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A refresh would drop nodes that already ended from the state, and this ``up`` would then
    create them again: arming is a config change and an ``up``, nothing else."""
    stack = FakeStack({"fleet:cloud": "gcp"})
    monkeypatch.setattr(cloud_stack, "_open_stack", lambda name, project_dir, create: stack)
    cloud_stack.set_warm_until("dev", UNTIL, on_output=lambda _: None)
    cloud_stack.set_warm_until("dev", None, on_output=lambda _: None)
    cloud_stack.set_warm_until("dev", None, on_output=lambda _: None)  # nothing armed: no update
    assert stack.calls == [
        ("set_config", "fleet:warm_until", UNTIL),
        ("up",),
        ("remove_config", "fleet:warm_until"),
        ("up",),
    ]
