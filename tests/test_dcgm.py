"""DCGM in the GPU health check: the reader against the scripted ``dcgmi`` stand-in, dcgmi's JSON
as NVIDIA's sources print it, the merged per-GPU verdicts, and ``fab doctor --gpu-diag``.

The reader under test (``launch/nodelib/fleetrun_gpu.py``) is the file the probe, the node agent
and ``--gpu-diag`` run on the nodes; here it runs in a subprocess whose ``PATH`` starts with the
stand-ins (``tests/gpu_standin``: ``nvidia-smi``, ``dmesg``, ``dcgmi``), so what it executes are
programs printing the real tools' formats. No fleet is needed.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from launch.nodelib import fleetrun_gpu
from launch.nodelib.fleetrun_gpu import DcgmFormatError, parse_diag, parse_health_check
from launch.reports.doctor_view import print_findings
from launch.rules import gpu_diag, gpu_health
from launch.rules.gpu_diag import judge_diag
from launch.rules.gpu_health import BAD, OK, UNKNOWN, WARN, GpuHealth, judge_fleet, new_faults
from launch.rules.preflight import ERROR, Findings, check_gpu_diag
from launch.transport.port import CommandResult
from tests.gpustandin import install, node_path

NODELIB = Path(fleetrun_gpu.__file__).resolve().parent
ECC_MSG = "Detected 2 volatile double-bit ECC error(s) in GPU 1."
REPLAY_MSG = "Detected more than 8 PCIe replays per minute for GPU 0 : 14"
FAULTY_MSG = "Found 3 faulty memory elements on GPU 1"


def env_with(fakebin: Path) -> dict[str, str]:
    return {**os.environ, "PATH": node_path(fakebin)}


def read(fakebin: Path, full: bool = True) -> GpuHealth:
    code = (
        f"import sys, json; sys.path.insert(0, {str(NODELIB)!r}); import fleetrun_gpu; "
        f"print(json.dumps(fleetrun_gpu.read_health({full})))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env_with(fakebin), capture_output=True, text=True, check=True
    )
    return gpu_health.parse_gpu_health(json.loads(out.stdout))


def standin(tmp_path: Path, scenario: dict[str, Any]) -> Path:
    return install(tmp_path / "fakebin", scenario, dcgm=True)


def lines(health: GpuHealth, expected: int | None = None) -> dict[str, tuple[str, str]]:
    return {v.label: (v.level, v.message) for v in judge_fleet({"n": health}, {"n": expected})["n"]}


def diag(fakebin: Path, level: int) -> gpu_diag.DiagReport:
    """``python - diag LEVEL`` with the reader on stdin, as ``fab doctor --gpu-diag`` sends it."""
    proc = subprocess.run(
        [sys.executable, "-", "diag", str(level)],
        input=(NODELIB / "fleetrun_gpu.py").read_bytes(),
        env=env_with(fakebin),
        capture_output=True,
        check=True,
    )
    return gpu_diag.parse_diag(json.loads(proc.stdout.decode().strip().splitlines()[-1]))


# -- health watches through the reader ------------------------------------------------------------


def test_healthy_dcgm_adds_nothing_but_says_it_was_read(tmp_path: Path) -> None:
    health = read(standin(tmp_path, {"count": 2}))
    assert health.dcgm is not None and health.dcgm.state == "ok" and health.dcgm.incidents == ()
    assert health.dcgm.overall == "Healthy"
    found = lines(health, 2)
    assert found["gpu-health"] == (
        OK,
        "2 GPU(s) of 2 expected, driver 550.54.15, CUDA 12.4, DCGM health watches read,"
        " read through nvidia-smi (pynvml not installed)",
    )
    assert found["gpu0"][0] == OK and found["gpu1"][0] == OK


def test_without_dcgmi_the_nvidia_smi_facts_stand_alone(tmp_path: Path) -> None:
    health = read(install(tmp_path / "fakebin", {"count": 1}))
    assert health.dcgm is None
    assert lines(health, 1)["gpu-health"] == (
        OK,
        "1 GPU(s) of 1 expected, driver 550.54.15, CUDA 12.4, read through nvidia-smi (pynvml not installed)",
    )


def test_a_memory_failure_named_by_both_is_said_once_and_one_only_dcgm_sees_is_added(tmp_path: Path) -> None:
    gpus: list[dict[str, Any]] = [{}, {"ecc_volatile": 2, "ecc_aggregate": 2}]
    incidents = [
        {"gpu": 1, "system": "Memory system", "health": "Failure", "message": ECC_MSG},
        {"gpu": 1, "system": "Memory system", "health": "Failure", "message": FAULTY_MSG},
    ]
    health = read(standin(tmp_path, {"gpus": gpus, "dcgm": {"incidents": incidents}}))
    assert health.dcgm is not None and [i.gpu for i in health.dcgm.incidents] == [1]
    # Health::AppendSystemIncidents joins one system's messages with ", " (one incident here)
    assert health.dcgm.incidents[0].message == f"{ECC_MSG}, {FAULTY_MSG}"
    level, message = lines(health)["gpu1"]
    assert level == BAD
    assert message == f"uncorrectable ECC 2 (volatile); DCGM Memory: {FAULTY_MSG}"


def test_the_same_fault_alone_is_not_repeated(tmp_path: Path) -> None:
    gpus: list[dict[str, Any]] = [{}, {"ecc_volatile": 2}]
    incidents = [{"gpu": 1, "system": "Memory system", "health": "Failure", "message": ECC_MSG}]
    found = lines(read(standin(tmp_path, {"gpus": gpus, "dcgm": {"incidents": incidents}})))
    assert found["gpu1"] == (BAD, "uncorrectable ECC 2 (volatile)")


def test_a_dcgm_memory_failure_nvidia_smi_cannot_see_makes_the_gpu_bad(tmp_path: Path) -> None:
    incidents = [{"gpu": 1, "system": "Memory system", "health": "Failure", "message": ECC_MSG}]
    found = lines(read(standin(tmp_path, {"count": 2, "dcgm": {"incidents": incidents}})))
    assert found["gpu1"] == (BAD, f"DCGM Memory: {ECC_MSG}")
    assert found["gpu0"][0] == OK


def test_a_pcie_warning_is_a_warning_in_the_gpus_line(tmp_path: Path) -> None:
    gpus: list[dict[str, Any]] = [{"pcie_width": 8}, {}]
    incidents = [{"gpu": 0, "system": "PCIe system", "health": "Warning", "message": REPLAY_MSG}]
    found = lines(read(standin(tmp_path, {"gpus": gpus, "dcgm": {"incidents": incidents}})))
    assert found["gpu0"] == (WARN, f"PCIe x8 of x16; DCGM PCIe: {REPLAY_MSG}")


def test_an_nvswitch_incident_goes_to_the_nodes_line(tmp_path: Path) -> None:
    incidents = [
        {
            "group": "Switch",
            "entity": 2,
            "system": "Internal error",  # HelperSystemToString has no name for the NVSwitch systems
            "health": "Failure",
            "message": "NVSwitch 2's NvLink 7 is down.",
        }
    ]
    found = lines(read(standin(tmp_path, {"count": 1, "dcgm": {"incidents": incidents}})), 1)
    assert found["gpu-health"] == (BAD, "DCGM Switch 2 Internal error: NVSwitch 2's NvLink 7 is down.")


def test_no_host_engine_is_unknown_never_healthy(tmp_path: Path) -> None:
    health = read(standin(tmp_path, {"count": 1, "dcgm": {"engine": False}}))
    assert health.dcgm is not None and health.dcgm.state == "no_engine"
    level, message = lines(health, 1)["gpu-health"]
    assert level == UNKNOWN
    assert message.endswith(
        "unknown: DCGM health (the host engine does not answer: is nv-hostengine running?)"
    )


def test_watches_off_are_set_then_read_on_the_next_check(tmp_path: Path) -> None:
    fakebin = standin(tmp_path, {"count": 1, "dcgm": {"watches": False}})
    first = read(fakebin)
    assert first.dcgm is not None and first.dcgm.state == "watches_set"
    assert lines(first, 1)["gpu-health"][0] == UNKNOWN
    second = read(fakebin)
    assert second.dcgm is not None and second.dcgm.state == "ok"
    assert lines(second, 1)["gpu-health"][0] == OK


def test_a_long_lived_reader_asks_dcgm_at_most_every_30_s(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[list[str]] = []

    def fake(argv: list[str], timeout: float) -> tuple[int, str, bool]:
        calls.append(argv)
        return 0, json.dumps({"header": [], "body": {"Overall Health": {"value": "Healthy"}}}), False

    monkeypatch.setattr(fleetrun_gpu, "_run_dcgmi", fake)
    monkeypatch.setattr(fleetrun_gpu.shutil, "which", lambda name: "/usr/bin/" + name)
    monkeypatch.setattr(fleetrun_gpu, "_dcgm_cache", {"at": None, "answer": None})
    for now in (100.0, 102.0, 129.0):
        assert fleetrun_gpu.dcgm_health(now)["state"] == "ok"
    assert len(calls) == 1
    fleetrun_gpu.dcgm_health(130.5)
    assert len(calls) == 2


def test_a_new_dcgm_failure_during_a_run_is_a_gpu_fault(tmp_path: Path) -> None:
    before = read(standin(tmp_path / "a", {"count": 2}), full=False)
    incidents = [{"gpu": 1, "system": "Memory system", "health": "Failure", "message": ECC_MSG}]
    after = read(standin(tmp_path / "b", {"count": 2, "dcgm": {"incidents": incidents}}), full=False)
    assert new_faults(before, before) == []
    assert new_faults(before, after) == [("gpu1", f"DCGM Memory: {ECC_MSG}")]
    assert new_faults(after, after) == []  # failing already at the start: not new


# -- dcgmi's JSON, and hostile answers -------------------------------------------------------------


def test_health_check_json_as_dcgmi_prints_it() -> None:
    out = """{
   "body" : {
      "GPU" : {
         "children" : {
            "3" : {
               "children" : {
                  "Errors" : {
                     "children" : {
                        "PCIe system" : {
                           "overflow" : [ "Detected more than 8 PCIe replays per minute for GPU", "3 : 14" ],
                           "value" : "Warning"
                        }
                     }
                  }
               },
               "value" : "Warning"
            }
         }
      },
      "Overall Health" : { "value" : "Warning" }
   },
   "header" : [ "Health Monitor Report" ]
}
"""
    overall, incidents = parse_health_check(out)
    assert overall == "Warning"
    assert incidents == [
        {
            "group": "GPU",
            "entity": 3,
            "system": "PCIe system",
            "health": "Warning",
            "message": "Detected more than 8 PCIe replays per minute for GPU 3 : 14",
        }
    ]


@pytest.mark.parametrize(
    ("out", "field"),
    [
        ('{"body": {"Overall Health": {"value": 3}}}', "body.Overall Health.value"),
        ('{"body": []}', "body"),
        (
            '{"body": {"Overall Health": {"value": "Failure"}, "GPU": {"children": {"x": {}}}}}',
            "body.GPU.children.x",
        ),
        (
            '{"body": {"Overall Health": {"value": "Failure"}, "GPU": {"children": {"0": {"children": '
            '{"Errors": {"children": {"Memory system": {"value": "Failure", "overflow": "no"}}}}}}}}}',
            "Memory system.overflow",
        ),
        ("Error: Health watches not enabled. Please enable watches.", "no JSON"),
        ('{"body": {"Overall Health"', "not JSON"),
    ],
)
def test_a_malformed_health_answer_names_the_field(out: str, field: str) -> None:
    with pytest.raises(DcgmFormatError, match=field.replace(".", r"\.")):
        parse_health_check(out)


def test_a_malformed_dcgm_part_degrades_to_unknown_and_keeps_the_gpus() -> None:
    data = {
        "smi": True,
        "queried": True,
        "health_fields": True,
        "gpus": [
            {"index": 0, "uuid": "GPU-0", "bus_id": "0000:18:00", "ecc_volatile": 0, "ecc_aggregate": 0}
        ],
        "xids": [],
        "dcgm": {
            "state": "ok",
            "incidents": [{"group": 1, "entity": 0, "system": "x", "health": "x", "message": ""}],
        },
    }
    health = gpu_health.parse_gpu_health(data)
    assert len(health.gpus) == 1 and health.dcgm is not None and health.dcgm.state == "malformed"
    assert "field 'group'" in (health.dcgm.detail or "")
    level, message = lines(health)["gpu-health"]
    assert level == UNKNOWN and "unknown: DCGM health (" in message and "field 'group'" in message
    for hostile in ("garbage", {"state": "sure"}, {"state": "ok", "incidents": [{}] * 1000}):
        assert gpu_health.parse_dcgm(hostile) is not None
        assert gpu_health.parse_dcgm(hostile).state == "malformed"  # type: ignore[union-attr]


def test_huge_answers_are_bounded_and_control_characters_shown_not_sent() -> None:
    errors = {
        f"System {i}": {"value": "Warning", "overflow": ["\x1b[31mred\x1b[0m " + "x" * 5000]}
        for i in range(500)
    }
    body = {
        "Overall Health": {"value": "Warning"},
        "GPU": {"children": {"0": {"children": {"Errors": {"children": errors}}}}},
    }
    overall, incidents = parse_health_check(json.dumps({"body": body}))
    assert len(incidents) == fleetrun_gpu.MAX_INCIDENTS and all(len(i["message"]) <= 300 for i in incidents)
    health = gpu_health.parse_dcgm({"state": "ok", "overall": overall, "incidents": incidents})
    assert health is not None and health.state == "ok"
    assert "\x1b" not in health.incidents[0].message and health.incidents[0].message.startswith(
        "\\x1b[31mred"
    )


# -- the diagnostic ---------------------------------------------------------------------------------


def test_diag_level_1_passes_on_a_healthy_node(tmp_path: Path) -> None:
    report = diag(standin(tmp_path, {"count": 2}), 1)
    assert (report.state, report.level, report.tests, report.passed, report.failed) == (
        "ok",
        1,
        ("software",),
        2,
        (),
    )
    verdicts = judge_diag(report)
    assert [(v.label, v.level) for v in verdicts] == [("gpu-health", OK)]
    assert verdicts[0].message.startswith("dcgm diag level 1 (software): 2 result(s) passed, 0 skipped in ")


def test_diag_names_the_failed_test_per_gpu(tmp_path: Path) -> None:
    fails = [
        {"test": "memory", "gpu": 3, "warning": FAULTY_MSG.replace("GPU 1", "GPU 3"), "error_id": 45},
        {
            "test": "pcie",
            "gpu": 3,
            "warning": "GPU 3 host-side PCIe replay violation, see dmesg for more information",
        },
    ]
    report = diag(standin(tmp_path, {"count": 4, "dcgm": {"diag_fail": fails}}), 2)
    assert report.tests == ("software", "pcie", "memory") and len(report.failed) == 2
    verdicts = {v.label: (v.level, v.message) for v in judge_diag(report)}
    assert verdicts["gpu3"] == (
        BAD,
        "dcgm diag: PCIe test failed: GPU 3 host-side PCIe replay violation, see dmesg for more information; "
        "dcgm diag: Memory test failed: Found 3 faulty memory elements on GPU 3",
    )
    assert verdicts["gpu-health"][0] == OK and "2 failed on the GPUs below" in verdicts["gpu-health"][1]
    assert set(verdicts) == {"gpu-health", "gpu3"}


@pytest.mark.parametrize(
    ("scenario", "dcgm", "said"),
    [
        ({"dcgm": {"engine": False}}, True, "the host engine does not answer (is nv-hostengine running?)"),
        (
            {"dcgm": {"diag_runtime_error": "Error: Diagnostic could not be run while DCGM is paused."}},
            True,
            "paused",
        ),
        ({}, False, "unknown: dcgmi not installed"),
    ],
)
def test_diag_that_cannot_run_is_unknown_never_ok(
    tmp_path: Path, scenario: dict[str, Any], dcgm: bool, said: str
) -> None:
    report = diag(install(tmp_path / "fakebin", {"count": 1, **scenario}, dcgm=dcgm), 1)
    verdicts = judge_diag(report)
    assert len(verdicts) == 1 and verdicts[0].level == UNKNOWN and said in verdicts[0].message


def test_diag_json_of_dcgm_3_and_a_runtime_error() -> None:
    old = {
        "DCGM GPU Diagnostic": {
            "test_categories": [
                {
                    "category": "Deployment",
                    "tests": [
                        {"name": "Denylist", "results": [{"status": "Pass"}]},
                        {
                            "name": "Persistence Mode",
                            "results": [
                                {
                                    "gpu_id": 1,
                                    "status": "Fail",
                                    "warnings": [
                                        {
                                            "warnings": "Persistence mode for GPU 1 is disabled.",
                                            "error_id": 12,
                                        }
                                    ],
                                }
                            ],
                        },
                    ],
                },
                {
                    "category": "Hardware",
                    "tests": [
                        {
                            "name": "GPU Memory",
                            "results": [{"gpu_id": "0", "status": "Fail", "warnings": [{"warning": "bad"}]}],
                        }
                    ],
                },
            ]
        }
    }
    found = parse_diag(json.dumps(old))
    assert [(f["test"], f["gpu"], f["warnings"]) for f in found["failed"]] == [
        ("Persistence Mode", 1, ["Persistence mode for GPU 1 is disabled."]),
        ("GPU Memory", 0, ["bad"]),
    ]
    assert parse_diag('{"DCGM Diagnostic": {"version": "4.6.0", "runtime_error": "no"}}') == {
        "runtime_error": "no"
    }
    with pytest.raises(DcgmFormatError, match=r"results\[0\]\.entity_id"):
        parse_diag(
            '{"DCGM Diagnostic": {"test_categories": [{"category": "c", "tests": [{"name": "memory", '
            '"results": [{"entity_group": "GPU", "entity_id": "zero", "status": "Fail"}]}]}]}}'
        )


@pytest.mark.parametrize(
    "hostile",
    [
        "not an object",
        {"level": 2, "state": "ok", "counts": "many"},
        {"level": 2, "state": "fine"},
        {"level": 9, "state": "ok"},
        {"level": 2, "state": "ok", "counts": {"pass": 1, "skip": 0}, "failed": [{"test": 3}]},
        {
            "level": 2,
            "state": "ok",
            "counts": {"pass": 1, "skip": 0},
            "failed": [{"test": "m", "status": "fail"}] * 1000,
        },
    ],
)
def test_a_malformed_diag_answer_is_unknown_naming_what(hostile: object) -> None:
    report = gpu_diag.parse_diag(hostile)
    assert report.state == "error" and (report.detail or "").startswith("answer not understood")
    verdicts = judge_diag(report)
    assert [v.level for v in verdicts] == [UNKNOWN]


def test_a_diagnostic_past_its_bound_is_stopped(tmp_path: Path) -> None:
    slow = tmp_path / "dcgmi"
    # its TERM handler stops the running diagnostic (the background sleep), as dcgmi's does: a
    # sleep left holding stdout would keep the pipe open for its 30 s
    slow.write_text("#!/bin/sh\ntrap 'kill $!; echo stopped; exit 143' TERM\nsleep 30 & wait\n")
    slow.chmod(0o755)
    code, out, late = fleetrun_gpu._run_dcgmi([str(slow)], 0.5)
    assert late and "stopped" in out


def test_a_diagnostic_whose_helper_holds_the_pipe_is_not_waited_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A dcgmi that ignores SIGTERM and leaves a process of another session holding its stdout:
    SIGKILL, then the pipe is let go (before, the last wait had no bound: as long as that process
    lived, here an hour)."""
    holder = tmp_path / "holder.pid"
    stubborn = tmp_path / "dcgmi"
    stubborn.write_text(
        f"#!/bin/sh\ntrap '' TERM\nsetsid sleep 3600 & echo $! > {holder}\necho started\nsleep 3600\n"
    )
    stubborn.chmod(0o755)
    monkeypatch.setattr(fleetrun_gpu, "DCGMI_TERM_GRACE_S", 0.5)
    monkeypatch.setattr(fleetrun_gpu, "DCGMI_KILL_WAIT_S", 0.5)
    try:
        code, out, late = fleetrun_gpu._run_dcgmi([str(stubborn)], 0.5)
    finally:
        if holder.exists():
            with contextlib.suppress(OSError):
                os.kill(int(holder.read_text()), signal.SIGKILL)
    assert late and code == -signal.SIGKILL


