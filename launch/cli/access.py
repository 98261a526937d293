"""A way in: ``fab ssh``, ``fab forward`` and ``fab ssh-config`` to a run's (or an inventory's) nodes.

A researcher wants a shell on the node that runs rank 0, a live TensorBoard or a notebook on it,
or their editor (VS Code Remote) attached to it, without copying addresses, keys and the
bastion's settings by hand. Each of these is the OpenSSH client with exactly the options
fleetrun's own connections use (``launch.transport.openssh``): the inventory's pinned host keys
in a known_hosts file written from it (``StrictHostKeyChecking yes``; nothing is ever learned, so
a rebuilt or impersonated machine is refused), the inventory's key only, and the jump host as a
``ProxyCommand`` with the same strict checking on the jump hop.

A target is a run (id, unique prefix or ``last``: its recorded inventory) or an inventory
selector (``local``, ``local:PREFIX``, ``stack:NAME``, an inventory file).
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

from launch.errors import FleetrunError, SpecError
from launch.job.inventory import Host, Inventory
from launch.paths import known_hosts_file
from launch.private_files import write_private_file
from launch.reports.safe_text import clean
from launch.transport.openssh import openssh_command, proxy_command, ssh_token_safe

SAFE_CONFIG_VALUE = re.compile(r"[A-Za-z0-9_.:@/+,=-]{1,4096}")
"""What a value of the written ssh config may hold (no space, quote, ``#`` or control character:
each would let an inventory's text end the line or start another directive)."""
ALIAS_PREFIX = "fleetrun-"
UNQUOTABLE_PATH = re.compile(r'["\\]|\$\{|[^\S ]|[\x00-\x1f\x7f]')
"""What a path in the written ssh config may not hold even quoted: a double quote or backslash
(OpenSSH's quoting has no reliable escape for them), ``${`` (OpenSSH expands ``${VAR}`` in
``IdentityFile`` and ``UserKnownHostsFile`` and has no escape for it), and any whitespace other
than a plain space or a control character (each would end the line or the directive)."""


def is_inventory_selector(target: str) -> bool:
    """Whether ``target`` names an inventory rather than a run."""
    if target == "local" or target.startswith(("local:", "stack:")):
        return True
    return target.endswith((".yaml", ".yml", ".json")) and Path(target).is_file()


def target_inventory(target: str) -> tuple[Inventory, str]:
    """The inventory behind ``target`` and how to name it in messages."""
    if is_inventory_selector(target):
        from launch.fleets.select import load_inventory

        return load_inventory(target), f"inventory {clean(target, 200)}"
    from launch.cli.run_lookup import find_run, open_records

    with open_records() as records:
        record = find_run(records, target)
    try:
        inventory = Inventory.model_validate(record.inventory)
    except ValueError as exc:
        raise FleetrunError(
            f"run {record.id}: its recorded inventory cannot be read: {clean(exc, 300)}"
        ) from None
    return inventory, f"run {record.id}"


def pick_node(inventory: Inventory, node: str | None, where: str) -> Host:
    """The named node, or the head (rank 0's node) when none is named."""
    if not node:
        return inventory.head
    for host in inventory.hosts:
        if host.name == node:
            return host
    names = ", ".join(h.name for h in inventory.hosts[:20])
    raise SpecError(f"--node {clean(node, 100)!r}: {where} has no such node (it has {names})")


def pinned_known_hosts(inventory: Inventory) -> Path:
    """The known_hosts file holding exactly this inventory's pinned keys (as every run writes it)."""
    return inventory.write_known_hosts(known_hosts_file(inventory.fingerprint()))


def ssh_argv(host: Host, known_hosts: Path, command: str = "", tty: bool | None = None) -> list[str]:
    """``ssh`` to ``host`` with fleetrun's strict options; a shell when ``command`` is empty."""
    argv = openssh_command(host, known_hosts)
    if tty is None:
        tty = not command and sys.stdin.isatty()
    argv += ["-t"] if tty else ["-T"]
    argv += ["-l", host.user, "--", host.address]
    if command:
        argv.append(command)
    return argv


def forward_argv(host: Host, known_hosts: Path, port: int, local_port: int) -> list[str]:
    """``ssh -N -L`` from ``127.0.0.1:local_port`` here to ``localhost:port`` on ``host``.

    ``ExitOnForwardFailure``: a local port already taken ends the command with an error instead of
    a tunnel that silently forwards nothing. Keepalives end it when the node goes away.
    """
    argv = openssh_command(host, known_hosts)
    argv += [
        "-N",
        "-T",
        "-o",
        "ExitOnForwardFailure=yes",
        "-o",
        "ServerAliveInterval=15",
        "-o",
        "ServerAliveCountMax=3",
        "-L",
        f"127.0.0.1:{local_port}:localhost:{port}",
        "-l",
        host.user,
        "--",
        host.address,
    ]
    return argv


def check_port(value: int | str, flag: str) -> int:
    """A TCP port as a number (a positional argument reaches a task as text): ASCII digits only
    (``str.isdigit`` also takes ``²`` and other digits ``int`` refuses)."""
    text = str(value).strip()
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= 65535:
        raise SpecError(f"{flag} {clean(text, 40)!r}: expected a TCP port from 1 to 65535")
    return int(text)


def ssh(target: str, node: str | None = None, command: str = "") -> int:
    """``fab ssh``: a shell (or ``command``) on a node; the exit code is ssh's (255: ssh's own failure,
    such as a host key that does not match the pinned one)."""
    inventory, where = target_inventory(target)
    host = pick_node(inventory, node, where)
    return run_client(ssh_argv(host, pinned_known_hosts(inventory), command))


def forward(target: str, port: int | str, node: str | None = None, local_port: int = 0) -> int:
    """``fab forward``: until Ctrl-C, ``127.0.0.1:local_port`` here reaches ``localhost:port`` on the node.

    Its reach, said when it starts: loopback is not private to a user. Every user (and every
    process) of this machine can connect to that port while the forward runs, as they could to
    the node's port from the node itself. A browser needs a TCP port, so it stays one (OpenSSH
    could bind a Unix socket, which a browser cannot open); on a shared machine, forward only
    what others may see, or protect it (TensorBoard has no login; Jupyter's token does)."""
    port = check_port(port, "PORT")
    local_port = check_port(local_port or port, "--local-port")
    inventory, where = target_inventory(target)
    host = pick_node(inventory, node, where)
    argv = forward_argv(host, pinned_known_hosts(inventory), port, local_port)
    print(
        f"forwarding http://127.0.0.1:{local_port} -> {clean(host.name, 100)}:localhost:{port} "
        f"({where}); Ctrl-C to stop. Any user of this machine can reach that port while it runs",
        flush=True,
    )
    return run_client(argv)


def run_client(argv: list[str]) -> int:
    """Run the ssh client in the foreground; its exit code. Ctrl-C (the client gets it too) is a
    clean end (0); SIGTERM to this process ends the client with it, so no tunnel outlives the command."""
    child = subprocess.Popen(argv)

    def stop(_signum: int, _frame: object) -> None:
        child.terminate()

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        return child.wait()
    except KeyboardInterrupt:
        child.terminate()
        child.wait()
        return 0
    finally:
        signal.signal(signal.SIGTERM, previous)


def _config_value(value: str, what: str, host: str) -> str:
    if not SAFE_CONFIG_VALUE.fullmatch(value):
        raise FleetrunError(
            f"host {clean(host, 100)}: {what} {clean(value, 100)!r} cannot be written into an ssh config "
            "(spaces, quotes, '#' or control characters)"
        )
    return value


def _config_path(value: str, what: str, host: str | None) -> str:
    """A file path as an ssh config value: ``%`` doubled (OpenSSH expands ``%`` tokens in it),
    in double quotes when it holds a space (how OpenSSH reads such a path: a ``HOME`` with a
    space is common). ``host`` None: the path is fleetrun's own (under ``FLEETRUN_HOME``)."""
    if UNQUOTABLE_PATH.search(value) or not value or len(value) > 4096:
        whose = f"host {clean(host, 100)}: {what}" if host is not None else f"fleetrun's own {what}"
        raise FleetrunError(
            f"{whose} {clean(value, 200)!r} cannot be written into an ssh config (a double quote, a "
            "backslash, '${' or a control character; OpenSSH has no escape for them): "
            + ("move the file" if host is not None else "set FLEETRUN_HOME to a plainer folder")
        )
    value = ssh_token_safe(value)
    return f'"{value}"' if not SAFE_CONFIG_VALUE.fullmatch(value) else value


def ssh_config(inventory: Inventory, known_hosts: Path, alias_prefix: str = ALIAS_PREFIX) -> str:
    """An OpenSSH config block, one ``Host`` entry per node (``ssh fleetrun-NODE``; VS Code Remote).

    Every entry pins the inventory's keys (``UserKnownHostsFile`` of exactly them, no global file,
    ``StrictHostKeyChecking yes``), uses only the inventory's key, and reaches a node behind a
    bastion through a ``ProxyCommand`` with the same strict checking (``proxy_command``).
    """
    if alias_prefix:
        _config_value(alias_prefix, "alias prefix", "-")
    lines = [
        "# written by fleetrun (fab ssh-config): host keys are pinned, never learned",
    ]
    pinned = _config_path(str(known_hosts), "known_hosts path", None)
    for host in inventory.hosts:
        name = host.name
        alias = _config_value(f"{alias_prefix}{name}", "alias", name)
        lines += [
            f"Host {alias}",
            f"    HostName {_config_value(host.address, 'address', name)}",
            f"    Port {host.port}",
            f"    User {_config_value(host.user, 'user', name)}",
            f"    UserKnownHostsFile {pinned}",
            "    GlobalKnownHostsFile /dev/null",
            "    StrictHostKeyChecking yes",
            "    UpdateHostKeys no",
            "    CheckHostIP no",
        ]
        if host.key is not None:
            lines += [
                f"    IdentityFile {_config_path(str(host.key), 'key path', name)}",
                "    IdentitiesOnly yes",
            ]
        if host.proxy_jump is not None:
            if host.proxy_jump.key is not None:
                _config_path(str(host.proxy_jump.key), "jump host key path", name)
            lines.append(f"    ProxyCommand {proxy_command(host.proxy_jump, known_hosts)}")
        lines.append("")
    return "\n".join(lines)


def write_ssh_config(target: str, output: str = "", alias_prefix: str = ALIAS_PREFIX) -> str:
    """``fab ssh-config``: the block printed, or written to ``output`` (mode 600) for ``Include``,
    through a temporary file no other user can plant or read (``write_private_file``)."""
    inventory, _where = target_inventory(target)
    text = ssh_config(inventory, pinned_known_hosts(inventory), alias_prefix)
    if output:
        write_private_file(Path(output), text.encode(), "--output")
    else:
        sys.stdout.write(text)
    return text
