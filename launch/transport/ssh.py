"""SSH to the fleet: Fabric connections with pinned host keys, and bounded parallel fan-out.

Fabric (paramiko) is used in-process: threaded paramiko was ~3x faster than pdsh at 64 nodes on
this machine kind. Fabric's own default accepts unknown host keys (``AutoAddPolicy``); every
connection made here replaces that with ``RejectPolicy`` and loads only fleetrun's known_hosts,
so an unknown or changed host key is refused, never learned.

A host behind a bastion (``proxy_jump``) is reached through a ``direct-tcpip`` channel of one
connection to the jump host, shared by every node behind it (a login node often limits how many
connections a user may open; one transport carries many channels), checked against the same
known_hosts with the same ``RejectPolicy``. OpenSSH commands (rsync) get the jump as a
``ProxyCommand`` running ``ssh`` with the same strict options: ``-J`` would not carry them.

Fan-out uses our own thread pool with a bound and per-command timeouts, because Fabric's
``ThreadingGroup`` joins its threads with no timeout and one hung host would block everything.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import secrets
import select
import time
from collections.abc import Callable, Collection, Iterable
from concurrent.futures import TimeoutError as FuturesTimeout
from concurrent.futures import as_completed
from pathlib import Path
from typing import TypeVar

import paramiko
import paramiko.sftp
from fabric import Config, Connection

from launch.errors import HostError
from launch.job.inventory import Host
from launch.processes import ensure_open_files  # noqa: F401 - re-exported: callers import it from here
from launch.settings import DEFAULT_FANOUT
from launch.transport.channels import BoundedOutput, LineSession
from launch.transport.daemon_pool import DaemonPool
from launch.transport.jump import (  # noqa: F401 - re-exported: callers import them from here
    DEFAULT_CONNECT_TIMEOUT,
    KEEPALIVE_S,
    JumpHosts,
    connect_errors,
    key_file_problem,
    unreachable_reason,
)
from launch.transport.openssh import openssh_command, proxy_command  # noqa: F401 - re-exported
from launch.transport.port import CommandResult, FleetPort, NodeResults
from launch.transport.reachability import sshd_answers

T = TypeVar("T")
MAX_COMMAND_S = 3600.0
"""The longest any command on a node may take when its caller names no timeout."""

# paramiko's transport thread logs a failed handshake (a port that never sends the SSH banner) as an
# ERROR with a traceback; with no handler configured, Python's last-resort handler printed it on
# the terminal. Every such failure also reaches the caller as an exception, which fleetrun names.
logging.getLogger("paramiko").addHandler(logging.NullHandler())


def _fabric_config() -> Config:
    return Config(
        overrides={"load_ssh_configs": False, "run": {"hide": True, "warn": True, "in_stream": False}}
    )


def _send_input(channel: paramiko.Channel, data: bytes) -> None:
    """Send ``data`` then end of input, tolerating a command that exited without reading it.

    A command that cannot start (a Python path that does not exist: exit 127) closes the channel
    before its stdin is sent; that is the node's answer, read next, not a lost connection. Only a
    closed channel is forgiven: a dead transport still raises from the read loop.
    """
    try:
        channel.sendall(data)
        channel.shutdown_write()
    except OSError:
        if not (channel.closed or channel.exit_status_ready()):
            raise


class NodeConnection:
    """One host's SSH connection, opened lazily, with strict host-key checking."""

    def __init__(
        self,
        host: Host,
        known_hosts: Path,
        connect_timeout: int = DEFAULT_CONNECT_TIMEOUT,
        jumps: JumpHosts | None = None,
    ) -> None:
        self.host = host
        self.known_hosts = known_hosts
        self.connect_timeout = connect_timeout
        self._own_jumps = jumps is None
        self.jumps = jumps if jumps is not None else JumpHosts(known_hosts, connect_timeout)
        # Bounded everywhere: a partitioned host keeps its TCP connection "open" (no RST), and
        # paramiko would otherwise wait up to an hour to open a channel on it.
        connect_kwargs: dict[str, object] = {
            "look_for_keys": False,
            "allow_agent": False,
            "banner_timeout": connect_timeout,
            "auth_timeout": connect_timeout,
            "channel_timeout": connect_timeout,
        }
        if host.key is not None:
            connect_kwargs["key_filename"] = str(host.key)
        self.conn = Connection(
            host=host.address,
            user=host.user,
            port=host.port,
            config=_fabric_config(),
            connect_timeout=connect_timeout,
            connect_kwargs=connect_kwargs,
        )
        client = self.conn.client
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
        client.load_host_keys(str(known_hosts))
        self.sessions: dict[str, LineSession] = {}

    def open(self) -> None:
        """Connect and authenticate; every failure is a ``HostError`` that says which kind it is.

        A missing or unreadable key file, an unreachable host (refused, timed out, no route, or
        the connection dropped during the handshake), a rejected key and a changed host key are
        told apart: each needs a different fix, and "authentication failed" for a host that went
        away sends the operator chasing keys.
        """
        host = self.host
        where = f"{host.user}@{host.address}:{host.port}"
        if self.conn.is_connected:
            return
        if host.key is not None:
            problem = key_file_problem(host.key)
            if problem:
                raise HostError(host.name, f"key file {host.key}: {problem} (inventory field 'key')")
        try:
            self._connect(where)
        except BaseException:
            # A failed connect can leave paramiko's transport thread running (Fabric only closes
            # what it counts as connected): close it here so failures do not pile up threads.
            with contextlib.suppress(Exception):
                self.conn.client.close()
            raise

    def _connect(self, where: str) -> None:
        host = self.host
        self.conn.connect_kwargs.pop("sock", None)
        if host.proxy_jump is not None:
            self.conn.connect_kwargs["sock"] = self.jumps.channel(host, self.connect_timeout)
            where = f"{where} through jump host {host.proxy_jump.label}"
        started = time.monotonic()
        with connect_errors(host.name, where, host.key, host.host_key, self.conn.client, "host"):
            try:
                self.conn.open()
            except paramiko.SSHException as exc:
                self._name_a_silent_port(exc, where, time.monotonic() - started)
                raise
            if self.conn.transport is not None:
                self.conn.transport.set_keepalive(KEEPALIVE_S)

    def _name_a_silent_port(self, exc: paramiko.SSHException, where: str, waited: float) -> None:
        """A port that accepts TCP but never speaks SSH (a hung sshd, a firewall's tarpit, another
        service) is named as such: paramiko gives up on the banner in its own thread and reports
        "No existing session" or "Error reading SSH protocol banner", which read like an SSH bug."""
        transport = self.conn.client.get_transport()
        if transport is None or transport.remote_version:
            return  # the server did send its banner: connect_errors names what failed after it
        if "Indecipherable protocol version" in str(exc):
            raise HostError(
                self.host.name, f"{where} answered, but not with SSH (is another service on that port?)"
            ) from None
        if waited >= 0.9 * self.connect_timeout:  # not a hang-up: that is over in an instant
            raise HostError(
                self.host.name,
                f"{where}: port {self.host.port} answered but sent no SSH banner within "
                f"{self.connect_timeout} s (is sshd hung or overloaded, or another service on that port?)",
            ) from None

    def run(
        self, command: str, timeout: float | None = None, on_stdout: Callable[[bytes], None] | None = None
    ) -> CommandResult:
        """Run a shell command; a non-zero exit is a result, a broken connection is a ``HostError``.

        Bounded like every node answer (``_exchange``): at most ``MAX_COMMAND_S`` when no
        ``timeout`` is given, and only the first and last ``MAX_OUTPUT_BYTES`` of each stream
        kept, the cut named in the result (``CommandResult.cut``) and in its text. ``on_stdout``
        also gets each chunk of stdout as it comes (a stream read as it runs: the relay's lines).
        """
        return self._exchange(command, None, MAX_COMMAND_S if timeout is None else timeout, on_stdout)

    def run_with_input(
        self, command: str, data: bytes, timeout: float, on_stdout: Callable[[bytes], None] | None = None
    ) -> CommandResult:
        """Run ``command`` with ``data`` on its stdin (then end of input): one round trip.

        How scripts and secrets reach a node: a command line is visible to every user of the
        machine (``ps``), stdin is not. Fabric's ``in_stream`` copies a non-terminal stream one
        byte per 10 ms, so this drives the channel itself. Output is bounded as for ``run``;
        ``on_stdout`` gets each chunk of stdout as it comes (the image pull's progress lines).
        """
        return self._exchange(command, data, timeout, on_stdout)

    def _exchange(
        self,
        command: str,
        data: bytes | None,
        timeout: float,
        on_stdout: Callable[[bytes], None] | None,
    ) -> CommandResult:
        """One command over a channel of this connection, driven here rather than by Fabric:
        Invoke keeps a command's whole output and joins it on every chunk it reads (16 MiB from a
        node took 33 s of the laptop's CPU, and all of its size in memory), and a node is
        untrusted. Here each stream keeps its first and last ``MAX_OUTPUT_BYTES``
        (``BoundedOutput``) and the whole exchange ends within ``timeout``."""
        self.open()
        transport = self.conn.transport
        if transport is None or not transport.is_active():
            raise HostError(self.host.name, "connection is not open")
        deadline = time.monotonic() + timeout
        out, err = BoundedOutput(self.host.name, "output"), BoundedOutput(self.host.name, "error output")
        try:
            channel = transport.open_session(timeout=DEFAULT_CONNECT_TIMEOUT)
        except (paramiko.SSHException, OSError, EOFError) as exc:
            self.close()
            raise HostError(self.host.name, f"connection lost: {exc or type(exc).__name__}") from None
        try:
            channel.settimeout(max(0.1, timeout))
            channel.exec_command(command)
            _send_input(channel, data or b"")
            while True:
                while channel.recv_ready():
                    chunk = channel.recv(65536)
                    out.add(chunk)
                    if on_stdout is not None:
                        on_stdout(chunk)
                while channel.recv_stderr_ready():
                    err.add(channel.recv_stderr(65536))
                done = channel.eof_received or channel.closed
                if done and not channel.recv_ready() and not channel.recv_stderr_ready():
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    raise HostError(self.host.name, f"command timed out after {timeout} s: {command[:80]}")
                select.select([channel], [], [], min(left, 1.0))
            if not channel.status_event.wait(max(0.0, deadline - time.monotonic())):
                raise HostError(self.host.name, f"command timed out after {timeout} s: {command[:80]}")
            code = channel.recv_exit_status()
        except (paramiko.SSHException, OSError, EOFError) as exc:
            self.close()
            raise HostError(self.host.name, f"connection lost: {exc or type(exc).__name__}") from None
        finally:
            with contextlib.suppress(Exception):
                channel.close()
        cut = "; ".join(line for line in (out.cut_line(), err.cut_line()) if line)
        return CommandResult(self.host.name, code, out.text(), err.text(), cut)

    def ask(self, command: str, request: str, timeout: float) -> str:
        """One request line to the long-lived ``command`` on this node, its answer line back.

        The command is started once on a channel of this connection and kept (``LineSession``).
        A channel that died while the connection lives (its process was killed) is replaced at
        once, so that is not mistaken for an unreachable node.
        """
        try:
            return self._line_session(command).ask(request, timeout)
        except HostError:
            self.sessions.pop(command, None)
            transport = self.conn.transport
            if transport is None or not transport.is_active():
                raise
            return self._line_session(command).ask(request, timeout)

    def _line_session(self, command: str) -> LineSession:
        session = self.sessions.get(command)
        if session is not None and not session.closed:
            return session
        self.open()
        transport = self.conn.transport
        if transport is None or not transport.is_active():
            raise HostError(self.host.name, "connection is not open")
        try:
            channel = transport.open_session(timeout=DEFAULT_CONNECT_TIMEOUT)
            channel.exec_command(command)
        except (paramiko.SSHException, OSError, EOFError) as exc:
            self.close()
            raise HostError(
                self.host.name, f"could not start {command[:60]}: {exc or type(exc).__name__}"
            ) from None
        self.sessions[command] = LineSession(self.host.name, channel)
        return self.sessions[command]

    def close_sessions(self) -> None:
        """End the long-lived commands; each exits on end of input.

        Called from the fan-out's timeout path while a worker thread may still be opening a
        session on this connection: the dict is swapped out first, never iterated while shared.
        """
        sessions, self.sessions = self.sessions, {}
        for session in list(sessions.values()):
            session.close()

    def put_file(self, remote_path: str, text: str, mode: int = 0o644) -> None:
        """Write a small file on the node (path relative to the home directory) with ``mode``.

        The file is created under a fresh temporary name with ``mode`` in the SFTP open request
        itself (the server's ``open(O_CREAT|O_EXCL, mode)``), written, then renamed over the
        target. A plain ``open`` + ``chmod`` leaves a moment where the new file has the server's
        default mode, and another user who opens it then can read what is written later.
        """
        self.open()
        sftp = self.conn.sftp()
        parts = remote_path.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            with contextlib.suppress(OSError):
                sftp.mkdir("/".join(parts[:i]), 0o700)
        tmp = f"{remote_path}.fleetrun-{secrets.token_hex(6)}"
        attrs = paramiko.SFTPAttributes()
        attrs.st_mode = mode
        flags = paramiko.sftp.SFTP_FLAG_WRITE | paramiko.sftp.SFTP_FLAG_CREATE | paramiko.sftp.SFTP_FLAG_EXCL
        kind, msg = sftp._request(paramiko.sftp.CMD_OPEN, tmp, flags, attrs)
        if kind != paramiko.sftp.CMD_HANDLE or msg is None:
            raise HostError(self.host.name, f"could not create {remote_path} over SFTP")
        try:
            with paramiko.SFTPFile(sftp, msg.get_binary(), "w") as fh:
                fh.chmod(mode)  # the server's umask may have narrowed the create mode; never widened
                fh.write(text)
            sftp.posix_rename(tmp, remote_path)
        except BaseException:
            with contextlib.suppress(Exception):
                sftp.remove(tmp)
            raise

    def close(self) -> None:
        # Closing a dead connection must never mask the real error.
        self.close_sessions()
        with contextlib.suppress(Exception):
            self.conn.close()
        if self._own_jumps:
            self.jumps.close()


