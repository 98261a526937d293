"""Errors of an SSH connect, and the shared connection to a jump host (``proxy_jump``).

Kept apart from ``launch.transport.ssh`` (which re-exports what callers use) so each stays short.
A host behind a bastion is reached through a ``direct-tcpip`` channel of one connection to the
jump host, shared by every node behind it: a login node often limits how many connections (and
unauthenticated handshakes, sshd's ``MaxStartups``) a user may have at once, while one transport
carries many channels (sshd's ``MaxSessions`` counts shells and commands, not forwarded channels).
The jump hop is checked against the same known_hosts with the same ``RejectPolicy`` as every
other connection, and the node's own host key is still checked end to end through the channel.
Every connection to a jump host (this one, and each OpenSSH command of ``openssh.jump_slot``)
holds one of ``JUMP_SLOTS`` lock-file slots shared by all fleetrun processes of the user.
"""

from __future__ import annotations

import contextlib
import errno
import threading
from collections.abc import Iterator
from pathlib import Path

import paramiko

from launch.errors import HostError, HostKeyMismatch
from launch.job.inventory import Host, JumpHost, bracketed
from launch.transport.jump_slots import (  # noqa: F401 - re-exported: callers import them from here
    DEFAULT_CONNECT_TIMEOUT,
    JUMP_SLOTS,
    KEEPALIVE_S,
    SLOT_POLL_S,
    give_jump_slot,
    shared_jump_slot,
    take_jump_slot,
)


def key_file_problem(path: Path) -> str | None:
    """Why the private key file cannot be read, or None when it can."""
    try:
        with open(path, "rb") as handle:
            handle.read(1)
    except FileNotFoundError:
        return "no such file"
    except PermissionError:
        return "not readable (permission denied)"
    except IsADirectoryError:
        return "is a directory, not a key file"
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})"
    return None


def unreachable_reason(exc: BaseException) -> str:
    """'connection refused', 'timed out', 'no route to host', ... for a failed TCP connect."""
    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError) and exc.errors:
        exc = next(iter(exc.errors.values()))
    if isinstance(exc, TimeoutError):
        return "connection timed out"
    if isinstance(exc, ConnectionRefusedError) or getattr(exc, "errno", None) == errno.ECONNREFUSED:
        return "connection refused"
    if getattr(exc, "errno", None) in (errno.EHOSTUNREACH, errno.ENETUNREACH):
        return "no route to host"
    if isinstance(exc, EOFError | ConnectionResetError):
        return "connection closed by the host"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror.lower()
    return str(exc) or type(exc).__name__


@contextlib.contextmanager
def connect_errors(
    name: str, where: str, key: Path | None, host_key: str, client: paramiko.SSHClient, field: str
) -> Iterator[None]:
    """Turn paramiko's connect failures into a ``HostError`` for ``name`` that says which kind.

    ``field`` names the inventory entry to fix (``host`` or ``proxy_jump``): a jump host's
    failure is reported for every host behind it, naming the jump host.
    """
    prefix = "" if field == "host" else "jump host: "
    try:
        yield
    except paramiko.BadHostKeyException as exc:
        raise HostKeyMismatch(
            name,
            f"{prefix}host key at {where} does not match the pinned key "
            f"(got {exc.key.get_name()} {exc.key.get_base64()[:24]}..., "
            f"expected {host_key[:40]}...). Refusing to connect: the machine was "
            "rebuilt or something is impersonating it. Update the pinned key"
            f"{'' if field == 'host' else ' (proxy_jump.host_key)'} only if you know why it changed.",
        ) from None
    except paramiko.AuthenticationException:
        transport = client.get_transport()
        if transport is None or not transport.is_active():
            # paramiko reports a connection that died mid-handshake as "Authentication failed".
            raise HostError(
                name, f"{prefix}unreachable at {where} (connection closed during authentication)"
            ) from None
        raise HostError(
            name, f"{prefix}authentication failed at {where} with key {key or '(none given)'}"
        ) from None
    except paramiko.SSHException as exc:
        if "not found in known_hosts" in str(exc):
            raise HostError(
                name, f"{prefix}no pinned host key for {where}; refusing to trust on first use"
            ) from None
        transport = client.get_transport()
        if "banner" in str(exc) or (transport is not None and not transport.is_active()):
            raise HostError(
                name, f"{prefix}unreachable at {where} (connection closed during the SSH handshake: {exc})"
            ) from None
        if key is not None and "key" in str(exc).lower() and "host key" not in str(exc).lower():
            raise HostError(name, f"{prefix}key file {key}: cannot be used: {exc}") from None
        raise HostError(name, f"{prefix}SSH error at {where}: {exc}") from None
    except (TimeoutError, OSError, EOFError) as exc:
        raise HostError(name, f"{prefix}unreachable at {where} ({unreachable_reason(exc)})") from None


