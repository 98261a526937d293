"""GPU health read on the node the way NVIDIA's own tools read it. Standard library only (3.8+),
plus NVML's Python bindings where the node has them.

Everything comes from NVIDIA's documented interfaces, in this order:

* NVML first (``nvidia-ml-py``, module ``pynvml``, imported lazily: :func:`nvml_gpus`): device
  count and identity, uncorrectable ECC counts (volatile and aggregate), pending page retirement,
  remapped rows, clock event reasons, PCIe generation and width, NVLink state per link,
  temperature, power, memory, utilisation. A query NVML answers ``NVML_ERROR_NOT_SUPPORTED`` is a
  value (the fact is ``unsupported``: a GeForce card has no ECC), any other error leaves the fact
  unread with NVML's reason. The answer's ``reader`` says which path answered.
* else ``nvidia-smi --query-gpu=FIELDS --format=csv,nounits``: one CSV row per GPU, read by
  POSITION for the fields asked (drivers 535+ print ``clocks_throttle_reasons.x`` under its new
  name ``clocks_event_reasons.x``: see ``ALIASES``). A field the driver refuses is asked again by
  its alias, else left out and named as the reason its fact is unread. ``[N/A]`` and ``[Not
  Supported]`` make a fact ``unsupported``; ``[Insufficient Permissions]`` and the like unread.
* ``nvidia-smi --query-remapped-rows=...``: row remapping pending / failed (A100 and later).
* ``nvidia-smi nvlink --status``: ``Link N: <inactive>`` per link.
* ``nvidia-smi -q``: the ``CUDA Version`` line and each GPU's ``Fabric`` section (State and
  Status, set on NVSwitch systems once the Fabric Manager has trained the fabric).
* the kernel log (``dmesg``, else ``journalctl -k``): ``NVRM: Xid (PCI:0000:3b:00): 79, ...``.
  Most distributions restrict it to root: then the Xid list is ``None`` (unknown), never empty.
* ``/sys/class/infiniband``: the EFA / InfiniBand devices the instance type should have.
* DCGM, when ``dcgmi`` is installed: its health watches (``dcgmi health -c -j``, after ``-s a``
  when no watch is set yet; at most every ``DCGM_EVERY_S`` in a long-lived process such as the
  node agent) and, on request only, its diagnostic (``dcgmi diag -r N -j``, :func:`read_diag`, run
  as ``python - diag N``). Both need DCGM's host engine (``nv-hostengine``): when it does not
  answer, the DCGM part says so and is unknown, never healthy. The JSON layouts are those of
  NVIDIA's dcgmi sources (``dcgmi/Health.cpp`` with ``dcgmi/DcgmiOutput.cpp`` for the health
  check; ``dcgmi/Diag.cpp`` with ``nvvs/include/NvvsJsonStrings.h`` for the diagnostic).

Nothing is judged here: the answer is facts, ``None`` where a fact could not be read; the verdicts
are made on the laptop (``launch.rules.gpu_health``), which parses the answer as untrusted input.
The probe (``fab doctor``, the pre-launch check) and the node agent's poll use the same reader.

The reads are independent of each other, and on a real 8-GPU node each ``nvidia-smi`` call takes
0.1 to over 1 s (it opens every GPU through NVML): :func:`read_health` starts them all at once,
each in its own thread with its own process and timeout, so a node answers in the time of its
slowest read instead of their sum, and one hung tool costs its own timeout, not everyone's.
"""

from __future__ import annotations

import contextlib
import csv
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

TOOL_TIMEOUT_S = 8
DETAILS_TIMEOUT_S = 20
"""``nvidia-smi -q`` reads everything about every GPU: the slowest of the reads."""
MAX_GPUS = 64
MAX_XIDS = 32
MAX_TEXT = 120
MAX_SAID = 200
"""nvidia-smi's complaint is kept whole: NVIDIA's longest ("NVIDIA-SMI has failed because ...") is 135."""
MAX_PROCESSES = 256
SMI = "nvidia-smi"

BASIC_FIELDS = ("index", "uuid", "name", "pci.bus_id", "driver_version")
CLOCK_EVENTS = {
    "clocks_event_reasons.hw_slowdown": "hw_slowdown",
    "clocks_event_reasons.hw_thermal_slowdown": "hw_thermal_slowdown",
    "clocks_event_reasons.hw_power_brake_slowdown": "hw_power_brake_slowdown",
    "clocks_event_reasons.sw_thermal_slowdown": "sw_thermal_slowdown",
    "clocks_event_reasons.sw_power_cap": "sw_power_cap",
}
"""The clock event reasons read, by the names drivers 535 and later print (``--help-query-gpu``)."""
FACT_FIELDS = {
    "persistence": ("persistence_mode",),
    "pcie": ("pcie.link.gen.current", "pcie.link.gen.max", "pcie.link.width.current", "pcie.link.width.max"),
    "ecc": ("ecc.errors.uncorrected.volatile.total", "ecc.errors.uncorrected.aggregate.total"),
    "retired_pages": ("retired_pages.pending",),
    "clock_events": tuple(CLOCK_EVENTS),
    "temperature": ("temperature.gpu",),
    "power": ("power.draw",),
    "memory": ("memory.used", "memory.total"),
    "utilization": ("utilization.gpu",),
}
"""Each fact and the ``--query-gpu`` fields it is read from: a fact is ``unsupported`` when its
first field reads ``[N/A]`` or ``[Not Supported]`` (a GeForce card has no ECC), and unread, with
the reason, when the field was refused or read ``[Insufficient Permissions]``, ``[Unknown Error]``..."""
HEALTH_FIELDS = tuple(f for fields in FACT_FIELDS.values() for f in fields)
FACTS = (*FACT_FIELDS, "remapped_rows", "nvlink")
ALIASES = {
    **{name: "clocks_throttle_reasons." + name.split(".", 1)[1] for name in CLOCK_EVENTS},
    "clocks_event_reasons.active": "clocks_throttle_reasons.active",
    "clocks_event_reasons.supported": "clocks_throttle_reasons.supported",
    "uuid": "gpu_uuid",
    "pci.bus_id": "gpu_bus_id",
}
"""Field names and their other spelling, from ``nvidia-smi --help-query-gpu`` (``"X" or "Y"``).
Driver 535 renamed ``clocks_throttle_reasons.*`` to ``clocks_event_reasons.*``, kept the old names
as aliases, and prints a query for either under the new name in the CSV header: the answer is
read by position, never by header equality. A driver older than 535 refuses the new names, so a
refused name is asked again by its alias."""
CANONICAL = {**{old: new for new, old in ALIASES.items()}}
REMAP_FIELDS = ("gpu_uuid", "remapped_rows.uncorrectable", "remapped_rows.pending", "remapped_rows.failure")
REFUSED = re.compile(r'Field "([^"]{1,80})" is not a valid field to query')
UNSUPPORTED_CELLS = ("[n/a]", "[not supported]", "n/a")
"""What nvidia-smi prints for a fact the GPU does not have: a value, ``unsupported``."""
ERROR_CELLS = ("unknown error", "gpu requires reset", "gpu is lost", "insufficient permissions")
"""What ``-q`` prints, without the CSV's brackets, for a value it could not read (``ECC Mode / Current :
Unknown Error`` on a GPU after an uncorrectable error): unread, never a value."""
XID_LINE = re.compile(
    r"NVRM: Xid \((?:PCI:)?([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2})[^)]{0,40}\): (\d{1,4}),? ?(.*)"
)
"""The driver's Xid line; drivers before about 2019 printed the bus without ``PCI:``."""
ISO_TIME = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)")
SMI_NO_HANDLE = re.compile(
    r"Unable to (?:determine|detect) the device handle for GPU ?(?:\d{1,3}: ?)?"
    r"([0-9A-Fa-f]{3,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.\d)?): ?([^\r\n]{0,100})"
)
"""nvidia-smi's line for a GPU the driver lists but NVML cannot open (``... for GPU 0000:0B:00.0:
Unknown Error``; newer drivers print no space after ``GPU``; the reason may be ``GPU is lost. Reboot
the system to recover this GPU``). It exits non-zero (``man nvidia-smi``: 15, "GPU has fallen off
the bus or has otherwise become inaccessible") and still lists the GPUs it can open."""
SMI_FAILED = (
    "no devices were found",
    "nvidia-smi has failed",
    "failed to initialize nvml",
    "unable to determine the device handle",
    "unable to detect the device handle",
    "gpu is lost",
)
"""The starts of nvidia-smi's own complaints when it cannot list GPUs (``No devices were found``,
``NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver``, ``Failed to
initialize NVML: Driver/library version mismatch``): kept as the reason the GPUs are unread."""


