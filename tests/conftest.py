"""Shared fixtures. The local fleet fixture builds real nodes (namespaces + sshd) once per session."""

from __future__ import annotations

import fcntl
import io
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from rich.console import Console

from launch.fleets.local import LocalFleet
from launch.job.inventory import Host, Inventory

REPO = Path(__file__).resolve().parent.parent
# Several checkouts may run fleet tests on one machine at once (parallel work): each sets
# FLEETRUN_TEST_TAG (up to 2 lowercase letters/digits) and FLEETRUN_TEST_SUBNET_BASE so that
# their fleets' names and subnets do not collide. CI uses the defaults.
TEST_TAG = os.environ.get("FLEETRUN_TEST_TAG", "")
SUBNET_BASE = int(os.environ.get("FLEETRUN_TEST_SUBNET_BASE", "0"))
# Under pytest-xdist (`make test` runs two workers, whole files each) every worker builds its own
# session fleet: the worker's number joins the tag and moves the subnets by SUBNETS_PER_WORKER.
# Module fleets (fleet_subnet offsets, all below SUBNETS_PER_WORKER) are unique per file already.
SUBNETS_PER_WORKER = 25
_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
if _WORKER.startswith("gw") and _WORKER[2:].isdigit():
    TEST_TAG += _WORKER[2:]
    SUBNET_BASE += SUBNETS_PER_WORKER * int(_WORKER[2:])
TEST_PREFIX = f"frt{TEST_TAG}"
TEST_SUBNET = 1 + SUBNET_BASE
STEPS_JOB = REPO / "tests" / "stdlib_job"
"""The torch-free trainer's folder (``python steps.py ...``): the job of fleet tests whose subject
is not training; its ranks start in a fraction of a second where each digits rank imports torch."""


