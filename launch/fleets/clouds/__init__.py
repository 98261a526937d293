"""Everything cloud-specific on the laptop side, one module per cloud behind ``CloudOps``.

``CLOUDS["aws"]`` / ``CLOUDS["gcp"]`` answer what the rest of ``launch`` must not decide by
switching on a cloud's name: which tag marks a cluster's resources, what is still billing after a
teardown (the leak audit), how a node copies its run directory to the bucket, how a node ends its
own billing (the watchdog's power-off hook), and what a provider error means for ``fab up``'s
zone failover. The modules import only the standard library and the shared contract (fleetrun_contract) at import
time; boto3 and google-cloud-compute load inside ``leftovers``, when a teardown is checked.

The tag/label keys come from ``fleetrun_contract.cluster``, the one place the Pulumi programs
take them from too, so what the audit looks for is what the program wrote.
"""

from __future__ import annotations

from launch.fleets.clouds.aws import AWS
from launch.fleets.clouds.base import (  # noqa: F401 - the package's names
    CloudOps,
    ClusterLocation,
    ErrorKind,
    classify,
    fill,
    missing_sdk,
)
from launch.fleets.clouds.gcp import GCP

CLOUDS: dict[str, CloudOps] = {ops.name: ops for ops in (AWS, GCP)}
