"""GPU health against REAL output: the captures of ``tests/gpu_captures`` (each with its SOURCE),
read the way a node reads them, judged to the verdict NVIDIA documents for them.

* ``nvidia-smi -q`` reports (GeForce RTX 3090 on 535, A10 on 550, H100 SXM on 565, an A100 excerpt
  on 510 with a row remapping pending): the reader runs in its own Python, as on a node, with the
  stand-in ``nvidia-smi`` replaying the capture verbatim and refusing every command no capture
  answers (``--query-gpu`` included), so the facts come from the report itself.
* a ``--query-gpu`` capture from driver 570 that asked ``clocks_throttle_reasons.*`` and was answered
  under ``clocks_event_reasons.*``: read by position, not refused for its header.
* kernel logs in ``dmesg``'s, ``journalctl``'s and syslog's formats: Xids judged from NVIDIA's
  catalogue.
* the NVML path: a fake ``pynvml`` (``tests/fake_nvml``) serving the facts of the same reports.

Where a test changes a capture (an uncorrectable ECC error written into the H100's report) it says
so: those are derived from the capture, never presented as captured.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from launch.nodelib import fleetrun_gpu, fleetrun_node
from launch.rules import gpu_health
from launch.rules.gpu_health import (
    BAD,
    OK,
    UNKNOWN,
    WARN,
    GpuFacts,
    GpuHealth,
    XidEvent,
    judge_fleet,
    new_faults,
    parse_gpu_health,
)
from launch.rules.xid_catalog import CATALOGUE, xid_meaning
from tests.gpustandin import CAPTURES, install, node_path, replay

NODELIB = Path(fleetrun_gpu.__file__).resolve().parent
FAKE_NVML = Path(__file__).resolve().parent / "fake_nvml"
H100 = "smi-q/h100-sxm-565.57.01"


def h100_with_ecc(errors: int) -> str:
    """The H100 capture DERIVED: ``errors`` uncorrectable DRAM errors since the driver loaded."""
    text = (CAPTURES / H100 / "output.txt").read_text()
    volatile = text.index("        Volatile\n")
    at = text.index("DRAM Uncorrectable            : 0", volatile)
    return (
        text[:at]
        + f"DRAM Uncorrectable            : {errors}"
        + text[at + len("DRAM Uncorrectable            : 0") :]
    )


def read_node(folder: Path, scenario: dict[str, Any], full: bool = True) -> GpuHealth:
    """The node's reader in its own Python, the stand-ins first on PATH (no pynvml there)."""
    install(folder, scenario)
    env = {**os.environ, "PATH": node_path(folder)}
    code = (
        f"import sys, json; sys.path.insert(0, {str(NODELIB)!r}); import fleetrun_gpu;"
        f" print(json.dumps(fleetrun_gpu.read_health({full})))"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return parse_gpu_health(json.loads(out.stdout))


def verdicts(health: GpuHealth) -> dict[str, tuple[str, str]]:
    return {v.label: (v.level, v.message) for v in judge_fleet({"n": health})["n"]}


# -- nvidia-smi -q reports ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("capture", "level", "message"),
    [
        (H100, OK, "NVIDIA H100 80GB HBM3, PCIe gen5 x16, no uncorrectable ECC, 30 C, 101 W"),
        ("smi-q/a10-550.90.12", OK, "NVIDIA A10, PCIe gen1 x16, no uncorrectable ECC, 33 C, 16 W"),
        # no ECC on a GeForce card: healthy on ECC; persistence mode off is fleetrun's own warning
        ("smi-q/rtx3090-535.154.05", WARN, "persistence mode off"),
        (
            "smi-q/a100-sxm4-510.73.08-remap-pending",
            BAD,
            "row remapping pending (reset the GPU); unknown: clock events (not in nvidia-smi -q's report),"
            " pcie (not in nvidia-smi -q's report)",
        ),
    ],
)
def test_each_report_capture_reads_to_its_documented_verdict(
    tmp_path: Path, capture: str, level: str, message: str
) -> None:
    folder = tmp_path / "fakebin"
    health = read_node(folder, replay(folder, q=capture))
    assert health.reader == "nvidia-smi -q" and health.queried and len(health.gpus) == 1
    found = verdicts(health)
    assert found["gpu0"] == (level, message)
    driver = (CAPTURES / capture / "SOURCE").read_text().split("driver: ", 1)[1].split()[0]
    assert health.driver == driver
    assert found["gpu-health"][1].endswith("read through nvidia-smi -q (pynvml not installed)")


