"""GPU health verdicts, per node and per GPU, from what the node's NVIDIA tools said: pure, no I/O.

The facts come from ``launch/nodelib/fleetrun_gpu.py`` (``nvidia-smi``'s query interface, its
``-q`` report, ``nvlink --status`` and the kernel's Xid lines), through the probe (``fab doctor``,
the pre-launch check) and the node agent's poll (during a run). They are untrusted: parsed here
within bounds into typed facts, and a malformed answer is a ``ProtocolError`` naming the field.

Levels: ``bad`` (a job on this GPU fails, hangs or corrupts: uncorrectable ECC since the driver
loaded, an Xid NVIDIA's catalogue says needs a reset, a drain or a repair (``launch.rules.xid_catalog``), a GPU missing, row remapping pending or failed, NVLinks down, the NVSwitch
fabric not trained), ``warn`` (it runs, slower or at risk: PCIe narrower than the GPU's maximum,
hardware or thermal slowdown, persistence mode off, uncorrectable ECC in the lifetime count only),
``unknown`` (something that matters could not be read here, typically the kernel log without root,
or a read that failed: always with the reason, never reported as healthy) and ``ok``. A fact the
GPU does not have (``unsupported``: no ECC on a GeForce card) is healthy on that fact. Why these: they are the faults Meta's Llama 3 report and
NVIDIA's own Xid catalogue put first, and the ones DCGM's health watches look at.

Where DCGM is installed, its health watches (``dcgmi health``) add their incidents to the same
per-GPU line: a ``Failure`` is bad, a ``Warning`` a warning, and an incident that names a fault
nvidia-smi or the kernel log already named (the same ECC count, Xid, pending retirement or
remapping, NVLink down) is not said twice. A host engine that does not answer makes the DCGM part
unknown. DCGM's active diagnostic (``dcgmi diag``, ``fab doctor --gpu-diag``) is judged in
``launch.rules.gpu_diag``.

During a run, :func:`new_faults` compares a poll against the node's first one: a new critical Xid,
an uncorrectable ECC count that went up, a GPU gone from the list, a new DCGM ``Failure``; each is
named with node, GPU and code (the ``gpu_fault`` stop rule).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from launch.nodelib.fleetrun_wire import ProtocolError, _Fields
from launch.rules.xid_catalog import XidMeaning, xid_meaning

__all__ = [
    "BAD",
    "FACTS",
    "DcgmHealth",
    "DcgmIncident",
    "OK",
    "UNKNOWN",
    "WARN",
    "GpuFacts",
    "GpuHealth",
    "GpuVerdict",
    "EnergyMeter",
    "LostGpu",
    "XidEvent",
    "expected_fabric_devices",
    "gpu_reading",
    "expected_gpus",
    "judge_fleet",
    "judge_node",
    "new_faults",
    "parse_gpu_health",
    "printable",
    "xid_name",
    "xid_meaning",
]

OK, WARN, BAD, UNKNOWN = "ok", "warn", "bad", "unknown"
RANK = {OK: 0, UNKNOWN: 1, WARN: 2, BAD: 3}
MAX_GPUS = 64
MAX_XIDS = 32
MAX_TEXT = 120

FACTS = (
    "persistence",
    "pcie",
    "ecc",
    "retired_pages",
    "clock_events",
    "temperature",
    "power",
    "memory",
    "utilization",
    "remapped_rows",
    "nvlink",
)
"""The facts the reader reads per GPU; each may be ``unsupported`` (the GPU has no such thing:
a value, judged healthy) or unread (with the reason: judged unknown)."""
READERS = ("nvml", "nvidia-smi", "nvidia-smi -q")
READER_NAMES = {"nvml": "NVML", "nvidia-smi": "nvidia-smi", "nvidia-smi -q": "nvidia-smi -q"}

HW_THROTTLE = {
    "hw_slowdown": "HW slowdown",
    "hw_thermal_slowdown": "HW thermal slowdown",
    "hw_power_brake_slowdown": "HW power brake",
    "sw_thermal_slowdown": "SW thermal slowdown",
}
"""Throttle reasons worth a warning; ``sw_power_cap`` is a GPU working at its power limit (normal)."""
THROTTLE_NAMES = (*HW_THROTTLE, "sw_power_cap")

INSTANCE_GPUS: Mapping[str, tuple[int, int]] = {
    "p4d.24xlarge": (8, 4),
    "p4de.24xlarge": (8, 4),
    "p5.48xlarge": (8, 32),
    "p5e.48xlarge": (8, 32),
    "p5en.48xlarge": (8, 16),
    "p3dn.24xlarge": (8, 1),
    "g5.48xlarge": (8, 1),
    "g6e.48xlarge": (8, 4),
    "a2-highgpu-8g": (8, 0),
    "a2-ultragpu-8g": (8, 0),
    "a3-highgpu-8g": (8, 0),
    "a3-megagpu-8g": (8, 0),
}
"""GPUs and EFA/InfiniBand devices an instance type comes with (the cloud's published specs)."""


@dataclass(frozen=True)
class GpuFacts:
    """One GPU as nvidia-smi reported it; ``None`` is "not read" (unsupported or not allowed)."""

    index: int
    uuid: str
    bus_id: str
    name: str | None = None
    persistence: bool | None = None
    pcie_gen: int | None = None
    pcie_gen_max: int | None = None
    pcie_width: int | None = None
    pcie_width_max: int | None = None
    ecc_volatile: int | None = None
    ecc_aggregate: int | None = None
    retired_pending: bool | None = None
    remap_unc: int | None = None
    remap_pending: bool | None = None
    remap_failure: bool | None = None
    throttle: tuple[str, ...] | None = None
    """Active throttle reasons (``THROTTLE_NAMES``); None when not read."""
    temp_c: float | None = None
    power_w: float | None = None
    mem_used_mib: float | None = None
    mem_total_mib: float | None = None
    util: float | None = None
    nvlink_active: int | None = None
    nvlink_inactive: int | None = None
    fabric_state: str | None = None
    fabric_status: str | None = None
    recovery: str | None = None
    """What the driver asks for this GPU (``-q``: ``GPU Recovery Action`` other than None, ``GPU
    Reset Status`` ``Reset Required``/``Drain and Reset Recommended`` Yes, 580+'s ``ECC Errors``
    ``Channel Repair Pending``/``TPC Repair Pending``/``Unrepairable Memory`` Yes); None: nothing
    asked, or not reported."""
    unsupported: tuple[str, ...] = ()
    """Facts this GPU does not have (NVML's NOT_SUPPORTED, nvidia-smi's ``[N/A]``): a GeForce
    card's ECC, a PCIe card's NVLinks."""
    unread: tuple[tuple[str, str], ...] = ()
    """(fact, why) for each fact a read of failed: the only source of "unknown" for a GPU."""

    @property
    def label(self) -> str:
        return f"gpu{self.index}"

    def why_unread(self, fact: str) -> str | None:
        return next((why for name, why in self.unread if name == fact), None)


@dataclass(frozen=True)
class XidEvent:
    bus_id: str
    code: int
    at: str | None
    text: str

    @property
    def key(self) -> tuple[str, int, str | None, str]:
        return (self.bus_id, self.code, self.at, self.text)


DCGM_LEVEL: Mapping[str, str] = {"Failure": BAD, "Warning": WARN, "Healthy": OK}
"""``dcgmi health``'s words (``Health::HelperHealthToString``); any other (``Internal error``) is
unknown."""
DCGM_STATES = ("ok", "watches_set", "no_engine", "error")
MAX_INCIDENTS = 64
MAX_DCGM_TEXT = 300


@dataclass(frozen=True)
class DcgmIncident:
    """One system's incident on one DCGM entity, as ``dcgmi health -c`` names it."""

    group: str
    """DCGM's entity group: ``GPU``, ``Switch`` (NVSwitch), ``LINK``, ``ConnectX``..."""
    entity: int
    system: str
    """``Memory system``, ``PCIe system``, ``NVLINK system``, ``InfoROM system``, ``Thermal
    system``, ``Power system``, ``Driver``..."""
    health: str
    message: str

    @property
    def gpu(self) -> int | None:
        """DCGM's GPU id, which follows NVML's enumeration as nvidia-smi's index does."""
        return self.entity if self.group == "GPU" else None

    @property
    def level(self) -> str:
        return DCGM_LEVEL.get(self.health, UNKNOWN)

    @property
    def text(self) -> str:
        system = self.system.removesuffix(" system")
        where = "" if self.group == "GPU" else f"{self.group} {self.entity} "
        return f"DCGM {where}{system}: {self.message}"


@dataclass(frozen=True)
class DcgmHealth:
    """DCGM's health watches on one node. ``state``: ``ok`` (checked), ``watches_set`` (none was
    set: set now, meaningful in about a minute), ``no_engine`` (nv-hostengine not answering),
    ``error`` (``detail``), ``malformed`` (the answer was not understood: ``detail`` names the
    field). All but ``ok`` are unknown."""

    state: str
    detail: str | None = None
    overall: str | None = None
    incidents: tuple[DcgmIncident, ...] = ()

    @property
    def unknown(self) -> str | None:
        """Why DCGM's health is unknown here, or None when it was read."""
        if self.state == "ok":
            return None
        return {
            "watches_set": "DCGM health (its watches were off: set now, a check means something in about a minute)",
            "no_engine": "DCGM health (the host engine does not answer: is nv-hostengine running?)",
        }.get(self.state, f"DCGM health ({self.detail or self.state})")


@dataclass(frozen=True)
class LostGpu:
    """A GPU the driver names but cannot open: nvidia-smi's ``Unable to determine the device handle
    for GPU 0000:09:00.0: Unknown Error`` (or ``GPU is lost. Reboot the system to recover this
    GPU``), NVML's ``GPU is lost`` for an index it counts. ``man nvidia-smi``: "GPU has fallen off
    the bus or has otherwise become inaccessible". nvidia-smi lists the others and leaves it out:
    without this the node's list is only shorter."""

    bus_id: str | None
    index: int | None
    why: str

    @property
    def text(self) -> str:
        where = f"GPU at PCI {self.bus_id}" if self.bus_id else f"GPU {self.index}"
        return f"{where}: the driver cannot open it ({self.why})"


@dataclass(frozen=True)
class GpuHealth:
    """One node's answer. ``smi`` False: no nvidia-smi (no GPUs, or no driver)."""

    smi: bool = False
    queried: bool = False
    """nvidia-smi answered with a GPU table."""
    health_fields: bool = False
    """The health fields were read (False: an old driver knew only the basic ones)."""
    driver: str | None = None
    cuda: str | None = None
    gpus: tuple[GpuFacts, ...] = ()
    xids: tuple[XidEvent, ...] | None = None
    """None: the kernel log could not be read here, so Xids are unknown (not absent)."""
    xid_source: str | None = None
    ib_devices: tuple[str, ...] | None = None
    dcgm: DcgmHealth | None = None
    """None: no ``dcgmi`` on the node (DCGM is optional; nvidia-smi's facts stand alone)."""
    reader: str | None = None
    """Which path read the GPUs: ``nvml`` or ``nvidia-smi`` (None: an older reader)."""
    reader_note: str | None = None
    """Why not NVML, when nvidia-smi read them (``pynvml (nvidia-ml-py) not installed``)."""
    lost: tuple[LostGpu, ...] = ()
    """GPUs the driver names but cannot open (not in ``gpus``)."""
    smi_said: str | None = None
    """nvidia-smi's own complaint when it listed no GPU or named one it cannot open (``No devices
    were found``, ``NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver``)."""

    @property
    def readers(self) -> str:
        """``NVML``, ``nvidia-smi (pynvml not installed)``: what read the GPUs."""
        name = READER_NAMES.get(self.reader or "", "nvidia-smi") if self.queried else "none"
        if self.reader in ("nvidia-smi", "nvidia-smi -q") and self.reader_note:
            name += f" ({self.reader_note})"
        return name

    @property
    def answered(self) -> str:
        """Every reader that answered: ``NVML + DCGM``, ``nvidia-smi``, ``none``."""
        names = [READER_NAMES.get(self.reader or "", "nvidia-smi")] if self.queried else []
        if self.dcgm is not None and self.dcgm.state == "ok":
            names.append("DCGM")
        return " + ".join(names) or "none"


@dataclass(frozen=True)
class GpuVerdict:
    """One line of the doctor: ``gpu3 bad uncorrectable ECC 2 (volatile); Xid 79 at 14:02: ...``."""

    gpu: int | None
    """None: the node as a whole (GPU count, fabric devices, versions)."""
    level: str
    message: str

    @property
    def label(self) -> str:
        return "gpu-health" if self.gpu is None else f"gpu{self.gpu}"


# -- parsing the node's answer --------------------------------------------------------------------


def _opt_text(fields: _Fields, key: str, limit: int = MAX_TEXT) -> str | None:
    return None if fields.data.get(key) is None else fields.text(key, limit)


def _opt_bool(fields: _Fields, key: str) -> bool | None:
    return None if fields.data.get(key) is None else fields.boolean(key, False)


def _opt_count(fields: _Fields, key: str) -> int | None:
    return fields.optional_integer(key, 0, 2**40)


def _gpu(fields: _Fields) -> GpuFacts:
    throttle: tuple[str, ...] | None = None
    raw = fields.data.get("throttle")
    if isinstance(raw, dict):
        flags = _Fields(raw, f"{fields.what} throttle")
        if all(flags.data.get(name) is not None for name in THROTTLE_NAMES):
            throttle = tuple(name for name in THROTTLE_NAMES if flags.boolean(name, False))
    elif raw is not None:
        raise ProtocolError(f"{fields.what}: field 'throttle': expected an object")
    return GpuFacts(
        index=fields.integer("index", 0, 4096),
        uuid=fields.text("uuid", 128),
        bus_id=fields.text("bus_id", 32),
        name=_opt_text(fields, "name"),
        persistence=_opt_bool(fields, "persistence"),
        pcie_gen=fields.optional_integer("pcie_gen", 0, 64),
        pcie_gen_max=fields.optional_integer("pcie_gen_max", 0, 64),
        pcie_width=fields.optional_integer("pcie_width", 0, 64),
        pcie_width_max=fields.optional_integer("pcie_width_max", 0, 64),
        ecc_volatile=_opt_count(fields, "ecc_volatile"),
        ecc_aggregate=_opt_count(fields, "ecc_aggregate"),
        retired_pending=_opt_bool(fields, "retired_pending"),
        remap_unc=_opt_count(fields, "remap_unc"),
        remap_pending=_opt_bool(fields, "remap_pending"),
        remap_failure=_opt_bool(fields, "remap_failure"),
        throttle=throttle,
        temp_c=fields.number("temp_c", -100.0, 1000.0),
        power_w=fields.number("power_w", 0.0, 100000.0),
        mem_used_mib=fields.number("mem_used_mib", 0.0, 1e9),
        mem_total_mib=fields.number("mem_total_mib", 0.0, 1e9),
        util=fields.number("util", 0.0, 100.0),
        nvlink_active=fields.optional_integer("nvlink_active", 0, 1024),
        nvlink_inactive=fields.optional_integer("nvlink_inactive", 0, 1024),
        fabric_state=_opt_text(fields, "fabric_state", 40),
        fabric_status=_opt_text(fields, "fabric_status", 40),
        recovery=None if fields.data.get("recovery") is None else printable(fields.text("recovery", 60)),
        unsupported=_facts_unsupported(fields),
        unread=_facts_unread(fields),
    )


def _fact(value: object, key: str) -> str:
    if not isinstance(value, str) or value not in FACTS:
        raise ProtocolError(f"field {key!r}: expected one of {', '.join(FACTS)}")
    return value


def _facts_unsupported(fields: _Fields) -> tuple[str, ...]:
    if fields.data.get("unsupported") is None:
        return ()
    return tuple(fields.strings("unsupported", len(FACTS), _fact))


def _facts_unread(fields: _Fields) -> tuple[tuple[str, str], ...]:
    raw = fields.data.get("unread")
    if raw is None:
        return ()
    if not isinstance(raw, dict) or len(raw) > len(FACTS):
        raise ProtocolError(f"{fields.what}: field 'unread': expected an object of facts")
    found = []
    for fact, why in raw.items():
        _fact(fact, "unread")
        if not isinstance(why, str):
            raise ProtocolError(f"{fields.what}: field 'unread.{fact}': expected a reason")
        found.append((fact, printable(why[:MAX_TEXT])))
    return tuple(found)


def _items(fields: _Fields, key: str, limit: int) -> list[_Fields] | None:
    if fields.data.get(key) is None:
        return None
    return [_Fields(item, f"{fields.what} {key}[{i}]") for i, item in enumerate(fields.objects(key, limit))]


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """A tool's text with control characters made visible: nothing reaches a terminal raw."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def _dcgm_strict(fields: _Fields) -> DcgmHealth:
    state = fields.text("state", 20)
    if state not in DCGM_STATES:
        raise ProtocolError(f"{fields.what}: field 'state': expected one of {', '.join(DCGM_STATES)}")
    incidents = []
    for item in _items(fields, "incidents", MAX_INCIDENTS) or []:
        incidents.append(
            DcgmIncident(
                group=printable(item.text("group", 20)),
                entity=item.integer("entity", 0, 1 << 20),
                system=printable(item.text("system", 40)),
                health=printable(item.text("health", 20)),
                message=printable(item.text("message", MAX_DCGM_TEXT)),
            )
        )
    detail = _opt_text(fields, "detail", MAX_DCGM_TEXT)
    overall = _opt_text(fields, "overall", 20)
    return DcgmHealth(
        state,
        None if detail is None else printable(detail),
        None if overall is None else printable(overall),
        tuple(incidents),
    )


def parse_dcgm(data: object, what: str = "dcgm") -> DcgmHealth | None:
    """The reader's ``dcgm`` part; a malformed one is DCGM health unknown (naming the field),
    never the end of the node's whole GPU reading."""
    if data is None:
        return None
    try:
        return _dcgm_strict(_Fields(data, what))
    except ProtocolError as exc:
        return DcgmHealth("malformed", printable(str(exc))[:MAX_DCGM_TEXT])


def parse_gpu_health(data: object, what: str = "gpu health") -> GpuHealth:
    """The reader's dict (already JSON-decoded within a bound) as typed facts."""
    fields = _Fields(data, what)
    xids = _items(fields, "xids", MAX_XIDS)
    ib = fields.data.get("ib_devices")
    return GpuHealth(
        smi=fields.boolean("smi", False),
        queried=fields.boolean("queried", False),
        health_fields=fields.boolean("health_fields", False),
        driver=_opt_text(fields, "driver", 64),
        cuda=_opt_text(fields, "cuda", 32),
        gpus=tuple(_gpu(g) for g in _items(fields, "gpus", MAX_GPUS) or []),
        xids=None
        if xids is None
        else tuple(
            XidEvent(
                x.text("bus_id", 32),
                x.integer("code", 0, 100000),
                _opt_text(x, "at", 40),
                x.text("text", MAX_TEXT),
            )
            for x in xids
        ),
        xid_source=_opt_text(fields, "xid_source", 20),
        ib_devices=None if ib is None else fields.strings("ib_devices", MAX_GPUS, _device),
        dcgm=parse_dcgm(fields.data.get("dcgm"), f"{what} dcgm"),
        reader=_reader(fields),
        reader_note=None
        if fields.data.get("reader_note") is None
        else printable(fields.text("reader_note", 120)),
        lost=tuple(
            LostGpu(
                _opt_text(x, "bus_id", 32),
                x.optional_integer("index", 0, 4096),
                printable(x.text("why", MAX_TEXT)),
            )
            for x in _items(fields, "lost", MAX_GPUS) or []
        ),
        smi_said=None if fields.data.get("smi_said") is None else printable(fields.text("smi_said", 200)),
    )


def _reader(fields: _Fields) -> str | None:
    reader = _opt_text(fields, "reader", 20)
    if reader is not None and reader not in READERS:
        raise ProtocolError(f"{fields.what}: field 'reader': expected one of {', '.join(READERS)}")
    return reader


def _device(value: object, key: str) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= 64:
        raise ProtocolError(f"field {key!r}: expected a device name")
    return value


# -- verdicts -------------------------------------------------------------------------------------


def xid_name(code: int) -> str:
    return xid_meaning(code).name


def xid_judged(xid: XidEvent) -> XidMeaning:
    """The Xid's meaning in NVIDIA's catalogue, its own line deciding where the catalogue says so."""
    return xid_meaning(xid.code, xid.text)


def _clock(at: str | None) -> str:
    """``2026-11-25T14:02:11`` as ``14:02`` (the line's own time, as the kernel logged it)."""
    if at and "T" in at:
        return f" at {at.split('T', 1)[1][:5]}"
    return ""


def _xid_text(xid: XidEvent) -> str:
    meaning = xid_judged(xid)
    if not meaning.known:
        return f"Xid {xid.code}{_clock(xid.at)}: not in NVIDIA's Xid catalogue ({printable(xid.text[:60])})"
    action = "" if meaning.action == "none" else f" ({meaning.action})"
    return f"Xid {xid.code}{_clock(xid.at)}: {meaning.name}{action}"


def _xid_bad(xid: XidEvent) -> bool:
    return xid_judged(xid).level == BAD


SAME_FAULT: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"volatile double-bit ECC|volatile DBE", re.I), "uncorrectable ECC"),
    (re.compile(r"pending (retired page|page retirement)", re.I), "page retirement pending"),
    (re.compile(r"row remapping failed", re.I), "row remapping failed"),
    (re.compile(r"row remappings? (are|is) pending", re.I), "row remapping pending"),
    (re.compile(r"NvLink link \d+ is currently down", re.I), "NVLinks inactive"),
)
"""DCGM's messages (``DCGM_FR_*_MSG`` in DCGM's ``dcgmlib/dcgm_errors.h``) for faults that
nvidia-smi's counters name too, with the words of that reason here: said once, not twice."""
XID_IN_DCGM = re.compile(r"\bXID (\d{1,5})\b", re.I)


