"""Code sync for a whole fleet: direct from the laptop, or through the head for big fleets.

Direct, every node is one rsync from the laptop: fine for a few nodes, but at 64 nodes the
laptop's uplink carries the code 64 times and the laptop runs 64 rsyncs. Above the playbook's
``relay_sync_above``, the laptop uploads once, to the head, and the head copies to the workers
over the private network (``nodelib/fleetrun_relay.py``), in parallel.

The head needs a way into the workers. fleetrun never puts the operator's key on a node (Ray's
launcher and SkyPilot copy it to the head). Instead, per sync: an ephemeral ed25519 key is made
in memory, the workers accept it only from the head's private address and only without
forwarding or a terminal (``restrict,from=...``), the head gets it with the workers' pinned host
keys (strict checking, as everywhere), and afterwards the key is removed from the workers and
deleted from the head, whatever happened. A worker the relay could not reach is synced directly
from the laptop, so the relay can only make a sync faster, never make it fail.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import shlex
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path

from launch.errors import HostError
from launch.job.inventory import Host
from launch.planning import remote_layout as layout
from launch.settings import DEFAULT_FANOUT
from launch.transport.cluster_ssh import known_hosts_text, new_ed25519_keypair
from launch.transport.ssh import CommandResult, Fleet, NodeConnection, parallel_map
from launch.transport.sync import SyncResult, rsync_filters, sync_all, sync_host

RELAY_SCRIPT = f"{layout.LIB}/fleetrun_relay.py"
OnDone = Callable[[str, SyncResult | BaseException], None]


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

    def authorized_line(self, head_address: str) -> str:
        """Accepted only from the head, with no forwarding, agent, X11 or terminal."""
        return f'restrict,from="{head_address}" {self.public_line}'


def authorize_command(line: str) -> str:
    return (
        'umask 077 && mkdir -p "$HOME/.ssh" && '
        f'printf "%s\\n" {shlex.quote(line)} >> "$HOME/.ssh/authorized_keys"'
    )


def revoke_command(tag: str) -> str:
    """Remove the relay key's line; the file is rewritten in place (same inode, owner and mode)."""
    path = '"$HOME/.ssh/authorized_keys"'
    return (
        f"if [ -f {path} ]; then grep -v -F {shlex.quote(tag)} {path} > {path}.fleetrun-tmp; "
        f"cat {path}.fleetrun-tmp > {path}; rm -f {path}.fleetrun-tmp; fi"
    )


def relay_config(
    workers: list[Host],
    job: str,
    filters: list[str],
    relay_dir: str,
    lib_current: Collection[str],
    parallel: int,
) -> dict[str, object]:
    return {
        "key": f"{relay_dir}/key",
        "known_hosts": f"{relay_dir}/known_hosts",
        "parallel": parallel,
        "timeout": 1800,
        "transfers": [
            {"source": layout.workdir(job), "dest": layout.workdir(job), "filters": filters},
            {"source": layout.LIB, "dest": layout.LIB, "filters": [], "lib": True},
        ],
        "targets": [
            {
                "name": h.name,
                "user": h.user,
                "address": h.private_address,
                "port": h.port,
                "ship_lib": h.name not in lib_current,
            }
            for h in workers
        ],
    }


class _LineReader:
    """A write-only stream for Fabric's ``out_stream``: hands each complete line to ``on_line``."""

    def __init__(self, on_line: Callable[[str], None]) -> None:
        self.on_line = on_line
        self.pending = ""

    def write(self, text: str) -> int:
        self.pending += text
        while "\n" in self.pending:
            line, self.pending = self.pending.split("\n", 1)
            if line.strip():
                self.on_line(line)
        return len(text)

    def flush(self) -> None:
        pass


