"""GPU health read on the node the way NVIDIA's own tools read it. Standard library only (3.8+).

Everything comes from NVIDIA's documented interfaces, through the tools a lab already has:

* ``nvidia-smi --query-gpu=FIELDS --format=csv,nounits``: one CSV row per GPU, with its header,
  so the columns are found by name (a driver that lacks a field fails the query: the basic fields
  are asked again and the rest stays unknown). Unsupported values read ``[N/A]`` or
  ``[Not Supported]``, unreadable ones ``[Insufficient Permissions]``: all of them are ``None``.
* ``nvidia-smi --query-remapped-rows=...``: row remapping pending / failed (A100 and later).
* ``nvidia-smi nvlink --status``: ``Link N: <inactive>`` per link.
* ``nvidia-smi -q``: the ``CUDA Version`` line and each GPU's ``Fabric`` section (State and
  Status, set on NVSwitch systems once the Fabric Manager has trained the fabric).
* the kernel log (``dmesg``, else ``journalctl -k``): ``NVRM: Xid (PCI:0000:3b:00): 79, ...``.
  Most distributions restrict it to root: then the Xid list is ``None`` (unknown), never empty.
* ``/sys/class/infiniband``: the EFA / InfiniBand devices the instance type should have.

Nothing is judged here: the answer is facts, ``None`` where a fact could not be read; the verdicts
are made on the laptop (``launch.rules.gpu_health``), which parses the answer as untrusted input.
The probe (``fab doctor``, the pre-launch check) and the node agent's poll use the same reader.
"""

from __future__ import annotations

import csv
import os
import re
import shutil
import subprocess

TOOL_TIMEOUT_S = 8
MAX_GPUS = 64
MAX_XIDS = 32
MAX_TEXT = 120
SMI = "nvidia-smi"

BASIC_FIELDS = ("index", "uuid", "name", "pci.bus_id", "driver_version")
HEALTH_FIELDS = (
    "persistence_mode",
    "pcie.link.gen.current",
    "pcie.link.gen.max",
    "pcie.link.width.current",
    "pcie.link.width.max",
    "ecc.errors.uncorrected.volatile.total",
    "ecc.errors.uncorrected.aggregate.total",
    "retired_pages.pending",
    "clocks_throttle_reasons.hw_slowdown",
    "clocks_throttle_reasons.hw_thermal_slowdown",
    "clocks_throttle_reasons.hw_power_brake_slowdown",
    "clocks_throttle_reasons.sw_thermal_slowdown",
    "clocks_throttle_reasons.sw_power_cap",
    "temperature.gpu",
    "power.draw",
    "memory.used",
    "memory.total",
    "utilization.gpu",
)
THROTTLE = {
    "clocks_throttle_reasons.hw_slowdown": "hw_slowdown",
    "clocks_throttle_reasons.hw_thermal_slowdown": "hw_thermal_slowdown",
    "clocks_throttle_reasons.hw_power_brake_slowdown": "hw_power_brake_slowdown",
    "clocks_throttle_reasons.sw_thermal_slowdown": "sw_thermal_slowdown",
    "clocks_throttle_reasons.sw_power_cap": "sw_power_cap",
}
REMAP_FIELDS = ("gpu_uuid", "remapped_rows.uncorrectable", "remapped_rows.pending", "remapped_rows.failure")
XID_LINE = re.compile(
    r"NVRM: Xid \(PCI:([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2})[^)]{0,40}\): (\d{1,4}), ?(.*)"
)
ISO_TIME = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)")


def run_tool(argv, timeout=TOOL_TIMEOUT_S):
    """(exit code, stdout) of ``argv``; exit None when the tool is missing or hangs."""
    if shutil.which(argv[0]) is None:
        return None, ""
    try:
        proc = subprocess.run(
            argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, timeout=timeout, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None, ""
    return proc.returncode, proc.stdout[: 512 * 1024].decode("utf-8", "replace")


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


def parse_csv(text, fields):
    """Rows of a ``--format=csv,nounits`` answer as dicts keyed by field name (units stripped
    from the header: ``memory.used [MiB]`` is ``memory.used``); None unless the header names
    exactly ``fields`` (an error message instead of a table, or another tool's output)."""
    rows = list(csv.reader(text.splitlines(), skipinitialspace=True))
    if not rows:
        return None
    header = [h.split(" [")[0].strip() for h in rows[0]]
    if header != list(fields):
        return None
    out = []
    for row in rows[1 : MAX_GPUS + 1]:
        if len(row) == len(header):
            out.append(dict(zip(header, row)))  # noqa: B905 - nodes may run Python 3.8
    return out


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


def gpu_from_row(row, health):
    gpu = {
        "index": whole(row.get("index", "")),
        "uuid": value(row.get("uuid", "")) or "",
        "name": value(row.get("name", "")),
        "bus_id": bus_key(row.get("pci.bus_id", "")),
    }
    if not health:
        return gpu
    throttle = {}
    for field, short in THROTTLE.items():
        throttle[short] = yes_no(row.get(field))
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
        }
    )
    return gpu