# -- fab doctor --gpu-diag ---------------------------------------------------------------------------


class LocalLink:
    """A node that is this machine with its own stand-ins first on PATH (the SSH part is not
    what is tested here: the command and its stdin are run as the node would run them)."""

    def __init__(self, name: str, fakebin: Path) -> None:
        from launch.job.inventory import Host
        from tests.conftest import SAMPLE_HOST_KEYS

        self.host = Host(
            name=name, address="127.0.0.1", user="me", python=sys.executable, host_key=SAMPLE_HOST_KEYS[0]
        )
        self.fakebin = fakebin

    def run_with_input(self, command: str, data: bytes, timeout: float) -> CommandResult:
        proc = subprocess.run(
            command, shell=True, input=data, env=env_with(self.fakebin), capture_output=True, timeout=timeout
        )
        return CommandResult(self.host.name, proc.returncode, proc.stdout.decode(), proc.stderr.decode())


class LocalFleet:
    def __init__(self, links: list[LocalLink]) -> None:
        self.links = {link.host.name: link for link in links}

    def map(self, fn: Any, hosts: Any = None, on_done: Any = None, deadline: Any = None) -> dict[str, Any]:
        return {h.name: fn(self.links[h.name]) for h in hosts}


def test_doctor_gpu_diag_prints_one_line_per_failed_gpu_and_fails(tmp_path: Path) -> None:
    from launch.run.doctor import gpu_diag

    fails = [{"test": "memory", "gpu": 1, "warning": "Found 3 faulty \x1b[2Jmemory elements on GPU 1"}]
    links = [
        LocalLink("node-a", standin(tmp_path / "a", {"count": 2})),
        LocalLink("node-b", standin(tmp_path / "b", {"count": 2, "dcgm": {"diag_fail": fails}})),
        LocalLink("node-c", install(tmp_path / "c" / "fakebin", {"count": 2})),
    ]
    fleet = LocalFleet(links)
    reports = gpu_diag(fleet, [link.host for link in links], 2)  # type: ignore[arg-type]
    findings = Findings()
    findings.add("node-a", "ssh", "ok", "reachable")
    check_gpu_diag(findings, reports, ["node-a", "node-b", "node-c"])
    got = [(v.node, v.check, v.level) for v in findings.verdicts]
    assert got == [
        ("node-a", "ssh", "ok"),
        ("node-a", "gpu-diag", "ok"),
        ("node-b", "gpu-diag", "ok"),
        ("node-b", "gpu1", ERROR),
        ("node-c", "gpu-diag", "warn"),
    ]
    assert findings.failed
    console = Console(record=True, width=200)
    print_findings(console, findings, ["node-a", "node-b", "node-c"])
    text = console.export_text()
    assert (
        "node-b gpu1       ERROR  dcgm diag: Memory test failed: Found 3 faulty \\x1b[2Jmemory elements on GPU 1"
        in text
    )
    assert "node-c gpu-diag   WARN   unknown: dcgmi not installed" in text
    assert "\x1b" not in text