# `make test` hands whole files to the xdist workers (``--dist loadfile --no-loadscope-reorder``)
# in collection order: the longest files first, so that the run ends on short files and the
# workers finish together. (xdist's own order, by number of tests, sent the one- and two-test fleet
# files, the longest ones, last.) Seconds of each file in a full run on a loaded machine
# (the summary's "slowest files", `make test` of 2026-11-29): only the order they give matters. Files not listed keep
# their collection order after these.
FILE_SECONDS = {
    "tests/test_recovery_fleet.py": 358,
    "tests/test_container_runs_fleet.py": 311,
    "tests/test_faults.py": 256,
    "tests/test_recovery_preempt_fleet.py": 227,
    "tests/test_checkpoint.py": 193,
    "tests/test_slurm_fleet.py": 179,
    "tests/test_warm_fleet.py": 118,
    "tests/test_recovery_network.py": 99,
    "tests/test_train_fleet.py": 98,
    "tests/test_hostile_fleet.py": 84,
    "tests/test_run_lifecycle.py": 69,
    "tests/test_horovod_fleet.py": 68,
    "tests/test_preempt_fleet.py": 68,
    "tests/test_shared_fleet.py": 66,
    "tests/test_install.py": 63,
    "tests/test_sweep.py": 62,
    "tests/test_bastion_fleet.py": 55,
    "tests/test_sagemaker_fleet.py": 48,
    "tests/test_doctor_fleet.py": 45,
    "tests/test_follow_fleet.py": 41,
    "tests/test_forked_ranks.py": 40,
    "tests/test_overrides.py": 37,
    "tests/test_collective.py": 34,
    "tests/test_node_agent.py": 33,
    "tests/test_queue.py": 31,
    "tests/test_mixed_hosts_fleet.py": 31,
    "tests/test_broken_inputs.py": 29,
    "tests/test_hooks.py": 27,
    "tests/test_gpu_captures_wider.py": 25,
    "tests/test_checkpoint_trust.py": 23,
    "tests/test_profile_fleet.py": 23,
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The longest files first (``FILE_SECONDS``); a stable sort: within a file, and among the
    files not listed, the order stays as collected."""
    items.sort(key=lambda item: -FILE_SECONDS.get(item.nodeid.split("::", 1)[0], 0))


_FILE_TOTALS: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Each file's seconds (setup, call and teardown of its tests; a module fleet's start and end
    count in its first and last test), summed where the reports arrive (xdist's controller)."""
    path = report.nodeid.split("::", 1)[0]
    _FILE_TOTALS[path] = _FILE_TOTALS.get(path, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The slowest files, to keep ``FILE_SECONDS`` (the order files are handed out) current."""
    if not _FILE_TOTALS:
        return
    slowest = sorted(_FILE_TOTALS.items(), key=lambda item: -item[1])[:30]
    terminalreporter.write_sep("=", f"slowest files (all files: {sum(_FILE_TOTALS.values()):.0f} s)")
    for path, seconds in slowest:
        terminalreporter.write_line(f"{seconds:8.1f}s {path}")


def fleet_prefix(letter: str) -> str:
    """A fleet prefix for one test module (``fr<letter><tag>``), unique per checkout."""
    return f"fr{letter}{TEST_TAG}"


def fleet_subnet(offset: int) -> int:
    """A module's fleet subnet: ``offset`` (unique per test file, 2..SUBNETS_PER_WORKER - 1) past this run's base."""
    if not 0 < offset < SUBNETS_PER_WORKER:
        raise ValueError(f"fleet subnet offset {offset}: expected 1..{SUBNETS_PER_WORKER - 1}")
    return offset + SUBNET_BASE


@contextmanager
def module_fleet(prefix: str, subnet: int, nodes: int, **options: bool) -> Iterator[LocalFleet]:
    """A test module's own local fleet (``LocalFleet.up`` options such as ``bastion``, ``mixed``,
    ``vm``); torn down when the block ends, failing the module if ``down`` leaves anything behind.

    The caller passes ``fleet_prefix(...)`` and ``fleet_subnet(...)`` itself, in its own file:
    tests/test_fleet_names_unique.py reads them there.
    """
    fleet = LocalFleet(prefix=prefix, subnet=subnet)
    fleet.up(nodes, say=lambda _m: None, **options)
    try:
        yield fleet
    finally:
        left = fleet.down(say=lambda _m: None)
        assert not any(left.values()), f"local fleet left things behind: {left}"


def fab(
    *args: str, home: Path, runs: Path | None = None, timeout: float = 300, columns: int = 200
) -> subprocess.CompletedProcess[str]:
    """The real ``fab`` CLI of this checkout as its own process, its output captured (``columns``
    wide: rich folds verdict lines and long paths to the terminal's width), its state under
    ``home`` and runs under ``runs``."""
    env = {**os.environ, "FLEETRUN_HOME": str(home), "COLUMNS": str(columns)}
    if runs is not None:
        env["FLEETRUN_RUNS"] = str(runs)
    return subprocess.run(
        [str(REPO / ".venv" / "bin" / "fab"), *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def needs_root() -> pytest.MarkDecorator:
    return pytest.mark.skipif(
        os.geteuid() != 0, reason="the local fleet needs root (network namespaces, users, sshd)"
    )


# Where a session keeps fleetrun's state: one folder per session fleet prefix (so per checkout tag
# and xdist worker), the same in every session, not under pytest's temporary directory. The local
# fleet removes only what its record (``$FLEETRUN_HOME/localfleet/<prefix>/created.jsonl``) names,
# so a session killed before its teardown (a timeout, a closed terminal) leaves fleets that the
# next session could neither reuse nor remove if their record sat in a fresh temporary folder: the
# next `make test` on that machine then failed with "will not build over things it did not
# create" (a CI run did, 2026-11-25). In a stable folder the next session finds the record and
# takes the fleets down first (``reclaim``).
STATE_ROOT = Path(os.environ.get("FLEETRUN_TEST_STATE", f"/var/tmp/fleetrun-tests-{os.geteuid()}"))


def reclaim(home: Path, say: Callable[[str], None] = lambda _m: None) -> dict[str, dict[str, list[str]]]:
    """Take down every local fleet recorded under ``home`` (an earlier session's, killed before its
    teardown); returns what each left behind (empty lists when clean). Only recorded things are
    removed, as by ``fab local.down``: the record is fleetrun's own state, the one thing trusted."""
    root = home / "localfleet"
    if not root.is_dir() or os.geteuid() != 0:
        return {}
    old = os.environ.get("FLEETRUN_HOME")
    os.environ["FLEETRUN_HOME"] = str(home)
    try:
        return {
            record.name: LocalFleet(prefix=record.name).down(say=say)
            for record in sorted(root.iterdir())
            if (record / "created.jsonl").is_file()
        }
    finally:
        if old is None:
            os.environ.pop("FLEETRUN_HOME", None)
        else:
            os.environ["FLEETRUN_HOME"] = old


_HELD: list[int] = []
"""The session's lock on its folder (``hold``): open for the life of the process."""


def hold(home: Path) -> None:
    """Lock ``home``'s slot for this session (an ``flock`` that goes with the process, a killed
    one included), or fail at once: a second session with the same fleet prefix running now
    must not take the first one's live fleets down as an earlier session's leftovers."""
    home.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(home.parent / f"{home.name}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise RuntimeError(
            f"another test session uses the fleet prefix {home.name} now ({home}): give this one "
            "its own FLEETRUN_TEST_TAG and FLEETRUN_TEST_SUBNET_BASE"
        ) from None
    _HELD.append(fd)


def fresh_home(home: Path) -> Path:
    """``home`` emptied for a new session, after the fleets an earlier one left there are down."""
    left = {prefix: found for prefix, found in reclaim(home).items() if any(found.values())}
    if left:
        raise RuntimeError(f"an earlier test session's fleets under {home} could not be removed: {left}")
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True, mode=0o700)
    return home


@pytest.fixture(scope="session")
def fleetrun_home() -> Iterator[Path]:
    """Point fleetrun's state (keys, known_hosts, run folders) at this session's own folder
    (``STATE_ROOT/<prefix>``), emptied first; it stays after the session for a look at what ran."""
    hold(STATE_ROOT / TEST_PREFIX)
    home = fresh_home(STATE_ROOT / TEST_PREFIX)
    old = {k: os.environ.get(k) for k in ("FLEETRUN_HOME", "FLEETRUN_RUNS")}
    os.environ["FLEETRUN_HOME"] = str(home)
    os.environ.pop("FLEETRUN_RUNS", None)
    yield home
    for key, value in old.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(scope="session")
def fleet(fleetrun_home: Path) -> Iterator[object]:
    """A 3-node local fleet for the session; torn down at the end, leaving nothing behind."""
    if os.geteuid() != 0:
        pytest.skip("the local fleet needs root (network namespaces, users, sshd)")

    with module_fleet(TEST_PREFIX, TEST_SUBNET, 3) as local:
        yield local


def user_processes(user: str) -> list[str]:
    """Live non-sshd processes of a node user; empty when nothing of a job runs.

    Zombies are not counted: a killed process whose parent is init stays a zombie until init
    reaps it, and it holds no resources (checked on this machine kind).
    """
    out = subprocess.run(
        ["ps", "-u", user, "-o", "pid=,stat=,comm="], capture_output=True, text=True, check=False
    ).stdout
    alive = []
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 3 and not parts[1].startswith("Z") and not parts[2].startswith("sshd"):
            alive.append(f"{parts[0]} {parts[2]}")
    return alive


@pytest.fixture
def digits_workdir(tmp_path: Path) -> Path:
    """A copy of the example trainer, so tests can change it freely."""
    target = tmp_path / "digits"
    shutil.copytree(REPO / "examples" / "digits", target, ignore=shutil.ignore_patterns("__pycache__"))
    return target


def write_playbook(path: Path, workdir: Path, **fields: object) -> Path:
    import yaml

    data: dict[str, object] = {
        "name": "t-digits",
        "workdir": str(workdir),
        "launcher": "torchrun",
        "nodes": 3,
        "procs_per_node": 1,
        "entrypoint": "python -m trainer.task --epochs 2",
        "env": {"OMP_NUM_THREADS": "1"},
        "teardown": "never",
    }
    data.update(fields)
    path.write_text(yaml.safe_dump(data))
    return path


def quiet_console() -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, width=200, force_terminal=False), buf