def test_the_geforce_card_has_no_ecc_and_says_so_instead_of_unknown(tmp_path: Path) -> None:
    folder = tmp_path / "fakebin"
    health = read_node(folder, replay(folder, q="smi-q/rtx3090-535.154.05"))
    gpu = health.gpus[0]
    assert gpu.ecc_volatile is None and "ecc" in gpu.unsupported and gpu.unread == ()
    assert "ECC" not in verdicts(health)["gpu0"][1]


def test_an_uncorrectable_ecc_error_in_the_h100_report_is_bad(tmp_path: Path) -> None:
    folder = tmp_path / "fakebin"
    health = read_node(folder, replay(folder, q=H100, text=h100_with_ecc(1)))
    assert verdicts(health)["gpu0"] == (BAD, "uncorrectable ECC 1 (volatile)")


def test_gpu_fault_fires_on_ecc_0_to_1_read_from_a_post_535_nvidia_smi_report(tmp_path: Path) -> None:
    """The stop rule on two readings of the H100 (driver 565) report: as captured, then DERIVED
    with one uncorrectable error."""
    from launch.rules.stoprules import NodeObservation, Observation, RuleState, StopRules, evaluate

    before = read_node(tmp_path / "a", replay(tmp_path / "a", q=H100))
    after = read_node(tmp_path / "b", replay(tmp_path / "b", q=H100, text=h100_with_ecc(1)))
    assert new_faults(before, after) == [("gpu0", "uncorrectable ECC 0 -> 1 (volatile)")]
    state = RuleState()

    def poll(now: float, health: GpuHealth) -> Any:
        nodes = (NodeObservation("h100", "running", gpu_health=health),)
        return evaluate(StopRules(), Observation(now=now, started_at=0.0, nodes=nodes), state)

    assert poll(1.0, before) is None
    decision = poll(2.0, after)
    assert decision is not None and decision.rule == "gpu_fault"
    assert "h100 gpu0: uncorrectable ECC 0 -> 1 (volatile)" in decision.reason


# -- --query-gpu by position ----------------------------------------------------------------------

GB200 = CAPTURES / "query-csv" / "gb200-570.26-throttle-names"


def test_a_query_answered_under_the_535_names_is_read_by_position() -> None:
    """Driver 570 answered a query for ``clocks_throttle_reasons.*`` with ``clocks_event_reasons.*``
    headers. The reader takes each column by its position in the query: this fails if it compares
    the header with the query (the answer would count as refused and the reader fall back)."""
    fields = tuple((GB200 / "query.txt").read_text().strip().split(","))
    text = (GB200 / "output.csv").read_text()
    header = [h.split(" [")[0] for h in text.splitlines()[0].split(", ")]
    assert header != list(fields)  # the capture's point: the names differ
    rows = fleetrun_gpu.parse_csv(text, fields)
    assert rows is not None and len(rows) == 5
    assert [r["pci.bus_id"] for r in rows][:2] == ["00000019:01:00.0", "00000008:01:00.0"]
    assert {r["clocks_throttle_reasons.hw_slowdown"] for r in rows} == {"Not Active"}
    assert [fleetrun_gpu.number(r["power.draw"]) for r in rows][0] == 518.42


def test_the_reader_does_not_fall_back_on_the_renamed_header(monkeypatch: pytest.MonkeyPatch) -> None:
    """``ask_fields`` as the reader runs it, nvidia-smi answering with the capture: the first
    answer is the one used, nothing refused, nothing asked again."""
    fields = tuple((GB200 / "query.txt").read_text().strip().split(","))
    asked: list[str] = []

    def tool(argv: list[str], timeout: float | None = None, with_errors: bool = False) -> Any:
        asked.append(argv[1])
        if argv[1] == "--query-gpu=" + ",".join(fields):
            return 0, (GB200 / "output.csv").read_text(), ""
        return 2, 'Field "x" is not a valid field to query.\n', ""

    monkeypatch.setattr(fleetrun_gpu, "run_tool", tool)
    rows, refused = fleetrun_gpu.ask_fields(fields)
    assert rows is not None and len(rows) == 5 and refused == {} and len(asked) == 1
    # keyed by the current names: clocks_throttle_reasons.* asked, clocks_event_reasons.* read
    assert rows[0]["clocks_event_reasons.sw_power_cap"] == "Not Active"


