"""GPU health: the node-side reader against the scripted ``nvidia-smi`` stand-in, the parser against
NVIDIA's documented formats, and the verdicts (``launch.rules.gpu_health``).

The reader under test (``launch/nodelib/fleetrun_gpu.py``) is the file the probe and the node
agent run on the nodes; here it runs in a subprocess whose ``PATH`` starts with the stand-ins
(``tests/gpu_standin``), so what it executes is a program printing nvidia-smi's formats.
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
from launch.nodelib.fleetrun_wire import ProtocolError
from launch.rules import gpu_health
from launch.rules.gpu_health import (
    BAD,
    OK,
    UNKNOWN,
    WARN,
    GpuHealth,
    judge_fleet,
    new_faults,
    parse_gpu_health,
)
from launch.rules.preflight import ERROR, Job, Observation, judge
from launch.rules.probe_facts import parse_probe_answer
from launch.run.doctor import probe_source
from tests.gpustandin import install, node_path, xid

NODELIB = Path(fleetrun_gpu.__file__).resolve().parent
XID79 = xid(1, 79, "2026-11-25T14:02:11", "pid='<unknown>', name=<unknown>, GPU has fallen off the bus.")


def read(tmp_path: Path, scenario: dict[str, Any], full: bool = True) -> GpuHealth:
    """Run the node's reader in its own Python with the stand-ins first on PATH."""
    fakebin = install(tmp_path / "fakebin", scenario)
    env = {**os.environ, "PATH": node_path(fakebin)}
    code = f"import sys, json; sys.path.insert(0, {str(NODELIB)!r}); import fleetrun_gpu; print(json.dumps(fleetrun_gpu.read_health({full})))"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return parse_gpu_health(json.loads(out.stdout))


def lines(health: GpuHealth, expected: int | None = None) -> dict[str, tuple[str, str]]:
    return {v.label: (v.level, v.message) for v in judge_fleet({"n": health}, {"n": expected})["n"]}


def test_healthy_node_is_ok_on_every_gpu(tmp_path: Path) -> None:
    health = read(tmp_path, {"count": 8, "cuda": "12.4"})
    assert len(health.gpus) == 8 and health.driver == "550.54.15" and health.cuda == "12.4"
    found = lines(health, 8)
    assert found["gpu-health"] == (
        OK,
        "8 GPU(s) of 8 expected, driver 550.54.15, CUDA 12.4, read through nvidia-smi (pynvml not installed)",
    )
    for i in range(8):
        level, message = found[f"gpu{i}"]
        assert level == OK, message
        assert message == "NVIDIA H100 80GB HBM3, PCIe gen5 x16, no uncorrectable ECC, 18 NVLinks, 34 C, 71 W"


def test_ecc_and_xid79_on_one_gpu_make_one_bad_line(tmp_path: Path) -> None:
    gpus: list[dict[str, Any]] = [{} for _ in range(4)]
    gpus[1] = {"ecc_volatile": 2, "ecc_aggregate": 2}
    found = lines(read(tmp_path, {"gpus": gpus, "xids": [XID79]}), 4)
    assert found["gpu1"] == (
        BAD,
        "uncorrectable ECC 2 (volatile); Xid 79 at 14:02: GPU has fallen off the bus (drain)",
    )
    assert all(found[f"gpu{i}"][0] == OK for i in (0, 2, 3))


def test_lost_gpu_is_missing_from_the_count_and_named_by_its_xid(tmp_path: Path) -> None:
    """After Xid 79 the GPU is gone from nvidia-smi's list (which then exits non-zero)."""
    gpus: list[dict[str, Any]] = [{} for _ in range(8)]
    gpus[1] = {"lost": True}
    health = read(tmp_path, {"gpus": gpus, "xids": [XID79]})
    assert [g.index for g in health.gpus] == [0, 2, 3, 4, 5, 6, 7]
    level, message = lines(health, 8)["gpu-health"]
    assert level == BAD
    assert (
        message == "7 GPU(s) of 8 expected; GPU at PCI 0000:28:00: the driver cannot open it (Unknown Error);"
        " GPU at PCI 0000:28:00: Xid 79 at 14:02: GPU has fallen off the bus (drain)"
    )


