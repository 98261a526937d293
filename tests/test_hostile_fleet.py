"""Untrusted input on a real local fleet, end to end (issue: untrusted input can't break the promises).

* A hostile job writes a nesting bomb, a 50 MB line, invalid UTF-8, Rich markup and ESC sequences
  into its metrics, status and log, leaves symlinks to a laptop file and to /dev/zero in its
  outputs, then replaces its own node agent with one that answers garbage and kills the running
  one. The run still ends with a record and a correct outcome, everything of it is stopped, what
  was pulled holds no secret and no device, and the terminal got no control sequence.
* A lab inventory (hosts.yaml) pointed at the same kind of machines: a run with ``teardown:
  always`` and a watchdog takeover both leave every machine up (sshd answers), because a lab
  machine is never powered off.
"""

from __future__ import annotations

import io
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import paramiko
import pytest
import yaml
from rich.console import Console

from launch.cli import app
from launch.fleets.kinds.base import TeardownState
from launch.fleets.local import LocalFleet
from launch.run.summary import RunResult
from tests.conftest import (
    REPO,
    STEPS_JOB,
    fleet_prefix,
    fleet_subnet,
    needs_root,
    user_processes,
    write_playbook,
)
from tests.faultkit import wait_for

pytestmark = needs_root()
SECRET = "TOP-SECRET-OPERATOR-TOKEN"

HOSTILE_JOB = r'''
"""Everything a careless or hostile job can do to fleetrun's readers, on rank 0."""
import os
import signal
import sys
import time

from fleetrun_metrics import Metrics

secret_path = sys.argv[1]
run_dir = os.environ["FLEETRUN_RUN_DIR"]
out = os.environ["FLEETRUN_OUTPUT_DIR"]
metrics = Metrics()
os.makedirs(out, exist_ok=True)
os.symlink(secret_path, os.path.join(out, "stolen.txt"))
os.symlink("/dev/zero", os.path.join(out, "zero"))
print("\x1b]0;pwned title\x07\x1b[2J[bold red]fake[/] could not open [/data/x] \x9b31m", flush=True)
if metrics.enabled:
    with open(os.path.join(run_dir, "metrics.jsonl"), "ab") as fh:
        fh.write(b"[" * 200_000 + b"\n")
        fh.write(b"x" * (50 << 20) + b"\n")
        fh.write(b'{"step": 1, "loss": "\xff\xfe"}\n')
    for step in range(1, 6):
        metrics.log(step=step, loss=1.0 / step, **{"\x1b]8;;http://evil\x1b\\key[/]": 1.0})
    with open(os.path.join(run_dir, "status.json"), "w") as fh:
        fh.write('{"status": "failed", "message": "\x1b[2J could not open [/data/shard-7]"}')
    # replace the node agent with one that answers garbage, and kill the one serving the watcher
    agent = os.path.expanduser("~/.fleetrun/lib/fleetrun_node.py")
    with open(agent, "w") as fh:
        fh.write("print('\\x1b]0;owned\\x07 [/red] not json')\n")
    me = os.getuid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                cmd = fh.read()
            owner = os.stat(f"/proc/{entry}").st_uid
        except OSError:
            continue
        if owner == me and b"fleetrun_node.py" in cmd and b"serve" in cmd:
            os.kill(int(entry), signal.SIGKILL)
time.sleep(600)
'''


@pytest.fixture
def fresh_fleet(fleetrun_home: Path) -> Iterator[LocalFleet]:
    fleet = LocalFleet(prefix=fleet_prefix("h"), subnet=fleet_subnet(7))
    fleet.up(2, say=lambda _m: None)
    yield fleet
    left = fleet.down(say=lambda _m: None)
    assert not any(left.values()), left


def terminal() -> tuple[Console, io.StringIO]:
    """A console that behaves like a real terminal, so any control sequence would be written."""
    buf = io.StringIO()
    return Console(file=buf, width=200, force_terminal=True, color_system="standard"), buf


def files_under(folder: Path) -> Iterator[Path]:
    for root, _dirs, names in os.walk(folder):  # does not follow symlinks
        for name in names:
            yield Path(root) / name


