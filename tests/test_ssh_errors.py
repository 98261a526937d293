"""SSH connection failures are named for what they are, against a real (in-process paramiko) SSH server.

A missing key file is not "unreachable"; a host that drops the connection during the handshake
is not "authentication failed"; a changed host key stays its own error (``HostKeyMismatch``).
"""

from __future__ import annotations

import io
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import paramiko
import pytest

from launch.errors import HostError, HostKeyMismatch
from launch.job.inventory import Host, Inventory
from launch.planning.cluster_ssh import new_ed25519_keypair
from launch.transport.ssh import NodeConnection

SERVER_PRIVATE, SERVER_PUBLIC = new_ed25519_keypair()
CLIENT_PRIVATE, _ = new_ed25519_keypair()
_, OTHER_PUBLIC = new_ed25519_keypair()


class Server(paramiko.ServerInterface):
    """Offers public-key auth and refuses it; ``drop`` closes the TCP connection instead of answering."""

    def __init__(self, conn: socket.socket, drop: bool) -> None:
        self.conn = conn
        self.drop = drop

    def get_allowed_auths(self, username: str) -> str:
        return "publickey"

    def check_auth_publickey(self, username: str, key: paramiko.PKey) -> int:
        if self.drop:
            self.conn.shutdown(socket.SHUT_RDWR)
        return paramiko.AUTH_FAILED


class ExitingServer(paramiko.ServerInterface):
    """Accepts the key; every command "fails to start": stderr, exit 127, channel closed, stdin
    (past its first byte) unread."""

    def get_allowed_auths(self, username: str) -> str:
        return "publickey"

    def check_auth_publickey(self, username: str, key: paramiko.PKey) -> int:
        return paramiko.AUTH_SUCCESSFUL

    def check_channel_request(self, kind: str, chanid: int) -> int:
        return paramiko.OPEN_SUCCEEDED

    def check_channel_exec_request(self, channel: paramiko.Channel, command: bytes) -> bool:
        def answer() -> None:
            channel.recv(1)  # the client sends stdin only once the exec request was granted
            channel.sendall_stderr(b"bash: /opt/x/python3: No such file or directory\n")
            channel.send_exit_status(127)
            channel.close()

        threading.Thread(target=answer, daemon=True).start()
        return True


