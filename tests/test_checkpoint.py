"""The checkpoint helper (``launch/nodelib/fleetrun_checkpoint.py``) on this machine's disk.

Imported the way nodes import it (``~/.fleetrun/lib`` on the path, plain module names). The
bucket path runs the real ``aws`` CLI against a local S3-compatible server (``tests/s3server.py``);
a few tests use shell commands on a folder as their storage, to hold an upload back
deterministically or to count the bucket commands.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.s3server import S3Server, aws_cli, serve_bucket

NODELIB = Path(__file__).resolve().parent.parent / "launch" / "nodelib"
sys.path.insert(0, str(NODELIB))

import fleetrun_checkpoint as ckpt  # noqa: E402
import fleetrun_protocol as protocol  # noqa: E402


def writer(payload: bytes, extra: dict[str, bytes] | None = None):  # noqa: ANN201
    def write(path: str) -> None:
        Path(path, "weights.bin").write_bytes(payload)
        for name, data in (extra or {}).items():
            Path(path, name).parent.mkdir(parents=True, exist_ok=True)
            Path(path, name).write_bytes(data)

    return write


def make(tmp_path: Path, **kwargs: object) -> ckpt.Checkpointer:
    options: dict[str, object] = {
        "directory": str(tmp_path / "ckpt"),
        "bucket": None,
        "run_dir": str(tmp_path),
        "resume_from": "",
        "handle_sigterm": False,
        "rank": 0,
        "world": 1,
    }
    options.update(kwargs)
    return ckpt.Checkpointer(**options)  # type: ignore[arg-type]


def test_save_writes_a_manifest_and_latest_finds_it(tmp_path: Path) -> None:
    cp = make(tmp_path)
    saved = cp.save(10, writer(b"abc", {"sub/opt.bin": b"xyz"}))
    assert saved is not None and saved.step == 10
    manifest = json.loads((tmp_path / "ckpt" / "step-10" / "MANIFEST.json").read_text())
    assert manifest["step"] == 10 and set(manifest["files"]) == {"weights.bin", "sub/opt.bin"}
    assert (
        manifest["files"]["weights.bin"]["size"] == 3
        and len(manifest["files"]["weights.bin"]["sha256"]) == 64
    )
    found = cp.latest()
    assert found is not None and (found.step, found.source) == (10, "node")
    assert Path(found.file("weights.bin")).read_bytes() == b"abc"
    assert not [p for p in (tmp_path / "ckpt").iterdir() if p.name.startswith(".")], "no temp dir left"


def test_a_writer_that_fails_leaves_no_checkpoint(tmp_path: Path) -> None:
    cp = make(tmp_path)
    cp.save(1, writer(b"good"))

    def broken(path: str) -> None:
        Path(path, "weights.bin").write_bytes(b"half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        cp.save(2, broken)
    assert cp.steps() == [1]
    found = cp.latest()
    assert found is not None and found.step == 1
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["step-1"]


def test_truncated_or_corrupted_files_are_never_resumed_from(tmp_path: Path) -> None:
    cp = make(tmp_path)
    cp.save(1, writer(b"one" * 100))
    cp.save(2, writer(b"two" * 100))
    weights = tmp_path / "ckpt" / "step-2" / "weights.bin"
    weights.write_bytes(b"two" * 50)  # truncated
    found = cp.latest()
    assert found is not None and found.step == 1, "a truncated file fails the size check"
    weights.write_bytes(b"owt" * 100)  # same size, other bytes
    assert ckpt.verify(str(weights.parent), hashes=False) is not None, "sizes alone cannot see this"
    assert ckpt.verify(str(weights.parent)) is None, "the sha256 check does"
    found = cp.latest()
    assert found is not None and found.step == 1
    (tmp_path / "ckpt" / "step-1" / "MANIFEST.json").write_text('{"step": 1, "files": [[[')
    assert cp.latest() is None, "a garbage manifest is no checkpoint"


def test_a_step_dir_without_manifest_is_incomplete(tmp_path: Path) -> None:
    cp = make(tmp_path)
    cp.save(3, writer(b"x"))
    (tmp_path / "ckpt" / "step-9").mkdir()
    (tmp_path / "ckpt" / "step-9" / "weights.bin").write_bytes(b"y")
    found = cp.latest()
    assert found is not None and found.step == 3


def test_keeps_the_last_n(tmp_path: Path) -> None:
    cp = make(tmp_path, keep=3)
    for step in range(1, 7):
        cp.save(step * 10, writer(str(step).encode()))
    assert cp.steps() == [60, 50, 40]
    cp.save(50, writer(b"again"))  # the same step saved again replaces it
    assert cp.steps() == [60, 50, 40]
    assert (tmp_path / "ckpt" / "step-50" / "weights.bin").read_bytes() == b"again"


def test_resume_from_is_preferred_when_complete(tmp_path: Path) -> None:
    cp = make(tmp_path)
    cp.save(5, writer(b"five"))
    cp.save(8, writer(b"eight"))
    chosen = make(tmp_path, resume_from=str(tmp_path / "ckpt" / "step-5")).latest()
    assert chosen is not None and (chosen.step, chosen.source) == (5, "resume_from")
    bad = make(tmp_path, resume_from=str(tmp_path / "nowhere")).latest()
    assert bad is not None and (bad.step, bad.source) == (8, "node"), "an incomplete choice falls back"


def test_only_rank_zero_writes_unless_sharded(tmp_path: Path) -> None:
    called: list[str] = []
    other = make(tmp_path, rank=1, world=2)
    assert other.save(1, lambda path: called.append(path)) is None and not called
    shards = [make(tmp_path, rank=r, world=2, sharded=True) for r in (0, 1)]
    for r, cp in enumerate(shards):
        saved = cp.save(4, writer(f"shard{r}".encode()))
        assert saved is not None and saved.path.endswith(f"step-4/rank-{r}")
    manifest = json.loads((tmp_path / "ckpt" / "step-4" / "rank-1" / "MANIFEST.json").read_text())
    assert (manifest["rank"], manifest["world"]) == (1, 2)
    found = shards[1].latest()
    assert found is not None and Path(found.file("weights.bin")).read_bytes() == b"shard1"
    assert make(tmp_path, rank=2, world=3, sharded=True).latest() is None, "rank 2 has no shard"


def test_should_save_on_the_flag_file(tmp_path: Path) -> None:
    cp = make(tmp_path)
    assert not cp.should_save()
    (tmp_path / "preempt.json").write_text("{}")
    assert cp.should_save() and cp.should_save(everywhere=True)


SIGTERM_SCRIPT = """
import sys, time
sys.path.insert(0, sys.argv[1])
import fleetrun_checkpoint as ckpt
cp = ckpt.Checkpointer(directory=sys.argv[2] + "/ckpt", bucket=None, run_dir=sys.argv[2], resume_from="")
print("ready", flush=True)
step = 0
while not cp.should_save():
    step += 1
    time.sleep(0.01)
