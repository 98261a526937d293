"""Spot notices for the local fleet: a cloud metadata endpoint inside each node's namespace.

``fab local.up --spot`` makes the fleet's nodes behave like spot instances: every node's namespace
answers at 169.254.169.254:80 (the address EC2 and GCE use) with the real flows the on-node
watchdog polls (EC2's IMDSv2: ``PUT /latest/api/token``, then
``GET /latest/meta-data/spot/instance-action`` with the token, 404 until a notice; GCE's
``/computeMetadata/v1/instance/preempted`` with ``Metadata-Flavor: Google``), and the fleet's
inventory names the EC2 poller. ``fab local.preempt --node NAME --in 30`` then serves one node a
notice: ``{"action": "terminate", "time": <now + 30 s>}``; at that time this daemon takes the node
as the cloud would (every process of it and its sshd end; ``LocalFleet.stop_node``), unless it
was replaced before (its host key changed: a fresh machine has no notice).

One root daemon per fleet (``python -m launch.fleets.local.spot_daemon PREFIX SUBNET NODES``), in this
machine's namespace: each node's listening socket is made inside that node's namespace by a
short-lived thread that enters it (``setns``), so nothing of the daemon runs in a node (a node's
power-off, which kills every process in its namespace, leaves it serving). ``down`` ends it by
its pid file. Notices are files under the fleet's state directory (root only); read bounded.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import secrets
import socket
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from launch.errors import LocalFleetError
from launch.fleets.local import daemon
from launch.fleets.local.naming import FleetNames

ADDRESS = "169.254.169.254"
PORT = 80
POLLER = "ec2-imdsv2"
MODULE = "launch.fleets.local.spot_daemon"
PID_FILE = "spot.pid"
LOG_FILE = "spot.log"
READY_FILE = "spot.ready"
CLONE_NEWNET = 0x40000000
MAX_NOTICE_BYTES = 4096
MAX_TOKENS = 1024
MAX_WINDOW_S = 3600.0
MAX_CONNECTIONS = 32
"""Connections one node's endpoint serves at once; more are closed on arrival. The daemon is
root and a job on the node can open connections freely: without a cap, one thread each, forever."""
IDLE_TIMEOUT_S = 5.0
"""A connection that sends nothing for this long is closed (a watchdog's poll is one request)."""
CONNECTION_DEADLINE_S = 15.0
"""A connection is closed after this long whatever it sends (a byte every few seconds keeps the
idle timeout from firing)."""


def notice_dir(names: FleetNames) -> Path:
    return names.state_dir / "spot"


def host_key_stamp(names: FleetNames, i: int) -> str:
    """The node's host key file as it is now: a replacement makes a new one (a new machine)."""
    try:
        info = (names.node_dir(i) / "ssh_host_ed25519_key.pub").stat()
    except OSError:
        return ""
    return f"{info.st_ino}:{info.st_mtime_ns}"


def serve_notice(names: FleetNames, node: str, in_s: float) -> float:
    """Announce ``node``'s end in ``in_s`` seconds; returns the deadline (unix seconds)."""
    index = names.node_index(node)
    if index is None or not names.node_dir(index).is_dir():
        raise LocalFleetError(f"--node {node}: not a node of local fleet {names.prefix}")
    if not 0 < in_s <= MAX_WINDOW_S:
        raise LocalFleetError(f"--in {in_s:g}: expected more than 0 and at most {MAX_WINDOW_S:g} seconds")
    if not spot_pids(names.state_dir):
        raise LocalFleetError(
            f"local fleet {names.prefix} has no spot notices: start it with fab local.up --spot"
        )
    return write_notice(names, index, in_s)


def write_notice(names: FleetNames, i: int, in_s: float, now: float | None = None) -> float:
    """The notice file the daemon answers from (atomic); the node's host key as it is now."""
    now = time.time() if now is None else now
    record = {"noticed_at": now, "deadline_at": now + in_s, "host_key": host_key_stamp(names, i)}
    where = notice_dir(names)
    where.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = where / f"{names.node_name(i)}.json.tmp"
    tmp.write_text(json.dumps(record))
    tmp.replace(where / f"{names.node_name(i)}.json")
    return now + in_s


def active_notice(names: FleetNames, i: int) -> dict[str, float] | None:
    """The node's notice while it concerns this machine (same host key), else None (and a notice
    of a replaced node is removed)."""
    path = notice_dir(names) / f"{names.node_name(i)}.json"
    try:
        with open(path, "rb") as fh:
            data = json.loads(fh.read(MAX_NOTICE_BYTES))
        noticed, deadline, key = float(data["noticed_at"]), float(data["deadline_at"]), str(data["host_key"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if key != host_key_stamp(names, i):
        path.unlink(missing_ok=True)  # the node was replaced: a fresh machine has no notice
        return None
    return {"noticed_at": noticed, "deadline_at": deadline}


class Handler(BaseHTTPRequestHandler):
    """The two clouds' flows, answered from the server's tokens and notice (``MetadataEndpoint``):
    EC2's IMDSv2 (``PUT /latest/api/token`` with the TTL header, then
    ``GET /latest/meta-data/spot/instance-action`` with the token: 401 for a token it did not
    issue, 404 until a notice) and GCE's (``GET /computeMetadata/v1/instance/preempted`` with
    ``Metadata-Flavor: Google``, answered ``FALSE`` or ``TRUE`` with that header)."""

    server: MetadataEndpoint

    def setup(self) -> None:
        super().setup()
        self.connection.settimeout(self.server.idle_timeout)  # every read: idle this long, closed

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base's name
        pass

    def _answer(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_PUT(self) -> None:  # noqa: N802 - http.server's name
        if self.path != "/latest/api/token":
            self._answer(404, b"")
            return
        if not self.headers.get("X-aws-ec2-metadata-token-ttl-seconds", "").isdigit():
            self._answer(400, b"missing the TTL header")
            return
        self._answer(200, self.server.new_token().encode())

    def do_GET(self) -> None:  # noqa: N802
        if self.path == "/latest/meta-data/spot/instance-action":
            if not self.server.valid(self.headers.get("X-aws-ec2-metadata-token", "")):
                self._answer(401, b"")
                return
            deadline = self.server.notice_deadline()
            if deadline is None:
                self._answer(404, b"")
                return
            when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(deadline))
            self._answer(200, json.dumps({"action": "terminate", "time": when}).encode())
            return
        if self.path == "/computeMetadata/v1/instance/preempted":
            if self.headers.get("Metadata-Flavor") != "Google":
                self._answer(403, b"missing Metadata-Flavor")
                return
            noticed = self.server.notice_deadline() is not None
            self._answer(200, b"TRUE" if noticed else b"FALSE", {"Metadata-Flavor": "Google"})
            return
        self._answer(404, b"")


class MetadataEndpoint(ThreadingHTTPServer):
    """A cloud metadata endpoint: the tokens it issued (with when), and its notice, if any."""

    daemon_threads = True

    def __init__(
        self,
        address: tuple[str, int],
        handler: type[Handler] = Handler,
        bind_and_activate: bool = True,
    ) -> None:
        super().__init__(address, handler, bind_and_activate=bind_and_activate)
        self.tokens: dict[str, float] = {}
        self.lock = threading.Lock()
        self.idle_timeout = IDLE_TIMEOUT_S
        self.connection_deadline = CONNECTION_DEADLINE_S
        self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)

    def process_request(self, request: socket.socket, client_address: object) -> None:  # type: ignore[override]
        """A thread for the connection only while a slot of ``slots``
        (``MAX_CONNECTIONS``) is free;
        past that it is closed at once (the client retries its poll)."""
        if not self.slots.acquire(blocking=False):
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)  # type: ignore[arg-type]
        except BaseException:
            self.slots.release()
            raise

    def process_request_thread(self, request: socket.socket, client_address: object) -> None:  # type: ignore[override]
        """Serve one connection, cut at ``connection_deadline`` whatever it sends, then free its slot."""

        def cut() -> None:
            with contextlib.suppress(OSError):  # the handler's blocked read returns at once
                request.shutdown(socket.SHUT_RDWR)

        timer = threading.Timer(self.connection_deadline, cut)
        timer.daemon = True
        timer.start()
        try:
            super().process_request_thread(request, client_address)  # type: ignore[arg-type]
        finally:
            timer.cancel()
            self.slots.release()

    def new_token(self) -> str:
        token = secrets.token_urlsafe(24)
        with self.lock:
            if len(self.tokens) >= MAX_TOKENS:
                self.tokens.clear()
            self.tokens[token] = time.time()
        return token

    def valid(self, token: str) -> bool:
        with self.lock:
            return token in self.tokens

    def notice_deadline(self) -> float | None:
        """When the machine will be taken (unix seconds), or None while there is no notice."""
        raise NotImplementedError


class NodeMetadata(MetadataEndpoint):
    """One node's metadata endpoint, on a socket already listening in that node's namespace."""

    def __init__(self, sock: socket.socket, names: FleetNames, index: int) -> None:
        super().__init__((ADDRESS, PORT), bind_and_activate=False)
        self.socket.close()
        self.socket = sock
        self.names = names
        self.index = index

    def notice_deadline(self) -> float | None:
        notice = active_notice(self.names, self.index)
        return None if notice is None else notice["deadline_at"]


def listen_in(netns: str, address: str = ADDRESS, port: int = PORT) -> socket.socket:
    """A listening TCP socket inside network namespace ``netns``: made by a thread that enters the
    namespace (``setns`` moves only the calling thread) and then ends; the socket stays there."""
    libc = ctypes.CDLL(None, use_errno=True)
    made: list[socket.socket] = []
    failed: list[BaseException] = []

    def enter_and_listen() -> None:
        try:
            fd = os.open(f"/run/netns/{netns}", os.O_RDONLY)
            try:
                if libc.setns(fd, CLONE_NEWNET) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"setns {netns}: {os.strerror(err)}")
            finally:
                os.close(fd)
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((address, port))
            sock.listen(64)
            made.append(sock)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            failed.append(exc)

    thread = threading.Thread(target=enter_and_listen)  # this thread never serves: it ends here
    thread.start()
    thread.join()
    if failed:
        raise failed[0]
    return made[0]


