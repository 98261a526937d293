"""Preemption notices: the pollers against a real HTTP metadata server of our own, the new
protocol records, and the watchdog's whole path as local processes (notice -> flag + SIGTERM to
every rank -> checkpoint in an S3 bucket -> ``preempted`` in the node's poll answer)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from launch.nodelib import fleetrun_preempt as preempt
from launch.nodelib.fleetrun_protocol import (
    BucketCommands,
    GuardConfig,
    PollAnswer,
    PreemptionNotice,
    ProtocolError,
)
from tests.metadataserver import MetadataServer, serve_in_thread
from tests.s3server import S3Server, aws_cli, free_port, serve_bucket

NODELIB = Path(__file__).resolve().parent.parent / "launch" / "nodelib"
AGENT = str(NODELIB / "fleetrun_node.py")


@pytest.fixture()
def metadata(tmp_path: Path) -> Iterator[tuple[MetadataServer, str, Path]]:
    control = tmp_path / "control"
    control.mkdir()
    server = serve_in_thread("127.0.0.1", 0, control)
    try:
        yield server, f"127.0.0.1:{server.server_address[1]}", control
    finally:
        server.shutdown()
        server.server_close()


def requests(control: Path) -> list[str]:
    path = control / "requests"
    return path.read_text().splitlines() if path.exists() else []


def test_ec2_imdsv2_token_flow(metadata: tuple[MetadataServer, str, Path]) -> None:
    _, address, control = metadata
    watch = preempt.Watch("ec2-imdsv2", address, interval=0)
    assert watch.poll(time.time()) is None and not watch.last_error, "404: no notice yet"
    assert watch.poll(time.time()) is None
    assert requests(control).count("/latest/api/token") == 1, "one token, reused"
    (control / "notice").touch()
    notice = watch.poll(time.time())
    assert notice is not None and '"terminate"' in notice.detail
    assert watch.window_s == 120.0


def test_ec2_token_refused_mid_way_is_renewed(metadata: tuple[MetadataServer, str, Path]) -> None:
    _, address, control = metadata
    watch = preempt.Watch("ec2-imdsv2", address, interval=0)
    assert watch.poll(time.time()) is None
    (control / "mode").write_text("expire-tokens")  # every token works once
    (control / "notice").touch()
    assert watch.poll(time.time()) is not None, "a 401 gets a fresh token and the notice"
    assert requests(control).count("/latest/api/token") >= 2


def test_gce_header_flow(metadata: tuple[MetadataServer, str, Path]) -> None:
    _, address, control = metadata
    watch = preempt.Watch("gce-metadata", address, interval=0)
    assert watch.poll(time.time()) is None and not watch.last_error, "FALSE: no notice"
    (control / "notice").touch()
    notice = watch.poll(time.time())
    assert notice is not None and "TRUE" in notice.detail and watch.window_s == 30.0


def test_polls_once_per_interval_and_again_after_the_clock_steps_back(
    metadata: tuple[MetadataServer, str, Path],
) -> None:
    """At most one request per interval; a wall clock stepped back (NTP) does not stop polling."""
    _, address, control = metadata
    watch = preempt.Watch("gce-metadata", address, interval=10.0)
    asked = lambda: requests(control).count("/computeMetadata/v1/instance/preempted")  # noqa: E731
    assert watch.poll(1000.0) is None and asked() == 1
    assert watch.poll(1005.0) is None and asked() == 1, "inside the interval: no request"
    assert watch.poll(1010.0) is None and asked() == 2
    (control / "notice").touch()
    assert watch.poll(400.0) is not None and asked() == 3, "the clock went back 10 minutes: polled"


@pytest.mark.parametrize("mode", ["500", "garbage", "slow"])
def test_a_bad_metadata_server_is_no_notice_and_never_an_error(
    metadata: tuple[MetadataServer, str, Path], mode: str
) -> None:
    _, address, control = metadata
    (control / "notice").touch()
    (control / "mode").write_text(mode)
    for poller in ("ec2-imdsv2", "gce-metadata"):
        watch = preempt.Watch(poller, address, interval=0)
        assert watch.poll(time.time()) is None
        assert watch.errors == 1 and watch.last_error, poller


def test_no_metadata_server_at_all(tmp_path: Path) -> None:
    port = free_port("127.0.0.1")  # nothing listens there
    watch = preempt.Watch("ec2-imdsv2", f"127.0.0.1:{port}", interval=0)
    assert watch.poll(time.time()) is None and "ConnectionRefused" in watch.last_error


def test_a_server_without_the_metadata_flavor_header_is_not_believed(tmp_path: Path) -> None:
    """A plain web server answering TRUE everywhere is not a GCE metadata server."""
    port = free_port("127.0.0.1")
    (tmp_path / "computeMetadata" / "v1" / "instance").mkdir(parents=True)
    (tmp_path / "computeMetadata" / "v1" / "instance" / "preempted").write_text("TRUE")
    proc = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        watch = preempt.Watch("gce-metadata", f"127.0.0.1:{port}", interval=0)
        assert watch.poll(time.time()) is None and "Metadata-Flavor" in watch.last_error
    finally:
        proc.kill()
        proc.wait()


# -- the protocol records -----------------------------------------------------------------------


def base_config(**fields: object) -> dict[str, object]:
    config: dict[str, object] = {"run_id": "r1", "node": "n0", "started_at": time.time()}
    config.update(fields)
    return config


def test_guard_config_carries_bucket_and_poller() -> None:
    bucket = BucketCommands(
        url="s3://b/runs/r1",
        copy=("aws", "s3", "cp", "{src}", "{dest}"),
        sync=("aws", "s3", "sync", "{src}", "{dest}"),
        remove=("aws", "s3", "rm", "--recursive", "{dest}"),
        env={"AWS_ENDPOINT_URL": "http://10.1.0.1:9000"},
    )
    config = GuardConfig(run_id="r1", node="n0", started_at=1.0, bucket=bucket, preemption="ec2-imdsv2")
    back = GuardConfig.from_json(config.to_json())
    assert back.bucket == bucket and back.preemption == "ec2-imdsv2"
    assert back.metadata_address == "169.254.169.254" and back.notice_window_s is None
    lean = GuardConfig.from_json(json.dumps(base_config()))
    assert lean.bucket is None and lean.preemption == ""


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"preemption": "some-cloud"}, "preemption"),
        ({"preemption": 1}, "preemption"),
        (
            {
                "bucket": {
                    "url": "not a url",
                    "copy": ["x", "{src}", "{dest}"],
                    "sync": ["x", "{src}", "{dest}"],
                }
            },
            "url",
        ),
        ({"bucket": {"url": "s3://b/p", "copy": ["x", "{src}"], "sync": ["x", "{src}", "{dest}"]}}, "copy"),
        ({"bucket": {"url": "s3://b/p", "sync": ["x", "{src}", "{dest}"]}}, "copy"),
        (
            {
                "bucket": {
                    "url": "s3://b/p",
                    "copy": ["x", "{src}", "{dest}"],
                    "sync": ["x", "{src}", "{dest}"],
                    "env": {"lower": "1"},
                }
            },
            "env",
        ),
        ({"notice_window_s": -1}, "notice_window_s"),
        ({"metadata_address": "http://x/y z"}, "metadata_address"),
    ],
)
def test_guard_config_refuses_bad_bucket_or_poller(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ProtocolError, match=message):
        GuardConfig.from_json(json.dumps(base_config(**fields)))


def test_preempted_travels_in_the_poll_answer() -> None:
    notice = PreemptionNotice(
        noticed_at=100.0,
        source="ec2-imdsv2",
        detail="x" * 5000,
        signalled=2,
        durable_step=7,
        durable_at=101.0,
    )
    answer = PollAnswer.from_json(PollAnswer(state="running", preempted=notice).to_json())
    assert answer.preempted is not None and answer.preempted.durable_step == 7
    assert len(answer.preempted.detail) <= 1000, "free text is bounded"
    assert PollAnswer.from_json(PollAnswer(state="running").to_json()).preempted is None
    bad = json.loads(PollAnswer(state="running", preempted=notice).to_json())
    bad["preempted"]["durable_step"] = "seven"
    with pytest.raises(ProtocolError, match="durable_step"):
        PollAnswer.from_json(json.dumps(bad))


# -- the watchdog's whole path, as local processes -------------------------------------------------

RANK = """
import os, sys, time
sys.path.insert(0, sys.argv[1])
import fleetrun_checkpoint as ckpt
cp = ckpt.default()
open(os.path.join(os.environ["FLEETRUN_RUN_DIR"], "ready-%s" % cp.rank), "w").close()
step = 0
while not cp.should_save():
    step += 1
    if step % 20 == 0:
        cp.save(step, lambda p: open(p + "/weights.bin", "w").write("w%d" % step))
    time.sleep(0.02)