def run_tool(argv, timeout=None, with_errors=False):
    """(exit code, stdout) of ``argv``, or (exit code, stdout, stderr) ``with_errors``; exit None
    when the tool is missing or hangs (past ``timeout``, by default ``TOOL_TIMEOUT_S``)."""
    timeout = TOOL_TIMEOUT_S if timeout is None else timeout
    nothing = (None, "", "") if with_errors else (None, "")
    if shutil.which(argv[0]) is None:
        return nothing
    try:
        proc = subprocess.run(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE if with_errors else subprocess.DEVNULL,
            timeout=timeout,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return nothing
    out = proc.stdout[: 512 * 1024].decode("utf-8", "replace")
    if with_errors:
        return proc.returncode, out, (proc.stderr or b"")[:4096].decode("utf-8", "replace")
    return proc.returncode, out


def value(text):
    """A CSV cell with NVIDIA's placeholders (``[N/A]``, ``[Not Supported]``, ...) as None."""
    text = text.strip()
    if not text or (text.startswith("[") and text.endswith("]")) or text in ("N/A", "Unknown Error"):
        return None
    return text[:MAX_TEXT]


def number(text):
    text = value(text) if text is not None else None
    if text is None:
        return None
    try:
        return float(text.split()[0])
    except (ValueError, IndexError):
        return None


def whole(text):
    found = number(text)
    return int(found) if found is not None else None


def yes_no(text):
    text = value(text) if text is not None else None
    if text is None:
        return None
    low = text.lower()
    if low in ("yes", "enabled", "active"):
        return True
    if low in ("no", "disabled", "not active"):
        return False
    return None


def canonical(name):
    """A field's name as drivers 535 and later print it (``clocks_throttle_reasons.x`` is
    ``clocks_event_reasons.x``; ``gpu_uuid`` is ``uuid``)."""
    return CANONICAL.get(name, name)


def parse_csv(text, fields):
    """Rows of a ``--format=csv,nounits`` answer to a query for ``fields``, as dicts keyed by the
    ASKED names, each column taken by its POSITION: nvidia-smi answers the fields in the order
    asked, but prints a field under its current name (a query for ``clocks_throttle_reasons.x``
    on driver 535+ comes back headed ``clocks_event_reasons.x``), so the header is only checked to
    hold one column per field. None for anything else (an error message instead of a table,
    another tool's output)."""
    # nvidia-smi's complaint about a GPU it cannot open may come on stdout, before the table of the
    # others: it is read by smi_complaints, and is no row of the table
    lines = [ln for ln in text.splitlines() if not SMI_NO_HANDLE.search(ln)]
    rows = list(csv.reader(lines, skipinitialspace=True))
    if not rows or len(rows[0]) != len(fields):
        return None
    header = [h.split(" [")[0].strip() for h in rows[0]]
    renamed = not all(canonical(h) == canonical(f) or h == f for h, f in zip(header, fields))  # noqa: B905
    # a name outside the alias table: a renamed field keeps its place, but a table whose first
    # column is not the first field asked is some other answer
    if renamed and canonical(header[0]) != canonical(fields[0]):
        return None
    out = []
    for row in rows[1 : MAX_GPUS + 1]:
        if len(row) == len(fields):
            out.append(dict(zip(fields, row)))  # noqa: B905 - nodes may run Python 3.8
    return out


def cell_state(text):
    """``ok``, ``unsupported`` (the GPU has no such thing: ``[N/A]``, ``[Not Supported]``) or the
    reason it could not be read (``[Insufficient Permissions]``, ``[Unknown Error]``, ``[GPU
    requires reset]``...), for one CSV cell."""
    if text is None:
        return "not asked"
    low = text.strip().lower()
    if low in UNSUPPORTED_CELLS:
        return "unsupported"
    if (low.startswith("[") and low.endswith("]")) or low.startswith(ERROR_CELLS):
        return "nvidia-smi said " + text.strip()[:60]
    if not low:
        return "nvidia-smi gave no value"
    return "ok"


def smi_complaints(texts):
    """nvidia-smi's own words in ``texts`` (its stdout and stderr; the drivers differ in which):
    (the GPUs it names and cannot open, ``[{"bus_id", "index", "why"}]``, and its first complaint
    line or None). A line of a CSV table or a report never matches: only NVIDIA's messages do."""
    lost, said = [], None
    for text in texts:
        for line in (text or "").splitlines()[:200]:
            stripped = line.strip()
            if said is None and stripped.lower().startswith(SMI_FAILED):
                said = stripped[:MAX_SAID]
            match = SMI_NO_HANDLE.search(stripped)
            if match and len(lost) < MAX_GPUS:
                bus = bus_key(match.group(1))
                if all(g["bus_id"] != bus for g in lost):
                    why = match.group(2).strip() or "no reason given"
                    lost.append({"bus_id": bus, "index": None, "why": why[:MAX_TEXT]})
    return lost, said


def bus_key(bus_id):
    """``00000000:3B:00.0`` (nvidia-smi) and ``0000:3b:00`` (an Xid line) as one key ``0000:3b:00``."""
    parts = bus_id.strip().lower().split(":")
    if len(parts) < 3:
        return bus_id.strip().lower()
    try:
        domain = int(parts[-3], 16)
    except ValueError:
        return bus_id.strip().lower()
    return f"{domain:04x}:{parts[-2]}:{parts[-1].split('.')[0]}"


def gpu_from_row(row, refused=None):
    """One GPU's facts from its row (keyed by the asked names, canonical ones), with per fact
    ``unsupported`` and ``unread`` (fact: reason); ``refused`` maps a field nvidia-smi would not
    answer to why."""
    refused = refused or {}
    gpu = {
        "index": whole(row.get("index", "")),
        "uuid": value(row.get("uuid", "")) or "",
        "name": value(row.get("name", "")),
        "bus_id": bus_key(row.get("pci.bus_id", "")),
    }
    unsupported, unread = [], {}
    for fact, fields in FACT_FIELDS.items():
        gone = [refused[f] for f in fields if f in refused]
        if gone:
            unread[fact] = gone[0]
            continue
        state = cell_state(row.get(fields[0]))
        if state == "unsupported":
            unsupported.append(fact)
        elif state != "ok":
            unread[fact] = state
    throttle = {short: yes_no(row.get(field)) for field, short in CLOCK_EVENTS.items()}
    gpu.update(
        {
            "persistence": yes_no(row.get("persistence_mode")),
            "pcie_gen": whole(row.get("pcie.link.gen.current")),
            "pcie_gen_max": whole(row.get("pcie.link.gen.max")),
            "pcie_width": whole(row.get("pcie.link.width.current")),
            "pcie_width_max": whole(row.get("pcie.link.width.max")),
            "ecc_volatile": whole(row.get("ecc.errors.uncorrected.volatile.total")),
            "ecc_aggregate": whole(row.get("ecc.errors.uncorrected.aggregate.total")),
            "retired_pending": yes_no(row.get("retired_pages.pending")),
            "throttle": throttle,
            "temp_c": number(row.get("temperature.gpu")),
            "power_w": number(row.get("power.draw")),
            "mem_used_mib": number(row.get("memory.used")),
            "mem_total_mib": number(row.get("memory.total")),
            "util": number(row.get("utilization.gpu")),
            "unsupported": unsupported,
            "unread": unread,
        }
    )
    return gpu


def ask_fields(fields, heard=None):
    """``nvidia-smi --query-gpu`` for ``fields`` as the driver will answer it: (rows keyed by the
    asked names, fields refused (name: reason)). A refused field (``Field "x" is not a valid field
    to query.``, exit 2) is asked again by its alias when it has one (a pre-535 driver knows
    ``clocks_throttle_reasons.x`` only), else left out and named, and the query sent again; rows
    None when no table came back at all. Every answer's stdout and stderr are added to ``heard``
    (a list) when given: nvidia-smi's complaints about GPUs it cannot open are read from them."""
    asked = list(fields)
    refused = {}
    for _ in range(len(fields) + 2):
        if not asked:
            return None, refused
        _code, out, err = run_tool(
            [SMI, "--query-gpu=" + ",".join(asked), "--format=csv,nounits"], with_errors=True
        )
        if heard is not None:
            heard.extend((out, err))
        rows = parse_csv(out, asked)
        if rows is not None:
            keyed = [{canonical(k): v for k, v in row.items()} for row in rows]
            return keyed, refused
        match = REFUSED.search(out) or REFUSED.search(err)
        if not match or match.group(1) not in asked:
            return None, refused
        name = match.group(1)
        i = asked.index(name)
        other = ALIASES.get(name) or CANONICAL.get(name)
        if other and other not in asked and canonical(name) not in refused:
            # a driver that lacks one name of a family (clocks_event_reasons.*) lacks them all:
            # the whole family is asked by its other spelling at once, one call instead of five
            family = name.split(".", 1)[0] + "."
            for j, field in enumerate(asked):
                spelled = ALIASES.get(field) or CANONICAL.get(field)
                if (
                    field.startswith(family)
                    and spelled
                    and spelled not in asked
                    and canonical(field) not in refused
                ):
                    asked[j] = spelled
                    refused[canonical(field)] = None  # asked once by its alias: not refused yet
            asked[i] = other
            refused[canonical(name)] = None
        else:
            del asked[i]
            refused[canonical(name)] = f"nvidia-smi does not know the field {canonical(name)}"
    return None, refused


def query_gpus(heard=None):
    """(gpus, driver, health fields read?) from ``--query-gpu``; (None, None, False) when the tool
    gives no table at all. A GPU that fell off the bus makes nvidia-smi exit non-zero but still
    list the others: the table counts, not the exit code, and the complaint that names the lost
    GPU goes to ``heard`` (see :func:`ask_fields`)."""
    rows, refused = ask_fields(BASIC_FIELDS + HEALTH_FIELDS, heard)
    refused = {k: v for k, v in refused.items() if v}
    if rows is None or any(f in refused for f in ("index", "uuid")):
        return None, None, False
    driver = None
    gpus = []
    for row in rows:
        gpu = gpu_from_row(row, refused)
        if gpu["index"] is None:
            continue
        driver = value(row.get("driver_version", "")) or driver
        gpus.append(gpu)
    health = not any(f in refused for f in HEALTH_FIELDS)
    return gpus, driver, health


def remapped_rows():
    """Per GPU uuid: (uncorrectable rows, pending, failure, cell state); {} when the query is not
    supported (a GPU before the A100 retires pages instead)."""
    _code, out = run_tool([SMI, "--query-remapped-rows=" + ",".join(REMAP_FIELDS), "--format=csv,nounits"])
    found = {}
    for row in parse_csv(out, REMAP_FIELDS) or []:
        uuid = value(row.get("gpu_uuid", ""))
        if uuid:
            found[uuid] = (
                whole(row.get("remapped_rows.uncorrectable")),
                yes_no(row.get("remapped_rows.pending")),
                yes_no(row.get("remapped_rows.failure")),
                cell_state(row.get("remapped_rows.pending")),
            )
    return found


# -- NVML (``nvidia-ml-py``, module ``pynvml``) ---------------------------------------------------

NVML_NOT_SUPPORTED = 3
"""``NVML_ERROR_NOT_SUPPORTED`` (``nvml.h``): the device has no such thing; a value, not a failure."""
NVML_ECC_UNCORRECTED = 1
"""``NVML_MEMORY_ERROR_TYPE_UNCORRECTED``."""
NVML_VOLATILE, NVML_AGGREGATE = 0, 1
"""``NVML_VOLATILE_ECC`` (since the driver loaded), ``NVML_AGGREGATE_ECC`` (the GPU's lifetime)."""
NVML_TEMPERATURE_GPU = 0
NVML_MAX_LINKS = 18
"""``NVML_NVLINK_MAX_LINKS`` (18 since the H100)."""
NVML_EVENT_BITS = {
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
}
"""``nvmlClocksEventReason*`` bits (``nvml.h``; ``nvmlClocksThrottleReason*`` before 535)."""


class NvmlUnsupported(Exception):
    """One NVML query answered NVML_ERROR_NOT_SUPPORTED."""


def _nvml_text(found):
    if isinstance(found, bytes):
        found = found.decode("utf-8", "replace")
    return str(found)[:MAX_TEXT]


def _nvml_error(nvml, exc):
    """Why a call failed, in NVML's words (``nvmlErrorString``)."""
    try:
        return _nvml_text(nvml.nvmlErrorString(exc.value))
    except Exception:  # noqa: BLE001 - any binding may lack the call: the exception's own text
        return _nvml_text(exc)


def _nvml_call(nvml, fn, *args):
    """``fn(*args)``; raises :class:`NvmlUnsupported` for NVML_ERROR_NOT_SUPPORTED."""
    try:
        return fn(*args)
    except nvml.NVMLError as exc:
        if getattr(exc, "value", None) == NVML_NOT_SUPPORTED:
            raise NvmlUnsupported() from exc
        raise


def _nvml_gpu(nvml, index):
    """One GPU's facts through NVML, in the same shape as :func:`gpu_from_row`'s."""
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    pci = nvml.nvmlDeviceGetPciInfo(handle)
    gpu = {
        "index": index,
        "uuid": _nvml_text(nvml.nvmlDeviceGetUUID(handle)),
        "name": _nvml_text(nvml.nvmlDeviceGetName(handle)),
        "bus_id": bus_key(_nvml_text(pci.busId)),
        "throttle": {short: None for short in NVML_EVENT_BITS},
    }
    unsupported, unread = [], {}

    def read(fact, reader):
        try:
            reader()
        except NvmlUnsupported:
            if fact not in unsupported:
                unsupported.append(fact)
        except nvml.NVMLError as exc:
            unread.setdefault(fact, "NVML: " + _nvml_error(nvml, exc))

    def persistence():
        gpu["persistence"] = _nvml_call(nvml, nvml.nvmlDeviceGetPersistenceMode, handle) == 1

    def pcie():
        gpu["pcie_gen"] = _nvml_call(nvml, nvml.nvmlDeviceGetCurrPcieLinkGeneration, handle)
        gpu["pcie_gen_max"] = _nvml_call(nvml, nvml.nvmlDeviceGetMaxPcieLinkGeneration, handle)
        gpu["pcie_width"] = _nvml_call(nvml, nvml.nvmlDeviceGetCurrPcieLinkWidth, handle)
        gpu["pcie_width_max"] = _nvml_call(nvml, nvml.nvmlDeviceGetMaxPcieLinkWidth, handle)

    def ecc():
        total = nvml.nvmlDeviceGetTotalEccErrors
        gpu["ecc_volatile"] = _nvml_call(nvml, total, handle, NVML_ECC_UNCORRECTED, NVML_VOLATILE)
        gpu["ecc_aggregate"] = _nvml_call(nvml, total, handle, NVML_ECC_UNCORRECTED, NVML_AGGREGATE)

    def retired():
        gpu["retired_pending"] = _nvml_call(nvml, nvml.nvmlDeviceGetRetiredPagesPendingStatus, handle) == 1

    def remapped():
        _corr, unc, pending, failure = _nvml_call(nvml, nvml.nvmlDeviceGetRemappedRows, handle)
        gpu["remap_unc"], gpu["remap_pending"], gpu["remap_failure"] = unc, bool(pending), bool(failure)

    def events():
        get = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
        get = get or nvml.nvmlDeviceGetCurrentClocksThrottleReasons
        mask = _nvml_call(nvml, get, handle)
        gpu["throttle"] = {short: bool(mask & bit) for short, bit in NVML_EVENT_BITS.items()}

    def temperature():
        gpu["temp_c"] = float(_nvml_call(nvml, nvml.nvmlDeviceGetTemperature, handle, NVML_TEMPERATURE_GPU))

    def power():
        gpu["power_w"] = _nvml_call(nvml, nvml.nvmlDeviceGetPowerUsage, handle) / 1000.0

    def memory():
        info = _nvml_call(nvml, nvml.nvmlDeviceGetMemoryInfo, handle)
        gpu["mem_used_mib"], gpu["mem_total_mib"] = info.used / 1048576.0, info.total / 1048576.0

    def utilization():
        gpu["util"] = float(_nvml_call(nvml, nvml.nvmlDeviceGetUtilizationRates, handle).gpu)

    def nvlink():
        active = inactive = 0
        for link in range(NVML_MAX_LINKS):
            try:
                state = _nvml_call(nvml, nvml.nvmlDeviceGetNvLinkState, handle, link)
            except NvmlUnsupported:
                if link == 0:
                    raise
                break  # past this GPU's last link
            except nvml.NVMLError as exc:
                if link == 0:
                    raise
                if getattr(exc, "value", None) == 2:  # NVML_ERROR_INVALID_ARGUMENT: no such link
                    break
                raise
            if state == 1:
                active += 1
            else:
                inactive += 1
        gpu["nvlink_active"], gpu["nvlink_inactive"] = active, inactive

    for fact, reader in (
        ("persistence", persistence),
        ("pcie", pcie),
        ("ecc", ecc),
        ("retired_pages", retired),
        ("remapped_rows", remapped),
        ("clock_events", events),
        ("temperature", temperature),
        ("power", power),
        ("memory", memory),
        ("utilization", utilization),
        ("nvlink", nvlink),
    ):
        read(fact, reader)
    gpu["unsupported"], gpu["unread"] = unsupported, unread
    return gpu


_nvml_open = {"module": None}
"""NVML stays initialised for the life of the process once it loaded: the node agent reads every
second, and ``nvmlInit`` opens every GPU (as each nvidia-smi call does)."""


def nvml_loaded():
    """(the initialised ``pynvml`` module, None) once NVML loads, else (None, why not). Loaded
    once and kept (``_nvml_open``); a node without ``pynvml`` or ``libnvidia-ml.so`` says which."""
    nvml = _nvml_open.get("module")
    if nvml is not None:
        return nvml, None
    try:
        import pynvml as nvml  # noqa: PLC0415 - optional on nodes: the fallback is nvidia-smi
    except ImportError:
        return None, "pynvml not installed"
    try:
        nvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - NVMLError_LibraryNotFound, DriverNotLoaded, ...
        return None, "NVML did not load: " + _nvml_text(exc)[:80]
    _nvml_open["module"] = nvml
    return nvml, None


def reader_available():
    """(the reader that can read this node's GPUs, None) or (None, why none can): "nvml" when
    NVML loads, else "nvidia-smi" when the binary is on PATH. The one answer to "does this node
    have a GPU reader", asked by the node agent (whether to poll GPUs during a run) and the probe
    (whether the node has GPUs), so a node with NVML but no nvidia-smi counts as one with GPUs."""
    nvml, why_not = nvml_loaded()
    if nvml is not None:
        return "nvml", None
    if shutil.which(SMI) is not None:
        return SMI, None
    return None, f"no GPU reader: {why_not} and no {SMI} on PATH"


def nvml_gpus(lost=None):
    """(gpus, driver, CUDA version, why not) through NVML: NVIDIA's own library, the one every tool
    (nvidia-smi too) reads through, with a stable API across drivers. ``pynvml`` (the
    ``nvidia-ml-py`` package) is imported here, not at the top: a node without it, or without a
    loadable ``libnvidia-ml.so``, answers (None, None, None, the reason) and the reader falls back
    to nvidia-smi. A GPU NVML cannot open (fallen off the bus) is missing from the list, as it is
    from nvidia-smi's. Xid events: NVML reports only those that happen while a process waits on
    an event set, so a one-shot read keeps taking them from the kernel log. Each GPU NVML counts
    but cannot open goes to ``lost`` (a list) with NVML's reason (``GPU is lost``)."""
    nvml, why_not = nvml_loaded()
    if nvml is None:
        return None, None, None, why_not
    try:
        driver = _nvml_text(nvml.nvmlSystemGetDriverVersion())
        cuda = None
        try:
            found = int(nvml.nvmlSystemGetCudaDriverVersion())
            cuda = f"{found // 1000}.{found % 1000 // 10}"
        except Exception:  # noqa: BLE001 - the CUDA version is a courtesy; -q reads it too
            cuda = None
        gpus = []
        for index in range(min(int(nvml.nvmlDeviceGetCount()), MAX_GPUS)):
            try:
                gpus.append(_nvml_gpu(nvml, index))
            except nvml.NVMLError as exc:
                # NVML_ERROR_GPU_IS_LOST and the like: not listed, as nvidia-smi does, but named
                if lost is not None:
                    lost.append({"bus_id": None, "index": index, "why": "NVML: " + _nvml_error(nvml, exc)})
        return gpus, driver, cuda, None
    except Exception as exc:  # noqa: BLE001 - a broken binding: nvidia-smi still answers
        _nvml_open["module"] = None  # initialised again at the next read
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()
        return None, None, None, "NVML failed: " + _nvml_text(exc)[:80]


def smi_utilization():
    """Mean GPU utilisation in percent from nvidia-smi; None without GPUs (or without the tool).
    The node agent's figure when its background reader has no reading (``mean_utilization``)."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            errors="replace",
            timeout=10,
            check=False,
        ).stdout[:4096]
        values = [float(v) for v in out.split() if v.strip()]
    except (OSError, ValueError, subprocess.SubprocessError):
        return None
    if not values or not all(math.isfinite(v) and 0 <= v <= 100 for v in values):
        return None
    return sum(values) / len(values)


def nvml_processes():
    """The compute processes on the GPUs through NVML: [{"gpu": uuid, "pid", "mem_mib"}], or None
    when NVML does not load (the caller asks nvidia-smi then). What ``nvidia-smi
    --query-compute-apps`` prints comes from the same call (``nvmlDeviceGetComputeRunningProcesses``);
    memory NVML cannot attribute (``usedGpuMemory`` None, as under MIG or in a container) is None."""
    nvml, _why_not = nvml_loaded()
    if nvml is None:
        return None
    found = []
    try:
        for index in range(min(int(nvml.nvmlDeviceGetCount()), MAX_GPUS)):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                uuid = _nvml_text(nvml.nvmlDeviceGetUUID(handle))[:128]
                running = list(nvml.nvmlDeviceGetComputeRunningProcesses(handle))[:MAX_PROCESSES]
            except nvml.NVMLError:
                continue  # a GPU lost or one without process accounting: nothing to list there
            for proc in running:
                pid, used = getattr(proc, "pid", None), getattr(proc, "usedGpuMemory", None)
                if not isinstance(pid, int) or isinstance(pid, bool) or not 0 < pid < 2**31:
                    continue
                mem = used // (1024 * 1024) if isinstance(used, int) and 0 <= used < 2**62 else None
                found.append({"gpu": uuid, "pid": pid, "mem_mib": mem})
    except Exception:  # noqa: BLE001 - a broken binding: nvidia-smi still answers
        return None
    return found[:MAX_PROCESSES]


def nvlinks():
    """Per GPU index: (active links, inactive links) from ``nvidia-smi nvlink --status``."""
    code, out = run_tool([SMI, "nvlink", "--status"])
    if code != 0:
        return {}
    found = {}
    current = None
    for line in out.splitlines():
        head = re.match(r"^GPU (\d{1,4}):", line)
        if head:
            current = int(head.group(1))
            found[current] = [0, 0]
            continue
        link = re.match(r"^\s+Link \d{1,3}: (.*)$", line)
        if link and current is not None:
            found[current][1 if "inactive" in link.group(1).lower() else 0] += 1
    return {k: tuple(v) for k, v in found.items()}


def report_blocks(text):
    """``nvidia-smi -q`` as (driver, CUDA version, per GPU: its bus key and its ``path: value``
    lines). A section is a line without a colon; a key's path is the sections above it that are
    less indented (``Clocks Event Reasons/HW Thermal Slowdown``, ``ECC Errors/Volatile/DRAM
    Uncorrectable``), so a key indented under another key (HW Thermal Slowdown under HW
    Slowdown) still belongs to the section."""
    versions = {}
    gpus = []
    stack = []
    for line in text.splitlines()[:100000]:
        match = re.match(r"^(Driver Version|CUDA Version|KMD Version|CUDA UMD Version)\s*:\s*(\S+)", line)
        if match:
            versions[match.group(1)] = value(match.group(2))
            continue
        match = re.match(r"^GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.\d)\s*$", line)
        if match:
            if len(gpus) < MAX_GPUS:
                gpus.append((bus_key(match.group(1)), {}))
            stack = []
            continue
        stripped = line.strip()
        if not gpus or not stripped or not line.startswith(" "):
            continue
        indent = len(line) - len(line.lstrip())
        while stack and stack[-1][0] >= indent:
            stack.pop()
        if ":" not in stripped:
            stack.append((indent, stripped[:60]))
            continue
        key, _, raw = stripped.partition(":")
        path = "/".join([name for _, name in stack] + [key.strip()[:60]])
        gpus[-1][1].setdefault(path, raw.strip()[:MAX_TEXT])
    # driver 610 marks "Driver Version" and "CUDA Version" deprecated (to go in CUDA 14) for
    # "KMD Version" and "CUDA UMD Version"
    driver = versions.get("Driver Version") or versions.get("KMD Version")
    cuda = versions.get("CUDA Version") or versions.get("CUDA UMD Version")
    return driver, cuda, gpus


REPORT_EVENTS = {
    "SW Power Cap": "sw_power_cap",
    "HW Slowdown": "hw_slowdown",
    "HW Thermal Slowdown": "hw_thermal_slowdown",
    "HW Power Brake Slowdown": "hw_power_brake_slowdown",
    "SW Thermal Slowdown": "sw_thermal_slowdown",
}
"""``-q``'s clock event reasons (``Clocks Event Reasons`` since 535, ``Clocks Throttle Reasons``
before) by the names the reader uses."""


def _report_ecc(lines, timescale):
    """The uncorrectable ECC count of one timescale (``Volatile``, ``Aggregate``) and its state:
    the sum of every ``... Uncorrectable ...`` counter (``SRAM Uncorrectable``, ``DRAM
    Uncorrectable``; 550+ splits SRAM into ``Parity`` and ``SEC-DED``), or before them ``Double
    Bit/Total``. All ``N/A``: the card has no ECC (``unsupported``)."""
    cells = [
        v for p, v in lines.items() if p.startswith("ECC Errors/" + timescale + "/") and "Uncorrectable" in p
    ]
    if not cells:
        cells = [v for p, v in lines.items() if p == "ECC Errors/" + timescale + "/Double Bit/Total"]
    if not cells:
        return None, "not in the report"
    states = [cell_state(c) for c in cells]
    if all(s == "unsupported" for s in states):
        return None, "unsupported"
    bad = [s for s in states if s not in ("ok", "unsupported")]
    if bad:
        return None, bad[0]
    return sum(whole(c) or 0 for c, s in zip(cells, states) if s == "ok"), "ok"  # noqa: B905


def gpu_from_report(index, bus, lines):
    """One GPU of ``nvidia-smi -q`` in the shape of :func:`gpu_from_row`."""

    def get(*paths):
        for path in paths:
            if path in lines:
                return lines[path]
        return None

    unsupported, unread = [], {}

    def state(fact, cell):
        found = cell_state(cell)
        if found == "unsupported":
            unsupported.append(fact)
        elif found == "not asked":
            unread[fact] = "not in nvidia-smi -q's report"
        elif found != "ok":
            unread[fact] = found

    gpu = {
        "index": index,
        "uuid": value(get("GPU UUID") or "") or "",
        "name": value(get("Product Name") or ""),
        "bus_id": bus,
    }
    persistence = get("Persistence Mode")
    state("persistence", persistence)
    link = "PCI/GPU Link Info/"
    gen, width = get(link + "PCIe Generation/Current"), get(link + "Link Width/Current")
    state("pcie", width)
    volatile, v_state = _report_ecc(lines, "Volatile")
    aggregate, _a_state = _report_ecc(lines, "Aggregate")
    mode = get("ECC Mode/Current", "Ecc Mode/Current")
    if v_state == "unsupported" and cell_state(mode) not in ("ok", "unsupported", "not asked"):
        # every counter N/A because the ECC mode itself cannot be read: unknown, not a card without ECC
        v_state = "nvidia-smi said ECC Mode: " + (mode or "").strip()[:60]
    if v_state == "unsupported":
        unsupported.append("ecc")
    elif v_state != "ok":
        unread["ecc"] = v_state if v_state != "not in the report" else "not in nvidia-smi -q's report"
    retired = get("Retired Pages/Pending Page Blacklist", "Retired Pages/Pending Page Retirement")
    state("retired_pages", retired)
    events = {}
    for section in ("Clocks Event Reasons", "Clocks Throttle Reasons"):
        for label, short in REPORT_EVENTS.items():
            found = lines.get(section + "/" + label)
            if found is not None:
                events[short] = yes_no(found)
    state("clock_events", get("Clocks Event Reasons/HW Slowdown", "Clocks Throttle Reasons/HW Slowdown"))
    remap = get("Remapped Rows")
    if remap is not None:
        state("remapped_rows", remap)
    temp = get("Temperature/GPU Current Temp")
    state("temperature", temp)
    # "Power Draw" until driver 535's era; 5xx drivers from about 550 print "Instantaneous" and
    # "Average Power Draw" instead (either may be N/A: the first with a value counts)
    draws = [
        get(f"{section}/{name}")
        for section in ("GPU Power Readings", "Power Readings")
        for name in ("Power Draw", "Instantaneous Power Draw", "Average Power Draw")
    ]
    power = next((d for d in draws if cell_state(d) == "ok"), next((d for d in draws if d is not None), None))
    state("power", power)
    # what the driver asks for this GPU: "GPU Reset Status" (drivers 550-565), "GPU Recovery
    # Action" (565 on: None, or the action NVML's nvmlDeviceGetGpuRecoveryAction names)
    asks = []
    action = value(get("GPU Recovery Action") or "")
    if action and action.lower() != "none":
        asks.append("recovery action " + action)
    for label in ("Reset Required", "Drain and Reset Recommended"):
        if yes_no(get("GPU Reset Status/" + label)):
            asks.append(label.lower())
    # 580+ (HBM channel and TPC repair): a repair waiting for a reset, or memory past repair
    for label, said in (
        ("Channel Repair Pending", "channel repair pending"),
        ("TPC Repair Pending", "TPC repair pending"),
        ("Unrepairable Memory", "unrepairable memory"),
    ):
        if yes_no(get("ECC Errors/" + label)):
            asks.append(said)
    used, total = get("FB Memory Usage/Used"), get("FB Memory Usage/Total")
    util = get("Utilization/Gpu")
    gpu.update(
        {
            "persistence": yes_no(persistence),
            "pcie_gen": whole(gen),
            "pcie_gen_max": whole(get(link + "PCIe Generation/Max")),
            "pcie_width": whole((width or "").replace("x", " ")),
            "pcie_width_max": whole((get(link + "Link Width/Max") or "").replace("x", " ")),
            "ecc_volatile": volatile,
            "ecc_aggregate": aggregate,
            "retired_pending": yes_no(retired),
            "throttle": {short: events.get(short) for short in REPORT_EVENTS.values()},
            "remap_unc": whole(get("Remapped Rows/Uncorrectable Error")),
            "remap_pending": yes_no(get("Remapped Rows/Pending")),
            "remap_failure": yes_no(get("Remapped Rows/Remapping Failure Occurred")),
            "temp_c": number(temp),
            "power_w": number(power),
            "mem_used_mib": number(used),
            "mem_total_mib": number(total),
            "util": number(util),
            "fabric_state": value(get("Fabric/State") or ""),
            "fabric_status": value(get("Fabric/Status") or ""),
            "recovery": ", ".join(asks)[:60] or None,
            "unsupported": unsupported,
            "unread": unread,
        }
    )
    return gpu


def query_details(heard=None):
    """``nvidia-smi -q``: (CUDA version, per bus key (fabric state, fabric status), driver, the
    GPUs as the report lists them (the reader's last resort when ``--query-gpu`` gives no table)).
    Its stdout and stderr go to ``heard`` when given."""
    code, out, err = run_tool([SMI, "-q"], timeout=DETAILS_TIMEOUT_S, with_errors=True)
    if heard is not None:
        heard.extend((out, err))
    if code != 0:
        return None, {}, None, []
    driver, cuda, blocks = report_blocks(out)
    gpus = [gpu_from_report(i, bus, lines) for i, (bus, lines) in enumerate(blocks)]
    fabric = {g["bus_id"]: (g["fabric_state"], g["fabric_status"]) for g in gpus}
    return cuda, fabric, driver, gpus


def kernel_xids():
    """Xid events in the kernel log, newest last (at most ``MAX_XIDS``), and where they were read;
    (None, None) when no kernel log can be read here (not root, ``dmesg_restrict``)."""
    code, out = run_tool(["dmesg", "--time-format", "iso"])
    source = "dmesg"
    if code != 0:
        code, out = run_tool(["journalctl", "-k", "-o", "short-iso", "--no-pager", "-q", "-n", "20000"])
        source = "journalctl"
        if code != 0 or not out.strip():
            return None, None
    return parse_xids(out), source


def parse_xids(text):
    """The Xid lines of a kernel log (``dmesg``'s or ``journalctl``'s, any time format), newest
    last, at most ``MAX_XIDS``; ``at`` is the line's ISO time when it starts with one (``dmesg
    --time-format iso``, ``journalctl -o short-iso``), else None."""
    events = []
    for line in text.splitlines():
        match = XID_LINE.search(line)
        if not match:
            continue
        at = ISO_TIME.match(line.strip())
        events.append(
            {
                "bus_id": bus_key(match.group(1)),
                "code": int(match.group(2)),
                "at": at.group(1) if at else None,
                "text": match.group(3).strip()[:MAX_TEXT],
            }
        )
    return events[-MAX_XIDS:]


def fabric_devices():
    """EFA / InfiniBand device names (``/sys/class/infiniband``): ``efa_0``, ``mlx5_0``..."""
    try:
        return sorted(os.listdir("/sys/class/infiniband"))[:MAX_GPUS]
    except OSError:
        return []


# -- DCGM (``dcgmi``) ----------------------------------------------------------------------------

DCGMI = "dcgmi"
DCGM_TIMEOUT_S = 6
DCGM_EVERY_S = 30.0
"""DCGM samples its health watches every 30 s by default (``dcgmi health -u``): a long-lived
reader (the node agent, polled every 2 s) asks no more often than that."""
MAX_INCIDENTS = 64
MAX_DCGM_TEXT = 300
MAX_DIAG_RESULTS = 128
MAX_DIAG_WARNINGS = 8
DIAG_TIMEOUT_S = {1: 120, 2: 600, 3: 2700}
"""Per ``dcgmi diag -r`` level: NVIDIA gives seconds for 1, about two minutes for 2 and about
15 for 3; the bound leaves room for a loaded or slow machine, then the diagnostic is stopped."""
NO_ENGINE_EXIT = 235
"""dcgmi's exit status when it cannot reach the host engine: ``DCGM_ST_CONNECTION_NOT_VALID``
(-21, ``dcgmlib/dcgm_structs.h``) as a process exit status."""
NO_ENGINE_TEXT = ("unable to establish a connection", "unable to connect to host engine")
WATCHES_OFF_TEXT = "health watches not enabled"
_dcgm_cache = {"at": None, "answer": None}


class DcgmFormatError(ValueError):
    """dcgmi's JSON is not laid out as its sources print it; the message names the field."""


DCGMI_TERM_GRACE_S = 30
"""How long dcgmi has to stop a diagnostic on SIGTERM before SIGKILL."""
DCGMI_KILL_WAIT_S = 5
"""How long the pipe may stay open after SIGKILL (a process outside the group holding it)."""


def _run_dcgmi(argv, timeout):
    """(exit code, stdout, timed out) of dcgmi, which prints its errors on stdout too. On a
    timeout its process group gets SIGTERM first (dcgmi's handler stops a running diagnostic),
    then SIGKILL; a process that still holds the pipe after that (one that left the group) is
    not waited for: the answer is bounded in time whatever dcgmi started."""
    try:
        proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
        )
    except OSError:
        return None, "", False
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _signal_group(proc, signal.SIGTERM)
        try:
            out, _ = proc.communicate(timeout=DCGMI_TERM_GRACE_S)
        except subprocess.TimeoutExpired:
            _signal_group(proc, signal.SIGKILL)
            try:
                out, _ = proc.communicate(timeout=DCGMI_KILL_WAIT_S)
            except subprocess.TimeoutExpired:
                proc.stdout.close()
                proc.wait()
                out = b""
        return proc.returncode, out[: 512 * 1024].decode("utf-8", "replace"), True
    return proc.returncode, out[: 2 * 1024 * 1024].decode("utf-8", "replace"), False


