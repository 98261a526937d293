"""GPU health against more REAL output (``tests/gpu_captures``, each with its SOURCE): drivers the
first captures did not cover (590, 595, 610), a MIG-enabled H100, ``--query-gpu`` tables full of
``[N/A]``, read the way a node reads them (the stand-in ``nvidia-smi`` replaying each capture
verbatim, the reader in its own Python: see ``test_gpu_captures``).

Where a test changes a capture it says so (DERIVED): those are never presented as captured.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from launch.rules.gpu_health import OK, WARN
from tests.gpustandin import CAPTURES, replay
from tests.test_gpu_captures import read_node, verdicts

H100_MIG = "smi-q/h100-mig-590.48.01"
RTX_610 = "smi-q/rtx2080super-610.57.04"


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
