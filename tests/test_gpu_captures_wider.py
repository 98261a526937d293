"""GPU health against more REAL output (``tests/gpu_captures``, each with its SOURCE): drivers the
first captures did not cover (590, 595, 610), a MIG-enabled H100, ``--query-gpu`` tables full of
``[N/A]``, read the way a node reads them (the stand-in ``nvidia-smi`` replaying each capture
verbatim, the reader in its own Python: see ``test_gpu_captures``).

Where a test changes a capture it says so (DERIVED): those are never presented as captured.
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
from launch.rules import gpu_diag
from launch.rules.gpu_health import (
    BAD,
    OK,
    UNKNOWN,
    WARN,
    GpuFacts,
    GpuHealth,
    XidEvent,
    judge_node,
    parse_gpu_health,
)
from tests.gpustandin import CAPTURES, install, node_path, replay, write_scenario
from tests.test_gpu_captures import NODELIB, nvml, read_node, verdicts

__all__ = ["nvml"]  # the fake pynvml fixture, shared with test_gpu_captures

H100_MIG = "smi-q/h100-mig-590.48.01"
RTX_610 = "smi-q/rtx2080super-610.57.04"
H100 = "smi-q/h100-sxm-565.57.01"
GB200 = CAPTURES / "query-csv" / "gb200-570.26-throttle-names"


def source_field(capture: str, name: str) -> str:
    return (CAPTURES / capture / "SOURCE").read_text().split(f"{name}: ", 1)[1].split()[0]


@pytest.mark.parametrize(
    ("capture", "level", "message"),
    [
        # driver 590 prints no "Power Draw": the instantaneous draw is read (444.72 W)
        (H100_MIG, OK, "NVIDIA H100 80GB HBM3, PCIe gen5 x16, no uncorrectable ECC, 53 C, 445 W"),
        (RTX_610, WARN, "persistence mode off"),
        ("smi-q/l40s-595.80", WARN, "persistence mode off"),
    ],
)
def test_each_newer_driver_report_reads_to_its_documented_verdict(
    tmp_path: Path, capture: str, level: str, message: str
) -> None:
    folder = tmp_path / "fakebin"
    health = read_node(folder, replay(folder, q=capture))
    assert health.reader == "nvidia-smi -q" and len(health.gpus) == 1
    assert verdicts(health)["gpu0"] == (level, message)
    assert health.driver == source_field(capture, "driver")
    assert health.gpus[0].power_w is not None and health.gpus[0].why_unread("power") is None


def test_a_mig_enabled_h100_is_one_gpu_with_its_own_ecc_and_no_utilisation(tmp_path: Path) -> None:
    """Four ``MIG Device`` blocks, each with an ``ECC Errors`` block of its own, sit inside the
    GPU's block: the GPU is still one GPU, its ECC the GPU's own counters; ``Remapped Rows : N/A``
    and ``Utilization/GPU : N/A`` are not faults."""
    folder = tmp_path / "fakebin"
    health = read_node(folder, replay(folder, q=H100_MIG))
    (gpu,) = health.gpus
    assert (gpu.bus_id, gpu.ecc_volatile, gpu.ecc_aggregate, gpu.util) == ("0000:00:09", 0, 0, None)
    assert set(gpu.unsupported) == {"retired_pages", "remapped_rows"} and gpu.unread == ()
    assert (gpu.power_w, gpu.mem_used_mib, gpu.fabric_state) == (444.72, 11125.0, "Completed")


def test_driver_610s_power_line_and_its_deprecated_version_lines(tmp_path: Path) -> None:
    """Driver 610 nests the power limits under ``GPU Ceiling Power Limit`` and marks ``Driver
    Version`` and ``CUDA Version`` deprecated (``[Deprecated; will be removed in CUDA 14.0. Use KMD
    Version instead]``): the version is the word before the note."""
    folder = tmp_path / "fakebin"
    health = read_node(folder, replay(folder, q=RTX_610))
    assert (health.driver, health.cuda, health.gpus[0].power_w) == ("610.57.04", "13.3", 38.89)
    assert "ecc" in health.gpus[0].unsupported and health.gpus[0].ecc_volatile is None


def test_without_the_deprecated_lines_the_kmd_version_is_the_driver(tmp_path: Path) -> None:
    """DERIVED from the 610 capture: its ``Driver Version`` and ``CUDA Version`` lines removed, as
    the driver's own note says CUDA 14 will do; ``KMD Version`` and ``CUDA UMD Version`` remain."""
    text = (CAPTURES / RTX_610 / "output.txt").read_text()
    lines = [
        ln for ln in text.splitlines(keepends=True) if not ln.startswith(("Driver Version", "CUDA Version"))
    ]
    assert len(lines) == len(text.splitlines()) - 2
    folder = tmp_path / "fakebin"
    health = read_node(folder, replay(folder, q=RTX_610, text="".join(lines)))
    assert (health.driver, health.cuda) == ("610.57.04", "13.3")