def relay_sync(
    fleet: Fleet,
    workdir: Path,
    job: str,
    known_hosts: Path,
    on_done: OnDone | None = None,
    lib_current: Collection[str] = (),
    parallel: int = DEFAULT_FANOUT,
) -> dict[str, SyncResult | BaseException]:
    """Laptop -> head, then head -> workers; any worker the relay missed is synced directly."""
    head, workers = fleet.hosts[0], fleet.hosts[1:]
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
    if not isinstance(head_result, BaseException) and workers:
        relayed = _through_head(
            fleet, head, workers, job, rsync_filters(workdir), lib_current, parallel, finish
        )
    missed = [h for h in workers if not isinstance(relayed.get(h.name), SyncResult)]
    if missed:
        direct = parallel_map(
            missed,
            lambda h: sync_host(h, workdir, job, known_hosts, ship_lib=h.name not in lib_current),
            max_parallel=parallel,
            on_done=finish,
        )
        results.update(direct)
    return {h.name: results[h.name] for h in fleet.hosts}


def _through_head(
    fleet: Fleet,
    head: Host,
    workers: list[Host],
    job: str,
    filters: list[str],
    lib_current: Collection[str],
    parallel: int,
    finish: OnDone,
) -> dict[str, SyncResult | BaseException]:
    key = RelayKey.generate()
    relay_dir = f"{layout.ROOT}/relay/{key.tag}"
    worker_names = {h.name for h in workers}
    relayed: dict[str, SyncResult | BaseException] = {}
    authorized: list[Host] = []
    try:
        line = key.authorized_line(head.private_address)
        answers = fleet.map(lambda c: c.run(authorize_command(line), timeout=30), hosts=workers, deadline=60)
        authorized = [h for h in workers if _ok(answers[h.name])]
        if not authorized:
            return relayed
        head_conn = fleet.connections[head.name]
        config = relay_config(authorized, job, filters, relay_dir, lib_current, parallel)
        head_conn.put_file(f"{relay_dir}/key", key.private_openssh, 0o600)
        head_conn.put_file(f"{relay_dir}/known_hosts", known_hosts_text(authorized), 0o600)
        head_conn.put_file(f"{relay_dir}/config.json", json.dumps(config), 0o600)

        def on_line(text: str) -> None:
            try:
                answer = json.loads(text)
            except ValueError:
                return
            name = answer.get("name")
            if name not in worker_names or name in relayed:
                return
            if answer.get("ok"):
                value: SyncResult | BaseException = SyncResult(
                    name, int(answer.get("files", 0)), int(answer.get("bytes", 0)), via=f"head {head.name}"
                )
                relayed[name] = value
                finish(name, value)
            else:
                relayed[name] = HostError(name, f"relay: {answer.get('error', 'failed')}")

        _run_relay(head_conn, relay_dir, _LineReader(on_line))
    except HostError:
        pass  # the relay is an optimisation: whoever it missed is synced directly
    finally:
        fleet.map(lambda c: c.run(revoke_command(key.tag), timeout=30), hosts=authorized, deadline=60)
        with contextlib.suppress(HostError):
            fleet.connections[head.name].run(f'rm -rf "$HOME/{relay_dir}"', timeout=30)
    return relayed


def _ok(answer: CommandResult | BaseException) -> bool:
    return isinstance(answer, CommandResult) and answer.ok


def _run_relay(head_conn: NodeConnection, relay_dir: str, reader: _LineReader) -> None:
    head_conn.open()
    command = f'python3 "$HOME/{RELAY_SCRIPT}" "$HOME/{relay_dir}/config.json"'
    try:
        # stdout is not hidden: it goes to ``reader`` (never to the terminal), one JSON line per worker
        head_conn.conn.run(
            command, timeout=3600, hide="stderr", warn=True, in_stream=False, out_stream=reader
        )
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
    """Sync the fleet's code: directly at up to ``relay_above`` nodes, through the head above."""
    if len(fleet.hosts) > relay_above:
        return relay_sync(fleet, workdir, job, known_hosts, on_done, lib_current, parallel)
    return sync_all(
        fleet.hosts,
        workdir,
        job,
        known_hosts,
        max_parallel=parallel,
        on_done=on_done,
        lib_current=lib_current,
    )