for _ in range(1000):  # the flag file comes first; the SIGTERM right after it (then exit)
    if cp._signalled:
        break
    time.sleep(0.01)
cp.save(step, lambda p: open(p + "/weights.bin", "w").write("final %d" % step))
ok = cp.wait_uploaded(60)
print("rank", cp.rank, "saved", step, "uploaded", ok, cp.upload_error, flush=True)
sys.exit(143)
"""


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    yield from serve_bucket("preempt-unit")


def test_notice_signals_every_rank_and_waits_for_the_bucket(
    tmp_path: Path, metadata: tuple[MetadataServer, str, Path], s3: S3Server
) -> None:
    _, address, control = metadata
    run_id = "r-preempt-unit"
    run_dir = tmp_path / run_id
    run_dir.mkdir()
    (tmp_path / "rank.py").write_text(RANK)
    commands = s3.commands("preempt-unit", f"runs/{run_id}", cli=aws_cli())
    config = GuardConfig(
        run_id=run_id,
        node="n0",
        started_at=time.time(),
        watcher_lost_after_s=3600,
        bucket=commands,
        preemption="ec2-imdsv2",
        metadata_address=address,
    )
    (run_dir / "guard.json").write_text(config.to_json())
    ranks = " & ".join(
        f"RANK={r} LOCAL_RANK={r} WORLD_SIZE=2 {sys.executable} {tmp_path / 'rank.py'} {NODELIB}"
        for r in (0, 1)
    )
    (run_dir / "launch.sh").write_text(
        f"export FLEETRUN_RUN_ID={run_id} FLEETRUN_RUN_DIR={run_dir}\n{ranks} & wait\n"
    )
    start = json.loads(
        subprocess.run(
            [sys.executable, AGENT, "start", str(run_dir)],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
    )
    assert start["guard"], start
    try:
        deadline = time.monotonic() + 60
        while not all((run_dir / f"ready-{r}").exists() for r in (0, 1)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert all((run_dir / f"ready-{r}").exists() for r in (0, 1)), (run_dir / "node.log").read_text()
        noticed = time.time()
        (control / "notice").touch()
        deadline = time.monotonic() + 120
        record: dict = {}
        while time.monotonic() < deadline:
            if (run_dir / "preempt.json").exists():
                record = json.loads((run_dir / "preempt.json").read_text())
                if record.get("durable_step") is not None:
                    break
            time.sleep(0.2)
        log = (run_dir / "guard.log").read_text()
        assert record.get("durable_step") is not None, log + (run_dir / "node.log").read_text()
        assert record["signalled"] == 2 and record["source"] == "ec2-imdsv2"
        for r in (0, 1):
            assert float((run_dir / "signals" / f"rank-{r}").read_text().split()[0]) >= noticed, (
                "every rank got SIGTERM"
            )
        pointer = json.loads(s3.get("preempt-unit", f"runs/{run_id}/checkpoints/LATEST.json"))
        assert pointer["steps"][0] == record["durable_step"] and pointer["updated"] >= noticed
        weights = s3.get(
            "preempt-unit", f"runs/{run_id}/checkpoints/step-{record['durable_step']}/weights.bin"
        )
        assert weights.startswith(b"final "), "the checkpoint made after the notice is the durable one"
        # what the laptop's drain reads (issue 19): when the node goes (this server's notice tells
        # no time ahead: EC2's window), the step saved here after the notice, the wait over
        assert record["deadline_at"] == pytest.approx(record["noticed_at"] + 120.0)
        assert record["saved_step"] == record["durable_step"] and record["durable_made_after"] is True
        assert record["settled_at"] is not None and record["settled_at"] >= record["durable_at"]
        poll = PollAnswer.from_json(
            subprocess.run(
                [sys.executable, AGENT, "poll", str(run_dir), "0", "--no-heartbeat"],
                capture_output=True,
                text=True,
                timeout=60,
                check=True,
            ).stdout
        )
        assert poll.preempted is not None and poll.preempted.durable_step == record["durable_step"]
        assert "SIGTERM sent to 2 rank(s)" in log
    finally:
        subprocess.run(
            [sys.executable, AGENT, "stop", run_id, "5"], capture_output=True, timeout=60, check=False
        )


def test_the_laptop_keeps_the_preempted_mark() -> None:
    """The watcher's model of a node keeps the notice once seen, and its observation says so."""
    from launch.run.watch import NodeWatch, Watcher

    watcher = object.__new__(Watcher)  # only the absorbing step, no fleet
    node = NodeWatch("n1", starts_processes=True)
    notice = PreemptionNotice(noticed_at=100.0, source="gce-metadata", signalled=1)
    Watcher._absorb(watcher, node, PollAnswer(state="running", preempted=notice), 1.0)
    Watcher._absorb(watcher, node, PollAnswer(state="exited", rc=143), 2.0)
    assert node.preempted == notice, "a later answer without the file does not clear it"
    assert node.state == "exited" and node.preempted.source == "gce-metadata"


def test_a_failing_preemption_path_does_not_end_the_watchdog(
    tmp_path: Path, metadata: tuple[MetadataServer, str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """preempt.json cannot be written (here: no run directory; on a node: a full disk): the error
    is logged and the watchdog goes on, instead of ending in ``guard_error``, which would stop
    the ranks while they save their checkpoint."""
    from launch.nodelib import fleetrun_guard as guard

    _, address, control = metadata
    cfg = GuardConfig(
        run_id="r-preempt-broken",
        node="n0",
        started_at=time.time(),
        watcher_lost_after_s=3600,
        preemption="gce-metadata",
        metadata_address=address,
    )
    memory: dict[str, object] = {"notice": preempt.Watch("gce-metadata", address, interval=0)}
    (control / "notice").touch()
    guard.poll_notice(str(tmp_path / "gone"), cfg, memory, time.time())
    assert memory["preempted"] is True, "the notice was seen and handled once"
    out = capsys.readouterr().out
    assert "the preemption path failed" in out and "FileNotFoundError" in out
