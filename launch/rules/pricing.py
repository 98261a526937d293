"""Approximate on-demand prices of common GPU machine types, for cost estimates and caps.

APPROXIMATE LIST PRICES. The numbers below are public on-demand, Linux, per-hour list prices
in USD for one region (AWS ``us-east-1``, GCP ``us-central1``), as recorded in early 2025
(:data:`PRICES_AS_OF`). They are not what you pay: other regions, spot/preemptible capacity,
reservations, savings plans, committed-use discounts, disks, network egress and taxes all
differ, and clouds change prices (AWS cut P4/P5 on-demand prices in mid-2025, so the P4/P5
rows here are on the high side). A cost cap computed from an overestimate stops a run early
rather than late, which is the safe direction. For exact numbers set ``price_per_node_hour``
in the playbook's ``stop:`` section; it always wins over this table.

A local fleet, or a machine type not in the table, costs 0 here: the cost rule then cannot
fire, and :func:`launch.rules.stoprules.configuration_warnings` says so when a cap is configured.
Kept as a small literal table (no network, no SDK), so the launcher stays offline and testable.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

PRICES_AS_OF = "2025-01 (AWS us-east-1, GCP us-central1, on-demand Linux list prices)"


@dataclass(frozen=True)
class MachinePrice:
    """One machine type: its approximate on-demand USD/hour and what GPUs it carries."""

    cloud: Literal["aws", "gcp"]
    usd_per_hour: float
    gpus: int
    gpu: str


def _aws(usd: float, gpus: int, gpu: str) -> MachinePrice:
    return MachinePrice("aws", usd, gpus, gpu)


def _gcp(usd: float, gpus: int, gpu: str) -> MachinePrice:
    return MachinePrice("gcp", usd, gpus, gpu)


#: Approximate on-demand USD per node-hour; see the module docstring before trusting a digit.
PRICES: dict[str, MachinePrice] = {
    # AWS, us-east-1
    "g4dn.xlarge": _aws(0.526, 1, "T4"),
    "g4dn.2xlarge": _aws(0.752, 1, "T4"),
    "g4dn.12xlarge": _aws(3.912, 4, "T4"),
    "g4dn.metal": _aws(7.824, 8, "T4"),
    "g5.xlarge": _aws(1.006, 1, "A10G"),
    "g5.2xlarge": _aws(1.212, 1, "A10G"),
    "g5.4xlarge": _aws(1.624, 1, "A10G"),
    "g5.12xlarge": _aws(5.672, 4, "A10G"),
    "g5.48xlarge": _aws(16.288, 8, "A10G"),
    "g6.xlarge": _aws(0.8048, 1, "L4"),
    "g6.12xlarge": _aws(4.6016, 4, "L4"),
    "g6.48xlarge": _aws(13.3504, 8, "L4"),
    "g6e.xlarge": _aws(1.861, 1, "L40S"),
    "g6e.12xlarge": _aws(10.493, 4, "L40S"),
    "g6e.48xlarge": _aws(30.131, 8, "L40S"),
    "p3.2xlarge": _aws(3.06, 1, "V100"),
    "p3.8xlarge": _aws(12.24, 4, "V100"),
    "p3.16xlarge": _aws(24.48, 8, "V100"),
    "p3dn.24xlarge": _aws(31.212, 8, "V100"),
    "p4d.24xlarge": _aws(32.7726, 8, "A100-40GB"),
    "p4de.24xlarge": _aws(40.9657, 8, "A100-80GB"),
    "p5.48xlarge": _aws(98.32, 8, "H100"),
    "p5en.48xlarge": _aws(84.80, 8, "H200"),
    # GCP, us-central1 (GPU included in the machine type's price for these families)
    "g2-standard-4": _gcp(0.7068, 1, "L4"),
    "g2-standard-8": _gcp(0.8536, 1, "L4"),
    "g2-standard-24": _gcp(2.0008, 2, "L4"),
    "g2-standard-48": _gcp(4.0016, 4, "L4"),
    "g2-standard-96": _gcp(8.0032, 8, "L4"),
    "a2-highgpu-1g": _gcp(3.6733, 1, "A100-40GB"),
    "a2-highgpu-2g": _gcp(7.3466, 2, "A100-40GB"),
    "a2-highgpu-4g": _gcp(14.6932, 4, "A100-40GB"),
    "a2-highgpu-8g": _gcp(29.3864, 8, "A100-40GB"),
    "a2-megagpu-16g": _gcp(55.7395, 16, "A100-40GB"),
    "a2-ultragpu-1g": _gcp(5.0688, 1, "A100-80GB"),
    "a2-ultragpu-8g": _gcp(40.5504, 8, "A100-80GB"),
    "a3-highgpu-8g": _gcp(88.2539, 8, "H100"),
}


def lookup(instance_type: str | None) -> MachinePrice | None:
    """The table entry for a machine type (case-insensitive), or None when unknown."""
    if not instance_type:
        return None
    return PRICES.get(instance_type.strip().lower())


def price_per_node_hour(instance_type: str | None, override: float | None = None) -> float:
    """USD per node-hour: the playbook's override if given, else the table, else 0 (unknown).

    0 means "no estimate" (local fleet, unknown type), not "free": callers that cap cost
    must treat it as "cannot enforce".
    """
    if override is not None:
        return max(0.0, float(override))
    entry = lookup(instance_type)
    return entry.usd_per_hour if entry else 0.0


def cost_so_far(nodes: int, price: float, elapsed_s: float) -> float:
    """Estimated USD spent: ``nodes`` machines at ``price`` USD/hour for ``elapsed_s`` seconds.

    Clouds bill per second (after a minimum), so a linear estimate is close enough for a cap.
    """
    if nodes <= 0 or price <= 0 or elapsed_s <= 0:
        return 0.0
    return nodes * price * elapsed_s / 3600.0
