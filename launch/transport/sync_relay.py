"""Code sync for a whole fleet: direct from the laptop, or through the head for big fleets.

Direct, every node is one rsync from the laptop: fine for a few nodes, but at 64 nodes the
laptop's uplink carries the code 64 times and the laptop runs 64 rsyncs. Above the playbook's
``relay_sync_above``, the laptop uploads once, to the head, and the head copies to the workers
over the private network (``nodelib/fleetrun_relay.py``), in parallel.

The head needs a way into the workers. fleetrun never puts the operator's key on a node (Ray's
launcher and SkyPilot copy it to the head). Instead, per sync: an ephemeral ed25519 key is made
in memory, the workers accept it only from the head's private address and only without
forwarding or a terminal (``restrict,from=...``), only until it expires (``expiry-time``), and only
to run rsync's receiver into the job's workdir (a forced ``command``: ``rsync_gate``); never into
the node library, which a worker gets from the laptop (checked by content, ``sync.nodelib_source``).
The head gets it with the workers' pinned host keys (strict checking, as everywhere), and
afterwards the key's exact line is removed from every worker (``launch.transport.authorized_keys``:
the operator's lines stay byte for byte) and the key deleted from the head, whatever happened,
Ctrl-C included. A worker the relay could not reach is synced directly
from the laptop, so the relay can only make a sync faster, never make it fail.
"""

from __future__ import annotations

import contextlib
import json
import re
import secrets
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

from launch.errors import HostError
from launch.job.inventory import Host
from launch.nodelib.fleetrun_protocol import ProtocolError, RelayResult
from launch.planning import remote_layout as layout
from launch.planning.authorized_keys import add_command, expiry_time, remove_command
from launch.planning.cluster_ssh import known_hosts_text, new_ed25519_keypair
from launch.settings import DEFAULT_FANOUT
from launch.transport.channels import MAX_ANSWER_BYTES
from launch.transport.ssh import CommandResult, Fleet, NodeConnection, parallel_map
from launch.transport.sync import SyncResult, rsync_filters, sync_all, sync_host
from launch.transport.sync_quick import quick_sync

RELAY_SCRIPT = f"{layout.LIB}/fleetrun_relay.py"
OnDone = Callable[[str, SyncResult | BaseException], None]


RELAY_VALID_S = 2 * 3600  # the relay's own timeout (1 h) and then some
SAFE_DEST = re.compile(r"[A-Za-z0-9._/-]+/")


def rsync_gate(dests: Sequence[str]) -> str:
    """The forced command on the workers: rsync's receiver into ``dests``, and nothing else.

    rsync's client runs ``rsync --server <flags> [--delete] [--stats] [--mkpath] . <dest>`` on
    the far side (checked with rsync 3.5.0 here: the relay's filters travel inside the protocol, not
    in argv). The gate splits ``$SSH_ORIGINAL_COMMAND`` into words (no globbing), accepts exactly
    that shape with the short flags of ``-a`` and the capability letters after the dot, and
    executes those same words; anything else (a shell, ``--sender``, another path, options that
    write elsewhere such as ``--log-file`` or ``--backup-dir``) is refused.
    """
    for dest in dests:
        if not SAFE_DEST.fullmatch(dest) or ".." in dest.split("/"):
            raise ValueError(f"relay destination {dest!r}: expected a plain home-relative directory/")
    refuse = 'refuse() { echo "fleetrun relay key: only the rsync receiver into the synced directories" >&2; exit 1; }'
    return "; ".join(
        [
            "set -f",
            "set -- $SSH_ORIGINAL_COMMAND",
            refuse,
            '[ "$#" -ge 5 ] || refuse',
            '[ "$1" = rsync ] && [ "$2" = --server ] || refuse',
            'flags=${3%%.*}; caps=${3#"$flags"}',
            'case "$flags" in -*[!logDtpre]*|-|[!-]*) refuse;; esac',
            'case "$caps" in *[!.A-Za-z]*) refuse;; esac',
            "shift 3",
            'while [ "$#" -gt 2 ]; do case "$1" in --delete|--stats|--mkpath) shift;; *) refuse;; esac; done',
            '[ "$1" = . ] || refuse',
            f'case "$2" in {"|".join(dests)}) ;; *) refuse;; esac',
            "exec $SSH_ORIGINAL_COMMAND",
        ]
    )