def _signal_group(proc, sig):
    with contextlib.suppress(OSError):  # already gone
        os.killpg(proc.pid, sig)


def _no_engine(code, out):
    low = out.lower()
    return code == NO_ENGINE_EXIT or any(t in low for t in NO_ENGINE_TEXT)


def _first_line(out):
    for line in out.splitlines():
        if line.strip():
            return line.strip()[:MAX_DCGM_TEXT]
    return ""


def _json_of(out, what):
    start = out.find("{")
    if start < 0:
        raise DcgmFormatError(f"{what}: no JSON in the answer ({_first_line(out) or 'empty'})")
    try:
        return json.loads(out[start:])
    except ValueError as exc:
        raise DcgmFormatError(f"{what}: not JSON ({exc})") from None


def _obj(value, where):
    if not isinstance(value, dict):
        raise DcgmFormatError(f"field {where}: expected an object")
    return value


def _text(value, where):
    if not isinstance(value, str):
        raise DcgmFormatError(f"field {where}: expected text")
    return value[:MAX_DCGM_TEXT]


def parse_health_check(out):
    """``dcgmi health -c -j``'s JSON as (overall health, incidents).

    The layout (``dcgmi/Health.cpp`` ``GenerateOutputFromResponse`` through ``DcgmiOutputJson``):
    ``{"header": ["Health Monitor Report"], "body": {"Overall Health": {"value": "Failure"},
    "GPU": {"children": {"1": {"value": "Failure", "children": {"Errors": {"children":
    {"Memory system": {"value": "Failure", "overflow": ["message in", "54-character parts"]}}}}}}}}}``:
    one entity group ("GPU", "Switch", ...) per incident's entity, the message of each system
    split into ``overflow`` parts. Raises :class:`DcgmFormatError` naming the field."""
    data = _obj(_json_of(out, "dcgmi health"), "(top)")
    body = _obj(data.get("body"), "body")
    overall = _text(
        _obj(body.get("Overall Health"), "body.Overall Health").get("value"), "body.Overall Health.value"
    )
    incidents = []
    for group, node in body.items():
        if group == "Overall Health":
            continue
        where = f"body.{group[:40]}"
        entities = _obj(_obj(node, where).get("children", {}), where + ".children")
        for entity, ent in entities.items():
            at = f"{where}.children.{entity[:20]}"
            if not entity.isdigit() or len(entity) > 9:
                raise DcgmFormatError(f"field {at}: expected an entity id")
            errors = _obj(_obj(ent, at).get("children", {}), at + ".children")
            systems = _obj(
                _obj(errors.get("Errors", {}), at + ".children.Errors").get("children", {}),
                at + ".children.Errors.children",
            )
            for system, found in systems.items():
                here = f"{at}.Errors.{system[:40]}"
                found = _obj(found, here)
                parts = found.get("overflow", [])
                if not isinstance(parts, list):
                    raise DcgmFormatError(f"field {here}.overflow: expected a list")
                message = " ".join(_text(p, here + ".overflow[]") for p in parts[:40])
                if len(incidents) < MAX_INCIDENTS:
                    incidents.append(
                        {
                            "group": group[:20],
                            "entity": int(entity),
                            "system": system[:40],
                            "health": _text(found.get("value"), here + ".value")[:20],
                            "message": message[:MAX_DCGM_TEXT],
                        }
                    )
    return overall[:20], incidents


