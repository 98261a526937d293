"""The GPU health reader's reads run at once (``fleetrun_gpu.read_health``), and the probe asks
``nvidia-smi --query-gpu`` once.

On a real 8-GPU node every ``nvidia-smi`` call takes 0.1 to over 1 s, so the reads one after the
other made the doctor wait for their sum on every node. These tests pin what the concurrency must
not change (the answer) and what it is for (the reads start together; a hung one is cut at its own
timeout while the others answer), against the scripted stand-ins of ``tests/gpu_standin``, without
timing anything: a wrapper in front of each stand-in (a file barrier) answers only once every read
has started, which reads made one after the other never reach.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from launch.nodelib import fleetrun_gpu
from launch.run.doctor import probe_source
from tests.gpustandin import install, write_scenario, xid
from tests.gpustandin import node_path as system_path

XID79 = xid(1, 79, "2026-11-25T14:02:11", "pid=4242, GPU has fallen off the bus.")
FAULTY = {
    "gpus": [
        {},
        {"ecc_volatile": 2, "remap_pending": "Yes", "nvlink_inactive": 2},
        {"fabric_state": "In Progress", "fabric_status": "N/A", "throttle": ["hw_slowdown"]},
        {"lost": True},
    ],
    "xids": [XID79],
}
READS = 5
"""The processes a full read starts on a node with ``nvidia-smi`` and no ``dcgmi``: ``--query-gpu``,
``--query-remapped-rows``, ``nvlink --status``, ``-q`` and ``dmesg``."""

WRAPPER = """#!/usr/bin/env python3
# In front of a stand-in script: logs the call, then answers (through the script) only once READS calls
# have started; a call named in HANG never answers.
import os, sys, time
here = os.path.dirname(os.path.abspath(__file__))
name, args = os.path.basename(sys.argv[0]), sys.argv[1:]
key = name + " " + (args[0].split("=")[0] if args else "")
with open(os.path.join(here, "calls.log"), "a") as log:
    log.write(key + "\\n")
started = os.path.join(here, "started")
os.makedirs(started, exist_ok=True)
open(os.path.join(started, key.replace(" ", "_")), "w").close()
if key in HANG:
    time.sleep(300)
    sys.exit(0)
until = time.monotonic() + WAIT
while len(os.listdir(started)) < READS and time.monotonic() < until:
    time.sleep(0.02)
if len(os.listdir(started)) < READS:
    sys.exit(3)