@dataclass(frozen=True)
class RelayKey:
    tag: str
    private_openssh: str
    public_line: str

    @classmethod
    def generate(cls) -> RelayKey:
        tag = f"fleetrun-relay-{secrets.token_hex(6)}"
        private, public = new_ed25519_keypair()
        return cls(tag=tag, private_openssh=private, public_line=f"{public} {tag}")

    def authorized_line(self, head_address: str, dests: Sequence[str], expires: str) -> str:
        """From the head only, until ``expires``, rsync's receiver only; no forwarding, agent, X11 or terminal."""
        command = f"sh -c '{rsync_gate(dests)}'".replace('"', '\\"')
        return (
            f'restrict,from="{head_address}",expiry-time="{expires}",command="{command}" {self.public_line}'
        )


def relay_dests(job: str) -> tuple[str]:
    """Where the relay key may write on a worker: the job's workdir, nothing else.

    Not the node library: that is the code every later run executes on the worker (watchdog,
    guard, checkpoint helper), and the head is only one node of the fleet. A worker whose library
    is not current gets it from this machine directly (``relay_sync``)."""
    return (f"{layout.workdir(job)}/",)


def relay_config(
    workers: list[Host], job: str, filters: list[str], relay_dir: str, parallel: int
) -> dict[str, object]:
    """What the head's relay does: the workdir only (``relay_dests``), to each worker."""
    return {
        "key": f"{relay_dir}/key",
        "known_hosts": f"{relay_dir}/known_hosts",
        "parallel": parallel,
        "timeout": 1800,
        "transfers": [{"source": layout.workdir(job), "dest": layout.workdir(job), "filters": filters}],
        "targets": [
            {"name": h.name, "user": h.user, "address": h.private_address, "port": h.port, "ship_lib": False}
            for h in workers
        ],
    }


class _LineReader:
    """Hands each complete line of a stream's bytes to ``on_line``; a line longer than
    ``MAX_ANSWER_BYTES`` (a hostile or broken head) is dropped, never held whole."""

    def __init__(self, on_line: Callable[[str], None]) -> None:
        self.on_line = on_line
        self.pending = bytearray()
        self.skipping = False

    def feed(self, chunk: bytes) -> None:
        start = 0
        while (end := chunk.find(b"\n", start)) >= 0:
            piece, start = chunk[start:end], end + 1
            if not self.skipping and len(self.pending) + len(piece) <= MAX_ANSWER_BYTES:
                line = bytes(self.pending + piece).decode("utf-8", "replace")
                if line.strip():
                    self.on_line(line)
            self.pending.clear()
            self.skipping = False
        rest = chunk[start:]
        if len(self.pending) + len(rest) > MAX_ANSWER_BYTES:
            self.pending.clear()
            self.skipping = True
        elif not self.skipping:
            self.pending += rest


def relay_sync(
    fleet: Fleet,
    workdir: Path,
    job: str,
    known_hosts: Path,
    on_done: OnDone | None = None,
    lib_current: Collection[str] = (),
    parallel: int = DEFAULT_FANOUT,
    hosts: list[Host] | None = None,
) -> dict[str, SyncResult | BaseException]:
    """Laptop -> head, then head -> workers; any worker the relay missed is synced directly.

    ``hosts``: a part of ``fleet`` (default all of it); its first node is the relay's head.
    """
    hosts = fleet.hosts if hosts is None else hosts
    head, workers = hosts[0], hosts[1:]
    done = on_done or (lambda _n, _r: None)
    results: dict[str, SyncResult | BaseException] = {}

    def finish(name: str, value: SyncResult | BaseException) -> None:
        results[name] = value
        done(name, value)

    try:
        head_result: SyncResult | BaseException = sync_host(
            head, workdir, job, known_hosts, ship_lib=head.name not in lib_current
        )
    except Exception as exc:  # noqa: BLE001 - a failed head sync means a plain direct sync
        head_result = exc
    finish(head.name, head_result)
    relayed: dict[str, SyncResult | BaseException] = {}
    # A worker without the current library gets it from here after the relay (the relay key may
    # write only the workdir); it is reported once, when both are done.
    needs_lib = {h.name for h in workers if h.name not in lib_current}

    def relayed_done(name: str, value: SyncResult | BaseException) -> None:
        if name not in needs_lib:
            finish(name, value)

    if not isinstance(head_result, BaseException) and workers:
        relayed = _through_head(fleet, head, workers, job, rsync_filters(workdir), parallel, relayed_done)

    def direct(host: Host) -> SyncResult:
        result = sync_host(host, workdir, job, known_hosts, ship_lib=host.name in needs_lib)
        through_head = relayed.get(host.name)
        if isinstance(through_head, SyncResult):  # the workdir came through the head, the library from here
            return SyncResult(
                host.name,
                through_head.files_sent + result.files_sent,
                through_head.bytes_sent + result.bytes_sent,
                via=through_head.via,
            )
        return result

    rest = [h for h in workers if not isinstance(relayed.get(h.name), SyncResult) or h.name in needs_lib]
    if rest:
        results.update(parallel_map(rest, direct, max_parallel=parallel, on_done=finish))
    return {h.name: results[h.name] for h in hosts}


