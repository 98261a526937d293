"""Shared helpers for the Pulumi program's tests: base configs and cached mock evaluations.

Evaluating the program under mocks costs ~10 ms per node, so each (cloud, nodes, variant) is
evaluated once per session and shared by the tests that inspect it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from infra.mocks import Snapshot, run_fleet
from infra.settings import FleetSettings, parse_settings

OPERATOR_CIDR = "81.2.69.142/32"


def aws_config(**overrides: Any) -> dict[str, Any]:
    return {
        "cloud": "aws",
        "region": "us-east-1",
        "node_count": "4",
        "machine_type": "p4d.24xlarge",
        "ssh_cidr": OPERATOR_CIDR,
        **overrides,
    }


def gcp_config(**overrides: Any) -> dict[str, Any]:
    return {
        "cloud": "gcp",
        "project": "my-gcp-project",
        "zone": "us-central1-a",
        "node_count": "4",
        "machine_type": "a2-highgpu-8g",
        "ssh_cidr": OPERATOR_CIDR,
        **overrides,
    }


CONFIGS: dict[str, Callable[..., dict[str, Any]]] = {"aws": aws_config, "gcp": gcp_config}


def settings_for(cloud: str, **overrides: Any) -> FleetSettings:
    return parse_settings(CONFIGS[cloud](**overrides), project="fleetrun", stack="test")


_CACHE: dict[tuple[Any, ...], Snapshot] = {}


def evaluate(cloud: str, **overrides: Any) -> Snapshot:
    """The program's resources and outputs for a config, evaluated once per session."""
    key = (cloud, tuple(sorted((k, str(v)) for k, v in overrides.items())))
    if key not in _CACHE:
        _CACHE[key] = run_fleet(settings_for(cloud, **overrides))
    return _CACHE[key]
