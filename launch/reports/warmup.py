"""The loss plot's and TensorBoard file's imports and first drawing, done before a run ends.

A failed run's exit waited for ``write_reports`` at its very end: importing matplotlib and
tensorboardX (about 1 s on an idle 2-core machine, 4-6 s loaded) and the first figure drawn
(fonts loaded, the Agg canvas and the PNG writer set up: 0.3 s idle, 1.7 s loaded). The watcher
starts this once the job logged its first step (the nodes' start-up, which on a local fleet
shares the laptop's CPUs, is over by then), so the wrap-up only draws the run's own figure.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import threading

__all__ = ["REPORT_MODULES", "warm_up"]

REPORT_MODULES = (
    "matplotlib.figure",
    "matplotlib.backends.backend_agg",
    "tensorboardX",
    "tensorboardX.summary",
)
"""What ``write_reports`` imports on first use."""

_started: list[threading.Thread] = []
_lock = threading.Lock()


def _load() -> None:
    for name in REPORT_MODULES:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001, S112 - write_reports imports it again and says why
            continue
    with contextlib.suppress(Exception):  # the real plot reports its own failure
        from launch.reports.plot import loss_axes

        fig, ax = loss_axes((8, 4.5))
        ax.plot([0, 1], [1.0, 0.5])
        ax.set_title("warm-up")
        fig.tight_layout()
        fig.savefig(io.BytesIO(), format="png")


def warm_up() -> threading.Thread | None:
    """Start the imports and a throwaway drawing in a daemon thread, once per process; the
    thread (None when no thread could be had: they happen on first use instead)."""
    with _lock:
        if _started:
            return _started[0]
        thread = threading.Thread(target=_load, name="fleetrun-warm-reports", daemon=True)
        try:
            thread.start()
        except RuntimeError:
            return None
        _started.append(thread)
        return thread