def test_missing_gpu_is_found_against_the_other_nodes_without_an_inventory_count(tmp_path: Path) -> None:
    full = read(tmp_path / "a", {"count": 8})
    short = read(tmp_path / "b", {"count": 7})
    verdicts = judge_fleet({"a": full, "b": short, "c": full})
    assert [v.level for v in verdicts["a"]] == [OK] * 9
    assert (verdicts["b"][0].label, verdicts["b"][0].level) == ("gpu-health", BAD)
    assert verdicts["b"][0].message == "7 GPU(s) of 8 expected"


def test_pcie_x8_throttling_and_persistence_are_warnings(tmp_path: Path) -> None:
    gpus: list[dict[str, Any]] = [{} for _ in range(3)]
    gpus[0] = {"pcie_width": 8}
    gpus[1] = {"throttle": ["hw_slowdown", "hw_thermal_slowdown", "sw_power_cap"]}
    gpus[2] = {"persistence": "Disabled", "throttle": ["sw_power_cap"]}
    found = lines(read(tmp_path, {"gpus": gpus}))
    assert found["gpu0"] == (WARN, "PCIe x8 of x16")
    assert found["gpu1"] == (WARN, "throttled: HW slowdown, HW thermal slowdown")
    assert found["gpu2"] == (WARN, "persistence mode off")


def test_row_remapping_nvlink_and_fabric_faults_are_bad(tmp_path: Path) -> None:
    gpus: list[dict[str, Any]] = [{} for _ in range(3)]
    gpus[0] = {"remap_pending": "Yes"}
    gpus[1] = {"nvlink_inactive": 2}
    gpus[2] = {"fabric_state": "In Progress", "fabric_status": "N/A"}
    found = lines(read(tmp_path, {"gpus": gpus}))
    assert found["gpu0"] == (BAD, "row remapping pending (reset the GPU)")
    assert found["gpu1"] == (BAD, "2 of 18 NVLinks inactive (the node's other GPUs have 18 active)")
    assert found["gpu2"] == (BAD, "NVSwitch fabric In Progress/? (is nvidia-fabricmanager running?)")


def test_an_unreadable_kernel_log_is_unknown_never_ok(tmp_path: Path) -> None:
    """Said once on the node's line (not on every GPU's): 64 nodes of 8 GPUs stay readable."""
    health = read(tmp_path, {"count": 2, "kernel_log": "restricted"})
    assert health.xids is None
    found = lines(health)
    level, message = found["gpu-health"]
    assert level == UNKNOWN and message.endswith(
        "unknown: Xid (kernel log not readable here: root, or the adm/systemd-journal group)"
    )
    assert found["gpu0"][0] == OK and found["gpu1"][0] == OK


def test_a_driver_without_the_health_fields_leaves_them_unknown(tmp_path: Path) -> None:
    """An old nvidia-smi refuses an unknown field (exit 2): the query is asked again without it,
    the other facts are read, and the one it refused is unknown with the field named."""
    fakebin = install(tmp_path / "fakebin", {"count": 1})
    smi = (fakebin / "nvidia-smi.script").read_text()
    (fakebin / "nvidia-smi.script").write_text(
        smi.replace('"retired_pages.pending"', '"retired_pages.pending.gone"')
    )
    env = {**os.environ, "PATH": node_path(fakebin)}
    code = f"import sys, json; sys.path.insert(0, {str(NODELIB)!r}); import fleetrun_gpu; print(json.dumps(fleetrun_gpu.read_health()))"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    health = parse_gpu_health(json.loads(out.stdout))
    assert health.queried and not health.health_fields and len(health.gpus) == 1
    level, message = lines(health)["gpu0"]
    assert level == UNKNOWN and message.endswith(
        "unknown: retired pages (nvidia-smi does not know the field retired_pages.pending)"
    )
    assert health.gpus[0].ecc_volatile == 0 and health.gpus[0].throttle == ()


