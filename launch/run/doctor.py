"""``fab doctor`` and ``fab train``'s pre-launch check: probe every node, test the rendezvous port.

One round trip per node gathers the facts: the probe script (``launch/nodelib/fleetrun_probe.py``)
travels on stdin to the host's own Python, which answers one JSON line; the laptop times the
round trip to bound each node's clock offset. The full doctor then tests the rendezvous port
for real over the same connections, in two steps: the head listens briefly on its private
address and the port, then every worker connects to it (a blocked port, a wrong route or a
firewall shows up as the worker's own connect error; a worker tries twice, so one connect lost
to a loaded machine is not reported as a blocked port). The head closes each test connection
only after the worker did, so no TIME_WAIT is left on the head's port for the job that
follows. ``fab train`` runs only the cheap probe, inside its existing connect step, so it costs
no extra round trip.

Verdicts are made by ``launch.rules.preflight`` (pure); this module only gathers.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import select
import shlex
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from paramiko import Channel

from launch.errors import HostError
from launch.job.inventory import Host, Inventory
from launch.job.spec import JobSpec
from launch.nodelib.fleetrun_wire import ProtocolError, decode
from launch.planning.image_pull import is_sif_file, sif_path
from launch.reports.safe_text import clean
from launch.rules.gpu_diag import DiagReport, parse_diag
from launch.rules.gpu_health import expected_fabric_devices, expected_gpus
from launch.rules.preflight import Findings, Job, Observation, errors_by_node, judge, pick_hosts
from launch.rules.probe_facts import ProbeFacts, parse_probe_answer
from launch.rules.recovery import Renewal
from launch.transport.port import FleetPort, NodeLink
from launch.transport.ssh import DEFAULT_CONNECT_TIMEOUT, Fleet
from launch.transport.sync import LIB_DIR

PROBE_TIMEOUT_S = 30.0
LISTEN_WINDOW_S = 30
CONNECT_TIMEOUT_S = 3

_LISTEN = """\
import select, socket, sys
addr, port = sys.argv[1], int(sys.argv[2])
s = socket.socket(socket.AF_INET6 if ':' in addr else socket.AF_INET)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
try:
    s.bind((addr, port)); s.listen(1024)
except OSError as exc:
    print('error', exc.strerror or exc, flush=True); sys.exit(0)
print('listening', flush=True)
accepted = []
while True:
    ready = select.select([s, sys.stdin] + accepted, [], [], WINDOW)[0]
    if not ready or sys.stdin in ready:
        break
    for r in ready:
        if r is s:
            c, _ = s.accept()
            if len(accepted) < 900: accepted.append(c)
            else: c.close()
        else:
            accepted.remove(r); r.close()
""".replace("WINDOW", str(LISTEN_WINDOW_S))

_CONNECT = """\
import socket, sys, time
for attempt in range(2):
    try:
        socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=TIMEOUT).close()
        print('ok'); break
    except socket.timeout:
        reason = 'connection timed out'
    except OSError as exc:
        reason = (exc.strerror or str(exc)).lower()
    time.sleep(0.5)
else:
    print(reason)
