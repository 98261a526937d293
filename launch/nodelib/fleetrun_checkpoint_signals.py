"""The checkpoint helper's stop signals and its records in the run's metrics. Standard library only.

``should_save()`` turns true on SIGTERM (a handler that sets a flag instead of killing the rank)
or when the watchdog's ``preempt.json`` appears; ``record_event`` appends the helper's events
(``checkpoint_saved``, ``checkpoint_refused``, ``checkpoint_resumed``) to ``metrics.jsonl``, where
the laptop's watcher reads them. Kept apart from ``fleetrun_checkpoint`` (which mixes these in)
to keep each module about one thing; shipped beside it to ``~/.fleetrun/lib``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

if not __package__:  # on a node, beside the other files in ~/.fleetrun/lib (not as launch.nodelib)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
if TYPE_CHECKING or __package__:  # one module per file: launch.nodelib.X here, X on a node
    from launch.nodelib.fleetrun_ranks import any_rank
else:
    from fleetrun_ranks import any_rank  # noqa: E402 - beside this file in ~/.fleetrun/lib

FLAG_FILE = "preempt.json"


class StopSignals:
    """``Checkpointer``'s SIGTERM handler and ``should_save`` (its attributes are set there)."""

    run_dir: str
    rank: int
    _stop: threading.Event
    _signalled: bool
    _told: bool

    def install_sigterm_handler(self) -> None:
        """SIGTERM sets the flag instead of killing the rank, every time.

        A rank checkpointing after a notice may get SIGTERM again (its node's notice and the
        laptop's stop, torchrun's shutdown): it must not die mid-save. A script that never asks
        ``should_save()`` is still stopped: fleetrun and torchrun follow SIGTERM with SIGKILL.
        Only from the main thread (Python's rule); elsewhere the flag file still works.
        """
        if threading.current_thread() is not threading.main_thread():
            return

        def on_sigterm(signum: int, frame: Any) -> None:
            first = not self._signalled
            self._signalled = True
            self._stop.set()
            if first:
                _mark_signal(self.run_dir, self.rank)

        with contextlib.suppress(ValueError, OSError):
            signal.signal(signal.SIGTERM, on_sigterm)

    def request_stop(self) -> None:
        self._stop.set()

    def should_save(self, everywhere: bool = False) -> bool:
        """True once a SIGTERM or the preemption flag file arrived: checkpoint at this step.

        ``everywhere``: agree across ranks (one all-reduce with torch.distributed), so every rank
        saves at the same step even though only one node got the notice; call it on every rank.
        """
        how = "sigterm" if self._stop.is_set() else ""
        if not how and self.run_dir and os.path.exists(os.path.join(self.run_dir, FLAG_FILE)):
            how = "flag"
            self._stop.set()
        flag = self._stop.is_set()
        if everywhere:
            flag = any_rank(flag)
            if flag and not self._stop.is_set():
                how = "peer"
                self._stop.set()
        if flag and not self._told:
            self._told = True
            _mark_signal(self.run_dir, self.rank, f"told-rank-{self.rank}", how)
        return flag


def _mark_signal(run_dir: str, rank: int, name: str = "", how: str = "sigterm") -> None:
    """Note when this rank got SIGTERM (``signals/rank-<R>``) or first heard of a stop, and how
    (``signals/told-rank-<R>``): the notice-to-signal benchmark reads them."""
    if not run_dir:
        return
    with contextlib.suppress(OSError):
        os.makedirs(os.path.join(run_dir, "signals"), exist_ok=True)
        with open(os.path.join(run_dir, "signals", name or f"rank-{rank}"), "w", encoding="utf-8") as fh:
            fh.write(f"{time.time()!r} {how}")


def record_event(run_dir: str, name: str, **fields: Any) -> None:
    """One event line in the run's ``metrics.jsonl`` (appended in one write, beside the metrics
    helper's lines): the laptop's watcher reads rank 0's, so it learns which steps were saved
    (``checkpoint_saved``: step and the manifest's sha256) and which checkpoints were refused."""
    if not run_dir:
        return
    line = json.dumps({"event": name, "time": time.time(), **fields}) + "\n"
    with contextlib.suppress(OSError, ValueError):
        fd = os.open(os.path.join(run_dir, "metrics.jsonl"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, line.encode("utf-8"))
        finally:
            os.close(fd)


def _log(message: str) -> None:
    with contextlib.suppress(OSError, ValueError):
        print(f"fleetrun_checkpoint: {message}", file=sys.stderr, flush=True)