# -- --query-gpu tables: the reader's own query answered out of a captured table --------------------


@pytest.mark.parametrize(
    ("q", "query", "level", "message"),
    [
        (
            H100_MIG,
            "query-csv/h100-mig-590.48.01",
            OK,
            "NVIDIA H100 80GB HBM3, PCIe gen5 x16, no uncorrectable ECC, 53 C, 434 W",
        ),
        (RTX_610, "query-csv/rtx2080super-610.57.04", WARN, "persistence mode off"),
    ],
)
def test_a_query_table_with_na_cells_reads_to_its_documented_verdict(
    tmp_path: Path, q: str, query: str, level: str, message: str
) -> None:
    """The stand-in answers the reader's ``--query-gpu`` with those columns of the captured table
    (made with every field the driver knows); ``-q`` with the same machine's report. ``[N/A]`` is
    a fact the GPU does not have (unsupported), never an error and never a GPU dropped."""
    folder = tmp_path / "fakebin"
    health = read_node(folder, replay(folder, q=q, query=query))
    assert health.reader == "nvidia-smi" and health.health_fields and len(health.gpus) == 1
    assert verdicts(health)["gpu0"] == (level, message)
    gpu = health.gpus[0]
    assert gpu.unread == ()
    if query.endswith("h100-mig-590.48.01"):
        assert set(gpu.unsupported) == {"retired_pages", "utilization"} and gpu.util is None
    else:
        assert set(gpu.unsupported) == {"ecc", "retired_pages"} and gpu.util == 0.0


# -- nvidia-smi that cannot list a GPU: its own words, replayed to every command ------------------

NO_GPU_LIST = "nvidia-smi gave no GPU list"


@pytest.mark.parametrize("stream", ["stdout", "stderr"])
@pytest.mark.parametrize(
    ("capture", "code", "level", "message"),
    [
        (
            "smi-error/no-devices-525-pytorch-ci",
            6,
            UNKNOWN,
            f'GPU health unknown: {NO_GPU_LIST}: "No devices were found"',
        ),
        (
            "smi-error/driver-not-loaded-460",
            9,
            UNKNOWN,
            f"GPU health unknown: {NO_GPU_LIST}: \"NVIDIA-SMI has failed because it couldn't communicate with"
            ' the NVIDIA driver. Make sure that the latest NVIDIA driver is installed and running."',
        ),
        (
            "smi-error/no-handle-unknown-error-docker",
            15,
            BAD,
            "GPU at PCI 0000:09:00: the driver cannot open it (Unknown Error); "
            f'{NO_GPU_LIST}: "Unable to determine the device handle for GPU 0000:09:00.0: Unknown Error"',
        ),
        (
            "smi-error/no-handle-unknown-error-tesla-p4",
            15,
            BAD,
            "GPU at PCI 0000:07:00: the driver cannot open it (Unknown Error); "
            f'{NO_GPU_LIST}: "Unable to determine the device handle for GPU0000:07:00.0: Unknown Error"',
        ),
        (
            "smi-error/no-handle-gpu-is-lost",
            15,
            BAD,
            "GPU at PCI 0000:02:00: the driver cannot open it (GPU is lost. Reboot the system to recover"
            f' this GPU); {NO_GPU_LIST}: "Unable to determine the device handle for GPU 0000:02:00.0: GPU is'
            ' lost. Reboot the system to recover this GPU"',
        ),
    ],
)
def test_nvidia_smis_complaint_reads_to_unknown_or_bad_never_healthy(
    tmp_path: Path, capture: str, code: int, level: str, message: str, stream: str
) -> None:
    """Every nvidia-smi command answers with the capture (on the stream the test names: most of
    these captures do not say which; the exit status is the captured one or ``man nvidia-smi``'s,
    as each SOURCE says). A GPU the driver names but cannot open is bad, named by its bus; no GPU
    listed is unknown with nvidia-smi's own reason, and bad when the node should have GPUs."""
    folder = tmp_path / "fakebin"
    health = read_node(folder, replay(folder, error=(capture, stream, code)))
    assert not health.queried and health.gpus == ()
    found = {v.label: (v.level, v.message) for v in judge_node(health)}
    assert found == {"gpu-health": (level, message)}
    assert judge_node(health, expected=4)[0].level == BAD