def dcgm_health(now=None):
    """DCGM's health watches, once every ``DCGM_EVERY_S`` in this process; None without ``dcgmi``.

    ``state``: ``ok`` (the check answered: ``overall`` and ``incidents``), ``watches_set`` (no
    watch was set, so this call set them all: DCGM needs about a minute of samples before its
    check means anything), ``no_engine`` (the host engine does not answer), ``error`` (another
    failure, or an answer not laid out as expected: ``detail`` says which)."""
    if shutil.which(DCGMI) is None:
        return None
    now = time.monotonic() if now is None else now
    at = _dcgm_cache["at"]
    if at is not None and now - at < DCGM_EVERY_S and _dcgm_cache["answer"] is not None:
        return _dcgm_cache["answer"]
    answer = _check_dcgm()
    _dcgm_cache["at"], _dcgm_cache["answer"] = now, answer
    return answer


def _check_dcgm():
    answer = {"state": "error", "detail": None, "overall": None, "incidents": []}
    code, out, late = _run_dcgmi([DCGMI, "health", "-c", "-j"], DCGM_TIMEOUT_S)
    if late:
        answer["detail"] = f"dcgmi health -c did not answer in {DCGM_TIMEOUT_S} s"
        return answer
    if _no_engine(code, out):
        answer["state"] = "no_engine"
        return answer
    if code != 0 and WATCHES_OFF_TEXT in out.lower():
        set_code, set_out, _ = _run_dcgmi([DCGMI, "health", "-s", "a"], DCGM_TIMEOUT_S)
        if set_code == 0:
            answer["state"] = "watches_set"
        elif _no_engine(set_code, set_out):
            answer["state"] = "no_engine"
        else:
            answer["detail"] = "dcgmi health -s a: " + (_first_line(set_out) or f"exit {set_code}")
        return answer
    if code != 0:
        answer["detail"] = "dcgmi health -c: " + (_first_line(out) or f"exit {code}")
        return answer
    try:
        answer["overall"], answer["incidents"] = parse_health_check(out)
    except DcgmFormatError as exc:
        answer["detail"] = str(exc)[:MAX_DCGM_TEXT]
        return answer
    answer["state"] = "ok"
    return answer


