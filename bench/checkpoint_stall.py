"""Training time lost per checkpoint: the helper's save next to a plain ``torch.save`` (issue 19).

What a training step waits for when it checkpoints: ``fleetrun_checkpoint.save_training_state``
(state dict to a temporary directory, every file fsynced and hashed into the manifest, renamed
into place, the ``checkpoint_saved`` record) against ``torch.save`` of the same state to the same
disk, without and with an fsync (a plain save that survives a power-off). The helper's fsync and
hashing (the seal), the bucket upload and the laptop's peer copy run in the background and are
not part of it; the bench waits for the seal between rounds, as a checkpoint interval longer than
the seal does (a shorter one makes the next save wait for it). Medians of ``--repeat``
saves, interleaved (each kind goes first in turn) so a busy machine slows all three alike.

    /opt/fleetrun/image/venv/bin/python bench/checkpoint_stall.py [--mib 256] [--repeat 5]

Prints a table and writes ``bench/results/checkpoint_stall.json``: wall seconds (what the step
waits) and the calling thread's CPU seconds (what the training thread spends; steadier than wall
time on a busy machine, and the seal's thread is not in it). The state: an MLP of about
``--mib`` MiB of float32 parameters with SGD momentum (so about twice that on disk).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "launch" / "nodelib"))

import fleetrun_checkpoint as ckpt  # noqa: E402
import torch  # noqa: E402


def build(mib: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    width = 2048
    layers = max(1, (mib * 1024 * 1024) // (4 * width * width))
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    model(torch.randn(4, width)).sum().backward()
    optimizer.step()
    return model, optimizer


def plain(path: str, state: dict, fsync: bool) -> tuple[float, float]:
    """Wall and this thread's CPU seconds of one ``torch.save`` to a new file, with or without an
    fsync; the previous one is removed afterwards, untimed, as the helper's rotation (``keep=1``
    here) removes its previous step after the new one is in place: each holds two at most."""
    started, cpu = time.perf_counter(), time.thread_time()
    with open(path, "wb") as fh:
        torch.save(state, fh)
        if fsync:
            fh.flush()
            os.fsync(fh.fileno())
    took = time.perf_counter() - started, time.thread_time() - cpu
    previous = f"{path.rsplit('-', 1)[0]}-{int(path.rsplit('-', 1)[1].split('.')[0]) - 1}.pt"
    with contextlib.suppress(OSError):
        os.remove(previous)
    return took


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--dir", default="", help="the disk to measure (default: a temporary dir)")
    parser.add_argument("--out", default=str(REPO / "bench" / "results" / "checkpoint_stall.json"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    model, optimizer = build(args.mib)
    times: dict[str, list[float]] = {"torch.save": [], "torch.save + fsync": [], "helper save": []}
    cpu: dict[str, list[float]] = {name: [] for name in times}
    with tempfile.TemporaryDirectory(dir=args.dir or None) as tmp:
        cp = ckpt.Checkpointer(
            directory=os.path.join(tmp, "ckpt"),
            bucket=None,
            run_dir=tmp,
            resume_from="",
            rank=0,
            handle_sigterm=False,
            keep=1,
        )

        def helper(i: int) -> tuple[float, float]:
            started, thread_cpu = time.perf_counter(), time.thread_time()
            ckpt.save_training_state(i + 1, model, optimizer, checkpointer=cp)
            took = time.perf_counter() - started, time.thread_time() - thread_cpu
            cp.flush()  # the seal ends before the next save, as it does within a checkpoint interval
            return took

        for i in range(args.repeat + 1):  # the first round warms the page cache and allocator
            state = {"step": i, "model": model.state_dict(), "optimizer": optimizer.state_dict()}
            saves = {
                "torch.save": lambda i=i, state=state: plain(
                    os.path.join(tmp, f"plain-{i}.pt"), state, False
                ),
                "torch.save + fsync": lambda i=i, state=state: plain(
                    os.path.join(tmp, f"fsynced-{i}.pt"), state, True
                ),
                "helper save": lambda i=i: helper(i),
            }
            order = list(saves)[i % 3 :] + list(saves)[: i % 3]  # each goes first in turn
            took = {name: saves[name]() for name in order}
            if i:
                for name, (wall, used) in took.items():
                    times[name].append(wall)
                    cpu[name].append(used)
        size = os.path.getsize(os.path.join(tmp, f"plain-{args.repeat}.pt"))
    medians = {name: statistics.median(values) for name, values in times.items()}
    cpu_medians = {name: statistics.median(values) for name, values in cpu.items()}
    base, durable = medians["torch.save"], medians["torch.save + fsync"]
    load = os.getloadavg()[0]
    print(f"checkpoint of {size / 1024**2:.0f} MiB, medians of {args.repeat} (interleaved), load {load:.1f}")
    print(
        f"{'save':<22}{'wall s':>8}{'vs torch.save':>15}{'vs +fsync':>11}{'thread CPU s':>14}{'vs torch.save':>15}"
    )
    for name, value in medians.items():
        used = cpu_medians[name]
        print(
            f"{name:<22}{value:>8.3f}{value / base:>14.2f}x{value / durable:>10.2f}x"
            f"{used:>14.3f}{used / cpu_medians['torch.save']:>14.2f}x"
        )
    result = {
        "bench": "checkpoint_stall",
        "bytes": size,
        "repeat": args.repeat,
        "seconds": {k: [round(v, 4) for v in vals] for k, vals in times.items()},
        "median_s": {k: round(v, 4) for k, v in medians.items()},
        "thread_cpu_s": {k: [round(v, 4) for v in vals] for k, vals in cpu.items()},
        "median_thread_cpu_s": {k: round(v, 4) for k, v in cpu_medians.items()},
        "helper_cpu_vs_torch_save": round(cpu_medians["helper save"] / cpu_medians["torch.save"], 3),
        "helper_vs_torch_save": round(medians["helper save"] / base, 3),
        "helper_vs_torch_save_fsync": round(medians["helper save"] / durable, 3),
        "goal": "helper save <= 1.1x torch.save of the same state on the same node",
        "host": os.uname().nodename,
        "load_average": load,
        "time": time.time(),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
