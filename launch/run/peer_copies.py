"""A second copy of the newest checkpoint on another node, so losing any one node (the head
included) loses at most what was saved since: no bucket needed.

Rank 0 writes checkpoints on its own node only. When that node goes (a power-off, a dead disk,
the head of a lab) and the run has no bucket, every checkpoint went with it. So, during the run,
the laptop copies each newly saved checkpoint to one other node, in the background:

* What triggers a copy: rank 0's ``checkpoint_saved`` event (step and the sha256 of its
  manifest), which the watcher reads with the metrics. Only the newest step waiting is copied;
  one still in flight is never interrupted, a newer one replaces a queued one.
* How: the same hardened rsync as the copy before a later attempt (``copy_step``: pulled through
  this machine, no links, no devices, per-file size cap, sparse kept sparse, renamed into place
  on the peer), with the operator's pinned host keys. No node gets a key to another node and no
  node's account is widened: the least privilege there is, at the cost of the checkpoint
  travelling twice over the laptop's link. The source is believed only when its manifest is the
  one rank 0 recorded.
* Where: the first node in inventory order, after the holder, that does not hold the step; the
  copy lands in that node's checkpoint directory (``step-<N>/``), so the helper's ``latest()``
  and the laptop's choice before a later attempt see it like any other. Older peer copies this
  run placed on that node beyond ``KEEP`` are removed; the node's own saves are never touched.
* Training never waits: the copy runs on the laptop, rank 0 only serves reads.
* With a bucket too: the helper's upload of a step takes several ``aws`` CLI calls, seconds on a
  loaded node, and until it ends the step lives on the head only; the peer copy of a small
  checkpoint is often done first. Whichever ends first makes the step durable: a step whose
  upload rank 0 already reported complete (``checkpoint_uploaded``) is not copied, and a later
  attempt resumes from the newest durable step of either (``checkpoints.newest_durable``).
  Nothing is copied without ``recovery:`` (no later attempt would use the copy, and the final
  pull would bring it home).
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from launch.job.inventory import Host
from launch.reports.safe_text import clean
from launch.run.checkpoints import LIST_SCRIPT, checkpoint_dir, copy_step, parse_claims, ssh_run

KEEP = 2
"""Peer copies kept per node (the newest one and the one before, in case the newest is cut)."""
STOP_WAIT_S = 20.0


def saver(watcher: Any) -> str | None:
    """The node whose metrics stream reported checkpoint saves (rank 0's), else the one whose
    stream has any record (rank 0 alone writes metrics: where its first save will be reported,
    even one made after the watcher stopped, ``launch.run.attempts.late_saves``), or None."""
    streams = [(str(n), getattr(node, "stream", None)) for n, node in getattr(watcher, "nodes", {}).items()]
    for name, stream in streams:
        if stream is not None and getattr(stream, "saved_checkpoints", None):
            return name
    for name, stream in streams:
        wrote = [getattr(stream, key, 0) for key in ("records", "events")] if stream is not None else []
        if any(wrote):
            return name
    return None


PEER_STAGING = ".peer-copies"
"""The run folder's staging folder for the copies (a step passes through the laptop)."""


class PeerCopies:
    """The run's recorded saves (across attempts) and the peer copies made of them."""

    def __init__(self, run_id: str, staging: Path, say: Callable[[str], None]) -> None:
        self.run_id = run_id
        self.staging = staging
        self.say = say
        self.recorded: dict[int, str] = {}
        """Every step rank 0 reported saving, with its manifest sha256 (all attempts)."""
        self.copied: dict[int, str] = {}
        """Step -> node holding a peer copy made by this run."""
        self.uploaded: dict[int, str] = {}
        """Step -> manifest sha256 of every upload rank 0 reported complete (all attempts)."""
        self.placed: dict[str, list[int]] = {}
        self.errors: list[str] = []
        self.hosts: list[Host] = []
        self.known_hosts: Path | None = None
        self.enabled = False
        self._cond = threading.Condition()
        self._queued: int | None = None
        self._busy = False
        self._current: int | None = None
        self._holder: str | None = None
        self._multiplex: Path | None = None
        self._thread: threading.Thread | None = None

    # -- fed by the watcher ------------------------------------------------------------------------
    def follow(self, watcher: Any, hosts: list[Host], known_hosts: Path, copy: bool) -> None:
        """Record what ``watcher`` sees saved (its ``on_poll`` is chained) and, with ``copy``,
        copy it to a peer: one call per attempt, with that attempt's hosts and pinned keys."""
        with self._cond:
            self.hosts, self.known_hosts = list(hosts), known_hosts
            self.enabled = copy and len(hosts) > 1
        previous = watcher.on_poll

        def on_poll(obs: Any) -> None:
            if previous is not None:
                previous(obs)
            self.offer(obs.metrics.saved_checkpoints, saver(watcher), obs.metrics.uploaded_checkpoints)

        watcher.on_poll = on_poll

    @property
    def holder(self) -> str | None:
        """The node whose metrics reported the saves (rank 0's), as last seen."""
        with self._cond:
            return self._holder

    def note_saves(self, saved: Mapping[int, str]) -> None:
        """Saves rank 0 recorded after the watcher stopped reading (during a stop's grace): they
        count like any recorded save for the next attempt's choice; no copy is queued (the
        attempt is over: the checkpoint spread moves them)."""
        with self._cond:
            self.recorded.update(saved)

    def durable(self) -> dict[int, str]:
        """Step -> where its second copy is (a node's name, or ``bucket``): the steps that
        survive the loss of rank 0's node, as far as this machine has seen."""
        with self._cond:
            found = {s: n for s, n in self.copied.items() if s in self.recorded}
            found.update(
                {s: "bucket" for s, digest in self.uploaded.items() if self.recorded.get(s) == digest}
            )
            return found

    def offer(
        self, saved: Mapping[int, str], holder: str | None = None, uploaded: Mapping[int, str] | None = None
    ) -> None:
        """Note the saves (and completed uploads) seen; queue the newest step not yet durable
        (never raises: a poll callback). ``holder``: the node whose metrics reported the saves
        (rank 0's), when known."""
        with self._cond:
            self.recorded.update(saved)
            self.uploaded.update(uploaded or {})
            self._holder = holder
            if not self.enabled or not saved:
                return
            step = max(saved)
            if self.uploaded.get(step) == saved[step]:
                return  # its upload was first: the bucket holds the second copy
            if step in self.copied or step == self._current or (self._queued or -1) >= step:
                return
            self._queued = step
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._work, name="fleetrun-peer-copy", daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def stop(self, wait_s: float = STOP_WAIT_S) -> None:
        """No more copies (an attempt ended): the one in flight gets ``wait_s`` to finish; the
        shared SSH connections end with their sockets' directory."""
        with self._cond:
            self.enabled = False
            self._queued = None
            done = self._cond.wait_for(lambda: not self._busy, wait_s)
            multiplex, self._multiplex = (self._multiplex, None) if done else (None, self._multiplex)
        if multiplex is not None:
            for socket_path in multiplex.glob("*"):
                subprocess.run(
                    ["ssh", "-o", f"ControlPath={socket_path}", "-O", "exit", "fleetrun-peer"],
                    capture_output=True,
                    timeout=10,
                    check=False,
                )
            shutil.rmtree(multiplex, ignore_errors=True)

    # -- the copying thread ------------------------------------------------------------------------
    def _work(self) -> None:
        while True:
            with self._cond:
                if self._queued is None or not self.enabled:
                    self._thread = None
                    return
                step, self._queued, self._busy = self._queued, None, True
                self._current = step
                hosts, known_hosts, digest = list(self.hosts), self.known_hosts, self.recorded.get(step)
                holder = self._holder
                raced = digest is not None and self.uploaded.get(step) == digest  # upload done meanwhile
            try:
                if known_hosts is not None and digest is not None and not raced:
                    self._copy(step, digest, hosts, known_hosts, holder)
            except Exception as exc:  # noqa: BLE001 - a failed copy is reported, training goes on
                line = f"peer copy of checkpoint step {step} failed: {clean(f'{type(exc).__name__}: {exc}', 300)}"
                self.errors.append(line)
                self.say(f"  {line}")
            finally:
                with self._cond:
                    self._busy, self._current = False, None
                    self._cond.notify_all()

    def _holders(self, step: int, digest: str, hosts: list[Host], known_hosts: Path) -> list[str]:
        """Nodes that hold ``step`` with the recorded manifest: asked head first (rank 0 is
        usually there), the others only when the head does not."""
        run = ssh_run(known_hosts)
        script = f"-c {shlex.quote(LIST_SCRIPT)} {shlex.quote('~/' + checkpoint_dir(self.run_id))}"
        found: list[str] = []
        for host in hosts:
            ok, out = run(host, f"{shlex.quote(host.python)} {script}", 60)
            if ok and any(c.step == step and c.manifest == digest for c in parse_claims(out)):
                found.append(host.name)
                if host is hosts[0]:
                    break
        return found

    def _copy(
        self, step: int, digest: str, hosts: list[Host], known_hosts: Path, holder_name: str | None = None
    ) -> None:
        """Pull ``step`` from rank 0's node (asked around when unknown), check its manifest is the
        recorded one, send it to the next node; then drop this run's older peer copies there."""
        if self._multiplex is None:
            self._multiplex = Path(tempfile.mkdtemp(prefix="frpc-"))  # short: a socket path
        names = [h.name for h in hosts]
        if holder_name in names:
            holders = [str(holder_name)]  # its manifest is checked against the record after the pull
        else:
            holders = self._holders(step, digest, hosts, known_hosts)
        if not holders:
            return  # rotated away already, or rank 0's node is gone: nothing to copy from
        start = names.index(holders[0])
        ordered = hosts[start + 1 :] + hosts[:start]
        target = next((h for h in ordered if h.name not in holders), None)
        if target is None:
            with self._cond:
                self.copied[step] = holders[-1]
            return
        holder = next(h for h in hosts if h.name == holders[0])
        staging = self.staging / f"peer-{step}"
        try:
            failed = copy_step(
                holder,
                [target],
                self.run_id,
                step,
                known_hosts,
                staging,
                ssh_run(known_hosts, self._multiplex),
                manifest=digest,
                multiplex=self._multiplex,
            )
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        if failed:
            raise next(iter(failed.values()))
        with self._cond:
            self.copied[step] = target.name
            mine = self.placed.setdefault(target.name, [])
            mine.append(step)
            old, self.placed[target.name] = mine[:-KEEP], mine[-KEEP:]
        for gone in old:
            if any(gone == s for s in self.placed.get(target.name, [])):
                continue
            ssh_run(known_hosts, self._multiplex)(
                target, f'rm -rf -- "$HOME/{checkpoint_dir(self.run_id)}/step-{int(gone)}"', 60
            )