def test_a_gpu_lost_among_listed_ones_is_bad_without_an_expected_count(tmp_path: Path) -> None:
    """SCRIPTED (the stand-in's own rendering, not a capture): two GPUs, one lost. nvidia-smi lists
    the other and names the lost one on stderr; on a single node with no inventory count the list
    alone looked healthy (one GPU, nothing missing). The lost GPU is named by its bus."""
    folder = tmp_path / "fakebin"
    health = read_node(folder, {"gpus": [{}, {"lost": True}]})
    assert [g.index for g in health.gpus] == [0]
    line = verdicts(health)["gpu-health"]
    assert line[0] == BAD and line[1].startswith(
        "GPU at PCI 0000:28:00: the driver cannot open it (Unknown Error)"
    )


def test_a_node_whose_only_gpu_is_lost_is_not_a_healthy_node_without_gpus(tmp_path: Path) -> None:
    """SCRIPTED as above, one GPU and it lost: nvidia-smi prints its table's header and no row
    (0 GPUs listed, which read as a fine node with no GPU)."""
    folder = tmp_path / "fakebin"
    health = read_node(folder, {"gpus": [{"lost": True}]})
    assert health.queried and health.gpus == ()
    assert verdicts(health)["gpu-health"] == (
        BAD,
        "GPU at PCI 0000:18:00: the driver cannot open it (Unknown Error)",
    )


def test_nvml_names_the_gpu_it_counts_but_cannot_open(nvml: Any) -> None:
    """The NVML path (fake ``pynvml`` serving the H100 capture's facts), a second GPU SCRIPTED as
    lost (``nvmlDeviceGetHandleByIndex`` raises NVML_ERROR_GPU_IS_LOST): it was left out of the
    list in silence; it is named, with NVML's reason."""
    nvml.MACHINE = nvml.load_report((CAPTURES / "smi-q/h100-sxm-565.57.01" / "output.txt").read_text())
    nvml.MACHINE["gpus"].append({"lost": True})
    health = parse_gpu_health(json.loads(json.dumps(fleetrun_gpu.read_health(full=False))))
    assert health.reader == "nvml" and [g.index for g in health.gpus] == [0]
    found = verdicts(health)
    assert found["gpu-health"][0] == BAD
    assert found["gpu-health"][1].startswith("GPU 1: the driver cannot open it (NVML: GPU is lost)")


# -- a pre-535 report of eight GPUs, each in its own PCI domain ------------------------------------

A100_X8 = "smi-q/a100-sxm4-40gb-x8-460.32.03"
A100_BUSES = [
    "0001:00:00",
    "0002:00:00",
    "0003:00:00",
    "0004:00:00",
    "000b:00:00",
    "000c:00:00",
    "000d:00:00",
    "000e:00:00",
]