cp.save(step, lambda path: open(path + "/weights.bin", "w").write("saved"))
print("saved", step, flush=True)
sys.stdin.readline()
print("still here", flush=True)
"""


def test_sigterm_turns_into_should_save_and_never_kills_mid_save(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", SIGTERM_SCRIPT, str(NODELIB), str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "RANK": "0"},
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        proc.send_signal(signal.SIGTERM)
        line = proc.stdout.readline().split()
        assert line[0] == "saved", "the first SIGTERM asks for a checkpoint instead of killing"
        assert (tmp_path / "ckpt" / f"step-{line[1]}" / "MANIFEST.json").exists()
        assert (tmp_path / "signals" / "rank-0").exists(), "the signal time is noted for the benchmark"
        first = (tmp_path / "signals" / "rank-0").read_text()
        proc.send_signal(signal.SIGTERM)  # a second stop (torchrun's, the laptop's) while saving
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "still here", "a second SIGTERM does not kill"
        assert proc.wait(timeout=30) == 0
        assert (tmp_path / "signals" / "rank-0").read_text() == first, "the first signal's time is kept"
    finally:
        proc.kill()
        proc.wait()


def test_save_returns_before_the_upload_finishes(tmp_path: Path) -> None:
    gate, store = tmp_path / "go", tmp_path / "store"
    held = f'while [ ! -e {gate} ]; do sleep 0.05; done; mkdir -p "$2" && cp -r "$1"/. "$2"'
    copy = 'mkdir -p "$(dirname "$2")" && cp "$1" "$2"'
    commands = protocol.BucketCommands(
        url=f"file://{store}",
        copy=(
            "sh",
            "-c",
            copy.replace("$1", '"${1#file://}"').replace("$2", "${2#file://}"),
            "sh",
            "{src}",
            "{dest}",
        ),
        sync=(
            "sh",
            "-c",
            held.replace("$1", "${1#file://}").replace("$2", "${2#file://}"),
            "sh",
            "{src}",
            "{dest}",
        ),
    )
    cp = make(tmp_path, bucket=commands)
    saved = cp.save(7, writer(b"seven"))
    assert saved is not None and (tmp_path / "ckpt" / "step-7" / "MANIFEST.json").exists()
    assert not cp.wait_uploaded(0.2), "the upload is held back by the gate: save did not wait for it"
    assert not (store / "checkpoints" / "step-7").exists()
    gate.touch()
    assert cp.wait_uploaded(60), cp.upload_error
    assert (store / "checkpoints" / "step-7" / "weights.bin").read_bytes() == b"seven"
    pointer = json.loads((store / "checkpoints" / "LATEST.json").read_text())
    assert pointer["steps"] == [7] and cp.uploaded_step == 7


def logged_bucket(store: Path, log: Path, gate: Path | None = None) -> protocol.BucketCommands:
    """A bucket in a folder whose every command appends a line to ``log`` (``copy SRC DEST``,
    ``sync SRC DEST``, ``remove DEST``); ``gate``: each sync waits for that file, then removes it."""

    def sh(kind: str, body: str, *args: str) -> tuple[str, ...]:
        strip = body.replace("$1", '"${1#file://}"').replace("$2", '"${2#file://}"')
        return ("sh", "-c", f'echo "{kind} $*" >> {log}; {strip}', "sh", *args)

    wait = f"while [ ! -e {gate} ]; do sleep 0.02; done; rm -f {gate}; " if gate else ""
    return protocol.BucketCommands(
        url=f"file://{store}",
        copy=sh("copy", 'mkdir -p "$(dirname $2)" && cp $1 $2', "{src}", "{dest}"),
        sync=sh("sync", wait + "mkdir -p $2 && cp -r $1/. $2", "{src}", "{dest}"),
        remove=sh("remove", "rm -rf $1", "{dest}"),
    )


def test_the_pointer_is_read_from_the_bucket_once_per_process(tmp_path: Path) -> None:
    """Each bucket command is a CLI process (seconds on a loaded node): after the first upload the
    helper knows the pointer it wrote, and an earlier attempt's steps still count."""
    store, log = tmp_path / "store", tmp_path / "bucket.log"
    earlier = make(tmp_path / "a", bucket=logged_bucket(store, log), keep=3)
    earlier.save(1, writer(b"one"))
    assert earlier.wait_uploaded(60), earlier.upload_error
    log.unlink()
    cp = make(tmp_path / "b", bucket=logged_bucket(store, log), keep=3)
    for step in (2, 3, 4):
        cp.save(step, writer(f"w{step}".encode()))
        assert cp.wait_uploaded(60), cp.upload_error
    reads = [line for line in log.read_text().splitlines() if line.startswith(f"copy file://{store}")]
    assert len(reads) == 1, log.read_text()
    pointer = json.loads((store / "checkpoints" / "LATEST.json").read_text())
    assert pointer["steps"] == [4, 3, 2], "step 1 (the earlier attempt's) dropped past keep"
    assert not (store / "checkpoints" / "step-1").exists()
    assert (store / "checkpoints" / "step-2" / "weights.bin").read_bytes() == b"w2"