def test_probe_carries_the_reader_and_the_doctor_prints_one_line_per_gpu(tmp_path: Path) -> None:
    """The probe as ``fab doctor`` sends it (``python -``, the reader prepended), on a node whose
    GPU 1 has an ECC error and an Xid 79: the doctor's verdicts name node, GPU and cause."""
    gpus: list[dict[str, Any]] = [{} for _ in range(2)]
    gpus[1] = {"ecc_volatile": 2}
    fakebin = install(tmp_path / "fakebin", {"gpus": gpus, "xids": [XID79]})
    env = {**os.environ, "PATH": node_path(fakebin)}
    proc = subprocess.run(
        [sys.executable, "-", "full", "127.0.0.1", "0", "0", ".fleetrun/lib/VERSION"],
        input=probe_source(),
        env=env,
        capture_output=True,
        check=True,
        cwd=tmp_path,
    )
    facts = parse_probe_answer(proc.stdout.decode().strip().splitlines()[-1])
    assert facts.gpu_health is not None and len(facts.gpu_health.gpus) == 2
    obs = Observation("node-a", "me", "10.0.0.1", facts=facts, gpus_expected=2)
    findings = judge([obs], Job(head="node-a", port=0, full=True))
    gpu_lines = {v.check: (v.level, v.message) for v in findings.verdicts if v.check.startswith("gpu")}
    assert gpu_lines["gpu1"] == (
        ERROR,
        "uncorrectable ECC 2 (volatile); Xid 79 at 14:02: GPU has fallen off the bus (drain)",
    )
    assert gpu_lines["gpu0"][0] == "ok" and gpu_lines["gpu-health"][0] == "ok"
    assert findings.failed


# -- the parser against NVIDIA's documented formats -----------------------------------------------

QUERY = (
    "index, uuid, name, pci.bus_id, driver_version, memory.used [MiB], power.draw [W]\n"
    "0, GPU-1d0cbd1e-49a3-2e8c-1f1d-5c0bbb0e4a11, NVIDIA A100-SXM4-40GB, 00000000:07:00.0, 535.104.05, 3 MiB, 52.40 W\n"
    "1, GPU-2e1dce2f-5ab4-3f9d-2a2e-6d1ccc1f5b22, NVIDIA A100-SXM4-40GB, 00000000:0F:00.0, 535.104.05, [N/A], [Not Supported]\n"
)


def test_csv_header_with_units_and_placeholders() -> None:
    fields = ("index", "uuid", "name", "pci.bus_id", "driver_version", "memory.used", "power.draw")
    rows = fleetrun_gpu.parse_csv(QUERY, fields)
    assert rows is not None and len(rows) == 2
    assert (
        fleetrun_gpu.number(rows[0]["memory.used"]) == 3.0
        and fleetrun_gpu.number(rows[0]["power.draw"]) == 52.4
    )
    assert (
        fleetrun_gpu.number(rows[1]["memory.used"]) is None
        and fleetrun_gpu.value(rows[1]["power.draw"]) is None
    )
    assert fleetrun_gpu.bus_key(rows[1]["pci.bus_id"]) == "0000:0f:00"
    assert fleetrun_gpu.parse_csv('Field "x" is not a valid field to query.\n', fields) is None


@pytest.mark.parametrize(
    ("line", "bus", "code"),
    [
        (
            "[  123.456] NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.",
            "0000:3b:00",
            79,
        ),
        (
            "NVRM: Xid (PCI:0000:01:00 GPU-I:05): 94, pid=7194, Contained: CE User Channel (0x9). RST: No, D-RST: No",
            "0000:01:00",
            94,
        ),
        (
            "2026-11-25T14:02:11,118000+00:00 NVRM: Xid (PCI:0000:B7:00): 48, pid=99, DBE (0x1) (0x0)",
            "0000:b7:00",
            48,
        ),
    ],
)
def test_xid_lines_in_the_kernels_format(line: str, bus: str, code: int) -> None:
    match = fleetrun_gpu.XID_LINE.search(line)
    assert match is not None
    assert (fleetrun_gpu.bus_key(match.group(1)), int(match.group(2))) == (bus, code)


