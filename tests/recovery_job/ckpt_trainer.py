"""A tiny DDP trainer that checkpoints and resumes, for the recovery tests and bench.

Checkpoints follow the layout fleetrun's checkpoint helper uses: ``$FLEETRUN_CHECKPOINT_DIR/
step-<N>/`` holding ``state.pt`` and ``MANIFEST.json`` {"step", "files": {name: {size, sha256}}},
written to a temporary directory, fsynced and renamed, so a directory with a manifest whose sizes
match is complete. Every node's local rank 0 writes one (the parameters are identical on every
rank under DDP), so a node's loss never takes the only copy with it. On start, every rank finds its
node's newest complete checkpoint (or ``$FLEETRUN_RESUME_FROM``), the ranks agree on the newest one
anywhere, and its holder broadcasts it: a fresh replacement node resumes like the others.

Data is a function of (step, rank), so an attempt that resumes at step N trains on what the
first attempt would have. ``--fail-rank R --fail-step S``: global rank R exits 3 at step S, in every
attempt (a deterministic bug).
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import io
import json
import os
import shutil
import signal
import sys
import time

import torch
import torch.distributed as dist
from fleetrun_metrics import Metrics
from torch import nn

STOP = {"requested": False}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--ckpt-every", type=int, default=5)
    p.add_argument("--keep", type=int, default=3)
    p.add_argument("--step-sleep", type=float, default=0.2)
    p.add_argument("--fail-rank", type=int, default=-1)
    p.add_argument("--fail-step", type=int, default=-1)
    return p.parse_args()


def sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def complete(path: str) -> int | None:
    """The step of a complete checkpoint directory, else None."""
    try:
        with open(os.path.join(path, "MANIFEST.json"), encoding="utf-8") as fh:
            manifest = json.load(fh)
        for name, info in manifest["files"].items():
            if os.path.getsize(os.path.join(path, name)) != info["size"]:
                return None
        return int(manifest["step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def latest(root: str) -> tuple[int, str] | None:
    resume = os.environ.get("FLEETRUN_RESUME_FROM")
    if resume and complete(resume) is not None:
        return complete(resume), resume  # type: ignore[return-value]
    found = []
    for name in os.listdir(root) if os.path.isdir(root) else []:
        step = complete(os.path.join(root, name)) if name.startswith("step-") else None
        if step is not None:
            found.append((step, os.path.join(root, name)))
    return max(found) if found else None


def save(root: str, step: int, state: dict, keep: int) -> None:
    final = os.path.join(root, f"step-{step}")
    if os.path.isdir(final):
        return
    tmp = os.path.join(root, f".tmp-step-{step}-{os.getpid()}")
    os.makedirs(tmp, exist_ok=True)
    path = os.path.join(tmp, "state.pt")
    with open(path, "wb") as fh:
        torch.save(state, fh)
        fh.flush()
        os.fsync(fh.fileno())
    manifest = {"step": step, "files": {"state.pt": {"size": os.path.getsize(path), "sha256": sha256(path)}}}
    with open(os.path.join(tmp, "MANIFEST.json"), "w", encoding="utf-8") as fh:
        json.dump(manifest, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.rename(tmp, final)
    steps = sorted(s for s in (complete(os.path.join(root, n)) for n in os.listdir(root)) if s is not None)
    for old in steps[:-keep]:
        shutil.rmtree(os.path.join(root, f"step-{old}"), ignore_errors=True)


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
    signal.signal(signal.SIGTERM, lambda *_: STOP.update(requested=True))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    root = os.environ["FLEETRUN_CHECKPOINT_DIR"]
    os.makedirs(root, exist_ok=True)
    attempt = int(os.environ.get("FLEETRUN_ATTEMPT", "1"))
    metrics = Metrics(rank=rank)
    torch.manual_seed(0)
    model = nn.Linear(8, 1)
    ddp = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)

    mine = latest(root)
    steps: list[int | None] = [None] * world
    dist.all_gather_object(steps, mine[0] if mine else -1)
    best = max(s for s in steps if s is not None)
    start = 0
    if best >= 0:
        holder = steps.index(best)
        box: list[object] = [None]
        if rank == holder:
            assert mine is not None
            with open(os.path.join(mine[1], "state.pt"), "rb") as fh:
                box[0] = fh.read()
        dist.broadcast_object_list(box, src=holder)
        state = torch.load(io.BytesIO(box[0]), weights_only=True)  # type: ignore[arg-type]
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = int(state["step"])
    metrics.event("world", world_size=world, attempt=attempt, resumed_from=start)
    print(f"rank {rank}: attempt {attempt}, world {world}, resuming at step {start}", flush=True)

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
        metrics.log(step=step, loss=float(reduced) / world, attempt=attempt)
        if local_rank == 0 and (step % args.ckpt_every == 0 or STOP["requested"]):
            save(
                root,
                step,
                {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step},
                args.keep,
            )
        if STOP["requested"]:
            print(f"rank {rank}: stop requested, checkpointed at step {step}", flush=True)
            return 0
        time.sleep(args.step_sleep)

    sums: list[str | None] = [None] * world
    dist.all_gather_object(sums, checksum(model))
    metrics.finish(
        "succeeded", message=f"{args.steps} steps", world_size=world, param_checksums=sums, attempt=attempt
    )
    del ddp
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
