"""``fab doctor`` through the real CLI on a fresh 3-node local fleet, healthy and with seeded faults.

One fleet for the module. Each fault is seeded on one node the way a lab machine gets it, and
undone afterwards; the assertions are on the verdict line that names the node and the cause:

* the head: the rendezvous port held by a stray listener (a Python socket as the node user),
  the home nearly full (a 512 MiB tmpfs mounted over it, the user's ``.ssh`` copied in);
* node 1: the head's address unreachable from it (an ``unreachable`` route in its namespace,
  which needs no nftables/iptables on the machine), its eth0 MTU lowered to 1400, its GPUs busy
  (an ``nvidia-smi`` stand-in first on its PATH, via ``~/.bashrc``, reporting pid 1 of root);
* node 2: its hostname mapped to 127.0.1.1 in its ``/etc/netns`` hosts file, its Python one
  without torch (Debian's ``/usr/bin/python3`` in a lab inventory), rsync not on its PATH (a
  ``~/.bashrc`` PATH of ``/usr/sbin`` only: the Python is given by absolute path).

Clock skew cannot be seeded (network namespaces share the machine's clock): that verdict is
unit-tested in ``test_preflight.py``.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from launch.fleets.local import LocalFleet
from tests.conftest import fab, fleet_prefix, fleet_subnet, module_fleet, needs_root, write_playbook
from tests.gpustandin import install, replay

pytestmark = needs_root()
PREFIX = fleet_prefix("k")
LINE = re.compile(
    r"^(\S+)\s+(ssh|python|torch|rsync|hostname|rdzv-port|interface|clock|disk|gpus)\s+(ok|WARN|ERROR)\s+(.*)$"
)
BUSY_GPU = {
    "count": 2,
    "compute_apps": [{"gpu_uuid": "GPU-5a17e001-7d2c-4f1a-9b3e-000000000001", "pid": 1, "used_memory": 4000}],
}
"""The scripted ``nvidia-smi`` (``tests/gpu_standin``) with root's pid 1 on GPU 1: the probe lists
the GPUs from the health reader's ``--query-gpu``, which a stand-in must answer in NVIDIA's format."""


@pytest.fixture(scope="module")
def lab(fleetrun_home: Path) -> Iterator[LocalFleet]:
    with module_fleet(PREFIX, fleet_subnet(9), 3) as fleet:
        yield fleet


def verdicts(stdout: str) -> dict[tuple[str, str], tuple[str, str]]:
    found: dict[tuple[str, str], tuple[str, str]] = {}
    for line in stdout.splitlines():
        match = LINE.match(line)
        if match:
            node, check, level, message = match.groups()
            if found.get((node, check), ("ok", ""))[0] == "ok":
                found[(node, check)] = (level, message)
    return found


def test_healthy_fleet_passes(lab: LocalFleet, fleetrun_home: Path) -> None:
    proc = fab("doctor", "--verbose", "--inventory", f"local:{PREFIX}", "--port", "29500", home=fleetrun_home)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    found = verdicts(proc.stdout)
    for i in range(3):
        node = lab.node_name(i)
        for check in ("ssh", "python", "torch", "rsync", "hostname", "interface", "clock", "disk", "gpus"):
            assert found[(node, check)][0] == "ok", (node, check, found.get((node, check)))
    assert found[(lab.node_name(0), "rdzv-port")] == ("ok", f"29500 on {lab.address(0)} free")
    assert found[(lab.node_name(1), "rdzv-port")] == ("ok", f"29500 on {lab.address(0)} reachable")
    assert "no errors" in proc.stdout


def _netns(lab: LocalFleet, i: int, *argv: str) -> None:
    subprocess.run(["ip", "netns", "exec", lab.netns(i), *argv], check=True, capture_output=True)


def _prepend_bashrc(home: Path, line: str) -> str:
    bashrc = home / ".bashrc"
    old = bashrc.read_text() if bashrc.exists() else ""
    bashrc.write_text(line + "\n" + old)
    return old


def test_seeded_faults_are_named_per_node(lab: LocalFleet, fleetrun_home: Path, tmp_path: Path) -> None:
    head, one, two = (lab.node_name(i) for i in range(3))
    homes = [lab.home(i) for i in range(3)]
    hosts_file = lab.netns_etc(2) / "hosts"
    hosts_before = hosts_file.read_text()
    bashrc_before = {}
    listener = None
    mounted = False
    nsenter: list[str] = []
    try:
        # head: a stray listener on the port, the home nearly full
        listener = subprocess.Popen(
            [
                "ip",
                "netns",
                "exec",
                lab.netns(0),
                "runuser",
                "-u",
                head,
                "--",
                "/usr/bin/python3",
                "-c",
                "import socket,sys; s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(('0.0.0.0', 29500)); s.listen(); "
                "print('up', flush=True); sys.stdin.read()",  # ends when this test's end of the pipe closes
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,  # runuser forks the listener: killing runuser alone left it holding the port
        )
        assert listener.stdout is not None and listener.stdout.readline().strip() == "up"
        user = pwd.getpwnam(head)
        ssh_copy = tmp_path / "ssh-copy"
        shutil.copytree(homes[0] / ".ssh", ssh_copy)
        # in the node sshd's own mount namespace (``ip netns exec`` gave it one): its sessions see it
        sshd_pid = (lab.node_dir(0) / "sshd.pid").read_text().strip()
        nsenter = ["nsenter", "-t", sshd_pid, "-m"]
        subprocess.run(
            [
                *nsenter,
                "sh",
                "-c",
                f"mount -t tmpfs -o size=512m,mode=0750,uid={user.pw_uid},gid={user.pw_gid} "
                f"fleetrun-doctor {homes[0]} && cp -a {ssh_copy} {homes[0]}/.ssh && "
                f"chown -R {head}:{head} {homes[0]}/.ssh",
            ],
            check=True,
        )
        mounted = True
        # node 1: no route to the head, MTU 1400, another user's process on GPU 1
        _netns(lab, 1, "ip", "route", "add", "unreachable", f"{lab.address(0)}/32")
        _netns(lab, 1, "ip", "link", "set", "eth0", "mtu", "1400")
        owner = pwd.getpwnam(one)
        install(homes[1] / "fakebin", BUSY_GPU, owner=(owner.pw_uid, owner.pw_gid))
        bashrc_before[1] = _prepend_bashrc(homes[1], 'export PATH="$HOME/fakebin:$PATH"')
        # node 2: hostname on loopback, no torch, no rsync
        hosts_file.write_text(hosts_before.replace(f"{lab.address(2)} {two}", f"127.0.1.1 {two}"))
        bashrc_before[2] = _prepend_bashrc(homes[2], 'export PATH="/usr/sbin"')
        data = lab.inventory().to_yaml_data()
        data["hosts"][2]["python"] = "/usr/bin/python3"
        inventory = tmp_path / "lab.yaml"
        inventory.write_text(yaml.safe_dump({"hosts": data["hosts"]}))

        proc = fab(
            "doctor", "--verbose", "--inventory", str(inventory), "--port", "29500", home=fleetrun_home
        )
        assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-2000:]
        found = verdicts(proc.stdout)
        level, message = found[(head, "rdzv-port")]
        assert level == "ERROR" and f"29500 on {lab.address(0)} already in use by python3" in message
        assert f"pid {listener.pid}" in message or "python3 (pid" in message
        assert found[(head, "disk")][0] == "ERROR" and "GiB free in the home" in found[(head, "disk")][1]
        assert found[(one, "interface")] == ("ERROR", "eth0 MTU 1400, other nodes 1500")
        level, message = found[(one, "gpus")]
        assert level == "WARN" and "GPU 1: root pid 1 4000 MiB" in message
        level, message = found[(two, "hostname")]
        assert level == "ERROR" and f"{two} resolves to loopback 127.0.1.1" in message
        assert found[(two, "torch")] == (
            "ERROR",
            "torch not installed, and the job's requirements do not bring it",
        )
        assert found[(two, "rsync")][0] == "ERROR"
        for node in (head, one):
            assert found[(node, "rsync")][0] == "ok" and found[(node, "torch")][0] == "ok"
        assert found[(one, "hostname")][0] == "ok" and found[(head, "interface")][0] == "ok"

        # the port test needs a free port on the head: another port shows the blocked worker
        proc = fab(
            "doctor", "--verbose", "--inventory", str(inventory), "--port", "29555", home=fleetrun_home
        )
        found = verdicts(proc.stdout)
        assert found[(one, "rdzv-port")] == (
            "ERROR",
            f"29555 on {lab.address(0)} not reachable from {one} (no route to host)",
        ), proc.stdout[-3000:]
        assert found[(two, "rdzv-port")] == ("ok", f"29555 on {lab.address(0)} reachable")
        assert found[(head, "rdzv-port")] == ("ok", f"29555 on {lab.address(0)} free")
    finally:
        if listener is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(listener.pid, signal.SIGKILL)  # runuser and the listener it forked
            listener.wait()
            for pipe in (listener.stdin, listener.stdout):
                if pipe is not None:
                    pipe.close()
        if mounted:
            for _ in range(20):
                if subprocess.run([*nsenter, "umount", str(homes[0])], check=False).returncode == 0:
                    break
                time.sleep(0.5)
        subprocess.run(
            [
                "ip",
                "netns",
                "exec",
                lab.netns(1),
                "ip",
                "route",
                "del",
                "unreachable",
                f"{lab.address(0)}/32",
            ],
            check=False,
        )
        subprocess.run(
            ["ip", "netns", "exec", lab.netns(1), "ip", "link", "set", "eth0", "mtu", "1500"], check=False
        )
        hosts_file.write_text(hosts_before)
        for i, text in bashrc_before.items():
            (homes[i] / ".bashrc").write_text(text)


def test_train_refuses_a_fleet_that_would_hang(
    lab: LocalFleet, fleetrun_home: Path, digits_workdir: Path, tmp_path: Path
) -> None:
    """The cheap part runs before every launch: a node whose hostname is on loopback stops
    ``fab train`` before anything is synced, with the doctor's verdict line, as a failed run."""
    two = lab.node_name(2)
    hosts_file = lab.netns_etc(2) / "hosts"
    before = hosts_file.read_text()
    playbook = write_playbook(
        tmp_path / "job.yaml", digits_workdir, name="t-doctor", entrypoint="python -m trainer.task"
    )
    runs = tmp_path / "runs"
    try:
        hosts_file.write_text(before.replace(f"{lab.address(2)} {two}", f"127.0.1.1 {two}"))
        proc = fab("train", str(playbook), "--inventory", f"local:{PREFIX}", home=fleetrun_home, runs=runs)
    finally:
        hosts_file.write_text(before)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-2000:]
    level, message = verdicts(proc.stdout)[(two, "hostname")]
    assert level == "ERROR" and "resolves to loopback 127.0.1.1" in message
    assert "preflight_failed" in proc.stdout
    assert not (lab.home(0) / ".fleetrun" / "jobs" / "t-doctor").exists(), "nothing was synced"


