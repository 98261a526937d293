"""The local fleet's spot notices and bucket (issue 19, item 6), without a fleet: the product's
metadata endpoint (``launch.fleets.local.spot``) on a loopback socket, asked by the watchdog's
real pollers; a notice ends with the machine it was for; bad ``local.preempt`` input is one line.
The real thing (an endpoint in each node's namespace, the fleet's S3 server) is in
tests/test_recovery_preempt_fleet.py."""

from __future__ import annotations

import select
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from launch.errors import LocalFleetError
from launch.fleets.kinds.refs import LocalFleetRef
from launch.fleets.local import LocalFleet, spot
from launch.fleets.local.bucket import bucket_name
from launch.fleets.local.naming import FleetNames
from launch.nodelib import fleetrun_preempt
from tests.conftest import fab, needs_root

NAMES = FleetNames(prefix="tsp", subnet=3)


@pytest.fixture
def endpoint(fleetrun_home: Path) -> Iterator[str]:
    """One node's endpoint (node 1 of fleet ``tsp``) on 127.0.0.1, its host key file in place."""
    node_dir = NAMES.node_dir(1)
    node_dir.mkdir(parents=True, exist_ok=True)
    (node_dir / "ssh_host_ed25519_key.pub").write_text("ssh-ed25519 AAAA old\n")
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    server = spot.NodeMetadata(sock, NAMES, 1)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.shutdown()
        server.server_close()
        for path in spot.notice_dir(NAMES).glob("*"):
            path.unlink()


def test_no_notice_until_one_is_served_then_both_clouds_flows_see_it(endpoint: str) -> None:
    ec2, gce = fleetrun_preempt.Ec2Imdsv2(endpoint), fleetrun_preempt.GceMetadata(endpoint)
    assert ec2.check() is None and gce.check() is None
    deadline = spot.write_notice(NAMES, 1, 30.0)
    notice = ec2.check()
    assert notice is not None and "terminate" in notice.detail
    # the notice tells its time (whole seconds), which the watchdog turns into its deadline
    assert notice.deadline is not None and abs(notice.deadline - deadline) <= 1.0
    assert gce.check() is not None


def test_the_ec2_flow_wants_a_token(endpoint: str) -> None:
    import http.client

    host, port = endpoint.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=5)
    conn.request(
        "GET", "/latest/meta-data/spot/instance-action", headers={"X-aws-ec2-metadata-token": "guess"}
    )
    assert conn.getresponse().status == 401


def test_a_replaced_node_has_no_notice(endpoint: str) -> None:
    spot.write_notice(NAMES, 1, 30.0)
    assert fleetrun_preempt.Ec2Imdsv2(endpoint).check() is not None
    key = NAMES.node_dir(1) / "ssh_host_ed25519_key.pub"
    key.unlink()
    key.write_text("ssh-ed25519 AAAA new\n")  # what a replacement does: a new machine, a new key
    assert fleetrun_preempt.Ec2Imdsv2(endpoint).check() is None
    assert not (spot.notice_dir(NAMES) / f"{NAMES.node_name(1)}.json").exists()


def test_a_torn_or_hostile_notice_file_is_no_notice(endpoint: str) -> None:
    where = spot.notice_dir(NAMES)
    where.mkdir(parents=True, exist_ok=True)
    for text in ("{", '{"noticed_at": "x"}', "[]", "{" * 100_000):
        (where / f"{NAMES.node_name(1)}.json").write_text(text)
        assert spot.active_notice(NAMES, 1) is None


def test_a_notice_for_a_node_that_is_not_there_is_refused(fleetrun_home: Path) -> None:
    with pytest.raises(LocalFleetError, match="not a node"):
        spot.serve_notice(NAMES, "tspnode7", 30)
    NAMES.node_dir(1).mkdir(parents=True, exist_ok=True)
    with pytest.raises(LocalFleetError, match="--in"):
        spot.serve_notice(NAMES, NAMES.node_name(1), 0)
    with pytest.raises(LocalFleetError, match="local.up --spot"):
        spot.serve_notice(NAMES, NAMES.node_name(1), 30)