class AnswerLink(LocalLink):
    """A node whose diagnostic printed ``answer`` (a hostile node's last line)."""

    def __init__(self, name: str, answer: str) -> None:
        super().__init__(name, Path("/nonexistent"))
        self.answer = answer

    def run_with_input(self, command: str, data: bytes, timeout: float) -> CommandResult:
        return CommandResult(self.host.name, 0, "noise\n" + self.answer + "\n", "")


def test_a_nesting_bomb_from_a_diagnostic_is_that_nodes_reason_not_a_crash() -> None:
    from launch.run.doctor import gpu_diag

    links = [
        AnswerLink("bomb", "[" * 200_000 + "]" * 200_000),
        AnswerLink("deep", '{"a": ' + "[" * 40 + "]" * 40 + "}"),
        AnswerLink("huge", '"' + "x" * 2_000_000 + '"'),
    ]
    reports = gpu_diag(LocalFleet(links), [link.host for link in links], 1)  # type: ignore[arg-type]
    assert "nested deeper than" in str(reports["bomb"]) and "nested deeper than" in str(reports["deep"])
    assert "over the limit" in str(reports["huge"])


def test_doctor_refuses_a_level_it_does_not_know() -> None:
    from launch.cli import app
    from launch.errors import SpecError

    with pytest.raises(SpecError, match="--gpu-diag 5"):
        app.doctor(None, inventory="local", gpu_diag=5)