def test_wrong_pinned_key_and_missing_python_are_named(
    lab: LocalFleet, fleetrun_home: Path, tmp_path: Path
) -> None:
    """Node 1 pinned with node 2's host key; node 2 given a Python that does not exist."""
    one, two = lab.node_name(1), lab.node_name(2)
    hosts = lab.inventory().to_yaml_data()["hosts"]
    hosts[1]["host_key"] = hosts[2]["host_key"]
    hosts[2]["python"] = "/opt/no-such-python/bin/python3"
    inventory = tmp_path / "lab.yaml"
    inventory.write_text(yaml.safe_dump({"hosts": hosts}))
    proc = fab("doctor", "--verbose", "--inventory", str(inventory), home=fleetrun_home)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-2000:]
    found = verdicts(proc.stdout)
    level, message = found[(one, "ssh")]
    assert level == "ERROR" and "does not match the pinned key" in message
    assert not any(node == one and check != "ssh" for node, check in found), (
        "an unreached node is not judged further"
    )
    assert (two, "python") in found, proc.stdout[-3000:]
    level, message = found[(two, "python")]
    assert (
        level == "ERROR" and "the probe did not run with /opt/no-such-python/bin/python3 (exit 127" in message
    )
    assert found[(lab.node_name(0), "ssh")][0] == "ok" and found[(lab.node_name(0), "torch")][0] == "ok"