def _said(message: str, reasons: Sequence[str]) -> bool:
    """Whether DCGM's ``message`` is a fault one of ``reasons`` (nvidia-smi's, the kernel log's) names."""
    xid = XID_IN_DCGM.search(message)
    if xid and any(r.startswith(f"Xid {int(xid.group(1))}") for r in reasons):
        return True
    return any(p.search(message) and any(words in r for r in reasons) for p, words in SAME_FAULT)


def _unsaid(incident: DcgmIncident, reasons: Sequence[str]) -> str | None:
    """``incident``'s text without the messages ``reasons`` already name (None: nothing left).
    DCGM joins the messages of one system on one GPU with ", " (``Health::AppendSystemIncidents``):
    each is weighed on its own, so a new fault beside a known one is still said."""
    parts = incident.message.split(", ")
    left = [part for part in parts if not _said(part, reasons)]
    if not left:
        return None
    if len(left) == len(parts):
        return incident.text
    return DcgmIncident(
        incident.group, incident.entity, incident.system, incident.health, ", ".join(left)
    ).text


def judge_gpu(
    gpu: GpuFacts,
    xids: Sequence[XidEvent] | None,
    health_fields: bool,
    incidents: Sequence[DcgmIncident] = (),
    usual_links: int | None = None,
) -> GpuVerdict:
    """One GPU: the worst level found and every reason, in one line (DCGM's incidents merged in).

    ``usual_links``: the active NVLinks most of the node's GPUs have. nvidia-smi and NVML list
    every link slot of the chip (18 on an H100), and a product uses fewer (an H100 PCIe's bridges
    train 12): inactive links are a fault when this GPU has fewer active than its peers. None: no
    peers to compare with, every inactive link is named."""
    bad: list[str] = []
    warn: list[str] = []
    unknown: list[str] = []
    if gpu.ecc_volatile:
        bad.append(f"uncorrectable ECC {gpu.ecc_volatile} (volatile)")
    elif gpu.ecc_aggregate:
        warn.append(f"uncorrectable ECC {gpu.ecc_aggregate} (aggregate, lifetime)")
    # the volatile count is what says "since the driver loaded": a lifetime count read beside an
    # unreadable volatile one does not make the GPU's ECC known
    if gpu.ecc_volatile is None and "ecc" not in gpu.unsupported:
        ecc_why = gpu.why_unread("ecc") or ("not read" if health_fields else "the driver refused the query")
        unknown.append(f"ECC ({ecc_why})")
    for fact in ("retired_pages", "remapped_rows", "clock_events", "pcie"):
        if (why := gpu.why_unread(fact)) is not None:
            unknown.append(f"{fact.replace('_', ' ')} ({why})")
    if gpu.remap_failure:
        bad.append("row remapping failed (the GPU needs repair)")
    if gpu.remap_pending:
        bad.append("row remapping pending (reset the GPU)")
    if gpu.retired_pending:
        bad.append("page retirement pending (reset the GPU)")
    if gpu.recovery:
        bad.append(f"the driver asks: {gpu.recovery}")
    for xid in xids or ():
        (bad if _xid_bad(xid) else warn).append(_xid_text(xid))
    if gpu.nvlink_inactive and gpu.nvlink_active is not None:
        total = gpu.nvlink_active + gpu.nvlink_inactive
        if usual_links is None:
            bad.append(f"{gpu.nvlink_inactive} of {total} NVLinks inactive")
        elif gpu.nvlink_active < usual_links:
            bad.append(
                f"{gpu.nvlink_inactive} of {total} NVLinks inactive (the node's other GPUs have {usual_links} active)"
            )
    if gpu.fabric_state is not None and (
        gpu.fabric_state != "Completed" or gpu.fabric_status not in (None, "Success")
    ):
        bad.append(
            f"NVSwitch fabric {gpu.fabric_state}/{gpu.fabric_status or '?'} (is nvidia-fabricmanager running?)"
        )
    if gpu.pcie_width is not None and gpu.pcie_width_max and gpu.pcie_width < gpu.pcie_width_max:
        warn.append(f"PCIe x{gpu.pcie_width} of x{gpu.pcie_width_max}")
    busy = gpu.util is not None and gpu.util >= 10
    if gpu.pcie_gen is not None and gpu.pcie_gen_max and gpu.pcie_gen < gpu.pcie_gen_max and busy:
        warn.append(f"PCIe gen{gpu.pcie_gen} of gen{gpu.pcie_gen_max} while busy")
    if gpu.throttle:
        slow = [HW_THROTTLE[t] for t in gpu.throttle if t in HW_THROTTLE]
        if slow:
            warn.append(f"throttled: {', '.join(slow)}")
    if gpu.persistence is False:
        warn.append("persistence mode off")
    for incident in incidents:
        # a DCGM failure repeats a reason only if that reason is bad too; a warning, any reason
        if incident.level == BAD and (text := _unsaid(incident, bad)):
            bad.append(text)
        elif incident.level == WARN and (text := _unsaid(incident, bad + warn)):
            warn.append(text)
        elif incident.level == UNKNOWN:
            unknown.append(incident.text)
    if bad:
        level = BAD
    elif warn:
        level = WARN
    elif unknown:
        level = UNKNOWN
    else:
        level = OK
    parts = bad + warn
    if not parts:
        parts.append(_summary(gpu))
    if unknown:
        parts.append("unknown: " + ", ".join(unknown))
    return GpuVerdict(gpu.index, level, "; ".join(parts))


