"""Pulled files are data: reading a run folder never follows a node's symlinks, never opens a
device or waits on a FIFO, and never reads more than a cap; the pull refuses oversized run
directories before copying anything. No fleet needed."""

from __future__ import annotations

import io
import os
import stat
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from launch.job.inventory import Host
from launch.run import run_folder as rf
from launch.run.artifacts import pull, pull_argv
from launch.run.run_folder import RunFolder
from launch.transport.ssh import CommandResult
from tests.conftest import sample_inventory

SECRET = "aws_secret_access_key = do-not-copy-me\n"


@pytest.fixture
def folder(tmp_path: Path) -> RunFolder:
    (tmp_path / "secret").write_text(SECRET)
    return RunFolder.create("job-1", base=tmp_path / "runs")


def node(folder: RunFolder, name: str) -> Path:
    path = folder.node_dir(name)
    path.mkdir(parents=True, exist_ok=True)
    return path


def test_a_symlinked_metrics_file_never_brings_its_target_into_the_run_folder(
    folder: RunFolder, tmp_path: Path
) -> None:
    (node(folder, "n0") / "metrics.jsonl").symlink_to(tmp_path / "secret")
    (node(folder, "n0") / "status.json").symlink_to("/dev/zero")
    assert folder.collect_rank0_files() is None, "a link is not rank 0's metrics"
    assert not (folder.path / "metrics.jsonl").exists() and not (folder.path / "status.json").exists()
    honest = node(folder, "n1")
    (honest / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n')
    (honest / "status.json").symlink_to(tmp_path / "secret")
    assert folder.collect_rank0_files() == "n1"
    assert (folder.path / "metrics.jsonl").read_text() == '{"step": 1, "loss": 2.0}\n'
    assert not (folder.path / "status.json").exists(), "the linked status.json was skipped"
    for path in folder.path.rglob("*"):
        if path.is_file() and not path.is_symlink():
            assert "do-not-copy-me" not in path.read_text(errors="replace"), path
    records, summary = folder.read_metrics()
    assert summary.last_step == 1 and len(records) == 1
    assert "nodes/n0/metrics.jsonl" not in folder.artifacts(), "links are not listed as artifacts"


def test_a_top_level_metrics_link_is_not_parsed(folder: RunFolder, tmp_path: Path) -> None:
    (folder.path / "metrics.jsonl").symlink_to(tmp_path / "secret")
    records, summary = folder.read_metrics()
    assert records == [] and summary.last_step is None


def test_fab_logs_on_a_link_to_dev_zero_returns_at_once(folder: RunFolder) -> None:
    log = node(folder, "n0") / "node.log"
    log.symlink_to("/dev/zero")
    text = rf.read_log_text(log)
    assert text.startswith("(node.log: not read") and len(text) < 200


def test_a_fifo_is_refused_without_waiting_for_a_writer(folder: RunFolder) -> None:
    fifo = node(folder, "n0") / "node.log"
    os.mkfifo(fifo)
    result: list[str] = []
    reader = threading.Thread(target=lambda: result.append(rf.read_log_text(fifo)), daemon=True)
    reader.start()
    reader.join(timeout=30)
    assert result == ["(node.log: not a regular file, not read)"]
    metrics = node(folder, "n1") / "metrics.jsonl"
    os.mkfifo(metrics)
    assert folder.collect_rank0_files() is None


@pytest.mark.skipif(os.geteuid() != 0, reason="mknod needs root")
def test_a_device_node_is_refused(folder: RunFolder) -> None:
    dev = node(folder, "n0") / "node.log"
    os.mknod(dev, 0o600 | stat.S_IFCHR, os.makedev(1, 5))  # what /dev/zero is
    assert rf.read_log_text(dev) == "(node.log: not a regular file, not read)"


def test_a_huge_log_shows_only_its_tail(folder: RunFolder) -> None:
    log = node(folder, "n0") / "node.log"
    log.write_bytes(b"x" * 5000 + b"\nthe end\n")
    text = rf.read_log_text(log, limit=100)
    assert text.startswith("[... first 4909 bytes not shown ...]\n") and text.endswith("the end\n")
    assert rf.read_log_text(node(folder, "n1") / "node.log") == "(no log)"


def test_copies_are_capped(folder: RunFolder, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rf, "MAX_METRICS_BYTES", 64)
    (node(folder, "n0") / "metrics.jsonl").write_bytes(b"y" * 10_000)
    assert folder.collect_rank0_files() == "n0"
    assert (folder.path / "metrics.jsonl").stat().st_size == 64


def test_pull_argv_takes_files_as_data() -> None:
    argv = pull_argv("u@h:.fleetrun/runs/r/", Path("/tmp/t"), "ssh", max_file_bytes=1000)
    for flag in (
        "--munge-links",
        "--no-devices",
        "--no-specials",
        "--no-owner",
        "--no-group",
        "--chmod=ug-s,go-w",
        "--max-size=1000",
    ):
        assert flag in argv
    assert argv.index("--no-devices") > argv.index("-az"), "later flags override -a's -D, -o, -g"


class FakeConn:
    def __init__(self, host: Host, du: CommandResult) -> None:
        self.host = host
        self.du = du
        self.commands: list[str] = []

    def run(self, command: str, timeout: float | None = None) -> CommandResult:
        self.commands.append(command)
        return self.du


class FakeFleet:
    """Only what ``pull`` uses: ``map`` over connections, exceptions returned per host."""

    def __init__(self, conns: list[FakeConn]) -> None:
        self.conns = conns

    def map(self, fn: Callable[[Any], Any], deadline: float | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for conn in self.conns:
            try:
                out[conn.host.name] = fn(conn)
            except Exception as exc:  # noqa: BLE001 - as the real fan-out does
                out[conn.host.name] = exc
        return out


def test_a_run_directory_over_the_cap_is_not_pulled_and_is_an_error(
    folder: RunFolder, tmp_path: Path
) -> None:
    hosts = sample_inventory(2).hosts
    big = FakeConn(
        hosts[0], CommandResult(hosts[0].name, 0, f"{40 * 1024**2}\t/home/u/.fleetrun/runs/r\n", "")
    )
    odd = FakeConn(hosts[1], CommandResult(hosts[1].name, 1, "", "du: cannot access: No such file"))
    buf = io.StringIO()
    errors = pull(
        FakeFleet([big, odd]), "r", folder, tmp_path / "kh", Console(file=buf), max_total_bytes=1024**3
    )  # type: ignore[arg-type]
    assert "more than the pull cap of 1.0 GiB: nothing pulled" in errors[hosts[0].name]
    assert "could not measure the run directory" in errors[hosts[1].name]
    assert big.commands == ['du -sk -- "$HOME/.fleetrun/runs/r"'], "one du, no rsync"
    assert not folder.node_dir(hosts[0].name).exists()