def query_gpus():
    """(gpus, driver, health fields read?) from ``--query-gpu``; (None, None, False) when the tool
    gives no table at all. A GPU that fell off the bus makes nvidia-smi exit non-zero but still
    list the others: the table counts, not the exit code."""
    fields = BASIC_FIELDS + HEALTH_FIELDS
    _code, out = run_tool([SMI, "--query-gpu=" + ",".join(fields), "--format=csv,nounits"])
    rows = parse_csv(out, fields)
    health = rows is not None
    if rows is None:
        _code, out = run_tool([SMI, "--query-gpu=" + ",".join(BASIC_FIELDS), "--format=csv,nounits"])
        rows = parse_csv(out, BASIC_FIELDS)
        if rows is None:
            return None, None, False
    driver = None
    gpus = []
    for row in rows:
        gpu = gpu_from_row(row, health)
        if gpu["index"] is None:
            continue
        driver = value(row.get("driver_version", "")) or driver
        gpus.append(gpu)
    return gpus, driver, health


def remapped_rows():
    """Per GPU uuid: (uncorrectable rows, pending, failure); {} when the query is not supported."""
    _code, out = run_tool([SMI, "--query-remapped-rows=" + ",".join(REMAP_FIELDS), "--format=csv,nounits"])
    found = {}
    for row in parse_csv(out, REMAP_FIELDS) or []:
        uuid = value(row.get("gpu_uuid", ""))
        if uuid:
            found[uuid] = (
                whole(row.get("remapped_rows.uncorrectable")),
                yes_no(row.get("remapped_rows.pending")),
                yes_no(row.get("remapped_rows.failure")),
            )
    return found


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


def query_details():
    """``nvidia-smi -q``: (CUDA version, per bus key (fabric state, fabric status))."""
    code, out = run_tool([SMI, "-q"], timeout=20)
    if code != 0:
        return None, {}
    cuda = None
    fabric = {}
    bus = None
    section = None
    for line in out.splitlines()[:100000]:
        match = re.match(r"^CUDA Version\s*:\s*(\S+)", line)
        if match:
            cuda = value(match.group(1))
            continue
        match = re.match(r"^GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.\d)\s*$", line)
        if match:
            bus, section = bus_key(match.group(1)), None
            continue
        stripped = line.strip()
        indent = len(line) - len(line.lstrip())
        if ":" not in stripped:
            if indent <= 4:
                section = stripped
            continue
        if indent <= 4:
            section = None  # a key of the GPU itself ends the section before it
            continue
        if bus is None or section != "Fabric":
            continue
        key, _, raw = stripped.partition(":")
        key = key.strip()
        if key in ("State", "Status"):
            state, status = fabric.get(bus, (None, None))
            fabric[bus] = (value(raw), status) if key == "State" else (state, value(raw))
    return cuda, fabric


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
    events = []
    for line in out.splitlines():
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
    return events[-MAX_XIDS:], source


def fabric_devices():
    """EFA / InfiniBand device names (``/sys/class/infiniband``): ``efa_0``, ``mlx5_0``..."""
    try:
        return sorted(os.listdir("/sys/class/infiniband"))[:MAX_GPUS]
    except OSError:
        return []


def read_health(full=True):
    """Everything above as one JSON-able dict. ``full`` adds the slower reads (``-q``, NVLink,
    fabric devices) that the doctor wants and a poll during the run does not."""
    answer = {"smi": shutil.which(SMI) is not None, "gpus": [], "driver": None, "cuda": None}
    if not answer["smi"]:
        return answer  # no NVIDIA tools: a CPU node; its kernel log holds no Xid to look for
    gpus, driver, health = query_gpus()
    answer["queried"] = gpus is not None
    answer["health_fields"] = health
    answer["gpus"] = gpus or []
    answer["driver"] = driver
    if gpus:
        remap = remapped_rows()
        for gpu in answer["gpus"]:
            rows = remap.get(gpu["uuid"])
            gpu["remap_unc"], gpu["remap_pending"], gpu["remap_failure"] = rows or (None, None, None)
        if full:
            links = nvlinks()
            cuda, fabric = query_details()
            answer["cuda"] = cuda
            for gpu in answer["gpus"]:
                active, inactive = links.get(gpu["index"], (None, None))
                gpu["nvlink_active"], gpu["nvlink_inactive"] = active, inactive
                gpu["fabric_state"], gpu["fabric_status"] = fabric.get(gpu["bus_id"], (None, None))
    xids, source = kernel_xids()
    answer["xids"] = xids
    answer["xid_source"] = source
    if full:
        answer["ib_devices"] = fabric_devices()
    return answer
