"""The checkpoint helper's bucket copy: a background thread that uploads the newest saved step,
then the bucket's ``LATEST.json`` pointer, and drops the steps past ``keep``. Standard library
only; mixed into ``fleetrun_checkpoint.Checkpointer`` (whose attributes these are), shipped
beside it to ``~/.fleetrun/lib``.

Every bucket command is a CLI process (``aws``: one to three seconds each on a loaded node), and
the step saved after a preemption notice often waits behind the upload of a periodic one: a rank
that gives up waiting (``wait_uploaded(timeout)``) and exits leaves the notice's checkpoint out of
the bucket, and a noticed node that is not rank 0's then waits for it until the cloud takes it.
So the path to a step's pointer is kept short: the pointer is read from the bucket once (this
process then knows what it wrote there), and the removal of steps past ``keep`` waits until no
newer step is queued.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import TYPE_CHECKING

if not __package__:  # on a node, beside the other files in ~/.fleetrun/lib (not as launch.nodelib)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
if TYPE_CHECKING or __package__:  # one module per file: launch.nodelib.X here, X on a node
    from launch.nodelib import fleetrun_bucket
    from launch.nodelib import fleetrun_protocol as protocol
    from launch.nodelib.fleetrun_checkpoint_files import manifest_digest, verify
    from launch.nodelib.fleetrun_checkpoint_signals import _log, record_event
else:
    import fleetrun_protocol as protocol  # noqa: E402 - beside this file in ~/.fleetrun/lib
    from fleetrun_checkpoint_files import manifest_digest, verify  # noqa: E402
    from fleetrun_checkpoint_signals import _log, record_event  # noqa: E402


class BucketUploads:
    """The upload thread of a ``Checkpointer`` (a newer step replaces one not yet started)."""

    bucket: fleetrun_bucket.Bucket | None
    keep: int
    rank: int
    sharded: bool
    run_dir: str
    pointer_name: str
    uploaded_step: int | None
    upload_error: str
    _cond: threading.Condition
    _queued: int | None
    _busy: int | None
    _thread: threading.Thread | None
    _pointer_steps: tuple[int, ...] | None
    """The steps of the pointer this process last wrote (None: not yet known, read the bucket's)."""
    _dropping: set[int]
    """Steps out of the pointer whose files are still in the bucket (removed when nothing waits)."""

    def _own(self, step_dir: str) -> str:
        raise NotImplementedError

    def step_dir(self, step: int) -> str:
        raise NotImplementedError

    def _enqueue(self, step: int) -> None:
        with self._cond:
            self._queued = step  # a newer step replaces one not yet started: only the newest matters
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._uploader, name="fleetrun-checkpoint-upload", daemon=True
                )
                self._thread.start()
            self._cond.notify_all()

    def _uploader(self) -> None:
        while True:
            with self._cond:
                while self._queued is None:
                    if not self._cond.wait(timeout=600):
                        self._thread = None
                        return
                step, self._queued, self._busy = self._queued, None, self._queued
            try:
                self._upload(step)
                with self._cond:
                    newer = self._queued is not None
                if not newer:  # a newer step first: the housekeeping can wait, its pointer not
                    self._drop_old()
            except Exception as exc:  # noqa: BLE001 - an upload failure must not end training
                self.upload_error = f"{type(exc).__name__}: {exc}"
                _log(f"checkpoint step {step}: upload failed: {self.upload_error}")
            with self._cond:
                self._busy = None
                self._cond.notify_all()

    def _upload(self, step: int) -> None:
        assert self.bucket is not None
        local = self._own(self.step_dir(step))
        ok, message = self.bucket.sync(local, self._own(self.bucket.checkpoints_url(f"step-{step}")))
        if not ok:
            self.upload_error = message
            _log(f"checkpoint step {step}: upload failed: {message}")
            return
        known = self._pointer_steps
        if known is None:  # the first upload of this process: an earlier attempt's steps count too
            old = self.bucket.pointer(self.pointer_name)
            known = old.steps if old else ()
        steps = sorted({step, *known}, reverse=True)
        kept, dropped = steps[: self.keep], steps[self.keep :]
        manifest = verify(local, hashes=False) if step == kept[0] else None
        created = None if manifest is None else manifest.created
        ok, message = self.bucket.put_pointer(
            protocol.BucketPointer(tuple(kept), time.time(), created), self.pointer_name
        )
        if not ok:
            self.upload_error = message
            _log(f"checkpoint step {step}: uploaded, but the pointer was not: {message}")
            return
        self.uploaded_step, self.upload_error = step, ""
        self._pointer_steps = tuple(kept)
        self._dropping = (self._dropping | set(dropped)) - set(kept)
        if self.rank == 0 and not self.sharded:
            # the laptop's word that the step is durable without this node: it then needs no
            # peer copy of it, and a later attempt may resume from the bucket's copy of it
            record_event(self.run_dir, "checkpoint_uploaded", step=step, manifest=manifest_digest(local))

    def _drop_old(self) -> None:
        """Remove the bucket's copies of the steps the pointer no longer names."""
        assert self.bucket is not None
        for gone in sorted(self._dropping):
            self._dropping.discard(gone)
            if self.bucket.commands.remove:
                self.bucket.remove(self._own(self.bucket.checkpoints_url(f"step-{gone}")) + "/")