def _gpu_of(result, where):
    """A diagnostic result's GPU: ``entity_id`` of an ``entity_group`` "GPU" (DCGM 4), else the
    ``gpu_id`` (DCGM 3: a digit string, or a number in the deployment tests) or ``gpu_ids`` (DCGM 2,
    the name NVVS's JsonOutput.h keeps "to maintain backwards compatibility"); None: not a GPU."""
    group = result.get("entity_group")
    if group is not None:
        if _text(group, where + ".entity_group") != "GPU":
            return None
        entity = result.get("entity_id")
        if not isinstance(entity, int) or isinstance(entity, bool) or not 0 <= entity < 4096:
            raise DcgmFormatError(f"field {where}.entity_id: expected a GPU id")
        return entity
    gpu = result.get("gpu_id", result.get("gpu_ids"))
    if gpu is None:
        return None
    if isinstance(gpu, str) and gpu.isdigit() and len(gpu) < 5:
        return int(gpu)
    if isinstance(gpu, int) and not isinstance(gpu, bool) and 0 <= gpu < 4096:
        return gpu
    raise DcgmFormatError(f"field {where}.gpu_id: expected a GPU id")


def _warnings_of(result, where):
    raw = result.get("warnings", [])
    if not isinstance(raw, list):
        raise DcgmFormatError(f"field {where}.warnings: expected a list")
    found = []
    for i, item in enumerate(raw[:MAX_DIAG_WARNINGS]):
        item = _obj(item, f"{where}.warnings[{i}]")
        text = item.get("warning", item.get("warnings"))  # DCGM 3's deployment tests say "warnings"
        found.append(_text(text, f"{where}.warnings[{i}].warning"))
    return found


