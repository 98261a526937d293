"""What an inventory says about where its machines came from: pure, typed, frozen data.

An ``Inventory`` carries one of these as ``fleet``. Only fleetrun's own state can produce a
``LocalFleetRef`` or a ``StackFleetRef`` (the local fleet's inventory file, a stack's outputs);
a lab inventory file always loads as ``LabFleet`` (``launch.fleets.kinds.lab``). The field
``kind`` is the discriminator and the registry key (``launch.fleets.kinds.registry``).

Imports nothing from fleetrun, so ``launch.job.inventory`` can import it without a cycle.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

PREFIX_PATTERN = r"^[a-z][a-z0-9]{0,5}\z"
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}\z"
BUCKET_PATTERN = r"^[a-z0-9][a-z0-9._-]{1,221}[a-z0-9]\z"
_OCTET = r"(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
LOCAL_ENDPOINT_PATTERN = rf"^http://(127\.{_OCTET}|198\.1[89])\.{_OCTET}\.{_OCTET}:[1-9][0-9]{{0,4}}\z"
"""A local fleet's S3 endpoint: http on loopback or 198.18.0.0/15 (the range reserved for network
tests, where local fleets live), with a port: never an address outside this machine's tests."""


class _Ref(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LabFleet(_Ref):
    """A lab's own machines (a hosts.yaml): fleetrun stops its processes, never the machines."""

    kind: Literal["lab"] = "lab"


class LocalFleetRef(_Ref):
    """The local fleet (network-namespace nodes on this machine) named by ``prefix``.

    ``bucket`` and ``s3_endpoint``: an S3-compatible server on this machine that the nodes use as
    their bucket (``fab local.up --bucket`` starts the fleet's own: the bucket path without a
    cloud); the endpoint must be a plain http URL on loopback or the local fleets' test range
    198.18.0.0/15, so a local fleet never sends its runs anywhere else. ``preemption_poller``: the
    watchdog polls that notice (``fab local.up --spot``: a metadata endpoint at 169.254.169.254
    inside every node, ``launch.fleets.local.spot``); "" (the default) for none.
    """

    kind: Literal["local"] = "local"
    prefix: str = Field(pattern=PREFIX_PATTERN)
    bucket: str | None = Field(default=None, pattern=BUCKET_PATTERN)
    s3_endpoint: str | None = Field(default=None, pattern=LOCAL_ENDPOINT_PATTERN)
    preemption_poller: Literal["", "ec2-imdsv2", "gce-metadata"] = ""


class StackFleetRef(_Ref):
    """A Pulumi stack's cluster. ``stack`` is None when the inventory came from an outputs file
    (then fleetrun cannot destroy it: ``fab down --stack NAME`` can)."""

    kind: Literal["stack"] = "stack"
    stack: str | None = Field(default=None, pattern=NAME_PATTERN)
    cluster_id: str = Field(pattern=NAME_PATTERN)
    cloud: Literal["aws", "gcp"]
    bucket: str | None = Field(default=None, pattern=BUCKET_PATTERN)


FleetRef = Annotated[LabFleet | LocalFleetRef | StackFleetRef, Field(discriminator="kind")]