def test_bad_gpu_is_named_per_gpu_with_the_nvidia_smi_stand_in(lab: LocalFleet, fleetrun_home: Path) -> None:
    """Node 1 runs the scripted ``nvidia-smi``/``dmesg``/``dcgmi`` (``tests/gpu_standin``) first on
    its PATH: GPU 1 has 2 uncorrectable ECC errors (DCGM's memory watch says so too), an Xid 79 in
    the kernel log and fails DCGM's memory test; GPU 0 runs at PCIe x8 and DCGM's PCIe watch
    warns of replays. ``fab doctor --gpu-diag 2`` (the reader sent with the probe, then as the
    diagnostic) prints one line per GPU, each fault once, and exits 1; the nodes without dcgmi
    say so (unknown, a warning)."""
    from tests.gpustandin import xid

    one = lab.node_name(1)
    home = lab.home(1)
    user = pwd.getpwnam(one)
    gpus: list[dict[str, object]] = [{"pcie_width": 8}, {"ecc_volatile": 2}]
    replays = "Detected more than 8 PCIe replays per minute for GPU 0 : 14"
    dcgm = {
        "incidents": [
            {"gpu": 0, "system": "PCIe system", "health": "Warning", "message": replays},
            {
                "gpu": 1,
                "system": "Memory system",
                "health": "Failure",
                "message": "Detected 2 volatile double-bit ECC error(s) in GPU 1.",
            },
        ],
        "diag_fail": [{"test": "memory", "gpu": 1, "warning": "Found 3 faulty memory elements on GPU 1"}],
    }
    fakebin = home / "fakebin"
    install(
        fakebin,
        {
            "gpus": gpus,
            "xids": [xid(1, 79, "2026-11-25T14:02:11", "pid=4242, GPU has fallen off the bus.")],
            "dcgm": dcgm,
        },
        owner=(user.pw_uid, user.pw_gid),
        dcgm=True,
    )
    before = _prepend_bashrc(home, 'export PATH="$HOME/fakebin:$PATH"')
    try:
        proc = fab(
            "doctor",
            "--inventory",
            f"local:{PREFIX}",
            "--port",
            "29500",
            "--gpu-diag",
            "2",
            home=fleetrun_home,
        )
    finally:
        (home / ".bashrc").write_text(before)
        shutil.rmtree(fakebin)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-2000:]
    gpu_line = re.compile(r"^(\S+)\s+(gpu\d+|gpu-health|gpu-diag)\s+(ok|WARN|ERROR)\s+(.*)$")
    found = [(m.group(1, 2), m.group(3, 4)) for m in map(gpu_line.match, proc.stdout.splitlines()) if m]
    mine = [(check, verdict) for (node, check), verdict in found if node == one]
    assert (
        "gpu1",
        ("ERROR", "uncorrectable ECC 2 (volatile); Xid 79 at 14:02: GPU has fallen off the bus (drain)"),
    ) in mine
    assert (
        "gpu1",
        ("ERROR", "dcgm diag: Memory test failed: Found 3 faulty memory elements on GPU 1"),
    ) in mine
    assert ("gpu0", ("WARN", f"PCIe x8 of x16; DCGM PCIe: {replays}")) in mine
    others = {node for (node, check), _ in found if node != one}
    assert others and all(
        verdict == ("WARN", "unknown: dcgmi not installed (DCGM's diagnostic cannot run here)")
        for (node, check), verdict in found
        if node != one
    ), "nodes without nvidia-smi have no GPU lines, only the diagnostic's unknown"


