"""Agreeing across the ranks of a job: one integer all-reduced, under torchrun or horovodrun.

The checkpoint helper needs two agreements: "did any rank get a stop?" (every rank then saves at
the same step) and "which step is whole on every rank?" (sharded resume). Under torchrun they go
through torch.distributed; under horovodrun there is no torch process group and they go through
Horovod. Standard library otherwise: torch and Horovod are used only when the job loaded them.
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["across_ranks", "any_rank", "horovod", "smallest_across_ranks"]


def any_rank(flag: bool) -> bool:
    """True on every rank when it is true on any."""
    return across_ranks(1 if flag else 0, "max", "fleetrun.should_save") > 0


def smallest_across_ranks(value: int) -> int:
    """The smallest of every rank's ``value`` (the value itself outside a distributed job)."""
    return across_ranks(value, "min", "fleetrun.agree")


def across_ranks(value: int, op: str, name: str) -> int:
    """All-reduce one integer with ``op`` (min/max): torch.distributed's, or Horovod's when the
    job runs under horovodrun (no torch process group there); ``value`` when neither is up."""
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        return value
    tensor = torch.tensor([value], dtype=torch.int64)
    if dist.is_available() and dist.is_initialized():
        if dist.get_backend() == "nccl":
            tensor = tensor.cuda()
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.MIN)
        return int(tensor.item())
    hvd = horovod()
    if hvd is not None:
        return int(hvd.allreduce(tensor, name=name, op=hvd.Max if op == "max" else hvd.Min).item())
    return value


def horovod() -> Any:
    """``horovod.torch`` when the job imported it and called ``hvd.init()``, else None. Never
    imports Horovod itself: a torchrun job must not pay for (or fail on) a Horovod import."""
    hvd = sys.modules.get("horovod.torch")
    try:
        return hvd if hvd is not None and hvd.is_initialized() else None
    except Exception:  # noqa: BLE001 - an odd Horovod build: behave as without it
        return None
