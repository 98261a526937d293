"""AWS: the lifetime of a kept-warm fleet's instances, which the cloud keeps, not the nodes.

When ``fleet:warm_until`` is set (the laptop sets it when a run keeps the fleet warm:
``launch.fleets.stack_lifetime``), the program adds, per node, an EventBridge Scheduler one-time
schedule, ``at(<warm_until>)`` in UTC, whose universal target is ``ec2:TerminateInstances`` for
that node's instance id, and one role they run as: assumable by ``scheduler.amazonaws.com`` for
this account only, allowed ``ec2:TerminateInstances`` on the cluster's instances' ARNs and
nothing else (no wildcard resource). One schedule per node, not one for all: TerminateInstances
fails whole when one id is unknown (a node that ended itself over an hour before), which would
leave the others running. Nothing on a node can change the schedule: the node role has no
EventBridge or IAM permission.

Terminate, not stop: a stopped instance still bills for its root volume (and an Elastic IP),
which is what promise 2 forbids. Nothing is lost by it: the deadline is after the run ended and
its artifacts were pulled (a blocked pull is never kept warm); the bucket is retained
(``retain_on_delete``) and is not a target. The next ``fab up`` refreshes the stack and
recreates terminated nodes, with their pinned host keys.

No node input depends on ``warm_until`` (tests compare the nodes with and without it), so the
``pulumi up`` that arms or disarms the lifetime changes only these three resources.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_aws as aws

from fleetrun_contract.lifetime import parse_warm_until

SCHEDULER_PRINCIPAL = "scheduler.amazonaws.com"
TERMINATE_ACTION = "ec2:TerminateInstances"


def terminate_target(partition: str) -> str:
    """EventBridge Scheduler's universal target for the EC2 API's TerminateInstances."""
    return f"arn:{partition}:scheduler:::aws-sdk:ec2:terminateInstances"


def at_expression(warm_until: str) -> str:
    """``at(2026-11-28T21:05:00)``: a one-time schedule, read in ``schedule_expression_timezone``."""
    return f"at({parse_warm_until(warm_until).strftime('%Y-%m-%dT%H:%M:%S')})"


def arn_parts(instance_arns: Sequence[str]) -> tuple[str, str]:
    """(partition, account) of the instances: ``arn:PARTITION:ec2:REGION:ACCOUNT:instance/ID``."""
    parts = instance_arns[0].split(":")
    return parts[1], parts[4]


def trust_policy(account: str) -> dict[str, Any]:
    """Only EventBridge Scheduler, and only for schedules of this account (the confused deputy)."""
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Principal": {"Service": SCHEDULER_PRINCIPAL},
                "Action": "sts:AssumeRole",
                "Condition": {"StringEquals": {"aws:SourceAccount": account}},
            }
        ],
    }


def terminate_policy(instance_arns: Sequence[str]) -> dict[str, Any]:
    """Terminate these instances, by ARN: no other instance, no other action."""
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "TerminateThisClustersInstances",
                "Effect": "Allow",
                "Action": [TERMINATE_ACTION],
                "Resource": sorted(instance_arns),
            }
        ],
    }


@dataclass(frozen=True)
class AwsNodeLifetimeArgs:
    cluster_id: str
    warm_until: str
    """``fleet:warm_until`` (``2026-11-28T21:05:00Z``)."""
    instance_ids: Sequence[pulumi.Output[str]]
    instance_arns: Sequence[pulumi.Output[str]]
    tags: Mapping[str, str]


class AwsNodeLifetime(pulumi.ComponentResource):
    """One-time schedules that terminate the cluster's instances at ``warm_until``, one per node."""

    def __init__(
        self, name: str, args: AwsNodeLifetimeArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("fleetrun:aws:NodeLifetime", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        arns = pulumi.Output.all(*args.instance_arns)
        role = aws.iam.Role(
            f"{name}-role",
            description=f"fleetrun {args.cluster_id}: EventBridge Scheduler terminates the kept-warm nodes",
            assume_role_policy=arns.apply(lambda a: json.dumps(trust_policy(arn_parts(a)[1]))),
            tags=dict(args.tags),
            opts=child,
        )
        policy = aws.iam.RolePolicy(
            f"{name}-terminate",
            role=role.id,
            policy=arns.apply(lambda a: json.dumps(terminate_policy(a))),
            opts=child,
        )
        partition = arns.apply(lambda a: terminate_target(arn_parts(a)[0]))
        self.schedules: list[aws.scheduler.Schedule] = []
        for rank, instance_id in enumerate(args.instance_ids):
            self.schedules.append(
                aws.scheduler.Schedule(
                    f"{name}-at{rank}",
                    description=f"fleetrun {args.cluster_id}: end node {rank} at {args.warm_until}",
                    schedule_expression=at_expression(args.warm_until),
                    schedule_expression_timezone="UTC",
                    flexible_time_window=aws.scheduler.ScheduleFlexibleTimeWindowArgs(mode="OFF"),
                    target=aws.scheduler.ScheduleTargetArgs(
                        arn=partition,
                        role_arn=role.arn,
                        input=instance_id.apply(lambda i: json.dumps({"InstanceIds": [i]})),
                        retry_policy=aws.scheduler.ScheduleTargetRetryPolicyArgs(
                            maximum_event_age_in_seconds=86400, maximum_retry_attempts=185
                        ),
                    ),
                    # The role must allow the call before the schedule fires (it is checked then).
                    opts=pulumi.ResourceOptions(parent=self, depends_on=[policy]),
                )
            )
        self.register_outputs({"schedules": [x.arn for x in self.schedules], "role": role.arn})
