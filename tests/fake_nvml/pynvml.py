"""A fake of NVML's Python bindings (``nvidia-ml-py``, module ``pynvml``) for the reader's NVML path.

It answers the calls ``launch/nodelib/fleetrun_gpu.py`` makes with the facts of a real capture
(``load_report``: an ``nvidia-smi -q`` report from ``tests/gpu_captures``, the same facts NVML
gave nvidia-smi when it printed them), in NVML's own units and conventions: power in milliwatts,
memory in bytes, ``NVML_FEATURE_ENABLED`` as 1, clock event reasons as the ``nvml.h`` bit mask, and
``NVMLError_NotSupported`` (``NVML_ERROR_NOT_SUPPORTED``, 3) where the report reads ``N/A``. Only
what the capture holds is served: its NVLink states are not in ``-q``, so ``nvmlDeviceGetNvLinkState``
answers NOT_SUPPORTED unless a test gives the links. ``MACHINE`` is the machine; a test sets it.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_GPU_IS_LOST = 15
MACHINE: dict[str, Any] = {"driver": "0", "cuda": 0, "gpus": []}
CALLS: list[str] = []


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return nvmlErrorString(self.value)


class NVMLError_NotSupported(NVMLError):  # noqa: N801 - pynvml's name
    def __init__(self) -> None:
        super().__init__(NVML_ERROR_NOT_SUPPORTED)


def nvmlErrorString(value: int) -> str:  # noqa: N802 - pynvml's names from here on
    return {2: "Invalid Argument", 3: "Not Supported", 15: "GPU is lost"}.get(value, "Unknown Error")


def nvmlInit() -> None:
    CALLS.append("nvmlInit")


def nvmlShutdown() -> None:
    CALLS.append("nvmlShutdown")


def nvmlSystemGetDriverVersion() -> str:
    return str(MACHINE["driver"])


def nvmlSystemGetCudaDriverVersion() -> int:
    return int(MACHINE["cuda"])


def nvmlDeviceGetCount() -> int:
    return len(MACHINE["gpus"])


def nvmlDeviceGetHandleByIndex(index: int) -> dict[str, Any]:
    gpu = MACHINE["gpus"][index]
    if gpu.get("lost"):
        raise NVMLError(NVML_ERROR_GPU_IS_LOST)
    return gpu


def _fact(handle: dict[str, Any], name: str) -> Any:
    found = handle.get(name)
    if found is None:
        raise NVMLError_NotSupported()
    if isinstance(found, NVMLError):
        raise found
    return found


def nvmlDeviceGetUUID(handle: dict[str, Any]) -> str:
    return _fact(handle, "uuid")


def nvmlDeviceGetName(handle: dict[str, Any]) -> str:
    return _fact(handle, "name")


def nvmlDeviceGetPciInfo(handle: dict[str, Any]) -> SimpleNamespace:
    return SimpleNamespace(busId=_fact(handle, "bus_id").encode())


def nvmlDeviceGetPersistenceMode(handle: dict[str, Any]) -> int:
    return 1 if _fact(handle, "persistence") else 0


def nvmlDeviceGetCurrPcieLinkGeneration(handle: dict[str, Any]) -> int:
    return _fact(handle, "pcie_gen")


def nvmlDeviceGetMaxPcieLinkGeneration(handle: dict[str, Any]) -> int:
    return _fact(handle, "pcie_gen_max")


def nvmlDeviceGetCurrPcieLinkWidth(handle: dict[str, Any]) -> int:
    return _fact(handle, "pcie_width")


def nvmlDeviceGetMaxPcieLinkWidth(handle: dict[str, Any]) -> int:
    return _fact(handle, "pcie_width_max")


def nvmlDeviceGetTotalEccErrors(handle: dict[str, Any], error_type: int, counter: int) -> int:
    if error_type != 1:  # NVML_MEMORY_ERROR_TYPE_UNCORRECTED: the only one the reader asks
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return _fact(handle, "ecc_volatile" if counter == 0 else "ecc_aggregate")


def nvmlDeviceGetRetiredPagesPendingStatus(handle: dict[str, Any]) -> int:
    return 1 if _fact(handle, "retired_pending") else 0


def nvmlDeviceGetRemappedRows(handle: dict[str, Any]) -> tuple[int, int, int, int]:
    pending = _fact(handle, "remap_pending")
    return (0, handle.get("remap_unc") or 0, 1 if pending else 0, 1 if handle.get("remap_failure") else 0)


EVENT_BITS = {
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
}


def nvmlDeviceGetCurrentClocksEventReasons(handle: dict[str, Any]) -> int:
    events = _fact(handle, "throttle")
    return sum(bit for name, bit in EVENT_BITS.items() if events.get(name))


def nvmlDeviceGetTemperature(handle: dict[str, Any], sensor: int) -> int:
    return int(_fact(handle, "temp_c"))


def nvmlDeviceGetPowerUsage(handle: dict[str, Any]) -> int:
    return int(round(_fact(handle, "power_w") * 1000))


def nvmlDeviceGetMemoryInfo(handle: dict[str, Any]) -> SimpleNamespace:
    return SimpleNamespace(
        used=int(_fact(handle, "mem_used_mib") * 1048576), total=int(_fact(handle, "mem_total_mib") * 1048576)
    )


def nvmlDeviceGetUtilizationRates(handle: dict[str, Any]) -> SimpleNamespace:
    return SimpleNamespace(gpu=int(_fact(handle, "util")), memory=0)


def nvmlDeviceGetNvLinkState(handle: dict[str, Any], link: int) -> int:
    links = _fact(handle, "nvlinks")
    if link >= len(links):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return 1 if links[link] else 0


def nvmlDeviceGetComputeRunningProcesses(handle: dict[str, Any]) -> list[SimpleNamespace]:
    return [SimpleNamespace(**p) for p in _fact(handle, "processes")]


def _report_processes(lines: dict[str, str]) -> list[dict[str, Any]]:
    """The report's ``Processes`` section as NVML's process records (``usedGpuMemory`` in bytes):
    ``Processes : None`` is none; one listed process (the path map keeps one) is that one."""
    pid = lines.get("Processes/Process ID", "")
    if not pid.isdigit():
        return []
    used = lines.get("Processes/Used GPU Memory", "").removesuffix(" MiB")
    return [{"pid": int(pid), "usedGpuMemory": int(used) * 1024 * 1024 if used.isdigit() else None}]


def load_report(text: str) -> dict[str, Any]:
    """``MACHINE`` from an ``nvidia-smi -q`` capture: the facts NVML gave nvidia-smi, each ``N/A``
    of the report a NOT_SUPPORTED here."""
    from launch.nodelib import fleetrun_gpu

    driver, cuda, blocks = fleetrun_gpu.report_blocks(text)
    gpus = []
    for index, (bus, lines) in enumerate(blocks):
        facts = fleetrun_gpu.gpu_from_report(index, bus, lines)
        facts["bus_id"] = next((v for p, v in lines.items() if p == "PCI/Bus Id"), bus)
        if "clock_events" in facts["unsupported"]:
            facts["throttle"] = None
        facts["processes"] = _report_processes(lines)
        gpus.append(facts)
    major, _, minor = (cuda or "0.0").partition(".")
    return {"driver": driver, "cuda": int(major) * 1000 + int(minor or 0) * 10, "gpus": gpus}
