"""A tiny DDP trainer that checkpoints and resumes through fleetrun's checkpoint helper, for the
recovery tests and bench (seconds per attempt, where the digits example takes longer).

Rank 0 writes ``$FLEETRUN_CHECKPOINT_DIR/step-<N>/`` every ``--ckpt-every`` steps and at the next
step after a SIGTERM (``fleetrun_checkpoint.should_save``); on start every rank resumes from the
checkpoint rank 0 finds (``FLEETRUN_RESUME_FROM``, its disk, the bucket), broadcast to the others.
Data is a function of (step, rank), so an attempt that resumes at step N trains on what the first
attempt would have. ``--fail-rank R --fail-step S``: global rank R exits 3 at step S, in every
attempt (a deterministic bug).
"""

from __future__ import annotations

import argparse
import datetime
import gc
import hashlib
import os
import sys
import time

import fleetrun_checkpoint as ckpt
import torch
import torch.distributed as dist
from fleetrun_metrics import Metrics
from torch import nn


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--ckpt-every", type=int, default=5)
    p.add_argument("--step-sleep", type=float, default=0.2)
    p.add_argument("--fail-rank", type=int, default=-1)
    p.add_argument("--fail-step", type=int, default=-1)
    return p.parse_args()


def batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(step * 1000 + rank)
    x = torch.randn(32, 8, generator=gen)
    y = x @ torch.arange(1.0, 9.0).unsqueeze(1) + 0.01 * torch.randn(32, 1, generator=gen)
    return x, y


def checksum(model: nn.Module) -> str:
    digest = hashlib.sha256()
    for p in model.parameters():
        digest.update(p.detach().numpy().tobytes())
    return digest.hexdigest()[:16]


def main() -> int:
    args = parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
    rank, world = dist.get_rank(), dist.get_world_size()
    metrics = Metrics(rank=rank)
    torch.manual_seed(0)
    model = nn.Linear(8, 1)
    ddp = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)
    checkpoints = ckpt.default()  # installs the SIGTERM handler
    resumed = ckpt.resume_training_state(model, optimizer)
    start = int(resumed["step"]) if resumed is not None else 0
    source = resumed["source"] if resumed is not None else "none"
    metrics.event("world", world_size=world, attempt=ckpt.attempt(), resumed_from=start, source=source)
    print(
        f"rank {rank}: attempt {ckpt.attempt()}, world {world}, resuming at step {start} ({source})",
        flush=True,
    )

    loss_fn = nn.MSELoss()
    for step in range(start + 1, args.steps + 1):
        x, y = batch(step, rank)
        optimizer.zero_grad()
        loss = loss_fn(ddp(x), y)
        loss.backward()
        optimizer.step()
        if rank == args.fail_rank and step == args.fail_step:
            print(f"rank {rank}: failing on purpose at step {step}", flush=True)
            os._exit(3)
        reduced = loss.detach().clone()
        dist.all_reduce(reduced)
        metrics.log(step=step, loss=float(reduced) / world, attempt=ckpt.attempt())
        stop = checkpoints.should_save(everywhere=True)
        if stop or step % args.ckpt_every == 0:
            ckpt.save_training_state(step, model, optimizer)
        if stop:
            checkpoints.wait_uploaded(30)
            print(f"rank {rank}: stop requested, checkpointed at step {step}", flush=True)
            sys.stdout.flush()
            os._exit(143)
        time.sleep(args.step_sleep)

    sums: list[str | None] = [None] * world
    dist.all_gather_object(sums, checksum(model))
    metrics.finish("succeeded", message=f"{args.steps} steps", world_size=world, param_checksums=sums)
    # As trainer.task does: drop DDP's reducer (it holds the process group) and collect it now, so
    # the group closes here, not during interpreter shutdown, where gloo's threads can fail the exit.
    del ddp, optimizer
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
