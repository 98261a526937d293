"""A tiny DDP trainer that checkpoints and resumes through fleetrun's checkpoint helper, for the
recovery tests and bench (seconds per attempt, where the digits example takes longer).

Rank 0 writes ``$FLEETRUN_CHECKPOINT_DIR/step-<N>/`` every ``--ckpt-every`` steps and at the next
step after a SIGTERM (``fleetrun_checkpoint.should_save``); on start every rank resumes from the
checkpoint rank 0 finds (``FLEETRUN_RESUME_FROM``, its disk, the bucket), broadcast to the others.
Data is a function of (step, rank), so an attempt that resumes at step N trains on what the first
attempt would have. ``--fail-rank R --fail-step S``: global rank R exits 3 at step S, in every
attempt (a deterministic bug). ``--plant-at S --marker PATH`` (hostile, attempt 1 only): rank 1
plants checkpoints on its own node whose state file runs ``touch PATH`` when unpickled (a new
step 999999, with a sparse 64 GiB file beside it, and a forged copy of the last step saved),
then exits 1: a later attempt must refuse them and never create ``PATH``.
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
    p.add_argument("--plant-at", type=int, default=-1)
    p.add_argument("--marker", default="")
    return p.parse_args()


def batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(step * 1000 + rank)
    x = torch.randn(32, 8, generator=gen)
    y = x @ torch.arange(1.0, 9.0).unsqueeze(1) + 0.01 * torch.randn(32, 1, generator=gen)
    return x, y


class Poison:
    """Unpickled, runs ``touch <marker>``: what a load with ``weights_only=False`` would do."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, (f"touch {self.marker}",))


def plant(directory: str, step: int, marker: str, sparse_bytes: int = 0) -> None:
    """A checkpoint directory the helper's way (files, then a manifest that matches them), whose
    state file is a code-executing pickle; ``sparse_bytes``: a sparse file of that apparent size."""
    import json

    path = os.path.join(directory, f"step-{step}")
    os.makedirs(path, exist_ok=True)
    state = os.path.join(path, ckpt.STATE_FILE)
    torch.save({"model": {}, "step": step, "x": Poison(marker)}, state)
    files = {}
    with open(state, "rb") as fh:
        data = fh.read()
    files[ckpt.STATE_FILE] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    if sparse_bytes:
        with open(os.path.join(path, "big.bin"), "wb") as fh:
            fh.truncate(sparse_bytes)
        files["big.bin"] = {"size": sparse_bytes, "sha256": "0" * 64}
    with open(os.path.join(path, "MANIFEST.json"), "w") as fh:
        json.dump({"step": step, "files": files, "created": time.time()}, fh)


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
        if rank == 1 and step == args.plant_at and ckpt.attempt() == 1:
            last = step - step % args.ckpt_every
            plant(checkpoints.directory, 999999, args.marker, sparse_bytes=64 * 1024**3)
            plant(checkpoints.directory, last, args.marker)
            print(f"rank {rank}: planted poisoned checkpoints 999999 and {last}; failing", flush=True)
            os._exit(1)
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
            # a notice leaves 120 s (EC2): the upload of the step saved after it may queue behind a
            # periodic one, each a few aws CLI calls of seconds on a loaded node
            checkpoints.wait_uploaded(90)
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
