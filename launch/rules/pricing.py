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
What a machine type *is* (its GPUs, their model) is known in one place only, the clouds' catalogs
in ``infra/clouds/*_catalog.py``; a test checks that every priced type is one of theirs.
"""

from __future__ import annotations

PRICES_AS_OF = "2025-01 (AWS us-east-1, GCP us-central1, on-demand Linux list prices)"


#: Approximate on-demand USD per node-hour; see the module docstring before trusting a digit.
PRICES: dict[str, float] = {
    # AWS, us-east-1
    "g4dn.xlarge": 0.526,
    "g4dn.2xlarge": 0.752,
    "g4dn.12xlarge": 3.912,
    "g4dn.metal": 7.824,
    "g5.xlarge": 1.006,
    "g5.2xlarge": 1.212,
    "g5.4xlarge": 1.624,
    "g5.12xlarge": 5.672,
    "g5.48xlarge": 16.288,
    "g6.xlarge": 0.8048,
    "g6.12xlarge": 4.6016,
    "g6.48xlarge": 13.3504,
    "g6e.xlarge": 1.861,
    "g6e.12xlarge": 10.493,
    "g6e.48xlarge": 30.131,
    "p3.2xlarge": 3.06,
    "p3.8xlarge": 12.24,
    "p3.16xlarge": 24.48,
    "p3dn.24xlarge": 31.212,
    "p4d.24xlarge": 32.7726,
    "p4de.24xlarge": 40.9657,
    "p5.48xlarge": 98.32,
    "p5en.48xlarge": 84.80,
    # GCP, us-central1 (GPU included in the machine type's price for these families)
    "g2-standard-4": 0.7068,
    "g2-standard-8": 0.8536,
    "g2-standard-24": 2.0008,
    "g2-standard-48": 4.0016,
    "g2-standard-96": 8.0032,
    "a2-highgpu-1g": 3.6733,
    "a2-highgpu-2g": 7.3466,
    "a2-highgpu-4g": 14.6932,
    "a2-highgpu-8g": 29.3864,
    "a2-megagpu-16g": 55.7395,
    "a2-ultragpu-1g": 5.0688,
    "a2-ultragpu-8g": 40.5504,
    "a3-highgpu-8g": 88.2539,
}


def lookup(instance_type: str | None) -> float | None:
    """The USD/hour of a machine type (case-insensitive), or None when unknown."""
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
    return entry if entry is not None else 0.0


def cost_so_far(nodes: int, price: float, elapsed_s: float) -> float:
    """Estimated USD spent: ``nodes`` machines at ``price`` USD/hour for ``elapsed_s`` seconds.

    Clouds bill per second (after a minimum), so a linear estimate is close enough for a cap.
    """
    if nodes <= 0 or price <= 0 or elapsed_s <= 0:
        return 0.0
    return nodes * price * elapsed_s / 3600.0