def parse_diag(out):
    """``dcgmi diag -r N -j``'s JSON as its tests' results: (tests run, counts, results that did
    not pass). The layout (``dcgmi/Diag.cpp`` ``HelperJsonBuildOutput``, key names from
    ``nvvs/include/NvvsJsonStrings.h``, checked against ``testing/python3/dcgm_diag_schema.json``):
    ``{"DCGM Diagnostic": {"test_categories": [{"category": "Hardware", "tests": [{"name":
    "memory", "results": [{"entity_group": "GPU", "entity_id": 0, "status": "Fail", "warnings":
    [{"warning": "...", "error_id": 0, ...}]}], "test_summary": {"status": "Fail"}}]}]}}``; a
    failure to run is ``{"DCGM Diagnostic": {"runtime_error": "..."}}``. DCGM 3 named the top
    key "DCGM GPU Diagnostic" and a result's GPU ``gpu_id``. Raises :class:`DcgmFormatError`."""
    data = _obj(_json_of(out, "dcgmi diag"), "(top)")
    key = "DCGM Diagnostic" if "DCGM Diagnostic" in data else "DCGM GPU Diagnostic"
    top = _obj(data.get(key), key)
    if top.get("runtime_error") is not None:
        return {"runtime_error": _text(top["runtime_error"], key + ".runtime_error")}
    categories = top.get("test_categories")
    if not isinstance(categories, list):
        raise DcgmFormatError(f"field {key}.test_categories: expected a list")
    tests, failed, counts = [], [], {"pass": 0, "skip": 0, "fail": 0, "warn": 0}
    for c, category in enumerate(categories[:16]):
        where = f"{key}.test_categories[{c}]"
        category = _obj(category, where)
        cat_name = _text(category.get("category", ""), where + ".category")
        items = category.get("tests", [])
        if not isinstance(items, list):
            raise DcgmFormatError(f"field {where}.tests: expected a list")
        for t, test in enumerate(items[:64]):
            at = f"{where}.tests[{t}]"
            test = _obj(test, at)
            name = _text(test.get("name"), at + ".name")[:60]
            tests.append(name)
            results = test.get("results", [])
            if not isinstance(results, list):
                raise DcgmFormatError(f"field {at}.results: expected a list")
            named = False
            for r, result in enumerate(results[:512]):
                here = f"{at}.results[{r}]"
                result = _obj(result, here)
                status = _text(result.get("status"), here + ".status")
                kind = status.lower() if status.lower() in counts else None
                if kind is None:
                    continue  # "Not Run" (not printed by DCGM 4) or a status to come
                counts[kind] += 1
                if kind in ("fail", "warn"):
                    named = True
                    if len(failed) < MAX_DIAG_RESULTS:
                        failed.append(
                            {
                                "test": name,
                                "category": cat_name[:40],
                                "gpu": _gpu_of(result, here),
                                "entity": _text(
                                    result.get(
                                        "entity_group",
                                        "GPU" if "gpu_id" in result or "gpu_ids" in result else "None",
                                    ),
                                    here + ".entity_group",
                                )[:20],
                                "status": kind,
                                "warnings": _warnings_of(result, here),
                            }
                        )
            summary = test.get("test_summary")
            if summary is not None:
                summary = _obj(summary, at + ".test_summary")
                status = _text(summary.get("status"), at + ".test_summary.status").lower()
                if status in ("fail", "warn") and not named and len(failed) < MAX_DIAG_RESULTS:
                    counts[status] += 1
                    failed.append(
                        {
                            "test": name,
                            "category": cat_name[:40],
                            "gpu": None,
                            "entity": "None",
                            "status": status,
                            "warnings": _warnings_of(summary, at + ".test_summary"),
                        }
                    )
    return {"tests": tests[:64], "counts": counts, "failed": failed}


