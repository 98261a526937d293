"""A torch-free stand-in trainer for fleet tests whose subject is not training: stop rules,
teardown, the watcher and watchdog, pulls, records, queueing, hooks.

Why: under torchrun every rank of the digits example imports torch (seconds of CPU each on a
small machine) and loads its data before the first step; this one starts in a fraction of a
second. It writes what a trainer writes through fleetrun's node library, so the laptop sees the
same things: metric records (``fleetrun_metrics``: ``metrics.jsonl`` on rank 0, every rank's
pace), the ``world`` event, ``status.json`` at the end, and, with ``--checkpoint-every``, real
checkpoints through ``fleetrun_checkpoint.save`` (SIGTERM or a preemption notice: a checkpoint at
the next step, then exit 143, as the digits trainer does).

There is no collective: ranks do not wait for each other, so a test about a rank blocked by a
stopped peer (a stall) or about recovered training state needs a real torch trainer.

The loss is a function of the step and ``--lr`` (``1 / (1 + lr * step)``: ``--lr 0`` never
improves, a plateau); ``--nan-at-step S`` logs NaN from step S on; ``--fail-rank R --fail-step S``:
global rank R exits 3 at step S; ``--hold-until PATH``: after step 1 is logged, wait until PATH
exists (at most 300 s), so a test can keep a run going until it has done what must overlap it,
whatever the machine's load. ``--steps 100000 --later-attempts N``: the first attempt goes on
until fleetrun stops it (as ranks stuck in a collective with a lost peer do), the next ones end N
steps past where they resume. Rank 0 writes ``$FLEETRUN_OUTPUT_DIR/final.json`` at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time

import fleetrun_checkpoint as ckpt
from fleetrun_metrics import Metrics

STOPPED_FOR_CHECKPOINT = 143
"""Exit code after a checkpoint asked for by SIGTERM or a preemption notice (128 + SIGTERM)."""


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--step-sleep", type=float, default=0.05, help="seconds per step")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--nan-at-step", type=int, default=-1)
    p.add_argument("--fail-rank", type=int, default=-1)
    p.add_argument("--fail-step", type=int, default=5)
    p.add_argument("--checkpoint-every", type=int, default=0, help="0: only on SIGTERM or a notice")
    p.add_argument("--hold-until", default="", help="after step 1, wait until this file exists")
    p.add_argument(
        "--later-attempts",
        type=int,
        default=0,
        help="attempt 2 and later: stop this many steps past the step it starts from (0: at --steps)",
    )
    return p.parse_args()


def loss_at(step: int, lr: float) -> float:
    return 1.0 / (1.0 + lr * step)


def main() -> int:
    args = parse_args()
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    metrics = Metrics(rank=rank)
    checkpoints = ckpt.default()  # installs the SIGTERM handler: a stop asks for a checkpoint
    step = 0
    found = checkpoints.latest()
    if found is not None:
        with open(found.file("state.json"), encoding="utf-8") as fh:
            step = int(json.load(fh)["step"])
        metrics.event("resumed", step=step, source=found.source, attempt=ckpt.attempt())
    if args.later_attempts and ckpt.attempt() > 1:
        args.steps = step + args.later_attempts
    metrics.event("world", world_size=world, ranks=[{"rank": rank, "host": socket.gethostname()}])
    print(f"rank {rank}: world {world}, starting after step {step}", flush=True)

    def save() -> None:
        def write(folder: str) -> None:
            with open(os.path.join(folder, "state.json"), "w", encoding="utf-8") as fh:
                json.dump({"step": step}, fh)

        checkpoints.save(step, write)
        metrics.event("checkpoint", step=step)

    while step < args.steps:
        step += 1
        if rank == args.fail_rank and step >= args.fail_step:
            print(f"rank {rank}: failing on purpose at step {step}", flush=True)
            os._exit(3)
        loss = float("nan") if 0 <= args.nan_at_step <= step else loss_at(step, args.lr)
        metrics.log(step=step, loss=loss, lr=args.lr)
        stop = checkpoints.should_save()
        if stop or (args.checkpoint_every and step % args.checkpoint_every == 0):
            save()
        if stop:
            checkpoints.wait_uploaded(timeout=60)
            print(f"rank {rank}: checkpoint at step {step} after a stop request; exiting", flush=True)
            sys.stdout.flush()
            os._exit(STOPPED_FOR_CHECKPOINT)
        if step == 1 and args.hold_until:
            held_until = time.monotonic() + 300
            while not os.path.exists(args.hold_until) and time.monotonic() < held_until:
                time.sleep(0.2)
        time.sleep(args.step_sleep)

    if rank == 0:
        out_dir = os.environ.get("FLEETRUN_OUTPUT_DIR", "outputs")
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, "final.json"), "w", encoding="utf-8") as fh:
            json.dump({"step": step, "loss": loss_at(step, args.lr)}, fh)
    metrics.finish("succeeded", message=f"{args.steps} steps", world_size=world)
    return 0


if __name__ == "__main__":
    sys.exit(main())
