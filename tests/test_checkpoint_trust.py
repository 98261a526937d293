"""Checkpoints are data, never code (issue 19): the trust rules, without a fleet.

On the laptop: a node's claimed step is believed only when rank 0 recorded saving it with that
very manifest and it is within the pull's caps (``launch.run.checkpoints.choose``); the record
comes from rank 0's ``checkpoint_saved`` events in the metrics. On a node: every load is
``torch.load(weights_only=True)``; a pickle that would run code is refused, named, and the resume
goes on with the next older checkpoint.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import threading
from pathlib import Path

import pytest

from launch.rules.metrics_stream import MetricsStream
from launch.run.checkpoints import Bounds, Claim, choose, parse_claims, resume_story
from tests.test_checkpoint import NODELIB, make, torch_python, writer

A, B = "a" * 64, "b" * 64


def test_a_claimed_step_never_recorded_is_refused_and_named() -> None:
    claims = {"n0": [Claim(20, A), Claim(10, B)], "n1": [Claim(999999, A)]}
    choice = choose(claims, {20: A, 10: B}, "r1")
    assert choice.step == 20 and choice.holders == ("n0",)
    assert len(choice.refused) == 1
    assert choice.refused[0].startswith("n1: ~/.fleetrun/runs/r1/checkpoints/step-999999/MANIFEST.json")
    assert "never recorded as saved by rank 0" in choice.refused[0]


def test_a_manifest_other_than_the_recorded_one_is_refused() -> None:
    choice = choose({"n0": [Claim(20, B), Claim(10, B)], "n1": [Claim(20, A)]}, {20: A, 10: B}, "r1")
    assert choice.step == 20 and choice.holders == ("n1",), "only the node with rank 0's manifest"
    assert choice.refused == (
        "n0: ~/.fleetrun/runs/r1/checkpoints/step-20/MANIFEST.json: differs from the manifest rank 0 "
        "recorded for step 20",
    )
    alone = choose({"n0": [Claim(20, B), Claim(10, B)]}, {20: A, 10: B}, "r1")
    assert alone.step == 10, "the run resumes from the last one that passes"


def test_oversized_claims_are_refused_by_the_pull_caps() -> None:
    bounds = Bounds(total_bytes=1000, file_bytes=100)
    recorded = {30: A, 20: A, 10: A}
    claims = {
        "n0": [Claim(30, A, size=2000, disk=8, largest=2000)],  # a sparse file: apparent size counts
        "n1": [Claim(20, A, size=500, disk=500, largest=200)],
        "n2": [Claim(10, A, size=500, disk=500, largest=100)],
    }
    choice = choose(claims, recorded, "r1", bounds)
    assert choice.step == 10
    assert "over the copy cap" in choice.refused[0] and choice.refused[0].startswith("n0: ")
    assert "over the per-file cap" in choice.refused[1] and choice.refused[1].startswith("n1: ")
    assert choose(claims, {}, "r1").step is None, "nothing recorded: nothing believed"


def test_node_listings_are_untrusted() -> None:
    good = {"step": 5, "manifest": A, "size": 3, "disk": 4096, "largest": 3}
    text = json.dumps(
        [good, {**good, "manifest": "x" * 64}, {**good, "size": -1}, {**good, "step": True}, "7", [1]]
    )
    assert parse_claims(text) == [Claim(5, A, 3, 4096, 3)]
    assert parse_claims("garbage") == [] and parse_claims('{"a": 1}') == []


def test_a_nesting_bomb_in_a_listing_is_dropped_not_a_recursion_error() -> None:
    good = json.dumps([{"step": 5, "manifest": A, "size": 3, "disk": 4096, "largest": 3}])
    assert parse_claims(good) == [Claim(5, A, 3, 4096, 3)]
    assert parse_claims("[" * 200_000 + "]" * 200_000) == []
    assert parse_claims('[{"step": 5, "x": ' + "[" * 100 + "]" * 100 + "}]") == []


def test_the_watcher_records_saves_and_refusals_from_the_metrics() -> None:
    stream = MetricsStream()
    lines = [
        {"event": "checkpoint_saved", "step": 10, "manifest": A},
        {"event": "checkpoint_saved", "step": 20, "manifest": "not-hex"},
        {"event": "checkpoint_saved", "step": "30", "manifest": A},
        {
            "event": "checkpoint_refused",
            "step": 99,
            "file": "/x/training_state.pt",
            "where": "node n1",
            "why": "no",
        },
        {"event": "checkpoint_resumed", "step": 10, "source": "resume_from"},
    ]
    stream.feed(b"".join(json.dumps(line).encode() + b"\n" for line in lines))
    summary = stream.summary()
    assert summary.saved_checkpoints == {10: A}
    assert summary.refused_checkpoints == ("step 99: /x/training_state.pt on node n1: no",)
    story = resume_story("step 10 from n1 (a peer copy)", summary)
    assert story is not None and "step 10 from n1 (a peer copy)" in story
    assert "rank 0 resumed from step 10 (resume_from)" in story and "refused step 99" in story


def test_a_save_records_its_step_and_manifest_digest(tmp_path: Path) -> None:
    cp = make(tmp_path)
    saved = cp.save(7, writer(b"w"))
    assert saved is not None
    events = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    digest = hashlib.sha256(Path(saved.path, "MANIFEST.json").read_bytes()).hexdigest()
    assert [(e["event"], e["step"], e["manifest"]) for e in events] == [("checkpoint_saved", 7, digest)]
    other = make(tmp_path, rank=1, sharded=True)
    assert other.save(7, writer(b"w")) is not None
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 1, "only rank 0 records"


def test_nothing_newer_than_the_laptops_choice_is_offered(tmp_path: Path) -> None:
    cp = make(tmp_path)
    for step in (10, 20, 30):
        cp.save(step, writer(b"w"))
    chosen = make(tmp_path, resume_from=str(tmp_path / "ckpt" / "step-20"))
    assert [c.step for c in chosen.candidates()] == [20, 10]
    assert [c.source for c in chosen.candidates()] == ["resume_from", "node"]
    assert [c.step for c in make(tmp_path).candidates()] == [30, 20, 10]


POISON_SCRIPT = """
import os, sys
sys.path.insert(0, sys.argv[1])
import torch
import fleetrun_checkpoint as ckpt
marker = sys.argv[3]
cp = ckpt.Checkpointer(directory=sys.argv[2], bucket=None, run_dir=sys.argv[4], resume_from="", rank=0)
model = torch.nn.Linear(3, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
assert ckpt.save_training_state(10, model, optimizer, sampler_state={"pos": 3}, checkpointer=cp)

class Evil:
    def __reduce__(self):
        return (os.system, ("touch " + marker,))

# a rank plants a newer step whose state file runs a command when unpickled, with a manifest
# that matches it (the helper's own seal), so only the load can tell
cp.save(20, lambda path: torch.save({"model": {}, "x": Evil()}, os.path.join(path, ckpt.STATE_FILE)))
try:
    ckpt.save_training_state(30, model, extra={"bad": object()}, checkpointer=cp)
except TypeError as exc:
    print("save refused:", exc)
other = torch.nn.Linear(3, 2)
state = ckpt.resume_training_state(other, torch.optim.SGD(other.parameters(), lr=0.1), checkpointer=cp)
assert state is not None and state["step"] == 10, state
assert torch.equal(other.weight, model.weight)
assert not os.path.exists(marker), "the pickle ran"
try:
    ckpt.load_training_state(ckpt.Checkpointer(directory=sys.argv[2], bucket=None, run_dir="", resume_from=sys.argv[2] + "/step-20", rank=0).latest(), other)
except ckpt.Refused as exc:
    print("load refused:", exc)
assert not os.path.exists(marker), "the pickle ran"
print("resumed from", state["step"], state["source"])
"""


def test_a_code_executing_pickle_is_refused_and_the_resume_falls_back(tmp_path: Path) -> None:
    python = torch_python()
    if python is None:
        pytest.skip("no Python with torch here (make setup builds the local fleet image)")
    marker = tmp_path / "pwned"
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    out = subprocess.run(
        [python, "-c", POISON_SCRIPT, str(NODELIB), str(tmp_path / "ckpt"), str(marker), str(run_dir)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    assert not marker.exists()
    assert "resumed from 10 node" in out.stdout
    assert "save refused: extra['bad'] is a object" in out.stdout
    assert "load refused: not plain data" in out.stdout
    assert "refused checkpoint step 20 (" in out.stderr and "training_state.pt on node " in out.stderr
    events = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    refused = [e for e in events if e["event"] == "checkpoint_refused"]
    assert [e["step"] for e in refused] == [20] and refused[0]["file"].endswith("step-20/training_state.pt")
    resumed = [e for e in events if e["event"] == "checkpoint_resumed"]
    assert [(e["step"], e["source"]) for e in resumed] == [(10, "node")]


OLD_TORCH_SCRIPT = """
import sys
sys.path.insert(0, sys.argv[1])
import torch
import fleetrun_checkpoint as ckpt
peer = ckpt.Checkpointer(directory=sys.argv[2], bucket=None, run_dir="", resume_from="", rank=0)
model = torch.nn.Linear(3, 2)
saved = ckpt.save_training_state(10, model, checkpointer=peer, background=False)
torch.__version__ = "2.5.1+cu121"  # this node's torch: weights_only is bypassable before 2.6
try:
    ckpt.load_state_bytes(open(saved.file(ckpt.STATE_FILE), "rb").read())
except ckpt.UnsafeTorch as exc:
    print("load refused:", exc)
here = ckpt.Checkpointer(directory=sys.argv[3], bucket=None, run_dir="", resume_from=saved.path, rank=0)
ckpt.resume_training_state(torch.nn.Linear(3, 2), checkpointer=here)
print("resumed: must not happen")
"""


def test_a_resume_on_a_torch_with_a_known_bypass_is_refused_with_one_line(tmp_path: Path) -> None:
    """A peer's checkpoint (``FLEETRUN_RESUME_FROM``), this node on torch 2.5.1: nothing is
    loaded, and the job ends with one line naming the fix, not a fresh start from step 0."""
    python = torch_python()
    if python is None:
        pytest.skip("no Python with torch here (make setup builds the local fleet image)")
    out = subprocess.run(
        [python, "-c", OLD_TORCH_SCRIPT, str(NODELIB), str(tmp_path / "peer"), str(tmp_path / "here")],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert "load refused: torch 2.5.1+cu121 has a known weights_only bypass" in out.stdout, out.stderr[-2000:]
    assert out.returncode == 1 and "must not happen" not in out.stdout
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith("fleetrun: cannot resume from ") and line.endswith(
        "install torch>=2.6 on the nodes"
    )


def test_peer_copies_follow_the_recorded_saves_newest_first(tmp_path: Path) -> None:
    """The laptop copies the newest recorded save to a peer, once; none with a bucket or one node;
    the saves it saw are kept for the choice before a later attempt, across attempts."""
    import threading

    from launch.run.peer_copies import PeerCopies
    from tests.fakefleet import fake_hosts

    hosts = fake_hosts(3)
    copies = PeerCopies("r1", tmp_path, lambda _line: None)
    done: list[int] = []
    release, started = threading.Event(), threading.Event()

    def fake_copy(step: int, digest: str, hosts_now: list, known_hosts: Path, holder: object = None) -> None:
        started.set()
        release.wait(10)
        done.append(step)
        copies.copied[step] = hosts_now[1].name

    copies._copy = fake_copy  # type: ignore[method-assign]

    class Watcher:
        on_poll = None

    class Obs:
        def __init__(self, saved: dict[int, str]) -> None:
            self.metrics = type("M", (), {"saved_checkpoints": saved, "uploaded_checkpoints": {}})()

    watcher = Watcher()
    copies.follow(watcher, hosts, tmp_path / "known_hosts", copy=True)
    assert watcher.on_poll is not None
    watcher.on_poll(Obs({5: A}))  # copying 5 (held back)
    assert started.wait(10)
    watcher.on_poll(Obs({5: A, 10: B}))  # queued
    watcher.on_poll(Obs({5: A, 10: B, 15: A}))  # replaces 10 in the queue
    watcher.on_poll(Obs({5: A, 10: B, 15: A}))  # already queued: nothing new
    release.set()
    for _ in range(100):
        if len(done) == 2:
            break
        threading.Event().wait(0.1)
    copies.stop(10)
    assert done == [5, 15], (done, copies.errors)
    assert copies.recorded == {5: A, 10: B, 15: A}
    copies.follow(watcher, hosts, tmp_path / "known_hosts", copy=False)
    watcher.on_poll(Obs({20: A}))
    copies.stop(10)
    assert done == [5, 15] and copies.recorded[20] == A, (
        "with a bucket or without recovery: recorded, not copied"
    )


BUCKET_POISON_SCRIPT = """
import json, os, sys
sys.path.insert(0, sys.argv[1])
import torch
import fleetrun_checkpoint as ckpt
import fleetrun_protocol as protocol
commands = protocol.BucketCommands.from_dict(json.loads(sys.argv[2]))
tmp, marker = sys.argv[3], sys.argv[4]

class Evil:
    def __reduce__(self):
        return (os.system, ("touch " + marker,))

def node(name):
    return ckpt.Checkpointer(directory=os.path.join(tmp, name), bucket=commands, run_dir="", resume_from="", rank=0)

writer = node("a")
model = torch.nn.Linear(3, 2)
assert ckpt.save_training_state(10, model, checkpointer=writer, background=False)
assert writer.wait_uploaded(120), writer.upload_error
# a node (or anyone with write access to the bucket) uploads a newer step that runs code
writer.save(20, lambda path: torch.save({"model": {}, "x": Evil()}, os.path.join(path, ckpt.STATE_FILE)))
assert writer.wait_uploaded(120), writer.upload_error
fresh = torch.nn.Linear(3, 2)
state = ckpt.resume_training_state(fresh, checkpointer=node("b"))  # a replacement node: empty disk
assert state is not None and (state["step"], state["source"]) == (10, "bucket"), state
assert torch.equal(fresh.weight, model.weight)
print("resumed from", state["step"], state["source"], os.path.exists(marker))
"""


def test_a_code_executing_pickle_in_the_bucket_is_refused(tmp_path: Path) -> None:
    from tests.s3server import aws_cli, serve_bucket

    python = torch_python()
    if python is None:
        pytest.skip("no Python with torch here (make setup builds the local fleet image)")
    for s3 in serve_bucket("ckpt-poison"):
        commands = s3.commands("ckpt-poison", "runs/r-poison", cli=aws_cli())
        marker = tmp_path / "pwned"
        out = subprocess.run(
            [
                python,
                "-c",
                BUCKET_POISON_SCRIPT,
                str(NODELIB),
                json.dumps(commands.to_dict()),
                str(tmp_path),
                str(marker),
            ],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
        assert "resumed from 10 bucket False" in out.stdout
        assert not marker.exists()
        assert (
            "refused checkpoint step 20 (" in out.stderr and "training_state.pt on the bucket)" in out.stderr
        )


# -- the head's newest checkpoint with a bucket too (issue 33) ------------------------------------


def test_the_resume_step_is_the_newest_durable_one_of_the_nodes_and_the_bucket() -> None:
    """A step is durable once its peer copy is on a node of the next attempt (``choose``'s step)
    or its upload completed: the newest of either wins, a tie goes to the nodes (no download),
    and an upload is believed only with the manifest rank 0 recorded for that step."""
    from launch.run.checkpoints import newest_durable

    recorded = {10: A, 15: B, 20: A}
    # the head was lost 0.5 s after saving 15: its upload was under way, the peer copy done
    assert newest_durable(15, {10: A}, recorded) == (15, "nodes")
    # the upload of 20 ended first (its peer copy was not made): the bucket's step
    assert newest_durable(15, {10: A, 20: A}, recorded) == (20, "bucket")
    assert newest_durable(None, {10: A}, recorded) == (10, "bucket")
    assert newest_durable(15, {15: B}, recorded) == (15, "nodes"), "a tie needs no download"
    # an upload reported with another manifest, or for a step never recorded, is not believed
    assert newest_durable(10, {20: B, 25: A}, recorded) == (10, "nodes")
    assert newest_durable(None, {}, recorded) is None


class _Listing:
    """A node's answer to the checkpoint listing (what ``complete_claims`` reads)."""

    def __init__(self, claims: list[dict[str, object]]) -> None:
        self.ok, self.stdout, self.stderr = True, json.dumps(claims), ""


class _ListingFleet:
    """Just enough of a fleet for ``spread_latest``'s question to every node: what it holds."""

    def __init__(self, held: dict[str, list[tuple[int, str]]]) -> None:
        self.held = held

    def map(self, fn: object, hosts: list, deadline: float) -> dict[str, object]:
        class Conn:
            def __init__(self, host: object, claims: list[dict[str, object]]) -> None:
                self.host = host
                self.claims = claims

            def run(self, command: str, timeout: float) -> _Listing:
                return _Listing(self.claims)

        found = {}
        for h in hosts:
            claims = [
                {"step": s, "manifest": m, "size": 1, "disk": 1, "largest": 1} for s, m in self.held[h.name]
            ]
            found[h.name] = fn(Conn(h, claims))  # type: ignore[operator]
        return found


def test_a_newer_completed_upload_outranks_the_nodes_copies_and_nothing_is_copied(tmp_path: Path) -> None:
    from launch.run.checkpoints import spread_latest
    from tests.fakefleet import fake_hosts

    hosts = fake_hosts(2)
    recorded = {10: A, 15: B, 20: A}
    fleet = _ListingFleet({"n0": [(15, B)], "n1": [(15, B), (10, A)]})
    url = "s3://b/runs/r1"
    spread = spread_latest(
        fleet,  # type: ignore[arg-type]
        hosts,
        "r1",
        tmp_path / "kh",
        tmp_path / "staging",
        recorded=recorded,
        bucket=True,
        uploaded={10: A, 20: A},
        bucket_url=url,
    )
    assert spread.resume_from == f"{url}/checkpoints/step-20", spread
    assert "step 20 from the bucket" in spread.record and "(step 15)" in spread.record
    # the upload of 20 not (yet) reported: the peer copy of 15 every node holds is the newest durable
    spread = spread_latest(
        fleet,  # type: ignore[arg-type]
        hosts,
        "r1",
        tmp_path / "kh",
        tmp_path / "staging",
        recorded=recorded,
        bucket=True,
        uploaded={10: A},
        bucket_url=url,
    )
    assert spread.resume_from is not None and spread.resume_from.endswith("checkpoints/step-15"), spread
    assert "every node holds checkpoint step 15" in spread.said


def test_the_watcher_records_completed_uploads_from_the_metrics() -> None:
    stream = MetricsStream()
    lines = [
        {"event": "checkpoint_saved", "step": 10, "manifest": A},
        {"event": "checkpoint_uploaded", "step": 10, "manifest": A},
        {"event": "checkpoint_uploaded", "step": 15, "manifest": None},
        {"event": "checkpoint_uploaded", "step": -1, "manifest": A},
    ]
    stream.feed(b"".join(json.dumps(line).encode() + b"\n" for line in lines))
    summary = stream.summary()
    assert summary.uploaded_checkpoints == {10: A}
    assert summary.saved_checkpoints == {10: A}, "an upload is not a save"


def test_with_a_bucket_a_step_already_uploaded_gets_no_peer_copy(tmp_path: Path) -> None:
    """Whichever second copy ends first: a step whose upload rank 0 reported complete is durable
    and is not copied; one still uploading is, and either kind counts as durable."""
    from launch.run.peer_copies import PeerCopies
    from tests.fakefleet import fake_hosts

    hosts = fake_hosts(3)
    copies = PeerCopies("r1", tmp_path, lambda _line: None)
    done: list[int] = []

    def fake_copy(step: int, digest: str, hosts_now: list, known_hosts: Path, holder: object = None) -> None:
        done.append(step)
        copies.copied[step] = hosts_now[1].name

    copies._copy = fake_copy  # type: ignore[method-assign]

    class Watcher:
        on_poll = None

    class Obs:
        def __init__(self, saved: dict[int, str], uploaded: dict[int, str]) -> None:
            self.metrics = type("M", (), {"saved_checkpoints": saved, "uploaded_checkpoints": uploaded})()

    watcher = Watcher()
    copies.follow(watcher, hosts, tmp_path / "known_hosts", copy=True)
    assert watcher.on_poll is not None
    watcher.on_poll(Obs({5: A}, {5: A}))  # its upload ended before the watcher saw the save
    watcher.on_poll(Obs({5: A, 10: B}, {5: A}))  # 10 still uploading: copied to a peer
    for _ in range(100):
        if done:
            break
        threading.Event().wait(0.1)
    copies.stop(10)
    assert done == [10], (done, copies.errors)
    assert copies.durable() == {5: "bucket", 10: "n1"}
    assert copies.uploaded == {5: A}
