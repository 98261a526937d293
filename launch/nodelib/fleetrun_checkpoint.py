"""Checkpoint helper for training code run by fleetrun. Standard library only (torch optional).

Usage in a training script::

    import fleetrun_checkpoint as ckpt
    found = ckpt.latest()                       # resume_from, else this node, else the bucket
    if found:
        state = ckpt.load_training_state(found, model, optimizer)   # RNG restored too
    for step in ...:
        ...
        if step % every == 0 or ckpt.should_save(everywhere=True):
            ckpt.save_training_state(step, model, optimizer, epoch=epoch, sampler_state=...)
        if ckpt.should_save(everywhere=True):  # SIGTERM, stop request or preemption notice
            ckpt.wait_uploaded(60); sys.exit(143)

Why: a lost node, a preempted VM or a stop must cost at most one checkpoint interval, not the run.
A checkpoint is ``$FLEETRUN_CHECKPOINT_DIR/step-<N>/`` (default ``$FLEETRUN_RUN_DIR/checkpoints``)
with ``MANIFEST.json`` (size and sha256 of every file). It is written to a temporary directory,
fsynced and renamed, so a crash mid-write never leaves a directory that looks complete; one whose
files differ from the manifest (a truncated upload, a full disk) is never resumed from. The last
``keep`` (3) are kept. Rank 0 writes (the others return at once) unless ``sharded``: then each rank
writes ``step-<N>/rank-<R>/``. After the local write, a background thread copies the step to the
run's bucket (``<url>/checkpoints/step-<N>/``, then the ``LATEST.json`` pointer), so a step waits
only for the local disk; a replacement node with an empty disk resumes from the bucket.

``should_save()`` turns true on SIGTERM (a handler installed here: torchrun's stop, fleetrun's
stop, the watchdog's preemption path) or when the watchdog's flag file ``preempt.json`` appears.
Environment (set per attempt by the laptop): ``FLEETRUN_ATTEMPT``, ``FLEETRUN_CHECKPOINT_DIR``,
``FLEETRUN_RESUME_FROM`` (a checkpoint directory, or a bucket URL of one, preferred when complete).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if not __package__:  # on a node, beside the other files in ~/.fleetrun/lib (not as launch.nodelib)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
if TYPE_CHECKING or __package__:  # one module per file: launch.nodelib.X here, X on a node
    from launch.nodelib import fleetrun_bucket
    from launch.nodelib import fleetrun_protocol as protocol
    from launch.nodelib.fleetrun_checkpoint_files import (
        MANIFEST,
        fetch_step,
        manifest_digest,
        replace_dir,
        scratch_name,
        seal,
        sweep_scratch,
        verify,
        written_here,
    )
    from launch.nodelib.fleetrun_checkpoint_signals import StopSignals, _log, record_event
    from launch.nodelib.fleetrun_checkpoint_upload import BucketUploads
    from launch.nodelib.fleetrun_ranks import smallest_across_ranks
else:
    import fleetrun_bucket  # noqa: E402 - beside this file in ~/.fleetrun/lib
    import fleetrun_protocol as protocol  # noqa: E402
    from fleetrun_checkpoint_files import (  # noqa: E402
        MANIFEST,
        fetch_step,
        manifest_digest,
        replace_dir,
        scratch_name,
        seal,
        sweep_scratch,
        verify,
        written_here,
    )
    from fleetrun_checkpoint_signals import StopSignals, _log, record_event  # noqa: E402
    from fleetrun_checkpoint_upload import BucketUploads  # noqa: E402
    from fleetrun_ranks import smallest_across_ranks  # noqa: E402

KEEP = 3
_STEP_RE = re.compile(r"step-(\d{1,18})")


def _env_int(names: tuple[str, ...], default: int) -> int:
    for name in names:
        try:
            return int(os.environ[name])
        except (KeyError, ValueError):
            continue
    return default


def attempt() -> int:
    """This attempt's number (1-based; ``FLEETRUN_ATTEMPT``): 1 outside fleetrun."""
    return max(1, _env_int(("FLEETRUN_ATTEMPT",), 1))