def test_local_preempt_bad_input_is_one_line(fleetrun_home: Path) -> None:
    result = fab("local.preempt", "--node", "nosuchnode", "--prefix", "tsp", home=fleetrun_home)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "fleetrun: error: --node nosuchnode: not a node of local fleet tsp"
    ]


def test_the_fleet_bucket_is_a_valid_local_ref() -> None:
    ref = LocalFleetRef(
        prefix="fr", bucket=bucket_name(FleetNames(prefix="fr")), s3_endpoint="http://198.18.3.1:9000"
    )
    assert ref.bucket == "fleetrun-fr"


def test_the_watchdog_waits_no_longer_than_the_served_notice() -> None:
    noticed = time.time()
    notice = fleetrun_preempt.Notice("x", deadline=noticed + 30)
    assert fleetrun_preempt.deadline_of(notice, noticed, fleetrun_preempt.Ec2Imdsv2.window_s) == noticed + 30


@needs_root()
def test_bucket_and_spot_are_refused_on_a_bastion_fleet_before_anything_is_built(fleetrun_home: Path) -> None:
    fleet = LocalFleet(prefix="tbq", subnet=3)
    with pytest.raises(LocalFleetError, match="--bucket and --spot"):
        fleet.up(2, say=lambda _m: None, bastion=True, bucket=True)
    assert not fleet.state_dir.exists() and fleet.existing_netns() == []


def _closed_by_server(conn: socket.socket) -> bool:
    """Whether the server closed ``conn`` (a read ends with nothing, or a reset); the client's own
    timeout is long, only there so a broken server fails the test instead of hanging it."""
    conn.settimeout(60)
    try:
        return conn.recv(1) == b""
    except ConnectionResetError:
        return True


def _answered(address: tuple[str, int]) -> bool:
    with socket.create_connection(address, timeout=60) as conn:
        conn.sendall(b"GET /nothing HTTP/1.0\r\n\r\n")
        return conn.recv(64).startswith(b"HTTP/1.0 404")


def test_the_metadata_endpoint_bounds_connections_and_their_time(fleetrun_home: Path) -> None:
    """The daemon is root and a job on the node can connect at will: past the cap a connection
    is closed on arrival, an idle one is closed after the idle timeout, and one that keeps
    trickling bytes is cut at the deadline; a slot freed serves again."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    server = spot.NodeMetadata(sock, NAMES, 1)
    server.slots = threading.BoundedSemaphore(2)
    server.idle_timeout = 3600.0  # the cap first: held connections must stay held
    threading.Thread(target=server.serve_forever, daemon=True).start()
    address = sock.getsockname()
    try:
        held = [socket.create_connection(address, timeout=60) for _ in range(2)]
        for conn in held:  # each is being served (its thread is reading) before the next arrives
            conn.sendall(b"GET / HTTP/1.1\r\n")
        extra = socket.create_connection(address, timeout=60)
        assert _closed_by_server(extra), "a connection past the cap was served"
        extra.close()
        for conn in held:
            conn.close()
        assert any(_answered(address) for _ in range(200)), "a freed slot never served again"

        server.idle_timeout = 0.2
        idle = socket.create_connection(address, timeout=60)
        assert _closed_by_server(idle), "an idle connection was held"
        idle.close()

        server.idle_timeout, server.connection_deadline = 3600.0, 0.5
        trickle = socket.create_connection(address, timeout=60)
        trickle.sendall(b"GET /")
        cut = False
        for _ in range(10_000):  # the request line a byte at a time: never idle, never done
            try:
                trickle.sendall(b"a")
            except OSError:
                cut = True
                break
            ready, _, _ = select.select([trickle], [], [], 0.05)
            if ready:
                cut = _closed_by_server(trickle)
                break
        assert cut, "a trickling connection was never cut"
        trickle.close()
    finally:
        server.shutdown()
        server.server_close()