def test_the_stand_in_answers_a_query_only_with_the_capture_made_for_it(tmp_path: Path) -> None:
    folder = tmp_path / "fakebin"
    (folder).mkdir()
    (folder / "gb200.csv").write_bytes((GB200 / "output.csv").read_bytes())
    fields = (GB200 / "query.txt").read_text().strip()
    install(folder, {"replay": {"query": {"fields": fields, "file": "gb200.csv"}}})
    env = {**os.environ, "PATH": node_path(folder)}
    same = subprocess.run(
        ["nvidia-smi", f"--query-gpu={fields}", "--format=csv"], env=env, capture_output=True, check=False
    )
    assert same.returncode == 0 and same.stdout == (GB200 / "output.csv").read_bytes()
    other = subprocess.run(
        ["nvidia-smi", "--query-gpu=index,uuid", "--format=csv"], env=env, capture_output=True, check=False
    )
    assert other.returncode == 2 and other.stdout == b"" and b"no capture answers" in other.stderr


# -- kernel logs: Xids from NVIDIA's catalogue -------------------------------------------------------


@pytest.mark.parametrize(
    ("capture", "level", "message"),
    [
        (
            "kernel/dmesg-390-gtx550ti-xid32",
            WARN,
            "Xid 32: Invalid or corrupted push buffer stream (application error)",
        ),
        ("kernel/journal-short-pop-os-xid79", BAD, "Xid 79: GPU has fallen off the bus (drain)"),
        ("kernel/syslog-pastebin-xid31", WARN, "Xid 31: GPU memory page fault (application error)"),
        ("kernel/readme-560-xid79", BAD, "Xid 79: GPU has fallen off the bus (drain)"),
        ("kernel/ml-engineering-xid63", WARN, "Xid 63: GPU memory remapping event"),
    ],
)
def test_each_kernel_log_capture_to_its_catalogue_verdict(capture: str, level: str, message: str) -> None:
    events = fleetrun_gpu.parse_xids((CAPTURES / capture / "output.txt").read_text())
    assert events
    xids = tuple(XidEvent(e["bus_id"], e["code"], e["at"], e["text"]) for e in events)
    gpu = GpuFacts(index=0, uuid="GPU-x", bus_id=xids[0].bus_id, ecc_volatile=0, ecc_aggregate=0)
    verdict = gpu_health.judge_gpu(gpu, xids[-1:], True)
    assert (verdict.level, verdict.message) == (level, message)


def test_an_iso_dmesg_line_keeps_its_time(tmp_path: Path) -> None:
    """``dmesg --time-format iso`` is what the reader asks: the line's own time is kept (the
    captures above are in other formats, which carry no ISO time: ``at`` is None there)."""
    line = (
        "2026-11-25T14:02:11,118000+00:00 NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus."
    )
    assert fleetrun_gpu.parse_xids(line)[0]["at"] == "2026-11-25T14:02:11"  # self-written line


def test_the_catalogue_is_complete_and_judges_by_nvidias_buckets() -> None:
    assert sorted(CATALOGUE) == list(range(1, 173))
    assert (xid_meaning(48).level, xid_meaning(48).action) == (BAD, "reset")
    assert (xid_meaning(79).level, xid_meaning(79).action) == (BAD, "drain")
    assert (xid_meaning(95).level, xid_meaning(95).action) == (BAD, "reset")
    assert (xid_meaning(94).level, xid_meaning(94).action) == (WARN, "application error")
    assert (xid_meaning(13).level, xid_meaning(13).action) == (WARN, "application error")
    assert (xid_meaning(54).level, xid_meaning(54).action) == (BAD, "replace")
    for code in (119, 120, 140, 143, 155, 158):
        assert xid_meaning(code).level == BAD, code


