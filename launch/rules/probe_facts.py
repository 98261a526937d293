"""The probe's answer (``launch/nodelib/fleetrun_probe.py``) as typed, bounded facts.

A node's answer is untrusted like everything from a node: it is decoded within a byte and depth
bound, every field is checked for its type and range, free text is clipped, lists are capped.
A malformed answer is a ``ProtocolError`` naming the field, which the doctor reports for that
node ("the probe's answer was not understood") instead of crashing or printing what it got.
"""

from __future__ import annotations

from dataclasses import dataclass

from launch.nodelib.fleetrun_wire import (
    MAX_NAME,
    MAX_TIMESTAMP,
    ProtocolError,
    _clip,
    _Fields,
    _json_object,
)
from launch.rules.gpu_health import GpuHealth, parse_gpu_health

MAX_PROBE_ANSWER_BYTES = 256 * 1024
MAX_PROBE_ITEMS = 64
MAX_VERSION = 64
MAX_PID = 2**31 - 1
MAX_BYTES = 2**62


@dataclass(frozen=True)
class PortHolder:
    process: str
    pid: int
    user: str | None


@dataclass(frozen=True)
class PortFacts:
    in_use: bool
    holders: tuple[PortHolder, ...]


@dataclass(frozen=True)
class GpuProcess:
    gpu: str
    pid: int
    user: str | None
    mem_mib: int | None


@dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str


CONTAINER_RUNTIMES = ("podman", "docker", "apptainer")


@dataclass(frozen=True)
class ImageFacts:
    """The ``container.image`` on a node: there already, or can its registry serve it."""

    present: bool
    pullable: bool | None
    """None: not asked (present, or Apptainer, which cannot ask a registry without pulling)."""
    error: str | None
    """The runtime's answer when the registry could not serve it (classified on the laptop)."""


@dataclass(frozen=True)
class ContainerFacts:
    """What the probe found for a playbook's ``container:``: runtimes, the one taken, the GPU hook."""

    wanted: str
    found: tuple[str, ...]
    runtime: str | None
    version: str | None = None
    nvidia_ctk: bool = False
    nvidia_container_cli: bool = False
    cdi_gpu: tuple[str, ...] = ()
    image: ImageFacts | None = None


def _runtime_name(value: object, key: str) -> str:
    if value not in CONTAINER_RUNTIMES:
        raise ProtocolError(f"field {key!r}: expected a container runtime, got {_clip(repr(value), 40)}")
    assert isinstance(value, str)
    return value


def _path(value: object, key: str) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= 256:
        raise ProtocolError(f"field {key!r}: expected a path, got {_clip(repr(value), 60)}")
    return value


def parse_container_facts(data: object) -> ContainerFacts:
    fields = _Fields(data, "probe answer container")
    runtime = fields.data.get("runtime")
    image = None
    if fields.data.get("image") is not None:
        img = _Fields(fields.data["image"], "probe answer container image")
        pullable = img.data.get("pullable")
        if pullable is not None and not isinstance(pullable, bool):
            raise ProtocolError("probe answer container image: field 'pullable': expected a boolean or null")
        image = ImageFacts(img.boolean("present", False), pullable, _opt_text(img, "error", 1000))
    return ContainerFacts(
        wanted=fields.text("wanted", 16),
        found=fields.strings("found", len(CONTAINER_RUNTIMES), _runtime_name),
        runtime=None if runtime is None else _runtime_name(runtime, "runtime"),
        version=_opt_text(fields, "version", 80),
        nvidia_ctk=fields.boolean("nvidia_ctk", False),
        nvidia_container_cli=fields.boolean("nvidia_container_cli", False),
        cdi_gpu=fields.strings("cdi_gpu", MAX_PROBE_ITEMS, _path) if fields.data.get("cdi_gpu") else (),
        image=image,
    )