def assert_nothing_running(fleet: LocalFleet, nodes: int = 3) -> None:
    """No live process of any node user (sshd aside), waiting briefly for SSH sessions to close."""
    deadline = time.monotonic() + 10
    left: dict[str, list[str]] = {}
    while time.monotonic() < deadline:
        left = {fleet.node_name(i): user_processes(fleet.node_name(i)) for i in range(nodes)}
        if not any(left.values()):
            return
        time.sleep(0.2)
    raise AssertionError(f"processes left running on the nodes: {left}")


SAMPLE_HOST_KEYS = [
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOvhipRqRG6pVVv2ReJ6BqUyaR82FT9Wa5PVWfYDKj6l",
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBfmCw1Vb2xhQhB8m0Vd5hWgSJ8e7mIvQ6bA3ZrV1eQm",
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHkq3mRZ0Yw6w5n9cD1qk0Vd6yVZ3eY2tL2b6Qm1sXcA",
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIDm7wq9x8y2c3eR4t5Y6u7i8o9p0a1s2d3f4g5h6j7kL",
]


def sample_inventory(
    n: int, gpus: int | None = 0, ports: list[int] | None = None, user: str | None = None
) -> Inventory:
    """n documentation-range hosts (203.0.113.x public, 10.0.0.x private) for pure plan tests."""
    return Inventory(
        hosts=[
            Host(
                name=f"n{i}",
                address=f"203.0.113.{i + 1}",
                private_address=f"10.0.0.{i + 1}",
                user=user or f"user{i}",
                port=(ports or [22] * n)[i],
                host_key=SAMPLE_HOST_KEYS[i],
                gpus=gpus,
                interface="ens5" if gpus is not None else None,
            )
            for i in range(n)
        ]
    )