""".replace("TIMEOUT", str(CONNECT_TIMEOUT_S))


def probe_source() -> bytes:
    """The probe as one script for ``python -``: the GPU health reader (``fleetrun_gpu.py``) first,
    registered as a module from its own source, then the probe, which imports it. One round trip,
    and the reader is the very file the node agent imports during a run."""
    lib = resources.files("launch.nodelib")
    reader = lib.joinpath("fleetrun_gpu.py").read_text(encoding="utf-8")
    boot = (
        "import sys as _sys, types as _types\n"
        "_gpu = _types.ModuleType('fleetrun_gpu')\n"
        f"exec(compile({reader!r}, 'fleetrun_gpu.py', 'exec'), _gpu.__dict__)\n"
        "_sys.modules['fleetrun_gpu'] = _gpu\n"
    )
    return boot.encode() + lib.joinpath("fleetrun_probe.py").read_bytes()


@dataclass(frozen=True)
class ContainerCheck:
    """A playbook's ``container:`` as the doctor checks it: the runtime asked for (or ``auto``),
    the image, and whether a login is needed (its credentials are never sent to the probe)."""

    runtime: str
    image: str
    login: bool = False

    @classmethod
    def of(cls, spec: JobSpec) -> ContainerCheck | None:
        box = spec.container
        return None if box is None else cls(box.runtime, box.image, bool(box.credentials))

    def probe_args(self) -> list[str]:
        """RUNTIME IMAGE SIF for the probe; an Apptainer file on the nodes is its own SIF."""
        if is_sif_file(self.image):
            return ["apptainer", self.image, self.image]
        return [self.runtime, self.image, f"~/{sif_path(self.image)}"]

    def job_fields(self) -> dict[str, Any]:
        return {"container_image": self.image, "container_login": self.login}


@dataclass(frozen=True)
class ProbeResult:
    facts: ProbeFacts | None
    problem: str | None
    offset_s: float | None


def probe_command(
    host: Host, mode: str, head: Host, port: int, container: ContainerCheck | None = None
) -> str:
    args = [mode, host.private_address or host.address, str(port), "1" if host.name == head.name else "0"]
    args += [LIB_DIR, *(container.probe_args() if container is not None else [])]
    return " ".join([shlex.quote(host.python), "-", *map(shlex.quote, args)])


def fan_out_deadline(fleet: FleetPort, nodes: int, per_node_s: float) -> float:
    """The whole fan-out's bound (``FleetPort.map``'s ``deadline``): ``per_node_s`` (each node's
    own timeout) for every wave of ``max_parallel`` nodes, and 30 s to spare. One node's bound for
    all of them cut 256 nodes off at 60 s (four waves of 64 on a loaded machine): those of the
    last wave were reported unreachable though they had only waited for their turn."""
    waves = -(-nodes // max(1, fleet.max_parallel))
    return per_node_s * max(1, waves) + 30


def run_probe(
    conn: NodeLink, mode: str, head: Host, port: int, source: bytes, container: ContainerCheck | None = None
) -> ProbeResult:
    """One round trip: the probe's facts, or why there are none; an unreachable node raises."""
    host = conn.host
    sent = time.time()
    command = probe_command(host, mode, head, port, container)
    result = conn.run_with_input(command, source, timeout=PROBE_TIMEOUT_S)
    received = time.time()
    lines = result.stdout.strip().splitlines()
    if not result.ok or not lines:
        tail = " / ".join((result.stderr or result.stdout).strip().splitlines()[-2:])
        return ProbeResult(
            None, f"the probe did not run with {host.python} (exit {result.exit_code}: {tail[:300]})", None
        )
    try:
        facts = parse_probe_answer(lines[-1])
    except ProtocolError as exc:
        return ProbeResult(None, f"the probe's answer was not understood: {exc}", None)
    # The clock is read last on the node, just before the answer leaves: against the moment it
    # arrived, the offset is off by at most the one-way latency; outside [sent, received] for sure.
    offset = facts.time - received
    if sent <= facts.time <= received:
        offset = 0.0
    return ProbeResult(facts, None, offset)


def gather(
    fleet: FleetPort,
    hosts: Sequence[Host],
    mode: str,
    port: int,
    on_done: Callable[[str, object], None] | None = None,
    container: ContainerCheck | None = None,
) -> list[Observation]:
    """Probe every node in parallel (bounded fan-out, a timeout per node); with ``container``,
    its runtime, GPU hook and (full mode) image too."""
    head = hosts[0]
    source = probe_source()
    results = fleet.map(
        lambda c: run_probe(c, mode, head, port, source, container),
        hosts=hosts,
        deadline=fan_out_deadline(fleet, len(hosts), PROBE_TIMEOUT_S),
        on_done=on_done,
    )
    observations = []
    for host in hosts:
        value = results[host.name]
        base = Observation(
            host.name,
            host.user,
            host.private_address or host.address,
            gpus_expected=expected_gpus(host.gpus, host.instance_type),
            gpu_indices=tuple(host.gpu_indices) if host.gpu_indices is not None else None,
            fabric_devices=expected_fabric_devices(host.instance_type),
        )
        if isinstance(value, BaseException):
            message = str(value).removeprefix(f"{host.name}: ") or type(value).__name__
            observations.append(dataclasses.replace(base, error=message))
        else:
            observations.append(
                dataclasses.replace(
                    base, facts=value.facts, probe_error=value.problem, clock_offset_s=value.offset_s
                )
            )
    return observations


MAX_LINE_BYTES = 4096


def _read_line(channel: Channel, timeout: float) -> str:
    """The head's first line (clipped), read for at most ``timeout`` and ``MAX_LINE_BYTES``."""
    buffer = b""
    deadline = time.monotonic() + timeout
    while b"\n" not in buffer and len(buffer) < MAX_LINE_BYTES and time.monotonic() < deadline:
        if channel.recv_ready():
            buffer += channel.recv(4096)
            continue
        if channel.exit_status_ready():
            break
        select.select([channel], [], [], 0.2)
    return buffer.decode("utf-8", "replace").split("\n", 1)[0][:300]


