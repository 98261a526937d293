"""``fab pull RUN``: the wrap-up's pull again for a run that ended, its exit code, and the
watchdog's files of a node that powered itself off, from the bucket."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from launch.fleets.local.prereqs import image_python
from launch.job.fleet_refs import LocalFleetRef
from launch.job.inventory import Host, Inventory
from launch.rules.stoprules import StopRules, Teardown
from launch.run.records import RunRecords
from launch.run.target import WatchTarget, bucket_dest
from tests.conftest import SAMPLE_HOST_KEYS, fab
from tests.s3server import S3Server, have_s3_tools


@contextmanager
def ended_run(home: Path, runs: Path, fleet: LocalFleetRef | None = None) -> Iterator[str]:
    """A run that ended, recorded, its one node a port on this machine that refuses (bound, never
    listening: a pull fails at once and for real); the playbook keeps its fleet. Yields its id."""
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    try:
        host = Host(
            name="n0", address="127.0.0.1", port=closed.getsockname()[1], user="nobody",
            host_key=SAMPLE_HOST_KEYS[0],
        )  # fmt: skip
        folder = runs / "20261128-120000-ab12"
        folder.mkdir(parents=True)
        WatchTarget(
            run_id=folder.name, job="t-pull",
            inventory=Inventory(hosts=[host], fleet=fleet) if fleet else Inventory(hosts=[host]),
            starters=("n0",), rules=StopRules(), teardown=Teardown.NEVER, started_at=time.time(),
            folder=folder,
        ).save()  # fmt: skip
        home.mkdir()
        with RunRecords(home / "runs.db") as records:
            records.start(run_id=folder.name, run_dir=str(folder), playbook_name="t-pull")
            records.finish(folder.name, state="succeeded")
        yield folder.name
    finally:
        closed.close()


def test_a_failed_pull_exits_1_even_when_nothing_waits_on_it(tmp_path: Path) -> None:
    """``fab pull`` printed "pulling artifacts ... failed" and exited 0 when the playbook keeps its
    fleet (``teardown: never``: no teardown to block); docs/reference/exit-codes.md promises 1
    ("fab pull could not secure every node's artifacts")."""
    home, runs = tmp_path / "home", tmp_path / "runs"
    with ended_run(home, runs) as run_id:
        proc = fab("pull", run_id, home=home, runs=runs, timeout=120)
    out = proc.stdout + proc.stderr
    assert "pulling artifacts from n0 failed: n0: unreachable" in out and "teardown: skipped" in out, out
    assert proc.returncode == 1, out


def test_the_watchdogs_files_of_a_powered_off_node_come_back_from_the_bucket(tmp_path: Path) -> None:
    """A node whose watchdog ended the run with the laptop gone ran ``before_stop``, uploaded its
    run directory to the bucket and powered off; ``fab pull`` (and ``fab watch``'s wrap-up) could
    not reach it and brought back nothing, though docs/daily-work.md says the hook's output is
    "uploaded and pulled with the run directory". Now the watchdog's files come from the bucket
    (the fleet's own S3-compatible server and its ``aws`` CLI, as ``fab local.up --bucket``),
    bounded: one too large stays there. The pull error, and so exit code 1, still stand."""
    missing = have_s3_tools()
    if missing or not (image_python().parent / "aws").exists():
        pytest.skip(missing or "the local fleet's image (its aws CLI) is not built: make setup")
    home, runs = tmp_path / "home", tmp_path / "runs"
    with S3Server() as server:
        server.create_bucket("frg-bucket")
        fleet = LocalFleetRef(prefix="frg", bucket="frg-bucket", s3_endpoint=server.endpoint)
        with ended_run(home, runs, fleet) as run_id:
            prefix = bucket_dest(run_id, "n0")
            server.put("frg-bucket", f"{prefix}/before-stop.log", b"copied outputs to /shared\n")
            server.put("frg-bucket", f"{prefix}/before-stop-result.json", b'{"hook": "before_stop", "rc": 0}')
            server.put("frg-bucket", f"{prefix}/guard.log", b"x" * (8 * 1024**2 + 1))
            server.put("frg-bucket", f"{prefix}/outputs/model.pt", b"weights")
            proc = fab("pull", run_id, home=home, runs=runs, timeout=300)
    out = proc.stdout + proc.stderr
    node = runs / run_id / "nodes" / "n0"
    assert (node / "before-stop.log").read_text() == "copied outputs to /shared\n", out
    assert json.loads((node / "before-stop-result.json").read_text())["rc"] == 0
    assert "n0: before-stop.log, before-stop-result.json fetched from the bucket" in out, out
    assert "guard.log in the bucket is over 8388608 bytes: not brought back" in out, out
    assert not (node / "guard.log").exists() and not (node / "outputs").exists()
    assert sorted(p.name for p in node.iterdir()) == ["before-stop-result.json", "before-stop.log"]
    assert proc.returncode == 1, out


def test_the_wrap_up_of_fab_watch_fetches_them_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same in the wrap-up every run ends with (``fab train``, ``fab watch RUN`` re-attached
    after the laptop came back): a node whose pull fails has its watchdog's files fetched from
    the bucket; a node pulled as usual is not asked for them. The fleet is the stand-in of
    ``tests/fakefleet.py``; the bucket is real (moto and the image's ``aws`` CLI)."""
    from tests.fakefleet import JobScript, NodeScript, fake_inventory, run_on_fake_fleet

    missing = have_s3_tools()
    if missing or not (image_python().parent / "aws").exists():
        pytest.skip(missing or "the local fleet's image (its aws CLI) is not built: make setup")
    with S3Server() as server:
        server.create_bucket("frz-bucket")
        fleet = LocalFleetRef(prefix="frz", bucket="frz-bucket", s3_endpoint=server.endpoint)
        inventory = fake_inventory(2, fleet=fleet)
        job = JobScript(nodes={"n1": NodeScript(fail_pull=True)})
        run_id_of: list[str] = []

        def put_last_words(run_id: str) -> None:
            for node in ("n0", "n1"):
                server.put("frz-bucket", f"{bucket_dest(run_id, node)}/before-stop.log", node.encode())

        from launch.run import wrapup

        real = wrapup.fetch_watchdog_files

        def after_the_upload(inventory: Inventory, run_id: str, *args: object, **kwargs: object) -> object:
            put_last_words(run_id)  # as the node's watchdog did before it powered off
            run_id_of.append(run_id)
            return real(inventory, run_id, *args, **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(wrapup, "fetch_watchdog_files", after_the_upload)
        run = run_on_fake_fleet(tmp_path, monkeypatch, job, inventory=inventory)
    assert run_id_of and list(run.summary.pull_errors) == ["n1"]
    assert (run.folder / "nodes" / "n1" / "before-stop.log").read_text() == "n1"
    assert not (run.folder / "nodes" / "n0" / "before-stop.log").exists(), "n0 was pulled: not asked"