def test_eight_a100s_of_a_pre_535_report_each_in_its_own_pci_domain(tmp_path: Path) -> None:
    folder = tmp_path / "fakebin"
    health = read_node(folder, replay(folder, q=A100_X8))
    assert (health.driver, health.cuda) == ("460.32.03", "11.2")
    assert [g.bus_id for g in health.gpus] == A100_BUSES and [g.index for g in health.gpus] == list(range(8))
    found = verdicts(health)
    assert found["gpu-health"][0] == OK
    assert {found[f"gpu{i}"] for i in range(8)} == {(WARN, "persistence mode off")}
    gpu = health.gpus[0]
    assert (gpu.remap_pending, gpu.remap_failure, gpu.power_w, gpu.throttle) == (False, False, 55.63, ())
    assert gpu.unsupported == ("retired_pages",) and gpu.unread == ()


def test_a_remapping_failure_in_one_block_is_that_gpus_alone(tmp_path: Path) -> None:
    """DERIVED from the capture: the third GPU's (00000003:00:00.0) ``Remapping Failure Occurred``
    set to Yes. Only gpu2 is bad: the report's blocks are each their own GPU's."""
    text = (CAPTURES / A100_X8 / "output.txt").read_text()
    block = text.index("GPU 00000003:00:00.0")
    at = text.index("Remapping Failure Occurred        : No", block)
    text = (
        text[:at]
        + "Remapping Failure Occurred        : Yes"
        + text[at + len("Remapping Failure Occurred        : No") :]
    )
    folder = tmp_path / "fakebin"
    found = verdicts(read_node(folder, replay(folder, q=A100_X8, text=text)))
    assert found["gpu2"] == (BAD, "row remapping failed (the GPU needs repair); persistence mode off")
    assert {found[f"gpu{i}"][0] for i in (0, 1, 3, 4, 5, 6, 7)} == {WARN}


# -- kernel logs in other formats, several GPUs, NVLink Xids ---------------------------------------------


def kernel_node(capture: str) -> tuple[list[dict[str, Any]], dict[str, tuple[str, str]]]:
    """The capture's Xid lines as the reader parses them, judged on a node whose GPUs sit at the
    buses the lines name (in the order first named)."""
    events = fleetrun_gpu.parse_xids((CAPTURES / capture / "output.txt").read_text())
    buses = list(dict.fromkeys(e["bus_id"] for e in events))
    gpus = tuple(GpuFacts(i, f"GPU-{i}", bus, ecc_volatile=0, ecc_aggregate=0) for i, bus in enumerate(buses))
    xids = tuple(XidEvent(e["bus_id"], e["code"], e["at"], e["text"]) for e in events)
    health = GpuHealth(smi=True, queried=True, health_fields=True, gpus=gpus, xids=xids)
    return events, {v.label: (v.level, v.message) for v in judge_node(health)}


def test_xid_45_after_nvlink_errors_on_four_gpus_is_a_warning_on_each() -> None:
    events, found = kernel_node("kernel/journal-nvlink-xid45-after-149-145")
    assert len(events) == 7 and {e["code"] for e in events} == {45} and {e["at"] for e in events} == {None}
    assert [e["bus_id"] for e in events[:4]] == ["0000:dc:00", "0000:ed:00", "0000:ba:00", "0000:97:00"]
    assert found["gpu-health"][0] == OK
    for i in range(4):
        level, message = found[f"gpu{i}"]
        assert level == WARN and message.startswith("Xid 45: Preemptive cleanup, due to previous errors")
    assert found["gpu0"][1].count("Xid 45") == 2  # 0000:dc:00 logged it twice


def test_dmesg_ctime_lines_keep_their_xids_and_109_asks_for_a_reset() -> None:
    events, found = kernel_node("kernel/dmesg-ctime-gpud-xid13-109")
    assert [e["code"] for e in events] == [13, 13, 13, 109] and {e["bus_id"] for e in events} == {
        "0000:cb:00"
    }
    level, message = found["gpu0"]
    assert level == BAD and message.startswith("Xid 109: Context Switch Timeout Error (reset)")
    assert message.count("Xid 13: Graphics Engine Exception (application error)") == 3