os.execv(os.path.join(here, name + ".script"), [name] + args)
"""


def wrapped(folder: Path, scenario: dict[str, Any], hang: tuple[str, ...] = (), barrier: int = 0) -> Path:
    """The stand-in scripts in ``folder``, each behind the wrapper instead of ``answer.sh`` (no kept
    answers: every call runs; ``barrier`` 0: no waiting)."""
    install(folder, scenario)
    script = (
        WRAPPER.replace("HANG", repr(hang))
        .replace("READS", str(barrier))
        .replace("WAIT", str(fleetrun_gpu.TOOL_TIMEOUT_S - 2))
    )
    for name in ("nvidia-smi", "dmesg"):
        (folder / name).write_text(script)
        (folder / name).chmod(0o755)
    return folder


def calls(folder: Path) -> list[str]:
    log = folder / "calls.log"
    return log.read_text().splitlines() if log.exists() else []


@pytest.fixture
def node_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """This process as a node without DCGM: the stand-ins' folder first on PATH, then the system's."""
    folder = tmp_path / "fakebin"
    monkeypatch.setenv("PATH", system_path(folder))
    return folder


def one_after_the_other(full: bool) -> dict[str, Any]:
    """The answer as the reads gave it one after the other (the reader before they ran at once)."""
    g = fleetrun_gpu
    answer: dict[str, Any] = {"smi": True, "gpus": [], "driver": None, "cuda": None}
    answer.update(reader="nvidia-smi", reader_note="pynvml not installed")
    heard: list[str] = []
    gpus, driver, health = g.query_gpus(heard)
    answer.update(queried=gpus is not None, health_fields=health, gpus=gpus or [], driver=driver)
    if gpus:
        remap = g.remapped_rows()
        for gpu in answer["gpus"]:
            gpu["remap_unc"], gpu["remap_pending"], gpu["remap_failure"], _state = remap.get(
                gpu["uuid"], (None, None, None, "ok")
            )
        if full:
            links = g.nvlinks()
            answer["cuda"], fabric, _driver, listed = g.query_details(heard)
            asked = {gpu["bus_id"]: gpu["recovery"] for gpu in listed}
            for gpu in answer["gpus"]:
                gpu["nvlink_active"], gpu["nvlink_inactive"] = links.get(gpu["index"], (None, None))
                gpu["fabric_state"], gpu["fabric_status"] = fabric.get(gpu["bus_id"], (None, None))
                gpu["recovery"] = asked.get(gpu["bus_id"])
    lost, said = g.smi_complaints(heard)
    answer["lost"] = [x for x in lost if x["bus_id"] not in {gpu["bus_id"] for gpu in gpus or []}]
    answer["smi_said"] = said if gpus is None or lost else None
    answer["xids"], answer["xid_source"] = g.kernel_xids()
    if full:
        answer["ib_devices"] = g.fabric_devices()
    answer["dcgm"] = g.dcgm_health()
    return answer


@pytest.mark.parametrize("full", [True, False])
def test_reads_at_once_answer_what_they_answered_one_after_the_other(node_path: Path, full: bool) -> None:
    install(node_path, FAULTY)
    together = fleetrun_gpu.read_health(full)
    assert together == one_after_the_other(full)
    assert len(together["gpus"]) == 3 and together["gpus"][1]["ecc_volatile"] == 2
    assert together["gpus"][1]["remap_pending"] is True and together["xids"][0]["code"] == 79
    if full:
        assert (
            together["gpus"][1]["nvlink_inactive"] == 2
            and together["gpus"][2]["fabric_state"] == "In Progress"
        )
        assert together["cuda"] == "12.4"


def test_the_reads_start_together_and_a_hung_one_is_cut_at_its_timeout(
    node_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each read answers only once all five have started (one after the other, the first would
    wait in vain and fail), while ``-q`` never answers: it is cut at its own timeout, and every
    other fact is read."""
    wrapped(node_path, FAULTY, hang=("nvidia-smi -q",), barrier=READS)
    monkeypatch.setattr(fleetrun_gpu, "DETAILS_TIMEOUT_S", 2)
    answer = fleetrun_gpu.read_health(True)
    assert sorted(calls(node_path)) == sorted(
        [
            "nvidia-smi --query-gpu",
            "nvidia-smi --query-remapped-rows",
            "nvidia-smi nvlink",
            "nvidia-smi -q",
            "dmesg --time-format",
        ]
    )
    assert answer["queried"] is True and answer["health_fields"] is True
    assert [g["index"] for g in answer["gpus"]] == [0, 1, 2]
    assert answer["gpus"][1]["ecc_volatile"] == 2 and answer["gpus"][1]["remap_pending"] is True
    assert answer["gpus"][1]["nvlink_inactive"] == 2 and answer["gpus"][0]["nvlink_active"] == 18
    assert [x["code"] for x in answer["xids"]] == [79] and answer["xid_source"] == "dmesg"
    # the hung report: unknown, never a default that reads as healthy
    assert answer["cuda"] is None
    assert all(g["fabric_state"] is None and g["fabric_status"] is None for g in answer["gpus"])