def parallel_map(
    hosts: list[Host],
    fn: Callable[[Host], T],
    max_parallel: int = DEFAULT_FANOUT,
    on_done: Callable[[str, T | BaseException], None] | None = None,
    deadline: float | None = None,
    on_timeout: Callable[[Host], None] | None = None,
) -> NodeResults[T]:
    """``fn`` on every host in a bounded pool; results or exceptions keyed by host name, in host order.

    With ``deadline`` (seconds), a host still busy gets a ``HostError`` and ``on_timeout`` (which
    should unblock the stuck call, e.g. close its connection); one hung host never stalls the rest,
    nor the process's exit (``DaemonPool``: a call no close can unblock is abandoned).
    """
    results: dict[str, T | BaseException] = {}
    pool = DaemonPool(max_workers=max(1, min(max_parallel, len(hosts))), thread_name_prefix="fleetrun")
    futures = {pool.submit(fn, h): h for h in hosts}
    try:
        for future in as_completed(futures, timeout=deadline):
            host = futures[future]
            try:
                value: T | BaseException = future.result()
            except BaseException as exc:  # noqa: BLE001 - collected and reported per host
                value = exc
            results[host.name] = value
            if on_done is not None:
                on_done(host.name, value)
    except FuturesTimeout:
        for future, host in futures.items():
            if host.name not in results:
                future.cancel()
                if on_timeout is not None:
                    on_timeout(host)
                results[host.name] = HostError(host.name, f"no answer within {deadline:.0f} s")
                if on_done is not None:
                    on_done(host.name, results[host.name])
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    return NodeResults((h.name, results[h.name]) for h in hosts)


