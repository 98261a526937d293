"""torch.profiler for a range of steps, driven by the playbook's ``profile:``. Standard library only.

The metrics helper (``fleetrun_metrics.Metrics``) calls ``on_step`` every time the training loop
logs a step, on every rank, so a loop that already logs is profiled without a line changed. The
launchers export ``FLEETRUN_PROFILE_STEPS`` ("20-30", both ends included) and
``FLEETRUN_PROFILE_RANKS`` ("0,3"); a rank in that list starts ``torch.profiler`` once the step
before the range is logged (at once when the range starts at step 0 or 1) and, when the last step
of the range is logged, writes under ``$FLEETRUN_RUN_DIR/profile/`` (pulled with the run):

* ``trace-rank<R>-steps<A>-<B>.json``: the Chrome trace (chrome://tracing, ui.perfetto.dev);
* ``plugins/profile/<run id>/rank<R>.<ns>.pt.trace.json``: the same trace in TensorBoard's
  profiler layout (``torch.profiler.tensorboard_trace_handler``), so
  ``tensorboard --logdir <that node's profile folder>`` shows it;
* ``ops-rank<R>.txt``: the operators that took the most time, as a table.

torch is imported only when a profile starts, so the helper stays importable without it. Nothing
here may stop training: a profiler that cannot start or write leaves ``error-rank<R>.txt`` and the
run goes on. A trace over ``MAX_TRACE_BYTES`` is deleted (the note says so), since the pull and
the bucket upload take the run directory whole.
"""

from __future__ import annotations

import atexit
import os
import re
import shutil
import traceback
from typing import Any

ENV_STEPS = "FLEETRUN_PROFILE_STEPS"
ENV_RANKS = "FLEETRUN_PROFILE_RANKS"
MAX_TRACE_BYTES = 256 * 1024 * 1024
MAX_RANGE = 100
_STEPS_RE = re.compile(r"(\d{1,9})-(\d{1,9})")


def parse_steps(text: str) -> tuple[int, int] | None:
    """``"20-30"`` -> (20, 30); None for anything else (the playbook was validated; env may not be)."""
    match = _STEPS_RE.fullmatch(text.strip())
    if not match:
        return None
    first, last = int(match.group(1)), int(match.group(2))
    if last < first or last - first + 1 > MAX_RANGE:
        return None
    return first, last


def parse_ranks(text: str) -> frozenset:
    """``"0,3"`` -> {0, 3}; words that are not ranks are skipped."""
    return frozenset(int(word) for word in text.split(",")[:1024] if word.strip().isdigit())


def wanted(rank: int, environ: Any = None) -> tuple[int, int] | None:
    """The step range this rank profiles, or None (no profile asked, or not on this rank)."""
    environ = os.environ if environ is None else environ
    steps = parse_steps(environ.get(ENV_STEPS, ""))
    if steps is None or rank not in parse_ranks(environ.get(ENV_RANKS, "")):
        return None
    return steps