def test_a_read_that_raises_is_raised_and_one_about_no_gpus_is_not(
    node_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As one after the other: an error of a read whose answer counts reaches the probe (which
    reports it); the GPU reads' errors do not count when ``--query-gpu`` lists no GPU."""
    install(node_path, FAULTY)

    def broken() -> None:
        raise ValueError("nvlink answer")

    monkeypatch.setattr(fleetrun_gpu, "nvlinks", broken)
    with pytest.raises(ValueError, match="nvlink answer"):
        fleetrun_gpu.read_health(True)
    install(node_path, {"gpus": [{"lost": True}]})
    answer = fleetrun_gpu.read_health(True)
    assert answer["gpus"] == [] and answer["queried"] is True


def test_the_full_probe_asks_for_the_gpus_once(node_path: Path, tmp_path: Path) -> None:
    """``fab doctor``'s probe: one ``--query-gpu`` (the reader's), its GPUs and driver in the
    probe's own GPU facts, and the compute processes beside them."""
    scenario = {
        "count": 2,
        "driver": "550.54.15",
        "compute_apps": [
            {"gpu_uuid": "GPU-5a17e001-7d2c-4f1a-9b3e-000000000001", "pid": 1, "used_memory": 4000}
        ],
    }
    wrapped(node_path, scenario)
    proc = subprocess.run(
        [sys.executable, "-", "full", "127.0.0.1", "0", "0", ".fleetrun/lib"],
        input=probe_source(),
        env=os.environ.copy(),
        capture_output=True,
        check=True,
        cwd=tmp_path,
    )
    answer = json.loads(proc.stdout.decode().strip().splitlines()[-1])
    assert [c for c in calls(node_path) if c.startswith("nvidia-smi --query-gpu")] == [
        "nvidia-smi --query-gpu"
    ]
    assert answer["nvidia_smi"] is True and answer["driver"] == "550.54.15"
    assert answer["gpus"] == [{"index": g["index"], "uuid": g["uuid"]} for g in answer["gpu_health"]["gpus"]]
    assert [g["index"] for g in answer["gpus"]] == [0, 1]
    assert answer["gpu_procs"] == [
        {"gpu": "GPU-5a17e001-7d2c-4f1a-9b3e-000000000001", "pid": 1, "user": "root", "mem_mib": 4000}
    ]


def test_the_stand_ins_kept_answers_follow_the_scenario(tmp_path: Path) -> None:
    """``answer.sh`` (the stand-ins' front) gives a kept answer's bytes, stderr and exit code
    again, and a new one once a test rewrites the scenario."""
    folder = install(tmp_path / "fakebin", {"gpus": [{}, {"lost": True}]})
    argv = [str(folder / "nvidia-smi"), "--query-gpu=index,uuid", "--format=csv,noheader"]
    first, again = (subprocess.run(argv, capture_output=True, text=True) for _ in range(2))
    assert (first.returncode, first.stdout, first.stderr) == (again.returncode, again.stdout, again.stderr)
    assert first.returncode == 15 and "Unable to determine the device handle" in first.stderr
    assert first.stdout.count("\n") == 1 and len(list((folder / ".answers").iterdir())) == 3
    write_scenario(folder, {"count": 2})
    changed = subprocess.run(argv, capture_output=True, text=True)
    assert changed.returncode == 0 and changed.stdout.count("\n") == 2 and changed.stderr == ""


def test_the_doctors_fan_out_bound_counts_the_waves() -> None:
    """256 nodes probed 64 at a time are four waves: each node keeps its own 30 s, so the whole
    fan-out's bound is four of them (one, for all of them, cut the last wave off at 60 s)."""
    from types import SimpleNamespace

    from launch.run.doctor import PROBE_TIMEOUT_S, fan_out_deadline

    fleet: Any = SimpleNamespace(max_parallel=64)
    assert fan_out_deadline(fleet, 64, PROBE_TIMEOUT_S) == PROBE_TIMEOUT_S + 30
    assert fan_out_deadline(fleet, 256, PROBE_TIMEOUT_S) == 4 * PROBE_TIMEOUT_S + 30
    assert fan_out_deadline(fleet, 65, 15) == 2 * 15 + 30
