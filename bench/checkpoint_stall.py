"""Training time lost per checkpoint: the helper's save next to a plain ``torch.save`` (issue 19).

What a training step waits for when it checkpoints: ``fleetrun_checkpoint.save_training_state``
(state dict to a temporary directory, every file fsynced and hashed into the manifest, renamed
into place, the ``checkpoint_saved`` record) against ``torch.save`` of the same state to the same
disk, without and with an fsync (a plain save that survives a power-off). The helper's fsync and
hashing (the seal), the bucket upload and the laptop's peer copy run in the background and are
not part of it; the bench waits for the seal between rounds, as a checkpoint interval longer than
the seal does (a shorter one makes the next save wait for it). Medians of ``--repeat``
saves, interleaved (plain, plain+fsync, helper) so a busy machine slows all three alike.

    /opt/fleetrun/image/venv/bin/python bench/checkpoint_stall.py [--mib 256] [--repeat 5]

Prints a table and writes ``bench/results/checkpoint_stall.json``. The state: an MLP of about
``--mib`` MiB of float32 parameters with SGD momentum (so about twice that on disk).
"""

from __future__ import annotations

import argparse
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


def plain(path: str, state: dict, fsync: bool) -> float:
    started = time.perf_counter()
    with open(path, "wb") as fh:
        torch.save(state, fh)
        if fsync:
            fh.flush()
            os.fsync(fh.fileno())
    return time.perf_counter() - started


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
    with tempfile.TemporaryDirectory(dir=args.dir or None) as tmp:
        cp = ckpt.Checkpointer(
            directory=os.path.join(tmp, "ckpt"),
            bucket=None,
            run_dir=tmp,
            resume_from="",
            rank=0,
            handle_sigterm=False,
        )
        for i in range(args.repeat + 1):  # the first round warms the page cache and allocator
            state = {"step": i, "model": model.state_dict(), "optimizer": optimizer.state_dict()}
            a = plain(os.path.join(tmp, "plain.pt"), state, fsync=False)
            b = plain(os.path.join(tmp, "plain-fsync.pt"), state, fsync=True)
            started = time.perf_counter()
            ckpt.save_training_state(i + 1, model, optimizer, checkpointer=cp)
            c = time.perf_counter() - started
            cp.flush()  # the seal ends before the next round, as it does within a checkpoint interval
            if i:
                for name, value in zip(times, (a, b, c), strict=True):
                    times[name].append(value)
        size = os.path.getsize(os.path.join(tmp, "plain.pt"))
    medians = {name: statistics.median(values) for name, values in times.items()}
    base, durable = medians["torch.save"], medians["torch.save + fsync"]
    print(f"checkpoint of {size / 1024**2:.0f} MiB, medians of {args.repeat} (interleaved)")
    print(f"{'save':<22}{'seconds':>10}{'vs torch.save':>16}{'vs +fsync':>12}")
    for name, value in medians.items():
        print(f"{name:<22}{value:>10.3f}{value / base:>15.2f}x{value / durable:>11.2f}x")
    result = {
        "bench": "checkpoint_stall",
        "bytes": size,
        "repeat": args.repeat,
        "seconds": {k: [round(v, 4) for v in vals] for k, vals in times.items()},
        "median_s": {k: round(v, 4) for k, v in medians.items()},
        "helper_vs_torch_save": round(medians["helper save"] / base, 3),
        "helper_vs_torch_save_fsync": round(medians["helper save"] / durable, 3),
        "goal": "helper save <= 1.1x torch.save of the same state on the same node",
        "host": os.uname().nodename,
        "load_average": os.getloadavg()[0],
        "time": time.time(),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
