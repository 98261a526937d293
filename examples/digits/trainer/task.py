"""Train an MLP on handwritten digits with DistributedDataParallel.

Run by fleetrun as ``torchrun ... -m trainer.task --epochs 5``; also runs alone (world size 1).
Logs through fleetrun's metrics helper (rank 0 writes), records which host each rank ran on,
and saves the final model to ``$FLEETRUN_OUTPUT_DIR``. ``--fail-rank``/``--fail-step`` make one
rank exit non-zero on purpose, to exercise failure handling.

Checkpoints through fleetrun's checkpoint helper: every ``--checkpoint-every`` steps (default
``$FLEETRUN_CHECKPOINT_EVERY``, 0 = only when asked), and at the next step once any rank got
SIGTERM or its node a preemption notice (then every rank exits with 143 after the checkpoint is
in the bucket). A later attempt resumes mid-epoch from the newest checkpoint: model, optimizer,
epoch and step, the position in the epoch's batches, and the RNG.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import gc
import hashlib
import os
import socket
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from trainer.data import load_digits
from trainer.model import build_model

try:
    import fleetrun_checkpoint as ckpt
    from fleetrun_metrics import Metrics
except ImportError:  # outside fleetrun: the helpers live in fleetrun's launch/nodelib
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "launch", "nodelib"))
    import fleetrun_checkpoint as ckpt
    from fleetrun_metrics import Metrics

STOPPED_FOR_CHECKPOINT = 143
"""Exit code after a checkpoint asked for by SIGTERM or a preemption notice (128 + SIGTERM)."""


def checkpoint_or_stop(
    checkpoints: Any, metrics: Any, args: argparse.Namespace, rank: int, step: int, save: Callable[[], None]
) -> None:
    """After each step: ``save()`` every ``--checkpoint-every`` steps, and on a stop (any rank's
    SIGTERM or a preemption notice, agreed by every rank so they all save the same step), then
    exit 143 once the checkpoint is in the bucket (or 60 s passed). Shared with task_horovod."""
    stop = checkpoints.should_save(everywhere=True)
    if stop or (args.checkpoint_every and step % args.checkpoint_every == 0):
        save()
    if stop:
        durable = checkpoints.wait_uploaded(timeout=60)
        metrics.event("stopped_for_checkpoint", step=step, uploaded=durable)
        print(f"rank {rank}: checkpoint at step {step} after a stop request; exiting", flush=True)
        sys.stdout.flush()
        os._exit(STOPPED_FOR_CHECKPOINT)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=32, help="per process")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data-dir", default=os.environ.get("FLEETRUN_DATA_DIR"))
    p.add_argument(
        "--step-sleep", type=float, default=0.0, help="seconds to sleep per step (slows a demo down)"
    )
    p.add_argument("--fail-rank", type=int, default=-1, help="this global rank exits with code 3 ...")
    p.add_argument("--fail-step", type=int, default=5, help="... at this step")
    p.add_argument("--nan-at-step", type=int, default=-1, help="from this step on, the logged loss is NaN")
    p.add_argument("--timeout", type=float, default=60.0, help="collective timeout in seconds")
    p.add_argument(
        "--checkpoint-every",
        type=int,
        default=int(os.environ.get("FLEETRUN_CHECKPOINT_EVERY", "0") or 0),
        help="steps between checkpoints (0: only on SIGTERM or a preemption notice)",
    )
    return p.parse_args(argv)


def my_address() -> str:
    iface_ip = os.environ.get("FLEETRUN_NODE_IPS", "").split(",")
    rank = int(os.environ.get("FLEETRUN_NODE_RANK", "-1"))
    if 0 <= rank < len(iface_ip) and iface_ip[rank]:
        return iface_ip[rank]
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "unknown"


def param_checksum(model: nn.Module) -> str:
    digest = hashlib.sha256()
    for p in model.parameters():
        digest.update(p.detach().cpu().numpy().tobytes())
    return digest.hexdigest()[:16]


def evaluate(model: nn.Module, loader: DataLoader) -> tuple[float, float]:
    model.eval()
    total, correct, loss_sum = 0, 0, 0.0
    loss_fn = nn.CrossEntropyLoss(reduction="sum")
    with torch.no_grad():
        for x, y in loader:
            out = model(x)
            loss_sum += float(loss_fn(out, y))
            correct += int((out.argmax(dim=1) == y).sum())
            total += len(y)
    model.train()
    return loss_sum / max(total, 1), correct / max(total, 1)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    distributed = "WORLD_SIZE" in os.environ and "RANK" in os.environ and "LOCAL_RANK" in os.environ
    use_cuda = torch.cuda.is_available()
    if distributed:
        backend = "nccl" if use_cuda else "gloo"
        if use_cuda:
            torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        dist.init_process_group(backend=backend, timeout=datetime.timedelta(seconds=args.timeout))
        rank, world = dist.get_rank(), dist.get_world_size()
    else:
        backend, rank, world = "none", 0, 1
    device = torch.device("cuda", torch.cuda.current_device()) if use_cuda else torch.device("cpu")
    metrics = Metrics(rank=rank)

    me = {"rank": rank, "host": socket.gethostname(), "addr": my_address(), "pid": os.getpid()}
    everyone: list[dict] = [me]
    if distributed:
        gathered: list[dict | None] = [None] * world
        dist.all_gather_object(gathered, me)
        everyone = [g for g in gathered if g is not None]
    metrics.event("world", world_size=world, backend=backend, ranks=everyone)

    torch.manual_seed(args.seed)
    train_set, test_set = load_digits(args.data_dir)
    sampler = DistributedSampler(train_set, num_replicas=world, rank=rank, shuffle=True, seed=args.seed)
    loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler)
    test_loader = DataLoader(test_set, batch_size=256)
    model = build_model(args.hidden).to(device)
    # exact_allreduce: a resumed run ends bit-identical to an uninterrupted one on any number of ranks
    ddp = ckpt.exact_allreduce(DistributedDataParallel(model)) if distributed else model
    optimizer = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()

    checkpoints = ckpt.default()  # installs the SIGTERM handler: a stop asks for a checkpoint
    step, first_epoch, skip = 0, 0, 0
    resumed = ckpt.resume_training_state(model, optimizer)  # before any step: DDP synced already
    if resumed is not None:
        step, first_epoch = int(resumed["step"]), int(resumed["epoch"])
        skip = int((resumed["sampler"] or {}).get("batches_done", 0))
        metrics.event(
            "resumed", step=step, epoch=first_epoch, source=resumed["source"], attempt=ckpt.attempt()
        )
        if rank == 0:
            print(f"resumed from step {step} (epoch {first_epoch}, {resumed['source']})", flush=True)

    def checkpoint(epoch: int, batches_done: int) -> None:
        sampler_state = {"epoch": epoch, "batches_done": batches_done, "seed": args.seed}
        ckpt.save_training_state(step, model, optimizer, epoch=epoch, sampler_state=sampler_state)
        metrics.event("checkpoint", step=step, epoch=epoch)

    started = time.time()
    last_loss = float("nan")
    for epoch in range(first_epoch, args.epochs):
        sampler.set_epoch(epoch)
        for batch, (x, y) in enumerate(loader):
            if epoch == first_epoch and batch < skip:
                continue  # these batches were trained on before the checkpoint
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            loss = loss_fn(ddp(x), y)
            loss.backward()
            optimizer.step()
            step += 1
            if rank == args.fail_rank and step >= args.fail_step:
                print(f"rank {rank}: failing on purpose at step {step}", flush=True)
                os._exit(3)
            reduced = loss.detach().clone()
            if distributed:
                dist.all_reduce(reduced)
                reduced /= world
            if 0 <= args.nan_at_step <= step:
                reduced = reduced * float("nan")  # a diverged run, as the stop rules see it
            last_loss = float(reduced)
            metrics.log(step=step, loss=last_loss, epoch=epoch, lr=args.lr)
            checkpoint_or_stop(
                checkpoints, metrics, args, rank, step, functools.partial(checkpoint, epoch, batch + 1)
            )
            if args.step_sleep:
                time.sleep(args.step_sleep)
        val_loss, val_acc = evaluate(model, test_loader)
        metrics.log(step=step, val_loss=val_loss, val_accuracy=val_acc, epoch=epoch)
        if rank == 0:
            print(
                f"epoch {epoch}: step {step} loss {last_loss:.4f} val_loss {val_loss:.4f} val_acc {val_acc:.3f}",
                flush=True,
            )

    checksum = param_checksum(model)
    checksums = [checksum]
    if distributed:
        gathered_sums: list[str | None] = [None] * world
        dist.all_gather_object(gathered_sums, checksum)
        checksums = [c for c in gathered_sums if c is not None]
    if rank == 0:
        out_dir = os.environ.get("FLEETRUN_OUTPUT_DIR", "outputs")
        os.makedirs(out_dir, exist_ok=True)
        torch.save(model.state_dict(), os.path.join(out_dir, "model.pt"))
    metrics.finish(
        "succeeded",
        message=f"{args.epochs} epochs in {time.time() - started:.1f} s",
        world_size=world,
        param_checksums=checksums,
    )
    if distributed:
        # DDP's reducer holds the process group: drop it first, so the group really closes
        # here and not during interpreter shutdown, where gloo's threads can abort the process.
        del ddp, optimizer
        gc.collect()
        dist.barrier()
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
