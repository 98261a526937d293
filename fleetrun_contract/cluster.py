"""How a fleetrun cluster is named and marked, known alike to the program that creates it and to
the launcher that confirms it is gone.

The cluster id is derived from the Pulumi project and stack names, not read from the stack's
state, so ``fab down`` can list a cluster's instances by tag even after a failed ``up`` exported
nothing. That only works while both sides compute it the same way and look for the same tag.
"""

from __future__ import annotations

import hashlib
import re

PROJECT_NAME = "fleetrun"
"""The Pulumi project name (``name:`` in ``Pulumi.yaml``, checkout or materialised); part of every cluster id."""

AWS_CLUSTER_TAG = "fleetrun:cluster"
"""AWS tag on every resource of a cluster; the teardown check and the watchdog's IAM condition use it."""
AWS_RANK_TAG = "fleetrun:node-rank"
GCP_CLUSTER_LABEL = "fleetrun-cluster"
"""GCP label on every resource of a cluster; the teardown check lists instances by it."""
GCP_RANK_LABEL = "fleetrun-node-rank"


def cluster_id_for(project: str, stack: str) -> str:
    """A short id, stable for a stack and distinct between stacks, valid as a GCP label value.

    Stable so that tags, the watchdog's IAM condition and bucket names are known at preview.
    """
    slug = re.sub(r"[^a-z0-9]+", "-", stack.lower()).strip("-")[:16].strip("-") or "stack"
    digest = hashlib.sha256(f"{project}/{stack}".encode()).hexdigest()[:6]
    return f"fr-{slug}-{digest}"


_AWS_ZONE = re.compile(r"^([a-z]{2}(-gov)?-[a-z]+-\d)")
_GCP_ZONE = re.compile(r"^([a-z]+-[a-z]+\d+)-([a-z])$")


def aws_region_of(zone: str) -> str:
    """``us-east-1`` for ``us-east-1a`` (or a Local/Wavelength zone of it); unknown shapes as given."""
    match = _AWS_ZONE.match(zone)
    return match.group(1) if match else zone


def gcp_region_of(zone: str) -> str:
    """``us-central1`` for ``us-central1-a``; unknown shapes as given."""
    match = _GCP_ZONE.match(zone)
    return match.group(1) if match else zone


def nodes_component_type(cloud: str) -> str:
    """The Pulumi type of the component holding a cloud's node resources (instances, their
    addresses and per-node grants). ``fab up`` destroys exactly this subtree of a failed partial
    fleet before trying the next zone; the Pulumi programs register their nodes under it."""
    return f"fleetrun:{cloud}:GpuNodes"
