"""GCP: the lifetime of a kept-warm fleet's instances, which the cloud keeps, not the nodes.

When ``fleet:warm_until`` is set (the laptop sets it when a run keeps the fleet warm:
``launch.fleets.stack_lifetime``), the program adds, per node, a Cloud Scheduler job that sends
``DELETE .../instances/<node>`` to the Compute Engine API at that minute (UTC), with an OAuth
token of a service account of its own. That account holds the cluster's custom role (only
``compute.instances.delete``) on each node's instance and nothing else; the nodes' own service
account has no Cloud Scheduler permission, so nothing on a node can move or pause the jobs.

Why not the instance's own ``scheduling.maxRunDuration`` / ``terminationTime`` (with
``instanceTerminationAction: DELETE``): Compute Engine applies a VM's scheduling only through
``instances.setScheduling``, which "you can only call on a stopped instance" (the API reference),
and the provider changes those fields by stopping and starting the VM. A kept-warm node is
running: stopping it to arm its lifetime would drop what is warm (the node's own timer, the
GPU driver state), may not get the GPU capacity back on start, and a stop clears the VM's
``terminationTimestamp`` anyway. A job that deletes a running VM needs no stop.

Delete, not stop: a stopped VM still bills for its disk and loses its ephemeral address, which is
what promise 2 forbids. Nothing is lost by it: the deadline is after the run ended and its
artifacts were pulled; the boot disk goes with the VM (auto-delete) and the bucket is retained
(``retain_on_delete``). The next ``fab up`` refreshes the stack and recreates deleted nodes.

A cron schedule names minute, hour, day and month but no year: the job would fire again a year
later. The laptop removes ``fleet:warm_until`` (and with it the jobs) when a run claims the fleet,
and ``pulumi destroy`` removes them with the stack when the fleet is torn down.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pulumi
import pulumi_gcp as gcp

from fleetrun_contract.lifetime import parse_warm_until

COMPUTE_API = "https://compute.googleapis.com/compute/v1"
CLOUD_PLATFORM_SCOPE = "https://www.googleapis.com/auth/cloud-platform"


def cron_at(warm_until: str) -> str:
    """``MINUTE HOUR DAY MONTH *`` of ``warm_until`` (read in the job's ``Etc/UTC`` time zone)."""
    when = parse_warm_until(warm_until)
    return f"{when.minute} {when.hour} {when.day} {when.month} *"


def delete_uri(project: str, zone: str, instance: str) -> str:
    return f"{COMPUTE_API}/projects/{project}/zones/{zone}/instances/{instance}"


@dataclass(frozen=True)
class GcpNodeLifetimeArgs:
    cluster_id: str
    warm_until: str
    """``fleet:warm_until`` (``2026-11-28T21:05:00Z``)."""
    project: str
    region: str
    zone: str
    instance_names: Sequence[pulumi.Output[str]]
    delete_role: pulumi.Input[str]
    """The cluster's custom role holding only ``compute.instances.delete``."""


class GcpNodeLifetime(pulumi.ComponentResource):
    """A service account that may delete the cluster's instances, one by one, and one Cloud
    Scheduler job per instance that deletes it at ``warm_until``."""

    def __init__(
        self, name: str, args: GcpNodeLifetimeArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("fleetrun:gcp:NodeLifetime", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        account = gcp.serviceaccount.Account(
            f"{name}-sa",
            account_id=f"{args.cluster_id}-lt"[:30],
            display_name=f"fleetrun {args.cluster_id} lifetime",
            description="Deletes the kept-warm nodes at fleet:warm_until (Cloud Scheduler); nothing else",
            project=args.project,
            opts=child,
        )
        member = account.email.apply(lambda e: f"serviceAccount:{e}")
        self.jobs: list[gcp.cloudscheduler.Job] = []
        for rank, instance in enumerate(args.instance_names):
            grant = gcp.compute.InstanceIAMMember(
                f"{name}-delete{rank}",
                instance_name=instance,
                zone=args.zone,
                project=args.project,
                role=args.delete_role,
                member=member,
                opts=child,
            )
            self.jobs.append(
                gcp.cloudscheduler.Job(
                    f"{name}-at{rank}",
                    description=f"fleetrun {args.cluster_id}: end node {rank} at {args.warm_until}",
                    project=args.project,
                    region=args.region,
                    schedule=cron_at(args.warm_until),
                    time_zone="Etc/UTC",
                    attempt_deadline="60s",
                    retry_config=gcp.cloudscheduler.JobRetryConfigArgs(
                        retry_count=5, min_backoff_duration="30s", max_backoff_duration="300s"
                    ),
                    http_target=gcp.cloudscheduler.JobHttpTargetArgs(
                        uri=pulumi.Output.from_input(instance).apply(
                            lambda n: delete_uri(args.project, args.zone, n)
                        ),
                        http_method="DELETE",
                        oauth_token=gcp.cloudscheduler.JobHttpTargetOauthTokenArgs(
                            service_account_email=account.email, scope=CLOUD_PLATFORM_SCOPE
                        ),
                    ),
                    # The account must be allowed to delete before the job can fire.
                    opts=pulumi.ResourceOptions(parent=self, depends_on=[grant]),
                )
            )
        self.register_outputs({"jobs": [job.name for job in self.jobs]})