def rendezvous_reach(fleet: Fleet, hosts: Sequence[Host], port: int) -> dict[str, str | None]:
    """Step 2: the head listens on its private address and ``port``; each worker connects.

    Returns per worker 'ok' or the connect error. Skipped (None) when the head cannot listen:
    the port in use is then the head's own verdict.
    """
    head, workers = hosts[0], list(hosts[1:])
    if not workers:
        return {}
    conn = fleet.connections[head.name]
    address = head.private_address or head.address
    command = f"{shlex.quote(head.python)} -c {shlex.quote(_LISTEN)} {shlex.quote(address)} {port}"
    try:
        conn.open()
        transport = conn.conn.transport
        if transport is None:
            return {}
        channel = transport.open_session(timeout=DEFAULT_CONNECT_TIMEOUT)
    except (HostError, OSError, EOFError):
        return {}
    try:
        channel.exec_command(command)
        if _read_line(channel, 15) != "listening":
            return {}
        probe = f"-c {shlex.quote(_CONNECT)} {shlex.quote(address)} {port}"
        results = fleet.map(
            lambda c: c.run(f"{shlex.quote(c.host.python)} {probe}", timeout=15),
            hosts=workers,
            deadline=fan_out_deadline(fleet, len(workers), 15),
        )
    finally:
        with contextlib.suppress(Exception):
            channel.shutdown_write()
            channel.close()
    reach: dict[str, str | None] = {}
    for name, value in results.items():
        if isinstance(value, BaseException) or not value.stdout.strip():
            reach[name] = None
        else:
            reach[name] = clean(value.stdout.strip().splitlines()[-1], 120)
    return reach


def torch_from_setup(requirements: str, setup: Sequence[str]) -> bool:
    """Whether the job's requirements or setup lines name torch (so setup will install it)."""
    text = (requirements + "\n" + "\n".join(setup)).lower()
    return "torch" in text


def doctor(
    fleet: Fleet,
    hosts: Sequence[Host],
    port: int,
    brings_torch: bool,
    container: ContainerCheck | None = None,
) -> tuple[list[Observation], Findings]:
    """The full doctor: probe, then the port test where the head is reachable and the port free."""
    observations = gather(fleet, hosts, "full", port, container=container)
    head = observations[0]
    port_free = head.facts is not None and (head.facts.port is None or not head.facts.port.in_use)
    if port_free:
        reached = {o.node for o in observations if o.facts is not None}
        reach = rendezvous_reach(fleet, [h for h in hosts if h.name in reached or h is hosts[0]], port)
        observations = [
            dataclasses.replace(o, rdzv_reach=reach[o.node]) if o.node in reach else o for o in observations
        ]
    extra = container.job_fields() if container is not None else {}
    job = Job(head=hosts[0].name, port=port, torch_from_setup=brings_torch, full=True, **extra)
    return observations, judge(observations, job)


def cheap(fleet: Fleet, hosts: Sequence[Host], port: int) -> tuple[list[Observation], Findings]:
    """What ``fab train`` checks before it changes anything: one round trip per node."""
    observations = gather(fleet, hosts, "cheap", port)
    return observations, judge(observations, Job(head=hosts[0].name, port=port, full=False))


@dataclass(frozen=True)
class HostChoice:
    """Which hosts of an inventory with spares a job gets, and why the others were skipped."""

    chosen: tuple[Host, ...]
    excluded: dict[str, str]
    findings: Findings

    spares: tuple[Host, ...] = ()
    """Healthy hosts not chosen: they replace a host excluded during the run (``gpu_fault``)."""

    def record(self) -> dict[str, object]:
        return {
            "chosen": [h.name for h in self.chosen],
            "excluded": dict(self.excluded),
            "spares": [h.name for h in self.spares],
        }


def choose_hosts(
    fleet: Fleet, hosts: Sequence[Host], count: int, least: int | None, port: int, mode: str = "cheap"
) -> HostChoice:
    """Probe every host of the inventory (one round trip each) and take the first ``count``
    healthy ones: a bad GPU, an unreachable machine or a missing rsync sends the job to a spare
    instead of failing it. Nothing is chosen when too few are healthy (the verdicts say why)."""
    observations = gather(fleet, hosts, mode, port)
    findings = judge(observations, Job(head=hosts[0].name, port=port, full=mode == "full"))
    problems = errors_by_node(findings)
    names, excluded = pick_hosts([h.name for h in hosts], problems, count, least)
    by_name = {h.name: h for h in hosts}
    spares = tuple(h for h in hosts if h.name not in names and h.name not in problems)
    return HostChoice(tuple(by_name[n] for n in names), excluded, findings, spares)


def hosts_for_run(
    inventory: Inventory,
    nodes: int,
    port: int,
    known_hosts: Path,
    say: Callable[[str], None],
    max_parallel: int,
) -> tuple[Inventory, HostChoice]:
    """A run's host choice, an edge of its life cycle: with more hosts than the job's ``nodes``,
    probe them all (the pre-launch check's one round trip each) and take the first healthy ones,
    saying every host skipped and why. With too few healthy hosts the first ``nodes`` are kept:
    the pre-launch check then refuses with its verdict lines. ``known_hosts``: the run's pinned
    keys, pinned once for the whole inventory (spares included)."""
    with Fleet(inventory.hosts, known_hosts, max_parallel=max_parallel) as fleet:
        choice = choose_hosts(fleet, inventory.hosts, nodes, None, port)
    for name, why in choice.excluded.items():
        say(clean(f"skipping host {name}: {why}", 600))
    if not choice.chosen:
        return inventory.first(nodes), choice
    return inventory.model_copy(update={"hosts": list(choice.chosen)}), choice


