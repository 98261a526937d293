"""OpenSSH client command lines (rsync ``-e``, pulls) with the same strict checking as paramiko.

A host behind a bastion gets its jump as a ``ProxyCommand`` running ``ssh -W`` with the same
strict options: ``-J``/``ProxyJump`` does not carry command-line ``-o`` options to the jump hop.
Each such command is one more SSH connection to the login node, so at most ``JUMP_SLOTS`` run
through one jump host at a time (``jump_slot``): sshd's default ``MaxStartups 10:30:100`` starts
dropping a user's concurrent handshakes past 10.
"""

from __future__ import annotations

import contextlib
import shlex
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from launch.transport.jump_slots import DEFAULT_CONNECT_TIMEOUT, JUMP_SLOTS, shared_jump_slot

if TYPE_CHECKING:  # the models are not imported at run time: ``fab exec``'s fast path has none
    from launch.job.inventory import Host, JumpHost


class OpenSshTarget(Protocol):
    """What an OpenSSH command line needs of a host: an inventory ``Host``, or ``fab exec``'s
    plain ``launch.transport.openssh_exec.ExecTarget`` read from fleetrun's own fleet state."""

    @property
    def port(self) -> int: ...

    @property
    def key(self) -> Path | None: ...

    @property
    def proxy_jump(self) -> JumpHost | None: ...


def ssh_token_safe(value: str) -> str:
    """``value`` with ``%`` doubled: OpenSSH expands ``%h``-style tokens in ``-i``,
    ``UserKnownHostsFile`` and ``ProxyCommand``, and an inventory's paths are untrusted text."""
    return value.replace("%", "%%")


def _strict_options(known_hosts: Path, connect_timeout: int) -> list[str]:
    return [
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        f"UserKnownHostsFile={ssh_token_safe(str(known_hosts))}",
        "-o",
        "GlobalKnownHostsFile=/dev/null",
        "-o",
        "BatchMode=yes",
        "-o",
        f"ConnectTimeout={connect_timeout}",
        "-o",
        "LogLevel=ERROR",
        "-F",
        "/dev/null",
    ]


def proxy_command(jump: JumpHost, known_hosts: Path, connect_timeout: int = DEFAULT_CONNECT_TIMEOUT) -> str:
    """The ``ProxyCommand`` that reaches a host through ``jump``: ``ssh -W`` with strict checking.

    Not ``-J``/``ProxyJump``: OpenSSH does not pass command-line ``-o`` options to the jump hop,
    which would then check its key against ``~/.ssh/known_hosts`` (or ask). Here the jump hop gets
    fleetrun's known_hosts, ``StrictHostKeyChecking=yes``, ``BatchMode``, no config file, and only
    the jump's own key. Every value is shell-quoted (the command runs under ``sh -c``) and its
    ``%`` doubled twice over (expanded once by the outer ssh in ``ProxyCommand``, once more by the
    inner one in ``-i``/``UserKnownHostsFile``); ``%h``/``%p`` are the only tokens left.
    """
    argv = ["ssh", "-p", str(jump.port), "-l", jump.user, *_strict_options(known_hosts, connect_timeout)]
    if jump.key is not None:
        argv += ["-o", "IdentitiesOnly=yes", "-i", ssh_token_safe(str(jump.key))]
    options = ssh_token_safe(shlex.join(argv))
    return f"{options} -W '[%h]:%p' -- {ssh_token_safe(shlex.quote(jump.address))}"


def openssh_command(
    host: OpenSshTarget, known_hosts: Path, connect_timeout: int = DEFAULT_CONNECT_TIMEOUT
) -> list[str]:
    """The OpenSSH client invocation (for rsync ``-e``) with the same strict checking as paramiko,
    through the host's jump host when it has one (``proxy_command``)."""
    cmd = ["ssh", "-p", str(host.port), *_strict_options(known_hosts, connect_timeout)]
    if host.key is not None:
        cmd += ["-o", "IdentitiesOnly=yes", "-i", ssh_token_safe(str(host.key))]
    if host.proxy_jump is not None:
        cmd += ["-o", f"ProxyCommand={proxy_command(host.proxy_jump, known_hosts, connect_timeout)}"]
    return cmd


_slots_guard = threading.Lock()
_slots: dict[tuple[str, int], threading.BoundedSemaphore] = {}


@contextlib.contextmanager
def jump_slot(host: Host) -> Iterator[None]:
    """Hold one of the ``JUMP_SLOTS`` OpenSSH commands allowed through ``host``'s jump host at
    once (no limit for a host reached directly)."""
    if host.proxy_jump is None:
        yield
        return
    with _slots_guard:
        slot = _slots.setdefault(host.proxy_jump.endpoint, threading.BoundedSemaphore(JUMP_SLOTS))
    with slot, shared_jump_slot(host.proxy_jump.endpoint):  # and across fleetrun processes
        yield
