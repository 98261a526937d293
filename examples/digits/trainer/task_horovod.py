"""Train the digits MLP with Horovod: the same job as ``trainer.task``, for ``launcher: horovod``.

Run by fleetrun as ``horovodrun -np N -H ... `` (see playbooks/digits-horovod.yaml); also runs
alone (``python -m trainer.task_horovod``: Horovod makes a world of one). The Horovod way of doing
what ``trainer.task`` does with DDP:

* ``hvd.DistributedOptimizer`` averages gradients across ranks at each step (DDP's all-reduce);
* rank 0's initial parameters *and optimizer state* are broadcast, so every rank starts equal
  (DDP broadcasts parameters in its constructor; Horovod leaves it to the script);
* the loss logged is the all-rank average, written by rank 0 through fleetrun's metrics helper;
* at the end every rank's parameter checksum is gathered, so a run can prove the replicas agree;
* checkpoints and resume through fleetrun's checkpoint helper, as in ``trainer.task``: every
  ``--checkpoint-every`` steps and on SIGTERM or a preemption notice (any rank's stop stops every
  rank at the same step, agreed with a Horovod all-reduce), and a later attempt resumes mid-epoch
  from rank 0's newest checkpoint, broadcast to every rank.

The command-line flags are ``trainer.task``'s, including ``--fail-rank``/``--fail-step`` and
``--checkpoint-every``.
"""

from __future__ import annotations

import functools
import os
import socket
import sys
import time

import horovod.torch as hvd
import torch
from torch import nn
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from trainer.data import load_digits
from trainer.model import build_model
from trainer.task import (
    Metrics,
    checkpoint_or_stop,
    ckpt,
    evaluate,
    my_address,
    param_checksum,
    parse_args,
)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    hvd.init()
    rank, world = hvd.rank(), hvd.size()
    use_cuda = torch.cuda.is_available()
    if use_cuda:
        torch.cuda.set_device(hvd.local_rank())
    device = torch.device("cuda", torch.cuda.current_device()) if use_cuda else torch.device("cpu")
    metrics = Metrics(rank=rank)

    me = {
        "rank": rank,
        "host": socket.gethostname(),
        "addr": my_address(),
        "pid": os.getpid(),
        # Where horovodrun's remote start landed: the node's own job venv and workdir.
        "python": sys.executable,
        "cwd": os.getcwd(),
    }
    everyone = hvd.allgather_object(me)
    backend = "horovod-gloo" if hvd.gloo_enabled() else "horovod-mpi"
    metrics.event("world", world_size=world, backend=backend, ranks=everyone)

    torch.manual_seed(args.seed + rank)  # different on purpose: the broadcast below must equalise them
    train_set, test_set = load_digits(args.data_dir)
    sampler = DistributedSampler(train_set, num_replicas=world, rank=rank, shuffle=True, seed=args.seed)
    loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler)
    test_loader = DataLoader(test_set, batch_size=256)
    model = build_model(args.hidden).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    # Wrap first: DistributedOptimizer is a new optimizer over the same parameters and does not
    # carry the wrapped one's state over, so a resumed momentum buffer must be loaded into it.
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    checkpoints = ckpt.default()  # installs the SIGTERM handler: a stop asks for a checkpoint
    step, first_epoch, skip = 0, 0, 0
    resumed = ckpt.resume_training_state(model, optimizer)  # rank 0's checkpoint, on every rank
    if resumed is not None:
        step, first_epoch = int(resumed["step"]), int(resumed["epoch"])
        skip = int((resumed["sampler"] or {}).get("batches_done", 0))
        metrics.event(
            "resumed", step=step, epoch=first_epoch, source=resumed["source"], attempt=ckpt.attempt()
        )
        if rank == 0:
            print(f"resumed from step {step} (epoch {first_epoch}, {resumed['source']})", flush=True)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    loss_fn = nn.CrossEntropyLoss()

    def checkpoint(epoch: int, batches_done: int) -> None:
        sampler_state = {"epoch": epoch, "batches_done": batches_done, "seed": args.seed}
        ckpt.save_training_state(step, model, optimizer, epoch=epoch, sampler_state=sampler_state)
        metrics.event("checkpoint", step=step, epoch=epoch)

    started = time.time()
    for epoch in range(first_epoch, args.epochs):
        sampler.set_epoch(epoch)
        for batch, (x, y) in enumerate(loader):
            if epoch == first_epoch and batch < skip:
                continue  # these batches were trained on before the checkpoint
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
            step += 1
            if rank == args.fail_rank and step >= args.fail_step:
                print(f"rank {rank}: failing on purpose at step {step}", flush=True)
                os._exit(3)
            reduced = hvd.allreduce(loss.detach(), name="loss", op=hvd.Average)
            metrics.log(step=step, loss=float(reduced), epoch=epoch, lr=args.lr)
            checkpoint_or_stop(
                checkpoints, metrics, args, rank, step, functools.partial(checkpoint, epoch, batch + 1)
            )
            if args.step_sleep:
                time.sleep(args.step_sleep)
        val_loss, val_acc = evaluate(model, test_loader)
        metrics.log(step=step, val_loss=val_loss, val_accuracy=val_acc, epoch=epoch)
        if rank == 0:
            print(
                f"epoch {epoch}: step {step} loss {float(loss.detach()):.4f} val_loss {val_loss:.4f} val_acc {val_acc:.3f}",
                flush=True,
            )

    checksums = hvd.allgather_object(param_checksum(model))
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
    hvd.barrier()
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