def sshd_answers(fleet: LocalFleet, i: int) -> bool:
    """A real SSH handshake with the node's pinned host key: the machine is up."""
    host = fleet.inventory().hosts[i]
    client = paramiko.SSHClient()
    client.load_host_keys(str(fleet.inventory().write_known_hosts(fleet.state_dir / "kh-check")))
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    try:
        client.connect(
            host.address, port=host.port, username=host.user, key_filename=str(host.key), timeout=10
        )
        _, stdout, _ = client.exec_command("echo up", timeout=10)
        return stdout.read().strip() == b"up"
    except (OSError, paramiko.SSHException):
        return False
    finally:
        client.close()


def test_a_hostile_job_ends_recorded_stopped_and_safely_pulled(
    fresh_fleet: LocalFleet, fleetrun_home: Path, tmp_path: Path
) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text(SECRET + "\n")
    work = tmp_path / "work"
    work.mkdir()
    (work / "hostile.py").write_text(HOSTILE_JOB)
    playbook = write_playbook(
        tmp_path / "job.yaml",
        work,
        name="t-hostile-all",
        nodes=2,
        teardown="always",
        entrypoint=f"python hostile.py {secret}",
        stop={"unreachable_timeout_s": 15, "stall_timeout_s": 120, "watcher_lost_after_s": 300},
    )
    console, buf = terminal()
    result = app.train(
        playbook,
        inventory=f"local:{fresh_fleet.prefix}",
        console=console,
        poll_interval=0.5,
        ask_on_interrupt=False,
    )
    assert isinstance(result, RunResult)
    # a correct outcome: the node stopped answering in the protocol, so the run failed, by rule
    assert result.outcome == "failed" and result.rule == "unreachable", (result.rule, result.reason)
    assert result.failed_nodes and result.failed_nodes[0] == fresh_fleet.node_name(0)
    assert not result.stop_errors, "the run was stopped without the replaced agent"
    assert result.teardown.state is TeardownState.DONE, result.teardown
    assert (result.folder / "summary.json").exists()
    # nothing of the run is left running, and the fleet is gone as the playbook asked
    assert not any(fresh_fleet.leftovers().values())
    # the terminal got no control sequence: only SGR colour codes, which Rich itself writes
    out = buf.getvalue()
    assert "\x07" not in out and "\x9b" not in out and "\x1b]" not in out and "\x1b[2J" not in out
    # what was pulled holds no copy of the secret, no device, no special file
    for path in files_under(result.folder):
        if path.is_symlink():
            assert not os.readlink(path).startswith(str(tmp_path)), f"{path} still points at the laptop"
            continue
        mode = path.lstat().st_mode
        assert path.is_file(), f"{path} is not a regular file"
        assert not mode & 0o6000, f"{path} kept a setuid/setgid bit"
        assert SECRET.encode() not in path.read_bytes()[: 4 << 20], f"{path} holds the secret"


def lab_inventory(fleet: LocalFleet, path: Path) -> Path:
    """The fleet's machines written as a lab's hosts.yaml: the way a lab describes its own."""
    hosts = []
    for host in fleet.inventory().hosts:
        hosts.append(
            {
                "name": host.name,
                "address": host.address,
                "private_address": host.private_address,
                "user": host.user,
                "key": str(host.key),
                "host_key": host.host_key,
                "python": host.python,
            }
        )
    path.write_text(yaml.safe_dump({"hosts": hosts}))
    return path