def test_nvlink_xids_144_to_149_by_their_own_fatal_or_nonfatal_word() -> None:
    events, found = kernel_node("kernel/kmsg-gpud-nvlink-xid144-145-149")
    assert [(e["bus_id"], e["code"]) for e in events] == [
        ("0000:01:00", 144),
        ("0000:00:00", 149),
        ("0019:01:00", 149),
        ("0018:01:00", 145),
    ]
    assert found["gpu0"] == (WARN, "Xid 144: NVLINK: SAW Error")
    assert found["gpu1"] == (BAD, "Xid 149: NVLINK: NETIR Error (reset)")
    assert found["gpu2"] == (BAD, "Xid 149: NVLINK: NETIR Error (reset)")
    assert found["gpu3"] == (WARN, "Xid 145: NVLINK: RLW Error")


# -- DCGM: dcgmi's JSON as DCGM 2/3 printed it ----------------------------------------------------------

DCGM_HEALTH = "dcgm/health-healthy-virtualclient"
DCGM_DIAG = "dcgm/diag-r3-pass-virtualclient"


def dcgm_node(folder: Path, **replays: str) -> Path:
    """The stand-ins with ``dcgmi`` answering each command in ``replays`` with that capture."""
    install(folder, {"count": 1}, dcgm=True)
    answers = {}
    for command, capture in replays.items():
        name = f"capture-dcgmi-{command}.txt"
        (folder / name).write_bytes((CAPTURES / capture / "output.txt").read_bytes())
        answers[command] = name
    write_scenario(folder, {"count": 1, "dcgm": {"engine": True, "replay": answers}})
    return folder