def _summary(gpu: GpuFacts) -> str:
    bits = [gpu.name or "GPU"]
    if gpu.pcie_width is not None:
        gen = f"gen{gpu.pcie_gen}" if gpu.pcie_gen is not None else ""
        bits.append(f"PCIe {gen} x{gpu.pcie_width}".replace("  ", " "))
    if gpu.ecc_volatile is not None:
        bits.append("no uncorrectable ECC")
    elif "ecc" in gpu.unsupported:
        bits.append("no ECC on this card")
    if gpu.nvlink_active:
        of = f" of {gpu.nvlink_active + gpu.nvlink_inactive}" if gpu.nvlink_inactive else ""
        bits.append(f"{gpu.nvlink_active}{of} NVLinks")
    if gpu.temp_c is not None:
        bits.append(f"{gpu.temp_c:.0f} C")
    if gpu.power_w is not None:
        bits.append(f"{gpu.power_w:.0f} W")
    return ", ".join(bits)


def expected_gpus(gpus: int | list[int] | None, instance_type: str | None) -> int | None:
    """How many GPUs the inventory (``gpus: 8``) or the instance type says a host has."""
    if isinstance(gpus, int):
        return gpus
    if isinstance(gpus, list):
        return None  # a shared machine lends some devices: each must be there, not a count
    if instance_type and instance_type in INSTANCE_GPUS:
        return INSTANCE_GPUS[instance_type][0]
    return None