@dataclass(frozen=True)
class ProbeFacts:
    """What one node said about itself. ``None`` means "not known" (not probed, or no tool)."""

    python: str
    hostname: str
    hostname_addrs: tuple[str, ...]
    rsync: bool
    home_free: int | None
    lib: str
    time: float
    port: PortFacts | None = None
    full: bool = False
    iface: str | None = None
    mtu: int | None = None
    torch: str | None = None
    torch_cuda: str | None = None
    nccl: str | None = None
    nvidia_smi: bool = False
    driver: str | None = None
    gpus: tuple[Gpu, ...] = ()
    gpu_procs: tuple[GpuProcess, ...] = ()
    gpu_health: GpuHealth | None = None
    """None: the probe had no GPU reader (an old probe); else what ``fleetrun_gpu`` read."""
    container: ContainerFacts | None = None
    """None: the playbook has no ``container:`` (not asked)."""


def _opt_text(fields: _Fields, key: str, limit: int = MAX_VERSION) -> str | None:
    if fields.data.get(key) is None:
        return None
    return fields.text(key, limit)


def _items(fields: _Fields, key: str) -> list[_Fields]:
    if fields.data.get(key) is None:
        return []
    items = fields.objects(key, MAX_PROBE_ITEMS)
    return [_Fields(item, f"{fields.what} {key}[{i}]") for i, item in enumerate(items)]


def _address(value: object, key: str) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= MAX_NAME:
        raise ProtocolError(f"field {key!r}: expected an address, got {_clip(repr(value), 60)}")
    return value


def parse_probe_answer(text: str | bytes) -> ProbeFacts:
    """The last line of the probe's stdout as ``ProbeFacts``, or a ``ProtocolError``."""
    fields = _json_object(text, MAX_PROBE_ANSWER_BYTES, "probe answer")
    fields.integer("v", 1, 1)
    mode = fields.text("mode", 10)
    if mode not in ("cheap", "full"):
        raise ProtocolError(
            f"probe answer: field 'mode': expected cheap or full, got {_clip(repr(mode), 30)}"
        )
    port = None
    if fields.data.get("port") is not None:
        pf = _Fields(fields.data["port"], "probe answer port")
        holders = tuple(
            PortHolder(h.text("process", 64), h.integer("pid", 1, MAX_PID), _opt_text(h, "user"))
            for h in _items(pf, "holders")
        )
        port = PortFacts(pf.boolean("in_use", False), holders)
    time_value = fields.number("time", 0.0, MAX_TIMESTAMP, required=True)
    assert time_value is not None
    return ProbeFacts(
        python=fields.text("python", MAX_VERSION),
        hostname=fields.text("hostname", MAX_NAME),
        hostname_addrs=fields.strings("hostname_addrs", MAX_PROBE_ITEMS, _address),
        rsync=fields.boolean("rsync", False),
        home_free=fields.optional_integer("home_free", 0, MAX_BYTES),
        lib=fields.text("lib", 200),
        time=time_value,
        port=port,
        full=mode == "full",
        iface=_opt_text(fields, "iface", 32),
        mtu=fields.optional_integer("mtu", 68, 1 << 20),
        torch=_opt_text(fields, "torch"),
        torch_cuda=_opt_text(fields, "torch_cuda"),
        nccl=_opt_text(fields, "nccl"),
        nvidia_smi=fields.boolean("nvidia_smi", False),
        driver=_opt_text(fields, "driver"),
        gpus=tuple(Gpu(g.integer("index", 0, 4096), g.text("uuid", 128)) for g in _items(fields, "gpus")),
        gpu_procs=tuple(
            GpuProcess(
                p.text("gpu", 128),
                p.integer("pid", 1, MAX_PID),
                _opt_text(p, "user"),
                p.optional_integer("mem_mib", 0, MAX_BYTES),
            )
            for p in _items(fields, "gpu_procs")
        ),
        gpu_health=None
        if fields.data.get("gpu_health") is None
        else parse_gpu_health(fields.data["gpu_health"], "probe answer gpu_health"),
        container=None
        if fields.data.get("container") is None
        else parse_container_facts(fields.data["container"]),
    )