def test_a_queued_step_reaches_the_pointer_before_old_steps_are_removed(tmp_path: Path) -> None:
    """The step saved after a notice, queued behind a periodic step's upload, is not also kept
    waiting for the removal of the steps past ``keep``: that comes after its pointer."""
    store, log, gate = tmp_path / "store", tmp_path / "bucket.log", tmp_path / "go"
    cp = make(tmp_path, bucket=logged_bucket(store, log, gate), keep=1)
    gate.touch()
    cp.save(1, writer(b"one"))
    assert cp.wait_uploaded(60), cp.upload_error
    cp.save(2, writer(b"two"))  # its sync waits for the gate
    wait_until(lambda: log.read_text().count("sync ") == 2)
    cp.save(3, writer(b"three"))  # queued behind step 2
    gate.touch()
    wait_until(lambda: not gate.exists())
    gate.touch()
    assert cp.wait_uploaded(60), cp.upload_error
    lines = log.read_text().splitlines()
    pointer_puts = [
        i for i, line in enumerate(lines) if line.startswith("copy ") and line.split()[2].startswith("file:")
    ]
    removals = [i for i, line in enumerate(lines) if line.startswith("remove ")]
    assert len(pointer_puts) == 3 and len(removals) == 2, lines
    assert pointer_puts[-1] < min(removals), f"step 3's pointer waited for the removals: {lines}"
    assert json.loads((store / "checkpoints" / "LATEST.json").read_text())["steps"] == [3]
    assert sorted(p.name for p in (store / "checkpoints").glob("step-*")) == ["step-3"]