def test_query_report_fabric_section_and_cuda_version(monkeypatch: pytest.MonkeyPatch) -> None:
    report = """
==============NVSMI LOG==============

Driver Version                            : 535.104.05
CUDA Version                              : 12.2

Attached GPUs                             : 2
GPU 00000000:18:00.0
    Product Name                          : NVIDIA H100 80GB HBM3
    Fabric
        State                             : Completed
        Status                            : Success
    Persistence Mode                      : Enabled
GPU 00000000:2A:00.0
    Product Name                          : NVIDIA H100 80GB HBM3
    Fabric
        State                             : In Progress
        Status                            : N/A
    Clocks Event Reasons
        Idle                              : Active
"""
    monkeypatch.setattr(fleetrun_gpu, "run_tool", lambda argv, timeout=8, with_errors=False: (0, report, ""))
    cuda, fabric, driver, gpus = fleetrun_gpu.query_details()
    assert cuda == "12.2" and driver == "535.104.05" and [g["persistence"] for g in gpus] == [True, None]
    assert fabric == {"0000:18:00": ("Completed", "Success"), "0000:2a:00": ("In Progress", None)}


def test_nvlink_status_counts_inactive_links(monkeypatch: pytest.MonkeyPatch) -> None:
    out = "GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-1d0c)\n\t Link 0: 25 GB/s\n\t Link 1: <inactive>\n\t Link 2: 25 GB/s\n"
    monkeypatch.setattr(fleetrun_gpu, "run_tool", lambda argv, timeout=8: (0, out))
    assert fleetrun_gpu.nvlinks() == {0: (2, 1)}


# -- untrusted answers, fleet-wide checks, faults during a run -------------------------------------


@pytest.mark.parametrize(
    "bad",
    [
        {"smi": True, "gpus": [{"index": -1, "uuid": "u", "bus_id": "b"}]},
        {"smi": True, "gpus": [{"index": 0, "uuid": "u", "bus_id": "b", "ecc_volatile": "2"}]},
        {"smi": True, "gpus": "many"},
        {"smi": True, "xids": [{"bus_id": "b", "code": 79}] * 100},
    ],
)
def test_malformed_answers_are_refused_with_the_field(bad: dict[str, Any]) -> None:
    with pytest.raises(ProtocolError):
        parse_gpu_health(bad)


def test_driver_and_cuda_differing_across_nodes_name_the_odd_node(tmp_path: Path) -> None:
    same = read(tmp_path / "a", {"count": 1, "driver": "550.54.15", "cuda": "12.4"})
    odd = read(tmp_path / "b", {"count": 1, "driver": "535.104.05", "cuda": "12.2"})
    verdicts = judge_fleet({"a": same, "b": odd, "c": same})
    assert not [v for v in verdicts["a"] if v.level != OK]
    assert [(v.level, v.message) for v in verdicts["b"] if v.level != OK] == [
        (WARN, "driver 535.104.05, other nodes 550.54.15"),
        (WARN, "CUDA 12.2, other nodes 12.4"),
    ]


def test_expected_counts_come_from_the_inventory_or_the_instance_type() -> None:
    assert gpu_health.expected_gpus(4, "p5.48xlarge") == 4
    assert gpu_health.expected_gpus(None, "p5.48xlarge") == 8
    assert gpu_health.expected_gpus([2, 3], None) is None
    assert gpu_health.expected_fabric_devices("p5.48xlarge") == 32
    health = GpuHealth(smi=True, queried=True, xids=(), ib_devices=("efa_0",) * 3)
    assert (
        gpu_health.judge_node(health, None, None, 4)[0].message == "3 EFA/InfiniBand device(s) of 4 expected"
    )


def test_new_faults_name_gpu_and_code(tmp_path: Path) -> None:
    before = read(tmp_path / "a", {"count": 4}, full=False)
    gpus: list[dict[str, Any]] = [{} for _ in range(4)]
    gpus[2] = {"ecc_volatile": 1}
    gpus[3] = {"lost": True}
    after = read(tmp_path / "b", {"gpus": gpus, "xids": [XID79]}, full=False)
    assert new_faults(before, before) == []
    assert new_faults(before, after) == [
        ("gpu3", "GPU 3 (0000:48:00) gone from nvidia-smi's list"),
        ("gpu2", "uncorrectable ECC 0 -> 1 (volatile)"),
        ("gpu1", "Xid 79 at 14:02: GPU has fallen off the bus (drain)"),
    ]