def expected_fabric_devices(instance_type: str | None) -> int:
    known = INSTANCE_GPUS.get(instance_type or "")
    return known[1] if known else 0


def judge_node(
    health: GpuHealth,
    expected: int | None = None,
    indices: Sequence[int] | None = None,
    fabric_devices: int = 0,
) -> list[GpuVerdict]:
    """One node: its GPUs (only ``indices`` when the host lends some of its devices) and the node
    line (count against ``expected``, fabric devices against the instance type)."""
    out: list[GpuVerdict] = []
    if not health.smi:
        if expected:
            out.append(GpuVerdict(None, BAD, f"no nvidia-smi, but {expected} GPU(s) expected"))
        return out
    if not health.queried:
        why = "nvidia-smi gave no GPU list (driver not loaded, or a GPU hangs it)"
        if health.smi_said:
            why = f'nvidia-smi gave no GPU list: "{health.smi_said}"'
        if health.lost:  # the driver names a GPU it cannot open: that GPU is bad, whatever was expected
            out.append(GpuVerdict(None, BAD, "; ".join([*(g.text for g in health.lost), why])))
        elif expected:
            out.append(GpuVerdict(None, BAD, f"{why}, but {expected} GPU(s) expected"))
        else:
            out.append(GpuVerdict(None, UNKNOWN, f"GPU health unknown: {why}"))
        return out
    by_bus: dict[str, list[XidEvent]] = {}
    for xid in health.xids or ():
        by_bus.setdefault(xid.bus_id, []).append(xid)
    present = {g.index for g in health.gpus}
    node_bad: list[str] = []
    if expected is not None and len(health.gpus) < expected:
        node_bad.append(f"{len(health.gpus)} GPU(s) of {expected} expected")
    missing_lent = [i for i in indices or () if i not in present]
    if missing_lent:
        node_bad.append(f"lent GPU(s) {', '.join(map(str, missing_lent))} not listed by nvidia-smi")
    node_bad.extend(g.text for g in health.lost)
    known_buses = {g.bus_id for g in health.gpus}
    for bus, events in by_bus.items():
        if bus not in known_buses:  # a GPU gone from the list leaves only its Xids behind
            node_bad.extend(f"GPU at PCI {bus}: {_xid_text(x)}" for x in events if _xid_bad(x))
    if health.ib_devices is not None and fabric_devices and len(health.ib_devices) < fabric_devices:
        node_bad.append(f"{len(health.ib_devices)} EFA/InfiniBand device(s) of {fabric_devices} expected")
    # DCGM's incidents on a GPU go to that GPU's line; those on an NVSwitch, a link, a ConnectX
    # or a GPU nvidia-smi does not list go to the node's line
    by_gpu: dict[int, list[DcgmIncident]] = {}
    node_warn: list[str] = []
    unknowns: list[str] = []
    dcgm = health.dcgm
    for incident in dcgm.incidents if dcgm is not None else ():
        if incident.gpu is not None and incident.gpu in present:
            by_gpu.setdefault(incident.gpu, []).append(incident)
        elif incident.gpu is not None and indices is not None and incident.gpu not in indices:
            continue  # a device this host does not lend
        elif incident.level == BAD:
            node_bad.append(incident.text)
        elif incident.level == WARN:
            node_warn.append(incident.text)
        elif incident.level == UNKNOWN:
            unknowns.append(incident.text)
    # an unreadable kernel log hides every GPU's Xids: said once, on the node's line, never "ok"
    if health.xids is None:
        unknowns.append("Xid (kernel log not readable here: root, or the adm/systemd-journal group)")
    if dcgm is not None and dcgm.unknown:
        unknowns.append(dcgm.unknown)
    no_read = ["unknown: " + ", ".join(unknowns)] if unknowns else []
    if node_bad:
        out.append(GpuVerdict(None, BAD, "; ".join(node_bad + node_warn + no_read)))
    else:
        count = f"{len(health.gpus)} GPU(s)" + (f" of {expected} expected" if expected else "")
        known = (
            health.driver and f"driver {health.driver}",
            health.cuda and f"CUDA {health.cuda}",
            dcgm is not None and dcgm.state == "ok" and "DCGM health watches read",
            health.reader and f"read through {health.readers}",
        )
        line = count + "".join(f", {v}" for v in known if v)
        level = WARN if node_warn else UNKNOWN if unknowns else OK
        out.append(GpuVerdict(None, level, "; ".join([line, *node_warn, *no_read])))
    links = [g.nvlink_active for g in health.gpus if g.nvlink_active is not None]
    # the most common count, a tie to the larger: of two GPUs with 16 and 18, the 16 is the fault
    usual_links = max(set(links), key=lambda n: (links.count(n), n)) if len(links) > 1 else None
    for gpu in health.gpus:
        if indices is not None and gpu.index not in indices:
            continue
        out.append(
            judge_gpu(
                gpu,
                None if health.xids is None else by_bus.get(gpu.bus_id, []),
                health.health_fields,
                by_gpu.get(gpu.index, ()),
                usual_links,
            )
        )
    return out