PowerOff = Callable[[FleetNames, int], None]
"""Powers node ``i`` of the fleet off (``LocalFleet.stop_node``; given by the daemon's entry point,
``launch.fleets.local.spot_daemon``, since the fleet imports this module)."""


def take_due(names: FleetNames, nodes: int, taken: dict[int, float], power_off: PowerOff) -> None:
    """Power off each node whose notice ran out, once per notice (the cloud takes the machine)."""
    for i in range(nodes):
        notice = active_notice(names, i)
        if notice is None or time.time() < notice["deadline_at"] or taken.get(i) == notice["noticed_at"]:
            continue
        taken[i] = notice["noticed_at"]
        power_off(names, i)
        (names.node_dir(i) / "powered-off").write_text(f"{time.time()}\n")
        print(f"{time.strftime('%H:%M:%S')} the notice ran out: took {names.node_name(i)}", flush=True)


def serve(names: FleetNames, nodes: int, power_off: PowerOff) -> None:
    for i in range(nodes):
        server = NodeMetadata(listen_in(names.netns(i)), names, i)
        threading.Thread(target=server.serve_forever, daemon=True).start()
    (names.state_dir / READY_FILE).write_text(str(os.getpid()))
    print(f"{time.strftime('%H:%M:%S')} serving {ADDRESS}:{PORT} in {nodes} node(s)", flush=True)
    taken: dict[int, float] = {}
    while names.state_dir.exists():
        take_due(names, nodes, taken, power_off)
        time.sleep(0.5)


def start(names: FleetNames, nodes: int, timeout: float = 30.0) -> None:
    """Give every node the metadata address and start the daemon; returns once it serves."""
    from launch.fleets.local.prereqs import run

    for i in range(nodes):
        run(["ip", "-n", names.netns(i), "link", "set", "lo", "up"])
        run(["ip", "-n", names.netns(i), "addr", "replace", f"{ADDRESS}/32", "dev", "lo"])
    (names.state_dir / READY_FILE).unlink(missing_ok=True)
    daemon.start(
        names.state_dir,
        [sys.executable, "-m", MODULE, names.prefix, str(names.subnet), str(nodes)],
        PID_FILE,
        LOG_FILE,
        (names.state_dir / READY_FILE).exists,
        timeout,
        "the spot notice daemon",
        cwd=Path(__file__).resolve().parents[3],
    )


def spot_pids(state_dir: Path) -> list[int]:
    """The fleet's spot daemon, by its pid file and confirmed by its command line."""
    return daemon.pids(state_dir, PID_FILE, MODULE)