def test_gpu_fault_rule_names_node_gpu_and_code_within_one_poll(tmp_path: Path) -> None:
    from launch.rules.recovery import classify
    from launch.rules.stoprules import NodeObservation, Observation, RuleState, StopRules, evaluate

    healthy = read(tmp_path / "a", {"count": 2}, full=False)
    gpus: list[dict[str, Any]] = [{}, {"lost": True}]
    faulty = read(tmp_path / "b", {"gpus": gpus, "xids": [XID79]}, full=False)
    rules, state = StopRules(), RuleState()

    def poll(now: float, b: GpuHealth) -> Any:
        nodes = (
            NodeObservation("a", "running", gpu_health=healthy),
            NodeObservation("b", "running", gpu_health=b),
        )
        return evaluate(rules, Observation(now=now, started_at=0.0, nodes=nodes), state)

    assert poll(1.0, healthy) is None and poll(2.0, healthy) is None
    decision = poll(3.0, faulty)
    assert decision is not None and (decision.rule, decision.outcome, decision.nodes) == (
        "gpu_fault",
        "failed",
        ("b",),
    )
    assert "b gpu1: GPU 1 (0000:28:00) gone from nvidia-smi's list" in decision.reason
    assert "b gpu1: Xid 79 at 14:02: GPU has fallen off the bus (drain)" in decision.reason
    loss = classify(decision, {}, 5.0)
    assert loss is not None and (loss.kind, loss.nodes) == ("gpu_fault", ("b",))
    off = RuleState()
    assert (
        evaluate(
            StopRules(gpu_fault=False),
            Observation(3.0, 0.0, (NodeObservation("b", "running", gpu_health=healthy),)),
            off,
        )
        is None
    )
    assert (
        evaluate(
            StopRules(gpu_fault=False),
            Observation(4.0, 0.0, (NodeObservation("b", "running", gpu_health=faulty),)),
            off,
        )
        is None
    )


def test_node_agent_answers_with_the_gpu_reading(tmp_path: Path) -> None:
    """The agent's poll answer carries the reader's counters (what ``gpu_fault`` compares)."""
    fakebin = install(tmp_path / "fakebin", {"count": 2, "gpus": [{"util": 40}, {"util": 60}]})
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    env = {**os.environ, "PATH": node_path(fakebin)}
    agent = NODELIB / "fleetrun_node.py"
    out = subprocess.run(
        [sys.executable, str(agent), "poll", str(run_dir), "0", "--no-heartbeat"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    from launch.nodelib.fleetrun_protocol import PollAnswer

    answer = PollAnswer.from_json(out.stdout.strip())
    assert answer.gpu_util == 50.0
    health = gpu_health.gpu_reading(answer.gpu)
    assert health is not None and [g.util for g in health.gpus] == [40.0, 60.0]
    assert gpu_health.gpu_reading({"smi": True, "gpus": "garbage"}) is None


def test_energy_is_power_over_time_per_node_and_gaps_are_not_counted() -> None:
    from launch.rules.gpu_health import EnergyMeter, GpuFacts

    def at(watts: float) -> GpuHealth:
        return GpuHealth(
            smi=True,
            queried=True,
            gpus=(GpuFacts(0, "u0", "b0", power_w=watts), GpuFacts(1, "u1", "b1", power_w=watts)),
        )

    meter = EnergyMeter()
    assert meter.kwh is None
    meter.add("a", 0.0, at(300.0))
    meter.add("a", 10.0, at(500.0))  # 10 s between 600 W and 1000 W: 8000 J
    meter.add("b", 5.0, at(100.0))
    meter.add("b", 500.0, at(100.0))  # a gap of 495 s (unreachable meanwhile): not counted
    meter.add("c", 1.0, GpuHealth(smi=True, queried=True))
    assert meter.joules == 8000.0 and meter.kwh == 8000.0 / 3.6e6