def _majority(values: Sequence[str]) -> str:
    return max(values, key=values.count)


def judge_fleet(
    nodes: Mapping[str, GpuHealth],
    expected: Mapping[str, int | None] | None = None,
    indices: Mapping[str, Sequence[int] | None] | None = None,
    fabric: Mapping[str, int] | None = None,
) -> dict[str, list[GpuVerdict]]:
    """Every node; a node whose GPU count, driver or CUDA differ from most nodes' is named.

    Without an expected count from the inventory or instance type, the most common count among
    the nodes with GPUs is expected: one node with 7 of 8 stands out.
    """
    counts = [len(h.gpus) for h in nodes.values() if h.smi and h.queried]
    usual = max(counts, key=counts.count) if counts else None
    out: dict[str, list[GpuVerdict]] = {}
    for name, health in nodes.items():
        want = (expected or {}).get(name)
        if want is None and health.smi and usual:
            want = usual
        out[name] = judge_node(health, want, (indices or {}).get(name), (fabric or {}).get(name, 0))
    for label, get in (("driver", lambda h: h.driver), ("CUDA", lambda h: h.cuda)):
        values = {n: get(h) for n, h in nodes.items() if get(h)}
        if len(set(values.values())) < 2:
            continue
        common = _majority(list(values.values()))
        for name, mine in values.items():
            if mine != common:
                out[name].append(GpuVerdict(None, WARN, f"{label} {mine}, other nodes {common}"))
    return out