class SshPool:
    """Connections to a set of hosts, reused across steps (connect once, run many): the
    ``FleetPort`` every real run goes through (``launch.transport.port``)."""

    def __init__(self, hosts: Iterable[Host], known_hosts: Path, max_parallel: int = DEFAULT_FANOUT) -> None:
        self.hosts = list(hosts)
        self.known_hosts = known_hosts
        self.max_parallel = max_parallel
        ensure_open_files(4 * len(self.hosts) + 256)
        self.jumps = JumpHosts(known_hosts)
        self.connections = {h.name: NodeConnection(h, known_hosts, jumps=self.jumps) for h in self.hosts}

    def map(
        self,
        fn: Callable[[NodeConnection], T],
        hosts: Iterable[Host] | None = None,
        on_done: Callable[[str, T | BaseException], None] | None = None,
        deadline: float | None = None,
    ) -> NodeResults[T]:
        """``parallel_map`` over this fleet's connections; a host past ``deadline`` has its
        connection closed, which unblocks the stuck call."""
        targets = list(hosts) if hosts is not None else self.hosts
        return parallel_map(
            targets,
            lambda h: fn(self.connections[h.name]),
            max_parallel=self.max_parallel,
            on_done=on_done,
            deadline=deadline,
            on_timeout=lambda h: self.connections[h.name].close(),
        )

    def run(self, command: str, timeout: float | None = None) -> NodeResults[CommandResult]:
        return self.map(lambda c: c.run(command, timeout=timeout))

    def subset(self, names: Collection[str]) -> SshPool:
        """The same pool (same open connections, same jump hosts) narrowed to ``names``: how a
        step works on fewer nodes. Closing a subset closes the connections it shares."""
        view = copy.copy(self)
        view.hosts = [h for h in self.hosts if h.name in names]
        return view

    def reconnect(self, hosts: list[Host], known_hosts: Path) -> SshPool:
        """See ``FleetPort.reconnect``: survivors keep their connection (same host, same pinned key)."""
        pool = SshPool(hosts, known_hosts, max_parallel=self.max_parallel)
        for host in hosts:
            conn = self.connections.pop(host.name, None)
            if conn is not None and conn.host == host:
                pool.connections[host.name].close()
                pool.connections[host.name] = conn
            elif conn is not None:
                conn.close()
        self.close()
        return pool

    def outside(self, hosts: list[Host], known_hosts: Path) -> SshPool:
        """See ``FleetPort.outside``: a pool of its own (its own jump connections)."""
        return SshPool(hosts, known_hosts, max_parallel=self.max_parallel)

    def answers(self, host: Host, timeout: float) -> bool:
        """Whether ``host``'s sshd answers with its banner (through its jump host, over the
        fleet's shared jump connection, when it has one): how recovery re-checks a node and
        waits for a lab machine or a new instance (``launch.transport.reachability``)."""
        return sshd_answers(host, timeout, self.jumps)

    def close(self) -> None:
        for conn in self.connections.values():
            conn.close()
        self.jumps.close()

    def __enter__(self) -> SshPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


Fleet = SshPool
"""The pool's former name, kept for the modules outside ``launch.run`` / ``launch.transport``
that still use it ("fleet" also names the inventory's ``FleetRef`` and the local namespaces)."""


def _implements_the_port(pool: SshPool) -> FleetPort:
    return pool  # the type checker proves ``SshPool`` is a ``FleetPort``