class StepProfiler:
    """One profile of steps ``first``..``last`` on one rank: waiting, then running, then done."""

    def __init__(self, first: int, last: int, rank: int, out_dir: str, run_id: str = "run") -> None:
        self.first, self.last, self.rank = first, last, rank
        self.out_dir = out_dir
        self.run_id = re.sub(r"[^A-Za-z0-9._-]", "_", run_id)[:200] or "run"
        self.state = "waiting"
        self.seen: int | None = None
        self.written: list = []
        self._prof: Any = None
        if first <= 1:  # no step before the range will be logged: the range starts now
            self._start(first)

    @property
    def chrome_path(self) -> str:
        return os.path.join(self.out_dir, f"trace-rank{self.rank}-steps{self.first}-{self.last}.json")

    def on_step(self, step: int) -> None:
        """The loop logged ``step`` (the same step may be logged again, e.g. with validation metrics)."""
        if self.state == "done" or (self.seen is not None and step <= self.seen):
            return
        self.seen = step
        if self.state == "waiting":
            if step >= self.last:
                self._note(
                    "error",
                    f"step {step} was logged before the profile of steps {self.first}-{self.last} "
                    "could start (the loop logs less often than every step?)",
                )
                self.state = "done"
            elif step + 1 >= self.first:
                self._start(step + 1)
            return
        if step >= self.last:
            self.stop()
        else:
            self._safely(self._prof.step)  # the next step's region ("ProfilerStep#<step + 1>") begins

    def stop(self) -> None:
        """Stop and write the trace (also at finish or exit, when the run ended inside the range)."""
        if self.state != "running":
            self.state = "done"
            return
        self.state = "done"
        self._safely(self._write)

    def _start(self, step: int) -> None:
        """Start recording; ``step`` is the one about to run (it names the first "ProfilerStep#")."""
        self.state = "done"  # unless the profiler really starts
        try:
            import torch
            from torch.profiler import ProfilerAction, ProfilerActivity, profile

            activities = [ProfilerActivity.CPU]
            if torch.cuda.is_available():
                activities.append(ProfilerActivity.CUDA)
            # A schedule that always records: only with a schedule does torch mark step regions.
            self._prof = profile(
                activities=activities,
                schedule=lambda _step: ProfilerAction.RECORD,
                record_shapes=False,
                with_stack=False,
            )
            self._prof.step_num = step  # step regions named by the loop's own step numbers
            self._prof.start()
        except Exception:  # noqa: BLE001 - training must go on without a profile
            self._note("error", "torch.profiler could not start:\n" + traceback.format_exc(limit=5))
            return
        self.state = "running"

    def _write(self) -> None:
        from torch.profiler import tensorboard_trace_handler

        prof = self._prof
        prof.stop()
        os.makedirs(self.out_dir, exist_ok=True)
        board = os.path.join(self.out_dir, "plugins", "profile", self.run_id)
        tensorboard_trace_handler(board, worker_name=f"rank{self.rank}")(prof)
        prefix = f"rank{self.rank}."
        traces = sorted(n for n in os.listdir(board) if n.startswith(prefix) and n.endswith(".pt.trace.json"))
        if not traces:
            raise RuntimeError(f"tensorboard_trace_handler wrote no trace into {board}")
        board_trace = os.path.join(board, traces[-1])
        size = os.path.getsize(board_trace)
        if size > MAX_TRACE_BYTES:
            os.unlink(board_trace)
            self._note(
                "error",
                f"the trace of steps {self.first}-{self.last} was {size} bytes, more than "
                f"{MAX_TRACE_BYTES}: deleted; profile fewer steps",
            )
            return
        shutil.copyfile(board_trace, self.chrome_path)
        table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=40)
        with open(os.path.join(self.out_dir, f"ops-rank{self.rank}.txt"), "w", encoding="utf-8") as fh:
            fh.write(f"# torch.profiler, rank {self.rank}, steps {self.first}-{self.last}\n{table}\n")
        self.written = [self.chrome_path, board_trace]

    def _safely(self, fn: Any) -> None:
        try:
            fn()
        except Exception:  # noqa: BLE001 - a failed profile is reported, never raised into training
            self.state = "done"
            self._note("error", "torch.profiler failed:\n" + traceback.format_exc(limit=5))

    def _note(self, kind: str, text: str) -> None:
        try:
            os.makedirs(self.out_dir, exist_ok=True)
            with open(os.path.join(self.out_dir, f"{kind}-rank{self.rank}.txt"), "a", encoding="utf-8") as fh:
                fh.write(text.rstrip() + "\n")
        except OSError:
            pass


_ACTIVE: dict = {}


def for_rank(rank: int, run_dir: str, environ: Any = None) -> StepProfiler | None:
    """The process's profiler for this rank (one per process, however many ``Metrics`` it makes)."""
    if rank in _ACTIVE:
        return _ACTIVE[rank]
    steps = wanted(rank, environ)
    profiler = None
    if steps is not None:
        environ = os.environ if environ is None else environ
        profiler = StepProfiler(
            steps[0], steps[1], rank, os.path.join(run_dir, "profile"), environ.get("FLEETRUN_RUN_ID", "run")
        )
        atexit.register(profiler.stop)  # a run that ends inside the range still leaves its trace
    _ACTIVE[rank] = profiler
    return profiler
