"""Fault injection on a local fleet, shared by tests/test_faults.py and bench/fault_latency.py."""

from __future__ import annotations

import io
import json
import os
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

from rich.console import Console

from launch.cli import app
from launch.fleets.local import LocalFleet
from launch.run.summary import RunResult


class _Stamped(io.StringIO):
    """Console text, each line also appended with the time to ``FLEETRUN_TEST_SAY`` (a file):
    where a slow fleet test spends its time, when one is measured."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path

    def write(self, text: str) -> int:
        stamp = time.strftime("%H:%M:%S")
        with open(self.path, "a") as fh:
            fh.writelines(f"{stamp} {line}\n" for line in text.splitlines() if line.strip())
        return super().write(text)


def quiet() -> Console:
    path = os.environ.get("FLEETRUN_TEST_SAY")
    return Console(file=_Stamped(path) if path else io.StringIO(), width=200, force_terminal=False)


def wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def is_step_record(line: bytes) -> bool:
    """A metric record of a training step: not an event, even one with a ``step`` field (the
    checkpoint helper's ``checkpoint_resumed`` event, written before the first step, has one)."""
    try:
        record = json.loads(line)
    except (ValueError, RecursionError):  # a hostile job's line (a nesting bomb) is no step
        return False
    return isinstance(record, dict) and "event" not in record and isinstance(record.get("step"), int)


def first_metrics(fleet: LocalFleet) -> bool:
    """Rank 0 has logged a training step (not just the world or the resume event): a fault made
    before it lands in the job's start-up, where other rules apply (``startup_timeout_s``)."""
    return any(
        is_step_record(line)
        for user in fleet.existing_users()
        for p in Path(f"/home/{user}/.fleetrun/runs").glob("*/metrics.jsonl")
        for line in p.read_bytes().splitlines()
    )


TORCHRUN_MODULES = ("torch.distributed.run", "fleetrun_torchrun")
"""torchrun's agent, as ``rank_start: exec`` or ``fork`` runs it (a forked rank's command line is
its own: ``python -u -m trainer.task``)."""


def worker_pids(user: str, job: str = "trainer.task") -> list[int]:
    """The training workers of a node running ``job`` (a module or script name on their command
    line), not torchrun's agent, which names it too."""
    out = subprocess.run(["pgrep", "-u", user, "-f", job], capture_output=True, text=True).stdout.split()
    pids = []
    for pid in out:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        if not any(launcher in cmd for launcher in TORCHRUN_MODULES):
            pids.append(int(pid))
    return pids


def first_worker(user: str, job: str = "trainer.task", wait_s: float = 120) -> int:
    """A training worker of ``user``'s node, waited for: another node's rank may have logged its
    first step before this one exists (a forked rank starts once its own agent has imported and
    preloaded what it forks from, which takes longer on a loaded machine)."""
    wait_for(lambda: bool(worker_pids(user, job)), wait_s, f"a rank of {job} on {user}")
    return worker_pids(user, job)[0]


def run_with_fault(
    playbook: Path,
    fleet: LocalFleet,
    fault: Callable[[], None] | None,
    on_fault: Callable[[float], None] | None = None,
    poll_interval: float = 0.5,
) -> RunResult:
    """``fab train`` in a thread; the fault is applied once rank 0 has logged metrics."""
    box: dict[str, object] = {}

    def target() -> None:
        try:
            box["result"] = app.train(
                playbook,
                inventory=f"local:{fleet.prefix}",
                console=quiet(),
                poll_interval=poll_interval,
                ask_on_interrupt=False,
            )
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test thread
            box["error"] = exc

    thread = threading.Thread(target=target)
    thread.start()
    if fault is not None:
        wait_for(lambda: first_metrics(fleet) or not thread.is_alive(), 180, "the first metrics")
        if on_fault is not None:
            on_fault(time.time())
        fault()
    thread.join(600)
    assert not thread.is_alive(), "fab train did not finish"
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    result = box["result"]
    assert isinstance(result, RunResult)
    return result