def test_a_real_h100_report_is_ok_and_an_uncorrectable_ecc_error_in_it_is_an_error(
    lab: LocalFleet, fleetrun_home: Path
) -> None:
    """Node 1's PATH serves a REAL ``nvidia-smi -q`` capture (an H100 SXM on driver 565,
    ``tests/gpu_captures/smi-q/h100-sxm-565.57.01``) verbatim, refusing every command no capture
    answers: the doctor reads the GPU from the report, says so, and finds it healthy. Then the
    same report DERIVED with one volatile uncorrectable DRAM error: ERROR on that GPU, exit 1."""
    from tests.test_gpu_captures import H100, h100_with_ecc

    one = lab.node_name(1)
    home = lab.home(1)
    user = pwd.getpwnam(one)
    fakebin = home / "fakebin"
    gpu_line = re.compile(r"^(\S+)\s+(gpu\d+|gpu-health)\s+(ok|WARN|ERROR)\s+(.*)$")

    def doctor(text: str | None) -> tuple[int, dict[str, tuple[str, str]]]:
        install(fakebin, replay(fakebin, q=H100, text=text), owner=(user.pw_uid, user.pw_gid))
        proc = fab(
            "doctor", "--verbose", "--inventory", f"local:{PREFIX}", "--port", "29500", home=fleetrun_home
        )
        lines = [m for m in map(gpu_line.match, proc.stdout.splitlines()) if m and m.group(1) == one]
        return proc.returncode, {m.group(2): (m.group(3), m.group(4)) for m in lines}

    before = _prepend_bashrc(home, 'export PATH="$HOME/fakebin:$PATH"')
    try:
        healthy_code, healthy = doctor(None)
        faulty_code, faulty = doctor(h100_with_ecc(1))
    finally:
        (home / ".bashrc").write_text(before)
        shutil.rmtree(fakebin)
    assert healthy_code == 0, healthy
    assert healthy["gpu0"] == (
        "ok",
        "NVIDIA H100 80GB HBM3, PCIe gen5 x16, no uncorrectable ECC, 30 C, 101 W",
    )
    assert healthy["gpu-health"] == (
        "ok",
        "1 GPU(s), driver 565.57.01, CUDA 12.7, read through nvidia-smi -q (pynvml not installed)",
    )
    assert faulty_code == 1, faulty
    assert faulty["gpu0"] == ("ERROR", "uncorrectable ECC 1 (volatile)")