def read_diag(level):
    """DCGM's active diagnostic at ``level`` (1, 2 or 3) as one JSON-able dict: ``state`` is
    ``ok`` (it ran: ``tests``, ``counts``, ``failed``), ``not_installed`` (no ``dcgmi``),
    ``no_engine``, ``timeout`` (stopped after ``DIAG_TIMEOUT_S``) or ``error`` (``detail``).
    A failed test makes dcgmi exit non-zero with its JSON on stdout: the JSON is what counts."""
    answer = {"level": level, "state": "error", "detail": None, "seconds": None}
    if level not in DIAG_TIMEOUT_S:
        answer["detail"] = f"level {level}: expected 1, 2 or 3"
        return answer
    if shutil.which(DCGMI) is None:
        answer["state"] = "not_installed"
        return answer
    began = time.monotonic()
    code, out, late = _run_dcgmi([DCGMI, "diag", "-r", str(level), "-j"], DIAG_TIMEOUT_S[level])
    answer["seconds"] = round(time.monotonic() - began, 1)
    if late:
        answer["state"] = "timeout"
        answer["detail"] = f"did not finish in {DIAG_TIMEOUT_S[level]} s (stopped)"
        return answer
    if _no_engine(code, out):
        answer["state"] = "no_engine"
        return answer
    try:
        found = parse_diag(out)
    except DcgmFormatError as exc:
        detail = str(exc) if "{" in out else "dcgmi diag: " + (_first_line(out) or f"exit {code}")
        answer["detail"] = detail[:MAX_DCGM_TEXT]
        return answer
    if "runtime_error" in found:
        answer["detail"] = found["runtime_error"]
        return answer
    answer.update(found)
    answer["state"] = "ok"
    return answer