DIAG_LEVELS = (1, 2, 3)
DIAG_SLACK_S = 60.0
"""Past the node's own bound on ``dcgmi diag`` (``fleetrun_gpu.DIAG_TIMEOUT_S``, after which the
reader stops the diagnostic and answers): the SSH round trip's margin."""
MAX_DIAG_ANSWER_BYTES = 1_000_000
"""A diagnostic's answer (its last line, JSON) is read within this many characters."""


def diag_source() -> bytes:
    """The GPU health reader itself, run as ``python - diag LEVEL``: one JSON line."""
    return resources.files("launch.nodelib").joinpath("fleetrun_gpu.py").read_bytes()


def diag_timeout(level: int) -> float:
    from launch.nodelib.fleetrun_gpu import DIAG_TIMEOUT_S

    return DIAG_TIMEOUT_S[level] + DIAG_SLACK_S


def gpu_diag(fleet: FleetPort, hosts: Sequence[Host], level: int) -> dict[str, DiagReport | str]:
    """``fab doctor --gpu-diag LEVEL``: DCGM's diagnostic (``dcgmi diag -r LEVEL -j``) on every
    node at once, each bounded on the node (the reader stops a diagnostic past its level's
    bound) and here; per node its report, or why there is none (text)."""
    if level not in DIAG_LEVELS:
        raise ValueError(f"diagnostic level {level}: expected 1, 2 or 3")
    source = diag_source()
    timeout = diag_timeout(level)

    def one(conn: NodeLink) -> DiagReport | str:
        result = conn.run_with_input(
            f"{shlex.quote(conn.host.python)} - diag {level}", source, timeout=timeout
        )
        lines = result.stdout.strip().splitlines()
        if not result.ok or not lines:
            tail = " / ".join((result.stderr or result.stdout).strip().splitlines()[-2:])
            return (
                f"the diagnostic did not run with {conn.host.python} (exit {result.exit_code}: {tail[:300]})"
            )
        try:
            # byte and nesting bounds before parsing: a bracket bomb raised RecursionError here
            data = decode(lines[-1], MAX_DIAG_ANSWER_BYTES, "the diagnostic's answer")
        except ProtocolError as exc:
            return clean(str(exc), 300)
        return parse_diag(data, f"{conn.host.name} gpu diag")

    results = fleet.map(one, hosts=hosts, deadline=timeout + 30)
    out: dict[str, DiagReport | str] = {}
    for host in hosts:
        value = results[host.name]
        if isinstance(value, BaseException):
            out[host.name] = str(value).removeprefix(f"{host.name}: ") or type(value).__name__
        else:
            out[host.name] = value
    return out


HOSTS_FILE = "hosts.json"
"""In the run folder: the hosts a run chose, and every host it left out and why."""


def _hosts_record(folder: Path) -> dict[str, Any]:
    """The run's ``hosts.json`` (fleetrun's own file), or an empty record."""
    try:
        data = json.loads((folder / HOSTS_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _save_hosts_record(folder: Path, data: dict[str, Any]) -> None:
    tmp = folder / (HOSTS_FILE + ".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    tmp.replace(folder / HOSTS_FILE)


def read_exclusions(folder: Path) -> dict[str, str]:
    excluded = _hosts_record(folder).get("excluded")
    return {str(k): str(v) for k, v in excluded.items()} if isinstance(excluded, dict) else {}


def record_exclusion(folder: Path, name: str, reason: str) -> None:
    """Add ``name`` to the run's excluded hosts (``hosts.json``), for the record and for every
    later attempt of the run (an excluded host is never taken again)."""
    data = _hosts_record(folder)
    excluded = data.get("excluded")
    data["excluded"] = {**(excluded if isinstance(excluded, dict) else {}), name: reason[:600]}
    _save_hosts_record(folder, data)


def record_renewal(folder: Path, renewal: Renewal) -> None:
    """Add a node given a new machine after it was left out (``FleetKind.renew``) to the run's
    ``hosts.json`` (``renewed``): which node, why, and its old and new address. Its name is not
    excluded: the name now stands for the new machine."""
    data = _hosts_record(folder)
    renewed = data.get("renewed")
    entry = {**renewal.to_json(), "reason": renewal.reason[:600]}
    data["renewed"] = [*(renewed if isinstance(renewed, list) else []), entry]
    _save_hosts_record(folder, data)