def worst(verdicts: Sequence[GpuVerdict]) -> str:
    return max((v.level for v in verdicts), key=lambda lv: RANK[lv], default=OK)


# -- during a run ---------------------------------------------------------------------------------


def gpu_reading(data: object) -> GpuHealth | None:
    """A poll answer's ``gpu`` field as facts; None when absent or malformed (a node that sends
    garbage here has no GPU reading this poll: no fault is made up from it)."""
    if data is None:
        return None
    try:
        return parse_gpu_health(data, "poll answer gpu")
    except ProtocolError:
        return None


def new_faults(baseline: GpuHealth, now: GpuHealth) -> list[tuple[str, str]]:
    """What went wrong since ``baseline`` (the node's first poll of the run): ``(gpu, reason)``
    for a new critical Xid, an uncorrectable ECC count that grew, a GPU gone from the list."""
    faults: list[tuple[str, str]] = []
    before = {g.uuid: g for g in baseline.gpus}
    after = {g.uuid: g for g in now.gpus}
    bus_label = {g.bus_id: g.label for g in baseline.gpus}
    if baseline.queried and not now.queried and baseline.gpus:
        faults.append(("gpus", "nvidia-smi stopped listing the GPUs"))
    elif now.queried:
        for uuid, gpu in before.items():
            if uuid not in after:
                faults.append((gpu.label, f"GPU {gpu.index} ({gpu.bus_id}) gone from nvidia-smi's list"))
    for uuid, gpu in after.items():
        old = before.get(uuid)
        if old is None:
            continue
        for label, was, is_ in (
            ("volatile", old.ecc_volatile, gpu.ecc_volatile),
            ("aggregate", old.ecc_aggregate, gpu.ecc_aggregate),
        ):
            if was is not None and is_ is not None and is_ > was:
                faults.append((gpu.label, f"uncorrectable ECC {was} -> {is_} ({label})"))
                break
    was_lost = {(g.bus_id, g.index) for g in baseline.lost}
    for lost in now.lost:  # one listed before is "gone from the list" above already
        if (lost.bus_id, lost.index) not in was_lost and lost.bus_id not in bus_label:
            faults.append((f"PCI {lost.bus_id}" if lost.bus_id else f"gpu{lost.index}", lost.text))
    seen = {x.key for x in baseline.xids or ()}
    for xid in now.xids or ():
        if xid.key not in seen and _xid_bad(xid):
            faults.append((bus_label.get(xid.bus_id, f"PCI {xid.bus_id}"), _xid_text(xid)))
    # a DCGM failure new since the first reading (the same system on the same entity failing
    # already then is not new; a DCGM that answered nothing then compares with nothing)
    if baseline.dcgm is not None and baseline.dcgm.state == "ok" and now.dcgm is not None:
        failing = {(i.group, i.entity, i.system) for i in baseline.dcgm.incidents if i.level == BAD}
        for incident in now.dcgm.incidents:
            if incident.level == BAD and (incident.group, incident.entity, incident.system) not in failing:
                label = f"gpu{incident.gpu}" if incident.gpu is not None else incident.group
                faults.append((label, incident.text))
    return faults


MAX_GAP_S = 60.0
"""Power readings further apart than this are not joined (a node unreachable meanwhile)."""


@dataclass
class EnergyMeter:
    """GPU energy of a run, from the power each node's GPUs draw at each poll (trapezoids between
    readings of one node; a gap over ``MAX_GAP_S`` is not counted). Joules; ``kwh`` for records."""

    joules: float = 0.0
    last: dict[str, tuple[float, float]] | None = None

    def add(self, node: str, now: float, health: GpuHealth | None) -> None:
        if health is None or not health.gpus:
            return
        watts = [g.power_w for g in health.gpus if g.power_w is not None]
        if not watts:
            return
        power = sum(watts)
        last = self.last if self.last is not None else {}
        self.last = last
        before = last.get(node)
        if before is not None and 0 < now - before[0] <= MAX_GAP_S:
            self.joules += (now - before[0]) * (power + before[1]) / 2
        last[node] = (now, power)

    @property
    def kwh(self) -> float | None:
        return None if self.last is None else self.joules / 3.6e6