def _through_head(
    fleet: Fleet,
    head: Host,
    workers: list[Host],
    job: str,
    filters: list[str],
    parallel: int,
    finish: OnDone,
) -> dict[str, SyncResult | BaseException]:
    key = RelayKey.generate()
    relay_dir = f"{layout.ROOT}/relay/{key.tag}"
    worker_names = {h.name for h in workers}
    relayed: dict[str, SyncResult | BaseException] = {}
    line = key.authorized_line(head.private_address, relay_dests(job), expiry_time(RELAY_VALID_S))
    try:
        answers = fleet.map(lambda c: c.run(add_command(line), timeout=30), hosts=workers, deadline=60)
        authorized = [h for h in workers if _ok(answers[h.name])]
        if not authorized:
            return relayed
        head_conn = fleet.connections[head.name]
        config = relay_config(authorized, job, filters, relay_dir, parallel)
        head_conn.put_file(f"{relay_dir}/key", key.private_openssh, 0o600)
        head_conn.put_file(f"{relay_dir}/known_hosts", known_hosts_text(authorized), 0o600)
        head_conn.put_file(f"{relay_dir}/config.json", json.dumps(config), 0o600)

        def on_line(text: str) -> None:
            try:
                answer = RelayResult.from_json(text)
            except ProtocolError:
                return  # not a result line: that worker counts as missed and is synced directly
            name = answer.name
            if name not in worker_names or name in relayed:
                return
            if answer.ok:
                value: SyncResult | BaseException = SyncResult(
                    name, answer.files, answer.sent_bytes, via=f"head {head.name}"
                )
                relayed[name] = value
                finish(name, value)
            else:
                relayed[name] = HostError(name, f"relay: {answer.error or 'failed'}")

        _run_relay(head_conn, relay_dir, _LineReader(on_line))
    except HostError:
        pass  # the relay is an optimisation: whoever it missed is synced directly
    finally:
        # Every worker, not only those that answered: an interrupted authorize may still have written.
        fleet.map(lambda c: c.run(remove_command(line), timeout=30), hosts=workers, deadline=60)
        with contextlib.suppress(HostError):
            fleet.connections[head.name].run(f'rm -rf "$HOME/{relay_dir}"', timeout=30)
    return relayed


def _ok(answer: CommandResult | BaseException) -> bool:
    return isinstance(answer, CommandResult) and answer.ok


def _run_relay(head_conn: NodeConnection, relay_dir: str, reader: _LineReader) -> None:
    head_conn.open()
    command = f'python3 "$HOME/{RELAY_SCRIPT}" "$HOME/{relay_dir}/config.json"'
    try:
        # stdout goes to ``reader`` as it comes (never to the terminal), one JSON line per worker
        head_conn.run(command, timeout=3600, on_stdout=reader.feed)
    except Exception as exc:  # noqa: BLE001 - any failure here falls back to direct syncs
        raise HostError(head_conn.host.name, f"relay on the head failed: {exc}") from None


def sync_fleet(
    fleet: Fleet,
    workdir: Path,
    job: str,
    known_hosts: Path,
    relay_above: int,
    on_done: OnDone | None = None,
    lib_current: Collection[str] = (),
    parallel: int = DEFAULT_FANOUT,
) -> dict[str, SyncResult | BaseException]:
    """Sync the fleet's code: a small change over the open connections where that is provably
    the same (``launch.transport.sync_quick``), the rest by rsync: directly at up to
    ``relay_above`` nodes, through the head above."""
    results: dict[str, SyncResult | BaseException] = dict(
        quick_sync(fleet, fleet.hosts, workdir, job, lib_current, on_done)
    )
    rest = [h for h in fleet.hosts if h.name not in results]
    if len(rest) > relay_above:
        results.update(relay_sync(fleet, workdir, job, known_hosts, on_done, lib_current, parallel, rest))
    elif rest:
        results.update(
            sync_all(
                rest,
                workdir,
                job,
                known_hosts,
                max_parallel=parallel,
                on_done=on_done,
                lib_current=lib_current,
            )
        )
    return {h.name: results[h.name] for h in fleet.hosts}