class JumpHosts:
    """One authenticated connection per jump host (``proxy_jump``), shared by the nodes behind it.

    Opened on first use under a per-jump lock (64 nodes behind one login node make one
    connection, not 64), reopened when it died, checked against the same known_hosts with
    ``RejectPolicy`` as every other connection. Each node gets a ``direct-tcpip`` channel of it as
    the socket of its own SSH connection, so the node's host key is checked end to end as well.
    """

    def __init__(self, known_hosts: Path, connect_timeout: int = DEFAULT_CONNECT_TIMEOUT) -> None:
        self.known_hosts = known_hosts
        self.connect_timeout = connect_timeout
        self._guard = threading.Lock()
        self._locks: dict[JumpHost, threading.Lock] = {}
        self._clients: dict[JumpHost, paramiko.SSHClient] = {}

    def _client(self, jump: JumpHost, for_host: str) -> paramiko.SSHClient:
        with self._guard:
            lock = self._locks.setdefault(jump, threading.Lock())
        with lock:
            client = self._clients.get(jump)
            transport = client.get_transport() if client is not None else None
            if client is not None and transport is not None and transport.is_active():
                return client
            if client is not None:
                with contextlib.suppress(Exception):
                    client.close()
                self._clients.pop(jump, None)
            if jump.key is not None:
                problem = key_file_problem(jump.key)
                if problem:
                    raise HostError(
                        for_host,
                        f"jump host {jump.label}: key file {jump.key}: {problem} (field 'proxy_jump.key')",
                    )
            client = paramiko.SSHClient()
            client.load_host_keys(str(self.known_hosts))
            client.set_missing_host_key_policy(paramiko.RejectPolicy())
            try:
                with (
                    shared_jump_slot(jump.endpoint),  # its handshake counts against MaxStartups too
                    connect_errors(for_host, jump.label, jump.key, jump.host_key, client, "proxy_jump"),
                ):
                    client.connect(
                        hostname=jump.address,
                        port=jump.port,
                        username=jump.user,
                        key_filename=str(jump.key) if jump.key is not None else None,
                        look_for_keys=False,
                        allow_agent=False,
                        timeout=self.connect_timeout,
                        banner_timeout=self.connect_timeout,
                        auth_timeout=self.connect_timeout,
                        channel_timeout=self.connect_timeout,
                    )
            except BaseException:
                with contextlib.suppress(Exception):
                    client.close()
                raise
            opened = client.get_transport()
            if opened is not None:
                opened.set_keepalive(KEEPALIVE_S)
            self._clients[jump] = client
            return client

    def channel(self, host: Host, timeout: float) -> paramiko.Channel:
        """A ``direct-tcpip`` channel from ``host``'s jump host to ``host``'s address and port."""
        jump = host.proxy_jump
        if jump is None:
            raise ValueError(f"{host.name} has no jump host")
        client = self._client(jump, host.name)
        transport = client.get_transport()
        target = f"{bracketed(host.address)}:{host.port}"
        try:
            if transport is None:
                raise EOFError("no transport")
            return transport.open_channel("direct-tcpip", (host.address, host.port), ("", 0), timeout=timeout)
        except paramiko.ChannelException as exc:
            raise HostError(
                host.name,
                f"unreachable at {target} through jump host {jump.label} "
                f"(the jump host could not connect: {exc.text or exc.code})",
            ) from None
        except (paramiko.SSHException, OSError, EOFError) as exc:
            if transport is not None and transport.is_active():
                # "Timeout opening channel": the jump host is still trying to reach a silent node.
                # Its connection carries every other node's session: it stays open.
                raise HostError(
                    host.name, f"unreachable at {target} through jump host {jump.label} ({exc})"
                ) from None
            with contextlib.suppress(Exception):
                client.close()
            raise HostError(
                host.name,
                f"jump host {jump.label}: connection lost while opening a channel to {target}: {exc}",
            ) from None

    def close(self) -> None:
        with self._guard:
            clients = list(self._clients.values())
            self._clients.clear()
        for client in clients:
            with contextlib.suppress(Exception):
                client.close()