@dataclass(frozen=True)
class Checkpoint:
    """A complete checkpoint: ``path`` holds this rank's files (the step dir, or its shard)."""

    path: str
    step: int
    source: str
    """``resume_from`` (the laptop chose it), ``node`` (this node's disk) or ``bucket``."""
    manifest: protocol.Manifest

    def file(self, name: str) -> str:
        return os.path.join(self.path, name)


class Checkpointer(StopSignals, BucketUploads):
    """Checkpoints of one run on this node, and its bucket copy. See the module docstring."""

    def __init__(
        self,
        directory: str | None = None,
        keep: int = KEEP,
        sharded: bool = False,
        rank: int | None = None,
        world: int | None = None,
        bucket: protocol.BucketCommands | None | bool = True,
        run_dir: str | None = None,
        resume_from: str | None = None,
        handle_sigterm: bool = True,
    ) -> None:
        self.run_dir = run_dir if run_dir is not None else os.environ.get("FLEETRUN_RUN_DIR", "")
        default_dir = os.path.join(self.run_dir, "checkpoints") if self.run_dir else "fleetrun-checkpoints"
        self.directory = os.path.abspath(
            directory or os.environ.get("FLEETRUN_CHECKPOINT_DIR") or default_dir
        )
        self.keep = max(1, int(keep))
        self.sharded = sharded
        self.rank = (
            _env_int(("RANK", "HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK"), 0)
            if rank is None
            else rank
        )
        self.world = (
            _env_int(("WORLD_SIZE", "HOROVOD_SIZE", "OMPI_COMM_WORLD_SIZE"), 1) if world is None else world
        )
        self.resume_from = (
            resume_from if resume_from is not None else os.environ.get("FLEETRUN_RESUME_FROM", "")
        )
        commands = fleetrun_bucket.read_commands(self.run_dir) if bucket is True else bucket or None
        self.bucket = fleetrun_bucket.Bucket(commands) if commands else None
        self.pointer_name = f"LATEST.rank-{self.rank}.json" if sharded else fleetrun_bucket.POINTER
        self._stop = threading.Event()
        self._signalled = False
        self._told = False
        self._cond = threading.Condition()
        self._queued: int | None = None
        self._busy: int | None = None
        self._thread: threading.Thread | None = None
        self._pointer_steps: tuple[int, ...] | None = None
        self._dropping: set[int] = set()
        self._swept = False
        self.uploaded_step: int | None = None
        self.upload_error = ""
        self.save_error = ""
        """Why the last background save (``save(background=True)``) did not complete, if so."""
        self._sealing: threading.Thread | None = None
        if handle_sigterm:
            self.install_sigterm_handler()

    # -- where things are ----------------------------------------------------------------------
    @property
    def writes(self) -> bool:
        """Whether this rank writes checkpoints (rank 0, or every rank when sharded)."""
        return self.sharded or self.rank == 0

    def _own(self, step_dir: str) -> str:
        return os.path.join(step_dir, f"rank-{self.rank}") if self.sharded else step_dir

    def step_dir(self, step: int) -> str:
        return os.path.join(self.directory, f"step-{step}")

    def steps(self) -> list[int]:
        """Steps with a directory on this node, newest first (complete or not)."""
        try:
            names = os.listdir(self.directory)
        except OSError:
            return []
        return sorted((int(m.group(1)) for n in names if (m := _STEP_RE.fullmatch(n))), reverse=True)

    # -- finding one -----------------------------------------------------------------------------
    def latest(self, hashes: bool = True, at_most: int | None = None) -> Checkpoint | None:
        """The newest complete checkpoint: ``FLEETRUN_RESUME_FROM``, this node, the bucket, or None.
        ``at_most``: only steps up to it (``agreed_latest`` narrows down with it)."""
        return next(self.candidates(hashes, at_most), None)

    def candidates(self, hashes: bool = True, at_most: int | None = None) -> Iterator[Checkpoint]:
        """Every complete checkpoint in the order a resume tries them: ``FLEETRUN_RESUME_FROM``
        (the laptop's choice), then this node's disk newest first (its own saves and the peer
        copies the laptop placed here), then the bucket. Each is verified (manifest, sizes,
        sha256) before it is offered; a caller that refuses one (it does not load as data) asks
        for the next. With a ``resume_from``, nothing newer than it is ever offered: a step the
        laptop did not choose (one a node claims and the run never recorded) is not believed."""
        self.flush()  # this process's own save still being sealed counts
        seen: set[str] = set()
        if self.resume_from:
            found = self._resume_from(hashes)
            if found is not None and (at_most is None or found.step <= at_most):
                seen.add(os.path.realpath(found.path))
                yield found
            match = _STEP_RE.fullmatch(self.resume_from.rstrip("/").rsplit("/", 1)[-1])
            if match is not None:
                bound = int(match.group(1))
                at_most = bound if at_most is None else min(at_most, bound)
        for step in self.steps():
            if at_most is not None and step > at_most:
                continue
            path = self._own(self.step_dir(step))
            if os.path.realpath(path) in seen:
                continue
            manifest = verify(path, hashes)
            if manifest is not None and manifest.step == step:
                seen.add(os.path.realpath(path))
                yield Checkpoint(path, step, "node", manifest)
        yield from self._bucket_candidates(at_most)

    def on_node(self, hashes: bool = True, at_most: int | None = None) -> Checkpoint | None:
        """The newest complete checkpoint on this node's disk (up to ``at_most``), or None: never
        a download.

        The watchdog asks this in a preemption window, where fetching the bucket's copy of a
        checkpoint (``latest``'s last resort) would spend the window on a useless transfer.
        """
        for step in self.steps():
            if at_most is not None and step > at_most:
                continue
            path = self._own(self.step_dir(step))
            manifest = verify(path, hashes)
            if manifest is not None:
                return Checkpoint(path, manifest.step, "node", manifest)
        return None

    def agreed_latest(self, smallest: Callable[[int], int] | None = None) -> Checkpoint | None:
        """Sharded: the newest step whose shard is complete on *every* rank, or None on every rank.

        Each rank's own newest shard is not enough: a rank whose newest shard was cut short would
        resume from an older step than the others, and the model would be stitched from two
        steps. Every rank offers its newest step; when they differ, all look again at or below
        the smallest offer, until every rank offers the same step (the offers only go down, so
        this ends). ``smallest`` is the all-reduce MIN of an integer (``smallest_across_ranks``
        by default); call this on every rank.
        """
        smallest = smallest or smallest_across_ranks
        bound: int | None = None
        while True:
            found = self.latest(at_most=bound)
            mine = found.step if found is not None else -1
            low = smallest(mine)
            if low < 0:
                return None
            if -smallest(-mine) == low:  # the largest offer equals the smallest: all agree
                return found
            bound = low

    def _resume_from(self, hashes: bool) -> Checkpoint | None:
        source = self.resume_from.rstrip("/")
        if "://" in source:
            match = _STEP_RE.fullmatch(source.rsplit("/", 1)[-1])
            if self.bucket is None or match is None:
                return None
            got = self._download(int(match.group(1)), self._own(source))
            return None if got is None else Checkpoint(got.path, got.step, "resume_from", got.manifest)
        path = (
            self._own(source)
            if self.sharded and not os.path.exists(os.path.join(source, MANIFEST))
            else source
        )
        manifest = verify(path, hashes)
        return None if manifest is None else Checkpoint(path, manifest.step, "resume_from", manifest)

    def _from_bucket(self, fits: Callable[[int], bool] = lambda _step: True) -> Checkpoint | None:
        for found in self._bucket_candidates(None):
            if fits(found.step):
                return found
        return None

    def _bucket_candidates(self, at_most: int | None) -> Iterator[Checkpoint]:
        if self.bucket is None:
            return
        pointer = self.bucket.pointer(self.pointer_name)
        for step in pointer.steps if pointer else ():
            if at_most is not None and step > at_most:
                continue
            got = self._download(step, self._own(self.bucket.checkpoints_url(f"step-{step}")))
            if got is not None:
                yield got

    def _download(self, step: int, url: str) -> Checkpoint | None:
        """Copy one step (this rank's part) from the bucket, verify it, move it into place."""
        final = self._own(self.step_dir(step))
        manifest = fetch_step(self.bucket, url, self.directory, step, final, _log)
        return None if manifest is None else Checkpoint(final, step, "bucket", manifest)

    # -- saving ----------------------------------------------------------------------------------
    def save(self, step: int, writer: Callable[[str], object], background: bool = False) -> Checkpoint | None:
        """Write step ``step`` with ``writer(directory)``; returns after the local write.

        Ranks that do not write (not rank 0, unsharded) return None without calling ``writer``.
        The bucket copy follows in the background (``wait_uploaded`` blocks for it).
        ``background``: return as soon as ``writer`` is done; the fsync, the hashes of the
        manifest and the rename into place follow in a thread (the step is not complete, and not
        offered by ``latest``, until then; ``flush`` waits for it, and so do ``latest``, the next
        ``save`` and ``wait_uploaded``). The training step then waits for the writer only: the
        hashing costs about as much again as ``torch.save`` itself. The answer's manifest lists
        no files until the seal is done.
        """
        if not self.writes:
            return None
        self.flush()  # one save in flight at most: the disk never holds a queue of them
        step = int(step)
        os.makedirs(self.directory, exist_ok=True)
        if not self._swept:  # what a writer killed mid-save (an earlier attempt) left behind
            self._swept = sweep_scratch(self.directory) is not None
        tmp = os.path.join(self.directory, scratch_name(f".tmp-step-{step}-rank-{self.rank}"))
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
        final = self._own(self.step_dir(step))
        try:
            writer(tmp)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        if not background:
            return Checkpoint(final, step, "node", self._publish(tmp, step, final))
        thread = threading.Thread(
            target=self._publish_quietly, args=(tmp, step, final), name="fleetrun-checkpoint-seal"
        )
        self._sealing = thread  # not a daemon: a process that ends normally finishes the seal
        thread.start()
        return Checkpoint(final, step, "node", protocol.Manifest(step=step, files={}, created=time.time()))

    def flush(self, timeout: float | None = None) -> bool:
        """Wait for a background save to be complete (sealed and in place); False on timeout."""
        thread = self._sealing
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
            if thread.is_alive():
                return False
            self._sealing = None
        return True

    def _publish(self, tmp: str, step: int, final: str) -> protocol.Manifest:
        """fsync and hash what the writer left, move it into place, keep the newest, record it."""
        try:
            manifest = seal(
                tmp, step, self.rank if self.sharded else None, self.world if self.sharded else None
            )
            os.makedirs(os.path.dirname(final), exist_ok=True)
            replace_dir(tmp, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        self._rotate()
        if self.rank == 0:
            record_event(self.run_dir, "checkpoint_saved", step=step, manifest=manifest_digest(final))
        if self.bucket is not None:
            self._enqueue(step)
        return manifest

    def _publish_quietly(self, tmp: str, step: int, final: str) -> None:
        try:
            self._publish(tmp, step, final)
        except Exception as exc:  # noqa: BLE001 - a failed seal is reported; training goes on
            self.save_error = f"{type(exc).__name__}: {exc}"
            _log(f"checkpoint step {step}: not saved: {self.save_error}")

    def refuse(self, found: Checkpoint, file: str, why: str) -> str:
        """Say (stderr, and the run's metrics as ``checkpoint_refused``) that ``found`` was not
        resumed from: a file that does not load as data, or the wrong shape. Returns the line."""
        where = "the bucket" if found.source == "bucket" else f"node {socket.gethostname()}"
        line = f"refused checkpoint step {found.step} ({os.path.join(found.path, file)} on {where}): {why}"
        _log(line)
        if self.rank == 0:
            record_event(
                self.run_dir,
                "checkpoint_refused",
                step=found.step,
                file=os.path.join(found.path, file),
                where=where,
                why=why[:300],
            )
        return line

    def _rotate(self) -> None:
        """Keep the newest ``keep`` steps this helper wrote (never one still waiting for its upload)."""
        with self._cond:
            protected = {self._queued, self._busy}
        mine = [s for s in self.steps() if written_here(self.step_dir(s), self._own(self.step_dir(s)), s)]
        for step in mine[self.keep :]:
            if step in protected:
                continue
            own = self._own(self.step_dir(step))
            shutil.rmtree(own, ignore_errors=True)
            if self.sharded:
                with contextlib.suppress(OSError):
                    os.rmdir(self.step_dir(step))  # the last shard out removes the step

    # -- the bucket copy (its thread: ``BucketUploads``) --------------------------------------------
    def wait_uploaded(self, timeout: float | None = None) -> bool:
        """Block until every saved step reached the bucket (or failed); False on timeout.

        True without a bucket. Whether the last upload worked: ``upload_error`` is empty.
        """
        started = time.monotonic()
        if not self.flush(timeout):
            return False
        left = None if timeout is None else max(0.0, timeout - (time.monotonic() - started))
        with self._cond:
            done = self._cond.wait_for(lambda: self._queued is None and self._busy is None, left)
        return bool(done) and not self.upload_error and not self.save_error


# -- the module-level helper ------------------------------------------------------------------------

_default: Checkpointer | None = None


def default() -> Checkpointer:
    """The process's checkpointer from the environment (made on first use, SIGTERM handler too)."""
    global _default
    if _default is None:
        _default = Checkpointer()
    return _default


def configure(**kwargs: Any) -> Checkpointer:
    """Replace the process's checkpointer (``keep``, ``sharded``, ``directory``...)."""
    global _default
    _default = Checkpointer(**kwargs)
    return _default


def latest(hashes: bool = True) -> Checkpoint | None:
    return default().latest(hashes)


def save(step: int, writer: Callable[[str], object]) -> Checkpoint | None:
    return default().save(step, writer)


def wait_uploaded(timeout: float | None = None) -> bool:
    return default().wait_uploaded(timeout)


def should_save(everywhere: bool = False) -> bool:
    return default().should_save(everywhere)


# -- torch conveniences (in their own module; imported last, they use the names above) ---------

if TYPE_CHECKING or __package__:  # one module per file: launch.nodelib.X here, X on a node
    from launch.nodelib.fleetrun_checkpoint_torch import (
        STATE_FILE,
        Refused,
        UnsafeTorch,
        exact_allreduce,
        load_state_bytes,
        load_training_state,
        resume_training_state,
        save_training_state,
    )
else:
    from fleetrun_checkpoint_torch import (
        STATE_FILE,
        Refused,
        UnsafeTorch,
        exact_allreduce,
        load_state_bytes,
        load_training_state,
        resume_training_state,
        save_training_state,
    )  # noqa: E402

__all__ = [
    "STATE_FILE",
    "Checkpoint",
    "Refused",
    "UnsafeTorch",
    "load_state_bytes",
    "Checkpointer",
    "attempt",
    "configure",
    "default",
    "exact_allreduce",
    "latest",
    "load_training_state",
    "resume_training_state",
    "save",
    "save_training_state",
    "should_save",
    "verify",
    "wait_uploaded",
]