def together(reads):
    """Each of ``reads`` (name: function of no arguments) in its own thread, all at once; per name
    its result, or the exception it raised. Every read bounds itself (each tool runs with its own
    timeout, DCGM's too), so the wait is that of the slowest read: no deadline is needed here, and
    none could stop a thread anyway."""
    results = {}

    def one(name, read):
        try:
            results[name] = (True, read())
        except Exception as exc:  # noqa: BLE001 - raised again in the caller's thread
            results[name] = (False, exc)

    threads = [
        threading.Thread(target=one, args=(name, read), name="fleetrun-gpu-" + name, daemon=True)
        for name, read in reads.items()
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def read_health(full=True):
    """Everything above as one JSON-able dict. ``full`` adds the slower reads (``-q``, NVLink,
    fabric devices) that the doctor wants and a poll during the run does not.

    The GPUs are read through NVML when ``pynvml`` loads (``reader`` "nvml"), else through
    nvidia-smi's query interface (``reader`` "nvidia-smi", ``reader_note`` says why not NVML).
    The other reads start together (:func:`together`): those about the GPUs (row remapping,
    NVLink, ``-q``) before it is known whether ``--query-gpu`` lists any, and their answers are
    used only when it does, so the answer is the one the reads would give one after the other; a
    read that raises makes this raise its error, the first in that order, as it did then."""
    nv_lost = []
    nv_gpus, nv_driver, nv_cuda, why_not = nvml_gpus(nv_lost)
    has_smi = shutil.which(SMI) is not None
    answer = {"smi": has_smi or nv_gpus is not None, "gpus": [], "driver": None, "cuda": None}
    if not answer["smi"]:
        return answer  # no NVIDIA tools: a CPU node; its kernel log holds no Xid to look for
    by_nvml = nv_gpus is not None
    answer["reader"] = "nvml" if by_nvml else "nvidia-smi"
    answer["reader_note"] = why_not
    heard = {"query": [], "details": []}  # each read's own list: they run in their own threads
    reads = {} if by_nvml else {"query": lambda: query_gpus(heard["query"]), "remap": remapped_rows}
    if full and not by_nvml:
        reads["nvlink"] = nvlinks
    if full and has_smi:
        reads["details"] = lambda: query_details(heard["details"])
    reads["xids"] = kernel_xids
    if full:
        reads["ib"] = fabric_devices
    reads["dcgm"] = dcgm_health
    results = together(reads)
    listed = bool(nv_gpus) if by_nvml else results["query"][0] and bool(results["query"][1][0])
    for name in reads:  # in the order they ran one after the other, not the order they ended
        ok, found = results[name]
        if not ok and (listed or name not in ("remap", "nvlink", "details")):
            raise found
    got = {name: found for name, (_ok, found) in results.items()}
    if by_nvml:
        gpus, driver, health = nv_gpus, nv_driver, True
    else:
        gpus, driver, health = got["query"]
        if gpus is None and "details" in got and got["details"][3]:
            # no --query-gpu table, but -q lists the GPUs: its report is the answer
            _cuda, _fabric, driver, gpus = got["details"]
            health = True
            answer["reader"] = "nvidia-smi -q"
    answer["queried"] = gpus is not None
    answer["health_fields"] = health
    # the GPUs the driver names but cannot open, in NVML's or nvidia-smi's words, and nvidia-smi's
    # own complaint when it listed none: never a silently shorter list
    lost, said = smi_complaints(heard["query"] + heard["details"])
    opened = {g["bus_id"] for g in gpus or []}
    answer["lost"] = ([g for g in lost if g["bus_id"] not in opened] or nv_lost)[:MAX_GPUS]
    answer["smi_said"] = said if gpus is None or lost else None
    answer["gpus"] = gpus or []
    answer["driver"] = driver
    answer["cuda"] = nv_cuda
    if gpus and answer["reader"] == "nvidia-smi":
        remap = got["remap"]
        for gpu in answer["gpus"]:
            rows = remap.get(gpu["uuid"])
            gpu["remap_unc"], gpu["remap_pending"], gpu["remap_failure"], state = rows or (None,) * 3 + (
                "ok",
            )
            if state == "unsupported":
                gpu["unsupported"].append("remapped_rows")
    if gpus and not by_nvml and full:
        links = got["nvlink"]
        for gpu in answer["gpus"]:
            active, inactive = links.get(gpu["index"], (None, None))
            gpu["nvlink_active"], gpu["nvlink_inactive"] = active, inactive
    if gpus and "details" in got:
        cuda, fabric = got["details"][:2]
        asked = {g["bus_id"]: g["recovery"] for g in got["details"][3]}
        answer["cuda"] = answer["cuda"] or cuda
        for gpu in answer["gpus"]:
            gpu["fabric_state"], gpu["fabric_status"] = fabric.get(gpu["bus_id"], (None, None))
            gpu["recovery"] = asked.get(gpu["bus_id"])
    answer["xids"], answer["xid_source"] = got["xids"]
    if full:
        answer["ib_devices"] = got["ib"]
    answer["dcgm"] = got["dcgm"]
    return answer


def main(argv):
    """``python - diag LEVEL`` (this file on stdin): DCGM's diagnostic, one JSON line."""
    if len(argv) == 3 and argv[1] == "diag" and argv[2].isdigit():
        sys.stdout.write(json.dumps(read_diag(int(argv[2]))) + "\n")
        return 0
    sys.stderr.write("usage: python fleetrun_gpu.py diag LEVEL\n")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
