"""Named cluster tiers, in the spirit of Cloud ML Engine's scale tiers (BASIC_GPU, STANDARD_1...).

A preset is a set of default config values for each cloud: ``fleet:preset: multi-node`` expands
into ``node_count``, ``machine_type`` (and GCP's accelerator keys) before validation, and any key
set explicitly in the stack config wins over the preset. Pure data: no Pulumi import.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Preset:
    name: str
    description: str
    common: Mapping[str, Any]
    """Values for every cloud (node count, disk size)."""
    per_cloud: Mapping[str, Mapping[str, Any]]
    """Values for one cloud (machine type, accelerator); a cloud missing here has no such tier."""

    def values_for(self, cloud: str) -> dict[str, Any] | None:
        if cloud not in self.per_cloud:
            return None
        return {**self.common, **self.per_cloud[cloud]}


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset(
            "cpu-smoke",
            "2 CPU nodes: try the whole up/train/down path for cents before paying for GPUs",
            {"node_count": 2, "disk_size_gb": 150},
            {"aws": {"machine_type": "m5.xlarge"}, "gcp": {"machine_type": "e2-standard-4"}},
        ),
        Preset(
            "basic-gpu",
            "1 node with 1 GPU (L4): debugging, notebooks, small fine-tunes",
            {"node_count": 1},
            {"aws": {"machine_type": "g6.xlarge"}, "gcp": {"machine_type": "g2-standard-8"}},
        ),
        Preset(
            "multi-gpu",
            "1 node with 8 A100s: single-node data parallel training",
            {"node_count": 1},
            {"aws": {"machine_type": "p4d.24xlarge"}, "gcp": {"machine_type": "a2-highgpu-8g"}},
        ),
        Preset(
            "multi-node",
            "4 nodes with 8 A100s each (32 GPUs), placed close together",
            {"node_count": 4},
            {"aws": {"machine_type": "p4d.24xlarge"}, "gcp": {"machine_type": "a2-highgpu-8g"}},
        ),
        Preset(
            "multi-node-h100",
            "4 nodes with 8 H100s each (32 GPUs), placed close together",
            {"node_count": 4},
            {"aws": {"machine_type": "p5.48xlarge"}, "gcp": {"machine_type": "a3-highgpu-8g"}},
        ),
    )
}


def describe_presets() -> str:
    return "; ".join(f"{p.name} ({p.description})" for p in PRESETS.values())