def test_a_lab_run_and_its_watchdog_never_power_anything_off(
    fresh_fleet: LocalFleet, fleetrun_home: Path, tmp_path: Path
) -> None:
    """The job is the torch-free trainer (``tests/stdlib_job``): what is tested is the teardown
    and the watchdog on lab machines, not training."""
    inventory = lab_inventory(fresh_fleet, tmp_path / "hosts.yaml")
    playbook = write_playbook(
        tmp_path / "job.yaml",
        STEPS_JOB,
        name="t-lab",
        nodes=2,
        teardown="always",
        entrypoint="python steps.py --steps 20",
    )
    console, _ = terminal()
    result = app.train(
        playbook, inventory=str(inventory), console=console, poll_interval=0.5, ask_on_interrupt=False
    )
    assert isinstance(result, RunResult) and result.ok, result.reason
    assert result.teardown.state is TeardownState.KEPT, result.teardown
    for i in range(2):
        assert sshd_answers(fresh_fleet, i) and not fresh_fleet.powered_off(i)

    # the watcher dies mid-run: each node's watchdog takes over, stops the run at its wall time,
    # and runs the lab's power-off hook, which powers nothing off
    long_job = write_playbook(
        tmp_path / "long.yaml",
        STEPS_JOB,
        name="t-lab-long",
        nodes=2,
        teardown="always",
        entrypoint="python steps.py --steps 100000 --step-sleep 0.05",
        stop={"watcher_lost_after_s": 5, "max_wall_time_s": 30},
    )
    fab = subprocess.Popen(
        [str(REPO / ".venv" / "bin" / "fab"), "train", str(long_job), "--inventory", str(inventory)],
        cwd=REPO,
        env={**os.environ, "FLEETRUN_HOME": str(fleetrun_home)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    outcome_files = [Path(f"/home/{fresh_fleet.node_name(i)}/.fleetrun/runs") for i in range(2)]

    def metrics_started() -> bool:
        return any(any(p.glob("t-lab-long-*/metrics.jsonl")) for p in outcome_files)

    wait_for(metrics_started, 180, "the long job's first metrics")
    fab.kill()
    fab.wait()
    for runs in outcome_files:
        try:
            wait_for(
                lambda runs=runs: any(runs.glob("t-lab-long-*/guard-outcome.json")),
                180,
                "the watchdog's outcome",
            )
        except AssertionError:
            logs = {str(p): p.read_text()[-2000:] for p in runs.glob("t-lab-long-*/*.log")}
            raise AssertionError(
                f"no guard-outcome.json under {runs}: {sorted(p.name for p in runs.glob('*/*'))} {logs}"
            ) from None
    for i in range(2):
        wait_for(lambda i=i: not user_processes(fresh_fleet.node_name(i)), 30, "the run to end")
        time.sleep(1)
        assert sshd_answers(fresh_fleet, i), f"node {i} went down after a lab watchdog takeover"
        assert not fresh_fleet.powered_off(i)


def test_a_64_mib_node_answer_is_cut_naming_the_node_in_bounded_memory(
    fleet: LocalFleet, fleetrun_home: Path
) -> None:
    """Issue 30, item 5: a node's command output was held whole in the laptop's memory (Invoke's
    buffer, joined again on every chunk). Now each stream keeps its first and last MiB, the
    result says which node sent how much, and the laptop's Python heap never holds the answer:
    its peak during the command stays a small fraction of the 64 MiB sent."""
    import tracemalloc

    from launch.transport.channels import MAX_OUTPUT_BYTES
    from launch.transport.ssh import Fleet

    inventory = fleet.inventory()
    known_hosts = inventory.write_known_hosts(fleetrun_home / "kh-big-answer")
    node = inventory.hosts[1]
    with Fleet([node], known_hosts) as pool:
        conn = pool.connections[node.name]
        conn.open()
        tracemalloc.start()
        try:
            result = conn.run("head -c 67108864 /dev/zero | tr '\\0' x; echo; echo END", timeout=600)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert result.ok and result.stdout.endswith("END\n"), "the tail is kept"
    assert result.stdout.startswith("x" * 1000), "the head is kept"
    assert len(result.stdout.encode()) <= 2 * MAX_OUTPUT_BYTES + 300, "only the head and the tail"
    assert f"{node.name} sent 67108869 bytes of output" in result.cut, result.cut
    assert f"[... {node.name} sent 67108869 bytes of output" in result.stdout, "said where it was cut"
    assert peak < 24 * 1024 * 1024, f"{peak / 2**20:.0f} MiB held for a 64 MiB answer"
