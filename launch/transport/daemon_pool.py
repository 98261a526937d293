"""A bounded pool of daemon threads for fan-outs to nodes, any of which may hang.

``concurrent.futures.ThreadPoolExecutor`` joins its worker threads when the interpreter exits. A
fan-out gives up on a hung node at its deadline, but the worker thread stays blocked where the
node left it: a TCP connect to an address that drops packets waits its whole connect timeout,
and no ``close`` can interrupt it. With that executor ``fab train`` and ``fab exec`` could not
exit until such threads ended, seconds after their work and their report were done. Here the
workers are daemon threads: what a deadline abandoned is abandoned, also at exit. Work that was
not abandoned has finished before ``parallel_map`` returns, so nothing a caller waits for is cut.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

__all__ = ["DaemonPool"]

T = TypeVar("T")

_Item = tuple["Future[Any]", Callable[[], Any]] | None


class DaemonPool:
    """``submit``/``shutdown`` like ``ThreadPoolExecutor``, at most ``max_workers`` daemon threads."""

    def __init__(self, max_workers: int, thread_name_prefix: str = "fleetrun") -> None:
        self.max_workers = max(1, max_workers)
        self.prefix = thread_name_prefix
        self._queue: queue.SimpleQueue[_Item] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._closed = False

    def submit(self, fn: Callable[..., T], *args: Any) -> Future[T]:
        future: Future[T] = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("cannot submit to a pool that was shut down")
            self._queue.put((future, lambda: fn(*args)))
            if len(self._threads) < self.max_workers:
                thread = threading.Thread(
                    target=self._work, name=f"{self.prefix}_{len(self._threads)}", daemon=True
                )
                self._threads.append(thread)
                thread.start()
        return future

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            future, call = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(call())
            except BaseException as exc:  # noqa: BLE001 - handed to whoever waits on the future
                future.set_exception(exc)

    def shutdown(self, wait: bool = False, cancel_futures: bool = True) -> None:
        """Stop taking work; with ``cancel_futures`` what has not started is cancelled. Threads
        still busy finish their call and then end (``wait``: this waits for that)."""
        with self._lock:
            self._closed = True
            if cancel_futures:
                while True:
                    try:
                        item = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    if item is not None:
                        item[0].cancel()
            for _ in self._threads:
                self._queue.put(None)
            threads = list(self._threads)
        if wait:
            for thread in threads:
                thread.join()