def test_collective_names_the_node_behind_a_slow_link(lab: LocalFleet, fleetrun_home: Path) -> None:
    """Node 2's link limited to 20 Mbit/s with ``tc tbf`` (netem is not in this kernel):
    ``fab doctor --collective`` runs the fleet's all-reduce and the ring of pairs in one torchrun
    launch and names node 2 (in two slow pairs: a slow node, not a link).
    Its own port, apart from the other tests' 29500."""

    two = lab.node_name(2)
    _netns(
        lab,
        2,
        "tc",
        "qdisc",
        "add",
        "dev",
        "eth0",
        "root",
        "tbf",
        "rate",
        "20mbit",
        "burst",
        "32kbit",
        "latency",
        "400ms",
    )
    env_before = {k: os.environ.get(k) for k in ("FLEETRUN_COLLECTIVE_MB", "FLEETRUN_COLLECTIVE_REPS")}
    os.environ.update({"FLEETRUN_COLLECTIVE_MB": "2", "FLEETRUN_COLLECTIVE_REPS": "2"})
    try:
        proc = fab(
            "doctor",
            "--collective",
            "--inventory",
            f"local:{PREFIX}",
            "--port",
            "29611",
            home=fleetrun_home,
            timeout=600,
        )
    finally:
        subprocess.run(
            ["ip", "netns", "exec", lab.netns(2), "tc", "qdisc", "del", "dev", "eth0", "root"], check=False
        )
        for key, value in env_before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-2000:]
    line = re.compile(r"^(\S+)\s+collective\s+(ok|WARN|ERROR)\s+(.*)$")
    found = {m.group(1): (m.group(2), m.group(3)) for m in map(line.match, proc.stdout.splitlines()) if m}
    assert two in found, proc.stdout[-4000:]
    assert found[two][0] == "ERROR" and "a slow node or link" in found[two][1], proc.stdout[-3000:]
    assert set(found) == {two}, "only the slow node has a problem line"
    assert "collective fleet: all-reduce" in proc.stdout
    saved = (
        sorted((fleetrun_home / "runs" / "collective").glob("*.json"))
        if (fleetrun_home / "runs").exists()
        else []
    )
    assert saved or "figures in" in proc.stdout
