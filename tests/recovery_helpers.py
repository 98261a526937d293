"""What the recovery and preemption fleet tests share: where runs are on the nodes, how far
training got, the attempts a run recorded, and a metadata server of our own in a node's namespace."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import yaml

from launch.cli import runs as history
from launch.fleets.local import LocalFleet
from launch.run.summary import RunResult
from tests.conftest import REPO
from tests.faultkit import wait_for

METADATA = "169.254.169.254"
"""The link-local address the clouds' metadata services answer on (the pollers ask it)."""


def run_dirs(fleet: LocalFleet) -> set[Path]:
    """Every run directory on every node of the fleet (replacement nodes included)."""
    return {p for user in fleet.existing_users() for p in Path(f"/home/{user}/.fleetrun/runs").glob("*")}


def step_reached(fleet: LocalFleet, step: int, old: set[Path]) -> bool:
    """Rank 0 (wherever it runs) has logged ``step`` in a run directory not in ``old``."""
    for run_dir in run_dirs(fleet) - old:
        for path in run_dir.glob("metrics.jsonl"):
            for line in path.read_text(errors="replace").splitlines():
                if f'"step": {step},' in line:
                    return True
    return False


def attempts_of(result: RunResult) -> list[dict]:
    """The attempts the run history recorded for ``result``'s run."""
    with history.open_records() as records:
        record = records.get(result.run_id)
    assert record is not None
    return record.attempts


def update_fleet_state(fleet: LocalFleet, **fields: object) -> None:
    """Set fields of the fleet's own state (bucket, notice poller), as a test may."""
    data = yaml.safe_load(fleet.inventory_path.read_text())
    data["fleet"].update(fields)
    fleet.inventory_path.write_text(yaml.safe_dump(data, sort_keys=False))


@contextmanager
def metadata_server(fleet: LocalFleet, i: int, control: Path) -> Iterator[None]:
    """``tests/metadataserver.py`` at 169.254.169.254 in node i's namespace (real HTTP, the IMDSv2
    token flow) until the block ends; touching ``control / "notice"`` announces an interruption."""
    ns = fleet.netns(i)
    subprocess.run(["ip", "-n", ns, "addr", "add", f"{METADATA}/32", "dev", "lo"], check=True)
    script = str(REPO / "tests" / "metadataserver.py")
    server = subprocess.Popen(
        ["ip", "netns", "exec", ns, sys.executable, script, METADATA, "80", str(control)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(lambda: (control / "ready").exists(), 30, "the metadata server")
        yield
    finally:
        server.kill()
        server.wait()