def serve(mode: str) -> tuple[int, threading.Thread]:
    """A one-connection server on 127.0.0.1: ``ssh`` (refuses the key), ``drop`` (vanishes mid-auth),
    ``hangup`` (accepts TCP, closes before the SSH banner), ``exit`` (accepts the key; every command
    exits 127 without reading its stdin)."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def run() -> None:
        conn, _ = listener.accept()
        listener.close()
        if mode == "hangup":
            conn.close()
            return
        transport = paramiko.Transport(conn)
        transport.add_server_key(paramiko.Ed25519Key.from_private_key(io.StringIO(SERVER_PRIVATE)))
        server: paramiko.ServerInterface = (
            ExitingServer() if mode == "exit" else Server(conn, drop=mode == "drop")
        )
        try:
            transport.start_server(server=server)
            transport.join(10)
        except (paramiko.SSHException, OSError, EOFError):
            pass
        finally:
            transport.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return port, thread


@pytest.fixture
def client_key(tmp_path: Path) -> Path:
    path = tmp_path / "id_ed25519"
    path.write_text(CLIENT_PRIVATE)
    path.chmod(0o600)
    return path


def connect(tmp_path: Path, port: int, key: Path | None, pinned: str = SERVER_PUBLIC) -> None:
    host = Host(name="h", address="127.0.0.1", port=port, user="u", key=key, host_key=pinned)
    known_hosts = Inventory(hosts=[host]).write_known_hosts(tmp_path / "known_hosts")
    conn = NodeConnection(host, known_hosts, connect_timeout=5)
    try:
        conn.open()
    finally:
        conn.conn.close()
        # A failed open must not leave paramiko's transport (and its thread) behind.
        assert conn.conn.client.get_transport() is None


@pytest.fixture
def free_port() -> Iterator[int]:
    sock = socket.create_server(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    yield port


def test_missing_key_file_is_named_not_unreachable(tmp_path: Path, free_port: int) -> None:
    with pytest.raises(HostError) as info:
        connect(tmp_path, free_port, tmp_path / "x")
    assert f"key file {tmp_path / 'x'}: no such file" in str(info.value)
    assert "unreachable" not in str(info.value)


def test_key_path_that_is_a_directory_is_named(tmp_path: Path, free_port: int) -> None:
    with pytest.raises(HostError, match="is a directory, not a key file"):
        connect(tmp_path, free_port, tmp_path)


def test_refused_connection_is_unreachable(tmp_path: Path, client_key: Path, free_port: int) -> None:
    with pytest.raises(HostError) as info:
        connect(tmp_path, free_port, client_key)
    assert "unreachable" in str(info.value) and "connection refused" in str(info.value)
    assert "authentication" not in str(info.value)


def test_hangup_before_the_banner_is_unreachable(tmp_path: Path, client_key: Path) -> None:
    port, thread = serve("hangup")
    with pytest.raises(HostError) as info:
        connect(tmp_path, port, client_key)
    thread.join(10)
    assert "unreachable" in str(info.value), str(info.value)
    assert "authentication failed" not in str(info.value)


def test_dropped_during_authentication_is_unreachable_not_auth_failed(
    tmp_path: Path, client_key: Path
) -> None:
    port, thread = serve("drop")
    with pytest.raises(HostError) as info:
        connect(tmp_path, port, client_key)
    thread.join(10)
    assert "unreachable" in str(info.value) and "during authentication" in str(info.value), str(info.value)
    assert not isinstance(info.value, HostKeyMismatch)


def test_refused_key_is_authentication_failed(tmp_path: Path, client_key: Path) -> None:
    port, thread = serve("ssh")
    with pytest.raises(HostError) as info:
        connect(tmp_path, port, client_key)
    thread.join(10)
    assert "authentication failed" in str(info.value) and str(client_key) in str(info.value)


def test_changed_host_key_stays_its_own_error(tmp_path: Path, client_key: Path) -> None:
    port, thread = serve("ssh")
    with pytest.raises(HostKeyMismatch, match="does not match the pinned key"):
        connect(tmp_path, port, client_key, pinned=OTHER_PUBLIC)
    thread.join(10)


def test_command_that_exits_before_reading_its_input_is_a_result_not_a_lost_connection(
    tmp_path: Path, client_key: Path
) -> None:
    """A Python that does not exist exits 127 before the probe script is sent: that is the
    node's answer (what doctor reports as the Python's fault), not a lost connection."""
    port, thread = serve("exit")
    host = Host(name="h", address="127.0.0.1", port=port, user="u", key=client_key, host_key=SERVER_PUBLIC)
    known_hosts = Inventory(hosts=[host]).write_known_hosts(tmp_path / "known_hosts")
    conn = NodeConnection(host, known_hosts, connect_timeout=5)
    try:
        result = conn.run_with_input("/opt/x/python3 -", b"x" * (8 << 20), timeout=30)
    finally:
        conn.close()
    thread.join(10)
    assert result.exit_code == 127
    assert "No such file or directory" in result.stderr


def test_a_port_that_never_sends_the_ssh_banner_is_named_without_a_traceback(
    tmp_path: Path, client_key: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """TCP is accepted, then silence (a hung sshd, a tarpit): paramiko's thread gives up on the
    banner and used to print its traceback; the doctor said "No existing session"."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    held: list[socket.socket] = []
    threading.Thread(target=lambda: held.append(listener.accept()[0]), daemon=True).start()
    host = Host(name="h", address="127.0.0.1", port=port, user="u", key=client_key, host_key=SERVER_PUBLIC)
    known_hosts = Inventory(hosts=[host]).write_known_hosts(tmp_path / "known_hosts")
    conn = NodeConnection(host, known_hosts, connect_timeout=1)
    try:
        with pytest.raises(HostError) as info:
            conn.open()
        time.sleep(1.5)  # paramiko's transport thread reports its own banner timeout by now
    finally:
        conn.conn.close()
        listener.close()
        for sock in held:
            sock.close()
    message = str(info.value)
    assert f"port {port} answered" in message and "no SSH banner within 1 s" in message, message
    assert "No existing session" not in message
    err = capfd.readouterr().err
    assert "Traceback" not in err and "protocol banner" not in err, err