def test_a_healthy_dcgm_2_health_report_adds_nothing_but_is_read(tmp_path: Path) -> None:
    folder = dcgm_node(tmp_path / "fakebin", health=DCGM_HEALTH)
    env = {**os.environ, "PATH": node_path(folder)}
    code = (
        f"import sys, json; sys.path.insert(0, {str(NODELIB)!r}); import fleetrun_gpu;"
        " print(json.dumps(fleetrun_gpu.read_health(False)))"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    health = parse_gpu_health(json.loads(out.stdout))
    assert health.dcgm is not None and (health.dcgm.state, health.dcgm.incidents) == ("ok", ())
    found = verdicts(health)
    assert found["gpu-health"][0] == OK and "DCGM health watches read" in found["gpu-health"][1]
    assert found["gpu0"][0] == OK


def dcgm_diag(folder: Path) -> gpu_diag.DiagReport:
    proc = subprocess.run(
        [sys.executable, "-", "diag", "3"],
        input=(NODELIB / "fleetrun_gpu.py").read_bytes(),
        env={**os.environ, "PATH": node_path(folder)},
        capture_output=True,
        check=True,
    )
    return gpu_diag.parse_diag(json.loads(proc.stdout.decode().strip().splitlines()[-1]))


def test_a_dcgm_2_level_3_diagnostic_that_passed(tmp_path: Path) -> None:
    report = dcgm_diag(dcgm_node(tmp_path / "fakebin", diag=DCGM_DIAG))
    assert (report.state, report.passed, report.skipped, report.failed) == ("ok", 15, 1, ())
    assert [v.level for v in gpu_diag.judge_diag(report)] == [OK]


def test_a_dcgm_2_failure_is_named_by_its_gpu_ids(tmp_path: Path) -> None:
    """DERIVED from the capture: Memory Bandwidth's result on GPU 0 set to Fail. DCGM 2 names a
    result's GPU ``gpu_ids``: the failure was read as no GPU's (the node's), not GPU 0's."""
    text = (CAPTURES / DCGM_DIAG / "output.txt").read_text()
    at = text.index('"name" : "Memory Bandwidth"')
    status = text.index('"status" : "Pass"', at)
    text = text[:status] + '"status" : "Fail"' + text[status + len('"status" : "Pass"') :]
    folder = dcgm_node(tmp_path / "fakebin", diag=DCGM_DIAG)
    (folder / "capture-dcgmi-diag.txt").write_text(text)
    report = dcgm_diag(folder)
    assert report.state == "ok" and len(report.failed) == 1
    failed = report.failed[0]
    assert (failed.test, failed.gpu, failed.status) == ("Memory Bandwidth", 0, "fail")
    lines = {v.label: v.level for v in gpu_diag.judge_diag(report)}
    assert lines["gpu0"] == BAD


# -- a pre-535 report with the old ECC layout and a retired page ---------------------------------------

V100 = "smi-q/v100-pcie-470.129.06-retired-page"


def derived(capture: str, old: str, new: str, after: str | None = None) -> str:
    """The capture with its first ``old`` (after ``after``, when given) replaced by ``new``."""
    text = (CAPTURES / capture / "output.txt").read_text()
    at = text.index(old, text.index(after) if after else 0)
    return text[:at] + new + text[at + len(old) :]


def test_a_v100_on_470_with_one_retired_page_and_corrected_errors_is_healthy(tmp_path: Path) -> None:
    """The old ECC layout (``Volatile/Double Bit/Total``), three corrected single-bit errors in the
    lifetime count and one page retired for them, nothing pending: healthy (NVIDIA's page
    retirement: a retired page is the repair; a pending one needs a reset)."""
    folder = tmp_path / "fakebin"
    health = read_node(folder, replay(folder, q=V100))
    gpu = health.gpus[0]
    assert (gpu.ecc_volatile, gpu.ecc_aggregate, gpu.retired_pending) == (0, 0, False)
    assert verdicts(health)["gpu0"] == (
        OK,
        "Tesla V100-PCIE-32GB, PCIe gen3 x16, no uncorrectable ECC, 29 C, 25 W",
    )


@pytest.mark.parametrize(
    ("old", "new", "after", "message"),
    [
        (
            "Pending Page Blacklist            : No",
            "Pending Page Blacklist            : Yes",
            None,
            "page retirement pending (reset the GPU)",
        ),
        (
            "Total                     : 0",
            "Total                     : 2",
            "Double Bit",
            "uncorrectable ECC 2 (volatile)",
        ),
    ],
)
def test_the_v100s_old_layout_faults_are_read(
    tmp_path: Path, old: str, new: str, after: str | None, message: str
) -> None:
    """DERIVED from the capture (one value changed each): a page pending retirement; two
    double-bit errors in the volatile count (the old layout's ``Double Bit/Total``)."""
    folder = tmp_path / "fakebin"
    health = read_node(folder, replay(folder, q=V100, text=derived(V100, old, new, after)))
    assert verdicts(health)["gpu0"] == (BAD, message)


# -- what the driver asks for a GPU: GPU Reset Status, GPU Recovery Action ----------------------------


@pytest.mark.parametrize(
    ("capture", "old", "new", "message"),
    [
        (
            "smi-q/h100-sxm-565.57.01",
            "GPU Recovery Action                   : None",
            "GPU Recovery Action                   : Node Reboot",
            "the driver asks: recovery action Node Reboot",
        ),
        (
            "smi-q/a10-550.90.12",
            "Reset Required                    : No",
            "Reset Required                    : Yes",
            "the driver asks: reset required",
        ),
        (
            H100_MIG,
            "Channel Repair Pending                         : No",
            "Channel Repair Pending                         : Yes",
            "the driver asks: channel repair pending",
        ),
        (
            H100_MIG,
            "Unrepairable Memory                            : No",
            "Unrepairable Memory                            : Yes",
            "the driver asks: unrepairable memory",
        ),
    ],
)
def test_a_recovery_the_driver_asks_for_makes_the_gpu_bad(
    tmp_path: Path, capture: str, old: str, new: str, message: str
) -> None:
    """Every capture says ``GPU Recovery Action : None``, ``Reset Required : No`` and (590)
    ``Channel Repair Pending`` / ``Unrepairable Memory : No`` (healthy, as the tests above read
    them). DERIVED: one changed to a request (``Node Reboot``: NVML's
    ``NVML_GPU_RECOVERY_ACTION_NODE_REBOOT``; ``Yes``). The reader ignored these lines; it now
    names any action other than None, and each Yes, as the driver wrote it."""
    folder = tmp_path / "fakebin"
    health = read_node(folder, replay(folder, q=capture, text=derived(capture, old, new)))
    level, said = verdicts(health)["gpu0"]
    assert level == BAD and said.startswith(message)
    assert health.gpus[0].recovery is not None


def test_no_recovery_asked_in_any_report_capture() -> None:
    """The report reader in this process (the read as a node does it is tested above, capture by
    capture): no real report asks for a recovery."""
    for path in sorted((CAPTURES / "smi-q").glob("*/output.txt")):
        _driver, _cuda, blocks = fleetrun_gpu.report_blocks(path.read_text())
        gpus = [fleetrun_gpu.gpu_from_report(i, bus, lines) for i, (bus, lines) in enumerate(blocks)]
        assert gpus and {g["recovery"] for g in gpus} == {None}, path.parent.name


# -- any capture as the answer to any command: never a crash, never a made-up healthy GPU ----------------

ALL_CAPTURES = sorted(
    str(p.parent.relative_to(CAPTURES)) for p in CAPTURES.glob("*/*/output.*") if p.suffix in (".txt", ".csv")
)


@pytest.mark.parametrize("capture", ALL_CAPTURES)
def test_any_capture_answering_every_nvidia_smi_command_is_read_without_a_crash(
    tmp_path: Path, capture: str
) -> None:
    """The stand-in answers EVERY nvidia-smi command (``--query-gpu``, ``--query-remapped-rows``,
    ``nvlink``, ``-q``) with this capture and exit 0: output of another command, another driver or
    another tool where the reader expects its own. The reader answers (no exception) and calls a
    GPU healthy only from a report that lists it (a ``-q`` capture), never from a table or a log."""
    source = CAPTURES / capture
    name = "output.csv" if (source / "output.csv").exists() else "output.txt"
    folder = tmp_path / "fakebin"
    folder.mkdir()
    (folder / "any.txt").write_bytes((source / name).read_bytes())
    health = read_node(folder, {"replay": {"error": {"file": "any.txt", "stream": "stdout", "exit": 0}}})
    found = verdicts(health)
    if capture.startswith("smi-q/"):
        assert health.queried and len(health.gpus) >= 1
    else:
        assert health.gpus == () and found["gpu-health"][0] != OK


# -- an H100 right after an uncorrectable error: its kernel log and its report --------------------------

H100_DBE = "smi-q/h100-550.90.07-ecc-unknown-remap-pending"


def test_an_ecc_mode_that_reads_unknown_error_is_unknown_ecc_not_a_card_without_ecc(tmp_path: Path) -> None:
    """``ECC Mode : Unknown Error`` and every counter ``N/A``: the reader took the N/As for a card
    without ECC ("unsupported", healthy on ECC). The row remapping pending makes the GPU bad; the
    ECC is named unknown with nvidia-smi's words."""
    folder = tmp_path / "fakebin"
    health = read_node(folder, replay(folder, q=H100_DBE))
    gpu = health.gpus[0]
    assert (gpu.bus_id, gpu.remap_unc, gpu.remap_pending, gpu.remap_failure) == ("0000:52:00", 1, True, False)
    assert "ecc" not in gpu.unsupported and gpu.why_unread("ecc") == "nvidia-smi said ECC Mode: Unknown Error"
    level, message = verdicts(health)["gpu0"]
    assert level == BAD and message.startswith(
        "row remapping pending (reset the GPU); unknown: ECC (nvidia-smi said ECC Mode: Unknown Error)"
    )


@pytest.mark.parametrize("said", ["Unknown Error", "GPU requires reset", "GPU is lost"])
def test_a_report_counter_nvidia_smi_could_not_read_is_never_a_zero(tmp_path: Path, said: str) -> None:
    """DERIVED from the H100 565 report: its volatile ``DRAM Uncorrectable : 0`` replaced by what
    ``-q`` prints for a value it could not read (no brackets in ``-q``). It read as 0 errors."""
    text = derived(
        H100, "DRAM Uncorrectable            : 0", f"DRAM Uncorrectable            : {said}", "Volatile"
    )
    folder = tmp_path / "fakebin"
    health = read_node(folder, replay(folder, q=H100, text=text))
    gpu = health.gpus[0]
    assert gpu.ecc_volatile is None and gpu.why_unread("ecc") == f"nvidia-smi said {said}"
    assert verdicts(health)["gpu0"][0] != OK


def test_the_dbe_its_remapping_and_the_contained_error_are_the_same_gpus() -> None:
    events, found = kernel_node("kernel/dmesg-h100-xid48-63-94")
    assert [(e["bus_id"], e["code"]) for e in events] == [
        ("0000:52:00", 48),
        ("0000:52:00", 63),
        ("0000:52:00", 94),
    ]
    assert found["gpu0"] == (
        BAD,
        "Xid 48: Double Bit ECC Error (reset); Xid 63: GPU memory remapping event;"
        " Xid 94: Contained memory error (application error)",
    )


def test_a_complaint_before_the_table_on_stdout_keeps_the_table_and_names_the_lost_gpu(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """DERIVED from two captures: the docker capture's complaint line put before the GB200 table
    on stdout, as nvidia-smi answers when one GPU of several cannot be opened (which stream it uses
    is not in the captures: the reader must read either). The table was lost whole (its first line
    was not the header): the other GPUs keep their rows and the lost one is named."""
    fields = tuple((GB200 / "query.txt").read_text().strip().split(","))
    said = (CAPTURES / "smi-error/no-handle-unknown-error-docker" / "output.txt").read_text()
    answer = said + (GB200 / "output.csv").read_text()

    def tool(argv: list[str], timeout: float | None = None, with_errors: bool = False) -> Any:
        return 15, answer, ""

    monkeypatch.setattr(fleetrun_gpu, "run_tool", tool)
    heard: list[str] = []
    rows, refused = fleetrun_gpu.ask_fields(fields, heard)
    assert rows is not None and len(rows) == 5 and refused == {}
    lost, first = fleetrun_gpu.smi_complaints(heard)
    assert lost == [{"bus_id": "0000:09:00", "index": None, "why": "Unknown Error"}]
    assert first == said.strip()


@pytest.mark.parametrize(
    ("lost", "field"),
    [
        ([{"bus_id": "0000:09:00", "index": None, "why": 5}], "why"),
        ([{"bus_id": None, "index": -1, "why": "x"}], "index"),
        ({"bus_id": "0000:09:00"}, "lost"),
    ],
)
def test_a_malformed_lost_gpu_from_a_node_is_refused_naming_the_field(lost: Any, field: str) -> None:
    from launch.nodelib.fleetrun_wire import ProtocolError

    with pytest.raises(ProtocolError, match=field):
        parse_gpu_health({"smi": True, "queried": True, "lost": lost})


def test_a_lost_gpus_reason_and_nvidia_smis_words_are_shown_not_obeyed() -> None:
    health = parse_gpu_health(
        {
            "smi": True,
            "queried": False,
            "lost": [{"bus_id": "0000:09:00", "index": None, "why": "\x1b[2Jgone" * 50}],
            "smi_said": "No devices\x1b[31m were found" * 20,
        }
    )
    (line,) = judge_node(health)
    assert line.level == BAD and "\x1b" not in line.message and "\\x1b" in line.message
    assert len(health.lost[0].why) <= 4 * fleetrun_gpu.MAX_TEXT and len(health.smi_said or "") <= 4 * 200