@pytest.mark.parametrize(
    ("code", "text", "level", "action"),
    [
        # SELF-WRITTEN lines in the layout NVIDIA's "XID 144-150 Decode" sheet describes (unit,
        # Fatal/Nonfatal, link, registers): no public capture of these was found
        (144, "SAW_MVB Fatal XC0 i0 Link 00 (0x00000001 0x00000002 0x00000000 0x00000000)", BAD, "reset"),
        (144, "SAW_MVB Nonfatal XC0 i0 Link 00 (0x00000001 0x00000001 0x00000000 0x00000000)", WARN, "none"),
        (145, "RLW_REMAP Fatal XC0 i0 Link 00 (0x00000004 0x00000040 0x00000000 0x00000000)", BAD, "reset"),
        (
            149,
            "NETIR_LINK_EVT Fatal XC0 i0 Link 07 (0x00000001 0x00000000 0x00000000 0x00000000)",
            BAD,
            "reset",
        ),
        (
            150,
            "MSE_WATCHDOG Nonfatal XC0 i0 Link -1 (0x00000001 0x00000000 0x00000000 0x00000000)",
            WARN,
            "none",
        ),
        (154, "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)", BAD, "reset"),
        (154, "GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)", BAD, "drain"),
        (154, "GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)", WARN, "none"),
    ],
)
def test_the_newest_xids_are_judged_by_their_own_line(code: int, text: str, level: str, action: str) -> None:
    meaning = xid_meaning(code, text)
    assert (meaning.level, meaning.action) == (level, action)


def test_an_xid_not_in_the_catalogue_is_a_warning_naming_the_code() -> None:
    xid = XidEvent("0000:3b:00", 999, None, "something new")
    verdict = gpu_health.judge_gpu(GpuFacts(0, "GPU-x", "0000:3b:00", ecc_volatile=0), (xid,), True)
    assert verdict.level == WARN
    assert verdict.message == "Xid 999: not in NVIDIA's Xid catalogue (something new)"


# -- NVML: a fake pynvml serving the captures' facts ------------------------------------------------