def test_rank_zero_records_an_upload_once_its_pointer_is_written(tmp_path: Path) -> None:
    """``checkpoint_uploaded`` (the laptop's word that a step no longer needs a peer copy) is
    written after the step and the bucket's pointer, never while the upload is held."""
    store, log, gate = tmp_path / "store", tmp_path / "bucket.log", tmp_path / "go"
    cp = make(tmp_path, bucket=logged_bucket(store, log, gate))
    saved = cp.save(5, writer(b"five"))
    assert saved is not None
    wait_until(lambda: "sync " in log.read_text() if log.exists() else False)

    def events() -> list[dict]:
        return [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]

    assert [e["event"] for e in events()] == ["checkpoint_saved"], "recorded while the upload is held"
    gate.touch()
    assert cp.wait_uploaded(60), cp.upload_error
    saved_event, uploaded = events()
    assert uploaded["event"] == "checkpoint_uploaded" and uploaded["step"] == 5
    assert uploaded["manifest"] == saved_event["manifest"]
    assert json.loads((store / "checkpoints" / "LATEST.json").read_text())["steps"] == [5]
    worker = make(tmp_path / "w", bucket=logged_bucket(store, log), rank=1, sharded=True, world=2)
    worker.save(5, writer(b"shard"))
    assert worker.wait_uploaded(60), worker.upload_error
    assert not (tmp_path / "w" / "metrics.jsonl").exists(), "only rank 0 (unsharded) records uploads"


