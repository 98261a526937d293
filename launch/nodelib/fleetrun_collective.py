"""``fab doctor --collective``'s test, run by torchrun on a group of nodes (one process per node).

A short matmul (this rank's GFLOP/s) and a short all-reduce (the group's bus bandwidth in GB/s,
as nccl-tests defines it: algorithm bandwidth x 2(n-1)/n), over gloo on CPU or NCCL on GPU, the
backends the job itself will use. Rank 0 prints one line ``FLEETRUN_COLLECTIVE {json}``; the
laptop parses it as untrusted input (``launch.rules.collective``). Sizes come from the
environment (``FLEETRUN_COLLECTIVE_MB``, ``FLEETRUN_COLLECTIVE_REPS``) so a test can keep it short.
"""

from __future__ import annotations

import datetime
import json
import os
import socket
import sys
import time

MARK = "FLEETRUN_COLLECTIVE "


def _sync(device) -> None:  # type: ignore[no-untyped-def]
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def matmul_gflops(device, n: int, reps: int) -> float:  # type: ignore[no-untyped-def]
    import torch

    a = torch.randn(n, n, device=device)
    b = torch.randn(n, n, device=device)
    (a @ b).sum().item()
    _sync(device)
    started = time.perf_counter()
    for _ in range(reps):
        c = a @ b
    _sync(device)
    elapsed = time.perf_counter() - started
    del c
    return 2.0 * n**3 * reps / elapsed / 1e9


def main() -> int:
    import torch
    import torch.distributed as dist

    gpu = torch.cuda.is_available()
    backend = "nccl" if gpu else "gloo"
    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local) if gpu else torch.device("cpu")
    if gpu:
        torch.cuda.set_device(device)
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=120))
    rank, world = dist.get_rank(), dist.get_world_size()
    size_mb = float(os.environ.get("FLEETRUN_COLLECTIVE_MB", "64" if gpu else "8"))
    reps = int(os.environ.get("FLEETRUN_COLLECTIVE_REPS", "10" if gpu else "4"))
    gflops = matmul_gflops(device, 4096 if gpu else 256, 20 if gpu else 5)
    tensor = torch.ones(max(1, int(size_mb * 2**20 / 4)), device=device)
    dist.all_reduce(tensor)  # warm-up: connections set up
    _sync(device)
    dist.barrier()
    started = time.perf_counter()
    for _ in range(reps):
        dist.all_reduce(tensor)
    _sync(device)
    elapsed = time.perf_counter() - started
    algbw = tensor.numel() * 4 * reps / elapsed / 1e9
    busbw = algbw * 2 * (world - 1) / world if world > 1 else algbw
    mine = {"host": socket.gethostname()[:255], "gflops": round(gflops, 3)}
    every = [None] * world
    dist.all_gather_object(every, mine)
    if rank == 0:
        result = {
            "backend": backend,
            "world": world,
            "bytes": tensor.numel() * 4,
            "reps": reps,
            "seconds": round(elapsed, 4),
            "busbw_gbps": round(busbw, 4),
            "ranks": every,
        }
        sys.stdout.write(MARK + json.dumps(result) + "\n")
        sys.stdout.flush()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