@pytest.fixture
def nvml(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    """The fake ``pynvml`` importable, and this process as a node without nvidia-smi or a kernel
    log (an empty PATH folder): every GPU fact must come through NVML."""
    monkeypatch.syspath_prepend(str(FAKE_NVML))
    sys.modules.pop("pynvml", None)
    module = importlib.import_module("pynvml")
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    # the reader keeps NVML open for its process: this test's fake, and none after it
    monkeypatch.setitem(fleetrun_gpu._nvml_open, "module", None)
    yield module
    sys.modules.pop("pynvml", None)


def nvml_read(module: Any, text: str) -> GpuHealth:
    module.MACHINE = module.load_report(text)
    return parse_gpu_health(json.loads(json.dumps(fleetrun_gpu.read_health(full=False))))


def test_nvml_reads_the_h100_report_as_healthy(nvml: Any) -> None:
    health = nvml_read(nvml, (CAPTURES / H100 / "output.txt").read_text())
    assert health.reader == "nvml" and health.driver == "565.57.01" and health.cuda == "12.7"
    gpu = health.gpus[0]
    assert (gpu.bus_id, gpu.ecc_volatile, gpu.remap_pending, gpu.pcie_gen, gpu.power_w) == (
        "0000:18:00",
        0,
        False,
        5,
        100.89,
    )
    assert set(gpu.unsupported) == {"retired_pages", "nvlink"}  # N/A in the report; no links in -q
    found = verdicts(health)
    assert found["gpu0"] == (OK, "NVIDIA H100 80GB HBM3, PCIe gen5 x16, no uncorrectable ECC, 30 C, 101 W")
    assert "read through NVML" in found["gpu-health"][1] and health.answered == "NVML"


def test_nvml_not_supported_ecc_on_the_geforce_card_is_healthy_on_ecc(nvml: Any) -> None:
    health = nvml_read(nvml, (CAPTURES / "smi-q/rtx3090-535.154.05" / "output.txt").read_text())
    gpu = health.gpus[0]
    assert "ecc" in gpu.unsupported and gpu.unread == ()
    assert verdicts(health)["gpu0"] == (WARN, "persistence mode off")


def test_an_nvml_read_that_fails_is_unknown_with_nvmls_reason(nvml: Any) -> None:
    nvml.MACHINE = nvml.load_report((CAPTURES / H100 / "output.txt").read_text())
    nvml.MACHINE["gpus"][0]["ecc_volatile"] = nvml.NVMLError(999)
    health = parse_gpu_health(fleetrun_gpu.read_health(full=False))
    assert health.gpus[0].unread == (("ecc", "NVML: Unknown Error"),)
    level, message = verdicts(health)["gpu0"]
    assert level == UNKNOWN and message.endswith("unknown: ECC (NVML: Unknown Error)")


def test_nvml_is_initialised_once_for_the_process(nvml: Any) -> None:
    """The node agent reads every second: NVML is opened at the first read and kept."""
    nvml.CALLS.clear()
    for _ in range(3):
        nvml_read(nvml, (CAPTURES / H100 / "output.txt").read_text())
    assert nvml.CALLS == ["nvmlInit"]


def test_gpu_fault_fires_on_ecc_0_to_1_read_through_nvml(nvml: Any) -> None:
    from launch.rules.stoprules import NodeObservation, Observation, RuleState, StopRules, evaluate

    before = nvml_read(nvml, (CAPTURES / H100 / "output.txt").read_text())
    after = nvml_read(nvml, h100_with_ecc(1))
    assert new_faults(before, after) == [("gpu0", "uncorrectable ECC 0 -> 1 (volatile)")]
    state = RuleState()
    nodes = (NodeObservation("h100", "running", gpu_health=before),)
    assert evaluate(StopRules(), Observation(now=1.0, started_at=0.0, nodes=nodes), state) is None
    nodes = (NodeObservation("h100", "running", gpu_health=after),)
    decision = evaluate(StopRules(), Observation(now=2.0, started_at=0.0, nodes=nodes), state)
    assert decision is not None and decision.rule == "gpu_fault"
    assert "h100 gpu0: uncorrectable ECC 0 -> 1 (volatile)" in decision.reason


class _OneRound(Exception):
    """Raised from the background reader's sleep: ends its loop after one reading."""


def background_round(monkeypatch: pytest.MonkeyPatch, reader: Any) -> GpuHealth | None:
    """One round of the node agent's background GPU reader (the thread's loop, run here until
    its first sleep), then what a poll answer carries, as the watcher reads it."""

    def stop(_seconds: float) -> None:
        raise _OneRound

    # the agent's own name for ``time`` replaced, not the time module the reads share
    monkeypatch.setattr(fleetrun_node, "time", SimpleNamespace(monotonic=time.monotonic, sleep=stop))
    with pytest.raises(_OneRound):
        reader()
    return gpu_health.gpu_reading(json.loads(json.dumps(fleetrun_node.gpu_reading())))


@pytest.fixture
def agent(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The node agent's GPU cache fresh for this test, and the threads ``start_gpu_reader``
    starts recorded (their targets), not run: the test runs their loop itself."""
    for key, value in {"at": 0.0, "reading": None, "background": False}.items():
        monkeypatch.setitem(fleetrun_node._gpu_cache, key, value)
    started: list[Any] = []

    class Recorded:
        def __init__(self, target: Any, name: str, daemon: bool) -> None:
            self.target = target

        def start(self) -> None:
            started.append(self.target)

    # the agent's own name for ``threading`` replaced: the reads still start threads of their own
    monkeypatch.setattr(fleetrun_node, "threading", SimpleNamespace(Thread=Recorded))
    return started


def test_the_background_reader_starts_on_nvml_without_nvidia_smi_and_gpu_fault_fires(
    nvml: Any, agent: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    from launch.rules.stoprules import NodeObservation, Observation, RuleState, StopRules, evaluate

    assert fleetrun_gpu.reader_available() == ("nvml", None)
    assert fleetrun_node.start_gpu_reader() is None
    assert len(agent) == 1 and fleetrun_node._gpu_cache["background"] is True
    nvml.MACHINE = nvml.load_report((CAPTURES / H100 / "output.txt").read_text())
    before = background_round(monkeypatch, agent[0])
    nvml.MACHINE = nvml.load_report(h100_with_ecc(1))
    after = background_round(monkeypatch, agent[0])
    assert before is not None and after is not None and after.reader == "nvml"
    state = RuleState()
    nodes = (NodeObservation("h100", "running", gpu_health=before),)
    assert evaluate(StopRules(), Observation(now=1.0, started_at=0.0, nodes=nodes), state) is None
    nodes = (NodeObservation("h100", "running", gpu_health=after),)
    decision = evaluate(StopRules(), Observation(now=2.0, started_at=0.0, nodes=nodes), state)
    assert decision is not None and decision.rule == "gpu_fault"
    assert "h100 gpu0: uncorrectable ECC 0 -> 1 (volatile)" in decision.reason


def test_without_nvml_or_nvidia_smi_the_background_reader_does_not_start_and_says_why(
    agent: list[Any], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    monkeypatch.setitem(fleetrun_gpu._nvml_open, "module", None)
    why = "no GPU reader: pynvml not installed and no nvidia-smi on PATH"
    assert fleetrun_gpu.reader_available() == (None, why)
    assert fleetrun_node.start_gpu_reader() == why
    assert agent == [] and fleetrun_node._gpu_cache["background"] is False
    assert fleetrun_node.gpu_reading() is None


def test_with_nvidia_smi_only_the_background_reader_starts(
    agent: list[Any], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    folder = tmp_path / "fakebin"
    install(folder, {"count": 1})
    monkeypatch.setenv("PATH", node_path(folder))
    monkeypatch.setitem(sys.modules, "pynvml", None)
    monkeypatch.setitem(fleetrun_gpu._nvml_open, "module", None)
    assert fleetrun_gpu.reader_available() == ("nvidia-smi", None)
    assert fleetrun_node.start_gpu_reader() is None and len(agent) == 1


def test_without_pynvml_the_reader_says_why_and_reads_nvidia_smi(tmp_path: Path) -> None:
    folder = tmp_path / "fakebin"
    health = read_node(folder, {"count": 1}, full=False)
    assert (health.reader, health.reader_note) == ("nvidia-smi", "pynvml not installed")
    assert health.readers == "nvidia-smi (pynvml not installed)"


def test_a_pre_535_driver_gets_the_old_names_in_one_more_call(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The stand-in as driver 470 (it knows only ``clocks_throttle_reasons.*``, as drivers before
    535 did): the first refusal switches the whole family to the old names, one call more."""
    folder = tmp_path / "fakebin"
    install(folder, {"count": 1, "driver": "470.103.01", "gpus": [{"throttle": ["hw_slowdown"]}]})
    monkeypatch.setenv("PATH", node_path(folder))
    calls: list[list[str]] = []
    real = fleetrun_gpu.run_tool

    def counted(argv: list[str], timeout: float | None = None, with_errors: bool = False) -> Any:
        calls.append(argv)
        return real(argv, timeout, with_errors)

    monkeypatch.setattr(fleetrun_gpu, "run_tool", counted)
    gpus, driver, health = fleetrun_gpu.query_gpus()
    assert driver == "470.103.01" and health is True and len(calls) == 2
    assert gpus is not None and gpus[0]["throttle"]["hw_slowdown"] is True


@pytest.mark.parametrize(
    ("bad", "field"),
    [
        ({"reader": "nvidia-smi; rm -rf /"}, "reader"),
        (
            {"gpus": [{"index": 0, "uuid": "GPU-x", "bus_id": "0000:01:00", "unsupported": ["ecc", "root"]}]},
            "unsupported",
        ),
        (
            {"gpus": [{"index": 0, "uuid": "GPU-x", "bus_id": "0000:01:00", "unread": {"ecc": 7}}]},
            "unread.ecc",
        ),
        ({"gpus": [{"index": 0, "uuid": "GPU-x", "bus_id": "0000:01:00", "unread": ["ecc"]}]}, "unread"),
    ],
)
def test_a_malformed_reader_part_is_refused_naming_the_field(bad: dict[str, Any], field: str) -> None:
    from launch.nodelib.fleetrun_wire import ProtocolError

    with pytest.raises(ProtocolError, match=field):
        parse_gpu_health({"smi": True, "queried": True, **bad})


def test_a_reason_from_the_node_is_shown_not_obeyed() -> None:
    health = parse_gpu_health(
        {
            "smi": True,
            "queried": True,
            "reader": "nvidia-smi",
            "reader_note": "no \x1b[31mpynvml",
            "gpus": [
                {"index": 0, "uuid": "GPU-x", "bus_id": "0000:01:00", "unread": {"ecc": "x\x1b[2Jy" * 100}}
            ],
        }
    )
    assert "\x1b" not in health.readers and "\\x1b" in health.readers
    why = health.gpus[0].why_unread("ecc")
    assert why is not None and "\x1b" not in why and len(why) <= 4 * fleetrun_gpu.MAX_TEXT


NVLINK = CAPTURES / "nvlink" / "h100-pcie-bridged" / "output.txt"


def nvlink_health(text: str, monkeypatch: pytest.MonkeyPatch) -> GpuHealth:
    """Two H100 PCIe GPUs, their NVLinks as ``nvlink --status`` printed them (``text``)."""
    monkeypatch.setattr(fleetrun_gpu, "run_tool", lambda argv, timeout=None: (0, text))
    links = fleetrun_gpu.nvlinks()
    gpus = tuple(
        GpuFacts(
            i,
            f"GPU-{i}",
            f"0000:0{i}:00",
            name="NVIDIA H100 PCIe",
            ecc_volatile=0,
            ecc_aggregate=0,
            nvlink_active=links[i][0],
            nvlink_inactive=links[i][1],
        )
        for i in (0, 1)
    )
    return GpuHealth(smi=True, queried=True, health_fields=True, gpus=gpus, xids=())


def test_bridged_h100_pcie_with_12_of_18_links_on_every_gpu_is_healthy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    found = verdicts(nvlink_health(NVLINK.read_text(), monkeypatch))
    assert found["gpu0"] == (OK, "NVIDIA H100 PCIe, no uncorrectable ECC, 12 of 18 NVLinks")
    assert found["gpu1"][0] == OK


def test_a_gpu_with_fewer_active_links_than_its_peer_is_bad(monkeypatch: pytest.MonkeyPatch) -> None:
    """DERIVED from the capture: GPU 1's link 0 down."""
    text = NVLINK.read_text()
    at = text.index("GPU 1:")
    text = text[:at] + text[at:].replace("Link 0: 26.562 GB/s", "Link 0: <inactive>", 1)
    found = verdicts(nvlink_health(text, monkeypatch))
    assert found["gpu0"][0] == OK
    assert found["gpu1"] == (BAD, "7 of 18 NVLinks inactive (the node's other GPUs have 12 active)")


def test_a_node_with_nvml_and_no_nvidia_smi_has_gpus_and_their_processes(
    nvml: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The probe (``fab doctor``, preflight) asks the same reader as the agent: a node whose GPUs
    NVML reads but which has no ``nvidia-smi`` binary (the nvml fixture's empty PATH) lists its
    GPUs and the compute processes on them, instead of "no nvidia-smi: no GPUs"."""
    from launch.nodelib import fleetrun_probe
    from launch.rules.probe_facts import parse_probe_answer

    monkeypatch.setattr(fleetrun_probe, "fleetrun_gpu", fleetrun_gpu)
    nvml.MACHINE = nvml.load_report((CAPTURES / H100 / "output.txt").read_text())
    assert nvml.MACHINE["gpus"][0]["processes"] == [], "the capture's 'Processes : None'"
    nvml.MACHINE["gpus"][0]["processes"] = [
        {"pid": os.getpid(), "usedGpuMemory": 512 * 1024 * 1024},
        {"pid": -4, "usedGpuMemory": 1},  # not a process id: dropped
        {"pid": 1, "usedGpuMemory": None},  # NVML cannot attribute the memory (MIG, a container)
    ]
    health = fleetrun_gpu.read_health(full=False)
    facts = fleetrun_probe.gpu_facts(health, fleetrun_probe.gpu_processes())
    assert facts["nvidia_smi"] is True and facts["driver"] == "565.57.01"
    uuid = nvml.MACHINE["gpus"][0]["uuid"]
    assert facts["gpus"] == [{"index": 0, "uuid": uuid}]
    assert [(p["gpu"], p["pid"], p["mem_mib"]) for p in facts["gpu_procs"]] == [
        (uuid, os.getpid(), 512),
        (uuid, 1, None),
    ]
    probe = parse_probe_answer(
        json.dumps({"v": 1, "mode": "full", "python": "3.11.2", "time": time.time(), **facts})
    )
    assert probe.nvidia_smi and len(probe.gpus) == 1 and len(probe.gpu_procs) == 2