def wait_until(condition: Callable[[], bool], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


# -- the real bucket path: moto's S3 server and the aws CLI ---------------------------------------


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    yield from serve_bucket("ckpt-unit")


def test_background_upload_to_s3_keeps_the_last_n(tmp_path: Path, s3: S3Server) -> None:
    commands = s3.commands("ckpt-unit", "runs/r-keep", cli=aws_cli())
    cp = make(tmp_path, bucket=commands, keep=2)
    for step in (1, 2, 3):
        cp.save(step, writer(f"w{step}".encode()))
        assert cp.wait_uploaded(120), cp.upload_error
    keys = s3.keys("ckpt-unit", "runs/r-keep/checkpoints/")
    steps = sorted({k.split("/")[3] for k in keys if "/step-" in k})
    assert steps == ["step-2", "step-3"], keys
    assert "runs/r-keep/checkpoints/step-3/MANIFEST.json" in keys
    pointer = json.loads(s3.get("ckpt-unit", "runs/r-keep/checkpoints/LATEST.json"))
    assert pointer["steps"] == [3, 2]


def test_latest_comes_from_the_bucket_when_the_disk_is_gone(tmp_path: Path, s3: S3Server) -> None:
    commands = s3.commands("ckpt-unit", "runs/r-lost", cli=aws_cli())
    first = make(tmp_path / "node-a", bucket=commands)
    first.save(12, writer(b"twelve", {"opt.bin": b"o" * 1000}))
    assert first.wait_uploaded(120), first.upload_error
    fresh = make(tmp_path / "node-b", bucket=commands)  # a replacement node: empty disk
    found = fresh.latest()
    assert found is not None and (found.step, found.source) == (12, "bucket")
    assert Path(found.file("weights.bin")).read_bytes() == b"twelve"
    again = fresh.latest()
    assert again is not None and again.source == "node", "downloaded once, then found on the disk"
    assert make(tmp_path / "node-c", bucket=None).latest() is None, "no disk, no bucket: none"


def test_a_corrupted_bucket_copy_falls_back_to_an_older_step(tmp_path: Path, s3: S3Server) -> None:
    commands = s3.commands("ckpt-unit", "runs/r-bad", cli=aws_cli())
    writer_node = make(tmp_path / "a", bucket=commands)
    for step in (1, 2):
        writer_node.save(step, writer(f"step{step}".encode()))
        assert writer_node.wait_uploaded(120), writer_node.upload_error
    s3.put("ckpt-unit", "runs/r-bad/checkpoints/step-2/weights.bin", b"step")  # truncated in the bucket
    found = make(tmp_path / "b", bucket=commands).latest()
    assert found is not None and (found.step, found.source) == (1, "bucket")
    assert not (tmp_path / "b" / "ckpt" / "step-2").exists(), "the bad copy is not kept"


def test_resume_from_a_bucket_url(tmp_path: Path, s3: S3Server) -> None:
    commands = s3.commands("ckpt-unit", "runs/r-url", cli=aws_cli())
    node = make(tmp_path / "a", bucket=commands)
    for step in (3, 6):
        node.save(step, writer(f"s{step}".encode()))
        assert node.wait_uploaded(120), node.upload_error
    chosen = make(tmp_path / "b", bucket=commands, resume_from=f"{commands.url}/checkpoints/step-3").latest()
    assert chosen is not None and (chosen.step, chosen.source) == (3, "resume_from")
    assert Path(chosen.file("weights.bin")).read_bytes() == b"s3"


def test_an_unreachable_bucket_is_reported_not_raised(tmp_path: Path) -> None:
    commands = protocol.BucketCommands(
        url="s3://nowhere/runs/r",
        copy=("fleetrun-no-such-cli", "cp", "{src}", "{dest}"),
        sync=("fleetrun-no-such-cli", "sync", "{src}", "{dest}"),
    )
    cp = make(tmp_path, bucket=commands)
    assert cp.save(1, writer(b"x")) is not None, "the local checkpoint is made anyway"
    assert not cp.wait_uploaded(30) and "no fleetrun-no-such-cli CLI" in cp.upload_error
    found = cp.latest()
    assert found is not None and found.source == "node"


TORCH_SCRIPT = """
import random, sys
sys.path.insert(0, sys.argv[1])
import torch
import fleetrun_checkpoint as ckpt
cp = ckpt.Checkpointer(directory=sys.argv[2], bucket=None, run_dir="", resume_from="", rank=0)
model = torch.nn.Linear(3, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
model(torch.ones(1, 3)).sum().backward()
optimizer.step()
torch.manual_seed(7)
random.seed(7)
saved = ckpt.save_training_state(42, model, optimizer, epoch=3, sampler_state={"pos": 17}, checkpointer=cp)
assert saved is not None
expected = (torch.rand(4), random.random())
other = torch.nn.Linear(3, 2)
other_opt = torch.optim.SGD(other.parameters(), lr=0.1, momentum=0.9)
found = cp.latest()
state = ckpt.load_training_state(found, other, other_opt)
assert (state["step"], state["epoch"], state["sampler"]) == (42, 3, {"pos": 17}), state
assert torch.equal(other.weight, model.weight)
assert other_opt.state_dict()["state"][0]["momentum_buffer"] is not None
assert torch.equal(torch.rand(4), expected[0]) and random.random() == expected[1], "RNG restored"
print("round trip ok")
"""


def torch_python() -> str | None:
    """This Python when it has torch, else the local fleet's image (torch CPU), else None."""
    try:
        import torch  # noqa: F401

        return sys.executable
    except ImportError:
        pass
    from launch.fleets.local import image_python

    image = image_python()
    return str(image) if image.exists() else None


def test_the_torch_state_round_trips_with_rng(tmp_path: Path) -> None:
    python = torch_python()
    if python is None:
        pytest.skip("no Python with torch here (make setup builds the local fleet image)")
    out = subprocess.run(
        [python, "-c", TORCH_SCRIPT, str(NODELIB), str(tmp_path / "ckpt")],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0 and "round trip ok" in out.stdout, out.stderr[-2000:]


def test_a_local_fleet_bucket_only_on_test_addresses() -> None:
    from pydantic import ValidationError

    from launch.fleets.kinds.local import LocalFleetKind
    from launch.fleets.kinds.refs import LocalFleetRef

    ref = LocalFleetRef(prefix="ab", bucket="ckpt", s3_endpoint="http://198.18.46.1:9000")
    commands = LocalFleetKind(ref).bucket_commands("runs/r1")
    assert commands is not None and commands.url == "s3://ckpt/runs/r1"
    assert commands.env["AWS_ENDPOINT_URL"] == "http://198.18.46.1:9000"
    assert commands.sync[0].endswith("/venv/bin/aws"), "the image's aws CLI, found by path"
    upload = LocalFleetKind(ref).bucket_upload_argv("runs/r1/n0")
    assert upload is not None and upload[-1] == "s3://ckpt/runs/r1/n0" and "{src}" in upload
    assert LocalFleetKind(LocalFleetRef(prefix="ab")).bucket_commands("runs/r1") is None
    for endpoint in ("http://10.0.0.1:9000", "https://198.18.0.1:9000", "http://52.216.1.1:80", "http://x:1"):
        with pytest.raises(ValidationError):
            LocalFleetRef(prefix="ab", bucket="ckpt", s3_endpoint=endpoint)


def assert_resume_matches_an_uninterrupted_run(
    tmp_path: Path, launcher: list[str], env: dict[str, str], resumed_step: int = 20
) -> None:
    """``launcher`` + the trainer's flags, run three times: whole (2 epochs), cut (1 epoch,
    checkpoints every 10 steps) and resumed (2 epochs): the resumed run starts at
    ``resumed_step`` (rank 0's last checkpoint of epoch 0: step 20 on 2 ranks) and ends with the
    whole run's parameters, bit for bit, on every rank."""
    digits = Path(__file__).resolve().parent.parent / "examples" / "digits"

    def train(run_dir: Path, *args: str) -> str:
        run_dir.mkdir(exist_ok=True)
        run_env = {**os.environ, "FLEETRUN_RUN_DIR": str(run_dir), "PYTHONPATH": str(NODELIB), **env}
        out = subprocess.run(
            [*launcher, *args], cwd=digits, env=run_env, capture_output=True, text=True, timeout=300
        )
        assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
        return out.stdout

    def checksums(run_dir: Path) -> list[str]:
        return json.loads((run_dir / "status.json").read_text())["param_checksums"]

    train(tmp_path / "whole", "--epochs", "2")
    train(tmp_path / "cut", "--epochs", "1", "--checkpoint-every", "10")
    resumed = train(tmp_path / "cut", "--epochs", "2", "--checkpoint-every", "10")
    assert f"resumed from step {resumed_step} (epoch 0, node)" in resumed
    assert checksums(tmp_path / "cut") == checksums(tmp_path / "whole")
    assert len(set(checksums(tmp_path / "cut"))) == 1, "every rank holds the same parameters"


def test_the_digits_trainer_resumes_mid_epoch_to_the_same_parameters(tmp_path: Path) -> None:
    """Two ranks (torchrun, gloo): a run cut after epoch 0 and resumed from its step-20
    checkpoint (rank 0's, broadcast) ends with the parameters of an uninterrupted run."""
    python = torch_python()
    if python is None:
        pytest.skip("no Python with torch here (make setup builds the local fleet image)")
    torchrun = [python, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    assert_resume_matches_an_uninterrupted_run(
        tmp_path, [*torchrun, "-m", "trainer.task"], {"OMP_NUM_THREADS": "1"}
    )


def test_three_ddp_ranks_resume_bit_identically(tmp_path: Path) -> None:
    """Three ranks (torchrun, gloo), where DDP's bucket rebuild after the first step used to make
    a resumed run differ in the last bits (the ring sums an element in an order set by its
    offset in the bucket): with ``exact_allreduce`` the parameters are equal, not just close."""
    python = torch_python()
    if python is None:
        pytest.skip("no Python with torch here (make setup builds the local fleet image)")
    torchrun = [python, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "3"]
    assert_resume_matches_an_uninterrupted_run(
        tmp_path, [*torchrun, "-m", "trainer.task"], {"OMP_NUM_THREADS": "1"}, resumed_step=10
    )


def test_keeping_the_last_n_deletes_only_checkpoints_fleetrun_wrote(tmp_path: Path) -> None:
    """Retention never removes a user's ``step-<N>`` directory nor follows a symlink out of the dir."""
    user = tmp_path / "ckpt" / "step-1"
    user.mkdir(parents=True)
    (user / "notes.txt").write_bytes(b"mine")
    outside = tmp_path / "elsewhere"
    scratch = make(tmp_path, directory=str(tmp_path / "scratch"), sharded=True)
    scratch.save(2, writer(b"a copy"))
    (tmp_path / "scratch" / "step-2").rename(outside)  # a complete shard, outside the checkpoint dir
    (tmp_path / "ckpt" / "step-2").symlink_to(outside)
    cp = make(tmp_path, keep=2, sharded=True)
    for step in (10, 20, 30):
        cp.save(step, writer(str(step).encode()))
    assert (user / "notes.txt").read_bytes() == b"mine", "a directory without a manifest is the user's"
    assert (outside / "rank-0" / "weights.bin").read_bytes() == b"a copy", "a symlink is not followed"
    assert (tmp_path / "ckpt" / "step-2").is_symlink()
    assert not (tmp_path / "ckpt" / "step-10").exists(), "fleetrun's own oldest step still goes"
    assert (tmp_path / "ckpt" / "step-20" / "rank-0" / "MANIFEST.json").is_file()
    assert (tmp_path / "ckpt" / "step-30" / "rank-0" / "MANIFEST.json").is_file()
    plain = make(tmp_path, directory=str(tmp_path / "plain"), keep=1)
    (tmp_path / "plain" / "step-1").mkdir(parents=True)
    (tmp_path / "plain" / "step-1" / "notes.txt").write_bytes(b"mine too")
    plain.save(5, writer(b"5"))
    plain.save(6, writer(b"6"))
    assert (tmp_path / "plain" / "step-1" / "notes.txt").read_bytes() == b"mine too"
    assert plain.steps() == [6, 1], "step 5 (fleetrun's) went, the user's step-1 stayed"


def test_on_node_never_downloads(tmp_path: Path) -> None:
    """The watchdog's look at this node's disk (``on_node``) runs no bucket command; ``latest`` may."""
    marker = tmp_path / "bucket-called"
    touch = ("sh", "-c", f"echo called >> {marker}; exit 1", "sh", "{src}", "{dest}")
    commands = protocol.BucketCommands(url="file:///nowhere", copy=touch, sync=touch)
    cp = make(tmp_path, bucket=commands)
    assert cp.on_node() is None and not marker.exists(), "an empty disk is None, not a download"
    assert cp.latest() is None and marker.exists(), "latest falls back to the bucket"
    marker.unlink()
    (tmp_path / "ckpt").mkdir(exist_ok=True)
    saved = cp.save(3, writer(b"three"))
    assert saved is not None
    found = cp.on_node(hashes=False)
    assert found is not None and (found.step, found.source) == (3, "node")


def test_the_horovod_trainer_resumes_mid_epoch_to_the_same_parameters(tmp_path: Path) -> None:
    """The same under horovodrun (Gloo, 2 ranks on this machine): no torch process group, so the
    helper's resume broadcast and stop agreement go through Horovod."""
    from launch.fleets.local import image_python

    python = image_python()
    horovodrun = python.parent / "horovodrun"
    if not horovodrun.exists():
        pytest.skip("no Horovod in the local fleet image (make horovod builds it)")
    launcher = [str(horovodrun), "--gloo", "-np", "2", "-H", "localhost:2", str(python), "-m"]
    env = {"OMP_NUM_THREADS": "1", "PATH": f"{python.parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    assert_resume_matches_an_uninterrupted_run(tmp_path, [*launcher, "trainer.task_horovod"], env)


def agree_in_lock_step(
    shards: list[ckpt.Checkpointer],
) -> tuple[dict[int, ckpt.Checkpoint | None], dict[int, list[int]]]:
    """Every rank's ``agreed_latest`` run side by side in threads, the all-reduce MIN played by a
    barrier; returns each rank's answer and the values it offered."""
    barrier = threading.Barrier(len(shards))
    slots: dict[int, int] = {}
    offered: dict[int, list[int]] = {r: [] for r in range(len(shards))}
    results: dict[int, ckpt.Checkpoint | None] = {}

    def rank(r: int) -> None:
        def smallest(value: int) -> int:
            offered[r].append(value)
            slots[r] = value
            barrier.wait()
            low = min(slots.values())
            barrier.wait()
            return low

        results[r] = shards[r].agreed_latest(smallest)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(len(shards))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return results, offered


def test_sharded_ranks_agree_on_the_newest_step_complete_everywhere(tmp_path: Path) -> None:
    """Rank 1's newest shard (step 30) was cut short: both ranks resume from step 20, the newest
    step whole on both, not rank 0 from 30 and rank 1 from 20."""
    shards = [make(tmp_path, rank=r, world=2, sharded=True, keep=5) for r in (0, 1)]
    for step in (10, 20, 30):
        for r, cp in enumerate(shards):
            assert cp.save(step, writer(f"s{step}r{r}".encode())) is not None
    (tmp_path / "ckpt" / "step-30" / "rank-1" / "weights.bin").write_bytes(b"cut")
    alone = shards[0].latest()
    assert alone is not None and alone.step == 30, "on its own, rank 0 would pick 30"

    results, offered = agree_in_lock_step(shards)
    first, second = results[0], results[1]
    assert first is not None and second is not None and (first.step, second.step) == (20, 20)
    assert Path(second.file("weights.bin")).read_bytes() == b"s20r1"
    assert offered[0][0] == 30 and offered[1][0] == 20, "the first offers differed"

    for step in (10, 20):
        (tmp_path / "ckpt" / f"step-{step}" / "rank-0" / "weights.bin").write_bytes(b"cut")
    results, _ = agree_in_lock_step(shards)
    assert results == {0: None, 1: None}, "no step whole on both ranks: both start fresh"


def test_a_writer_killed_mid_save_leaves_nothing_behind_at_the_next_save(tmp_path: Path) -> None:
    """Temporary dirs name their host and process: the next save on this host removes those whose
    process is gone (kill -9 mid-save, an earlier attempt), and nothing else: not a live writer's,
    not another host's (a shared disk), not a symlink, not a user's directory."""
    import fleetrun_checkpoint_files as files

    dead = subprocess.run(["sh", "-c", "echo $$"], capture_output=True, text=True, check=True).stdout.strip()
    directory = tmp_path / "ckpt"
    host = files.scratch_name("x").split("-")[1]
    names = {
        "dead_tmp": f".tmp-step-7-rank-0-{host}-{dead}",
        "dead_incoming": f".incoming-7-{host}-{dead}",
        "live_tmp": f".tmp-step-8-rank-0-{host}-{os.getpid()}",
        "other_host": f".tmp-step-9-rank-0-elsewhere-{dead}",
        "user": ".tmp-step-mine",
    }
    for name in names.values():
        (directory / name).mkdir(parents=True)
        (directory / name / "weights.bin").write_bytes(b"partial")
    (directory / "step-3").mkdir()
    (directory / "step-3" / f"rank-1.old-{host}-{dead}-123").mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("mine")
    (directory / f".tmp-step-6-rank-0-{host}-{dead}").symlink_to(outside)

    cp = make(tmp_path)
    assert cp.save(10, writer(b"ten")) is not None
    left = {p.name for p in directory.iterdir()}
    assert names["dead_tmp"] not in left and names["dead_incoming"] not in left
    assert not (directory / "step-3" / f"rank-1.old-{host}-{dead}-123").exists(), "a sharded leftover too"
    assert {names["live_tmp"], names["other_host"], names["user"], "step-10"} <= left
    assert (outside / "keep").read_text() == "mine" and (
        directory / f".tmp-step-6-rank-0-{host}-{dead}"
    ).is_symlink()
