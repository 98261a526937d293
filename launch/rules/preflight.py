"""``fab doctor``'s verdicts: what will break a multi-node job, named per node, from probe facts.

Pure functions of what the nodes said (``ProbeFacts``), what the laptop measured (SSH errors,
clock offsets, the rendezvous port test) and the job (port, whether its requirements bring torch).
No I/O here, so every verdict is unit-tested from hand-written facts.

Levels: ``error`` would break or hang the job (exit 1; ``fab train`` refuses to start), ``warn``
is worth knowing but a job can run (versions that differ only in a patch release, a clock off by
seconds, other users' processes on the GPUs, little disk), ``ok`` says what was checked. The
causes are the ones labs report most: rendezvous stuck on the wrong NIC or a blocked port, a
hostname resolving to 127.0.1.1 (gloo), EADDRINUSE from a zombie run, mismatched torch/NCCL.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from launch.nodelib.fleetrun_checkpoint_torch import torch_bypass
from launch.rules import gpu_diag, gpu_health
from launch.rules.image_pull import classify_pull_error
from launch.rules.probe_facts import ContainerFacts, ProbeFacts

T = TypeVar("T", str, int)

GiB = 1024**3
DISK_ERROR_BYTES = 2 * GiB
DISK_WARN_BYTES = 10 * GiB
CLOCK_SKEW_S = 1.0

OK, WARN, ERROR = "ok", "warn", "error"
CHECKS = (
    "ssh",
    "python",
    "torch",
    "rsync",
    "hostname",
    "rdzv-port",
    "interface",
    "clock",
    "disk",
    "container",
    "gpu-hook",
    "image",
    "gpus",
    "gpu-health",
    "gpu-diag",
    "collective",
)
"""Check names in display order; one GPU's own line is ``gpu0``, ``gpu1``... after ``gpu-health``."""
GPU_LEVEL = {
    gpu_health.OK: OK,
    gpu_health.UNKNOWN: WARN,
    gpu_health.WARN: WARN,
    gpu_health.BAD: ERROR,
}
"""A GPU verdict as a doctor level: ``unknown`` is a warning (never ok), ``bad`` an error."""


def check_order(check: str) -> tuple[int, int]:
    """Sort key of a check name: the listed checks in order, then GPUs by index."""
    if check in CHECKS:
        return (CHECKS.index(check), 0)
    if check.startswith("gpu") and check[3:].isdigit():
        return (len(CHECKS), int(check[3:]))
    return (len(CHECKS) + 1, 0)


@dataclass(frozen=True)
class Verdict:
    node: str
    check: str
    level: str
    message: str


@dataclass(frozen=True)
class Observation:
    """Everything known about one node: its probe facts or why there are none, and the laptop's
    measurements (clock offset against the laptop, the worker's TCP test to the head's port)."""

    node: str
    user: str
    private_address: str
    facts: ProbeFacts | None = None
    error: str | None = None
    """Why the node could not be reached (the SSH error names the cause)."""
    probe_error: str | None = None
    """Reached, but the probe gave no usable answer (no such Python, or a garbled answer)."""
    clock_offset_s: float | None = None
    rdzv_reach: str | None = None
    """'ok', the reason a connect to the head's port failed, or None when not tested."""
    gpus_expected: int | None = None
    """GPUs the inventory (``gpus: 8``) or the instance type says the host has; None: unknown."""
    gpu_indices: tuple[int, ...] | None = None
    """The devices a shared host lends (``gpus: [2, 3]``): only these are judged."""
    fabric_devices: int = 0
    """EFA/InfiniBand devices the instance type comes with."""


@dataclass(frozen=True)
class Job:
    head: str
    port: int
    torch_from_setup: bool = False
    """The job's requirements or setup install torch: a node without it is fine before setup."""
    full: bool = True
    container_image: str | None = None
    """The playbook's ``container.image`` (None: no ``container:``, nothing of it is judged)."""
    container_login: bool = False
    """The image comes from a private registry through ``container.credentials``: the doctor
    does not send them, so an image it cannot see there is a warning, not an error."""


@dataclass
class Findings:
    verdicts: list[Verdict] = field(default_factory=list)
    gpu_readers: dict[str, str] = field(default_factory=dict)
    """Per node, what read its GPUs (``NVML + DCGM``, ``nvidia-smi``): the doctor's table says it."""

    def add(self, node: str, check: str, level: str, message: str) -> None:
        self.verdicts.append(Verdict(node, check, level, message))

    @property
    def errors(self) -> list[Verdict]:
        return [v for v in self.verdicts if v.level == ERROR]

    @property
    def failed(self) -> bool:
        return bool(self.errors)


def _minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def _majority(values: Sequence[T]) -> T:
    """The most common value; on a tie the first one (nodes come head first: the head's)."""
    return max(values, key=values.count)


def _is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address.split("%")[0]).is_loopback
    except ValueError:
        return False


def check_reach(findings: Findings, obs: Observation) -> bool:
    """SSH reach with the pinned key; the connection's own error names the cause."""
    if obs.error is not None:
        findings.add(obs.node, "ssh", ERROR, obs.error)
        return False
    findings.add(obs.node, "ssh", OK, "reached with the pinned host key")
    if obs.probe_error is not None:
        findings.add(obs.node, "python", ERROR, obs.probe_error)
    return True


def check_versions(findings: Findings, nodes: Sequence[Observation], job: Job) -> None:
    """Python, torch, CUDA (torch's build and the driver) and NCCL the same on every node.

    The reference is the most common value (the head's on a tie), so one odd node is the one named.
    """
    probed = [o for o in nodes if o.facts is not None]
    if not probed:
        return
    pythons = [o.facts.python for o in probed if o.facts]
    usual = _majority(pythons)
    for obs in probed:
        assert obs.facts is not None
        version = obs.facts.python
        if version == usual:
            findings.add(obs.node, "python", OK, f"Python {version}")
        elif _minor(version) != _minor(usual):
            findings.add(obs.node, "python", ERROR, f"Python {version}, other nodes {usual}")
        else:
            findings.add(obs.node, "python", WARN, f"Python {version}, other nodes {usual}")
    if not job.full:
        return
    torches = [o.facts.torch for o in probed if o.facts and o.facts.torch]
    usual_torch = _majority(torches) if torches else None
    for obs in probed:
        facts = obs.facts
        assert facts is not None
        if facts.torch is None:
            if job.torch_from_setup:
                findings.add(obs.node, "torch", WARN, "torch not installed (the job's setup installs it)")
            else:
                findings.add(
                    obs.node,
                    "torch",
                    ERROR,
                    "torch not installed, and the job's requirements do not bring it",
                )
            continue
        problems: list[tuple[str, str]] = []
        if usual_torch and facts.torch != usual_torch:
            problems.append((ERROR, f"torch {facts.torch}, other nodes {usual_torch}"))
        if bypass := torch_bypass(facts.torch):  # the checkpoint loader refuses it at resume
            problems.append((WARN, bypass))
        for label, mine, values in (
            ("CUDA (torch build)", facts.torch_cuda, [o.facts.torch_cuda for o in probed if o.facts]),
            ("NCCL", facts.nccl, [o.facts.nccl for o in probed if o.facts]),
            ("CUDA driver", facts.driver, [o.facts.driver for o in probed if o.facts]),
        ):
            known = [v for v in values if v]
            if mine and known and mine != _majority(known):
                problems.append((WARN, f"{label} {mine}, other nodes {_majority(known)}"))
        if problems:
            level = ERROR if any(lv == ERROR for lv, _ in problems) else WARN
            findings.add(obs.node, "torch", level, "; ".join(m for _, m in problems))
        else:
            extra = "".join(
                f", {label} {v}"
                for label, v in (("CUDA", facts.torch_cuda), ("NCCL", facts.nccl), ("driver", facts.driver))
                if v
            )
            findings.add(obs.node, "torch", OK, f"torch {facts.torch}{extra}")


def check_node(findings: Findings, obs: Observation, job: Job) -> None:
    """rsync, the hostname, disk and GPUs: facts of one node alone."""
    facts = obs.facts
    assert facts is not None
    if facts.rsync:
        findings.add(obs.node, "rsync", OK, "rsync found")
    else:
        findings.add(obs.node, "rsync", ERROR, "rsync not found on the node's PATH (the code sync needs it)")
    loop = [a for a in facts.hostname_addrs if _is_loopback(a)]
    if loop:
        findings.add(
            obs.node,
            "hostname",
            ERROR,
            f"hostname {facts.hostname} resolves to loopback {loop[0]} (gloo and torchrun would "
            "advertise it to the other nodes); map it to the private address in /etc/hosts",
        )
    elif not facts.hostname_addrs:
        findings.add(obs.node, "hostname", WARN, f"hostname {facts.hostname} does not resolve")
    else:
        findings.add(obs.node, "hostname", OK, f"{facts.hostname} -> {', '.join(facts.hostname_addrs[:3])}")
    if facts.home_free is not None:
        free = f"{facts.home_free / GiB:.1f} GiB free in the home"
        if facts.home_free < DISK_ERROR_BYTES:
            findings.add(obs.node, "disk", ERROR, f"only {free} (under {DISK_ERROR_BYTES // GiB} GiB)")
        elif facts.home_free < DISK_WARN_BYTES:
            findings.add(obs.node, "disk", WARN, f"only {free} (under {DISK_WARN_BYTES // GiB} GiB)")
        else:
            findings.add(obs.node, "disk", OK, free)
    if job.container_image is not None:
        check_container(findings, obs, job)
    if job.full:
        check_gpus(findings, obs)


def _gpu_node(obs: Observation) -> bool:
    facts = obs.facts
    assert facts is not None
    return bool(obs.gpus_expected) or bool(facts.gpus) or facts.nvidia_smi


def check_container(findings: Findings, obs: Observation, job: Job) -> None:
    """``container:``: a runtime (which one ``auto`` takes), the GPU hook on a GPU node, the image."""
    facts = obs.facts
    assert facts is not None and job.container_image is not None
    box: ContainerFacts | None = facts.container
    if box is None:
        findings.add(
            obs.node, "container", WARN, "the probe did not report container runtimes (an old probe)"
        )
        return
    if box.runtime is None:
        wanted = "podman, docker or apptainer" if box.wanted == "auto" else box.wanted
        findings.add(
            obs.node, "container", ERROR, f"no container runtime: {wanted} not found on the node's PATH"
        )
        return
    how = " (auto)" if box.wanted == "auto" else ""
    findings.add(obs.node, "container", OK, f"{box.version or box.runtime}{how}")
    if not job.full:
        return
    if _gpu_node(obs):
        if box.runtime == "apptainer":
            findings.add(obs.node, "gpu-hook", OK, "apptainer --nv binds the node's driver libraries")
        elif box.cdi_gpu:
            findings.add(obs.node, "gpu-hook", OK, f"CDI spec {box.cdi_gpu[0]} names nvidia.com/gpu")
        elif box.nvidia_ctk or box.nvidia_container_cli:
            tool = "nvidia-ctk" if box.nvidia_ctk else "nvidia-container-cli"
            level = OK if box.runtime == "docker" else WARN
            why = (
                ""
                if level == OK
                else ": generate the CDI spec (nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml)"
            )
            findings.add(obs.node, "gpu-hook", level, f"NVIDIA Container Toolkit found ({tool}){why}")
        else:
            findings.add(
                obs.node,
                "gpu-hook",
                ERROR,
                f"a GPU node with no GPU hook for {box.runtime}: install the NVIDIA Container Toolkit "
                "(nvidia-ctk) and generate a CDI spec in /etc/cdi naming nvidia.com/gpu",
            )
    image = box.image
    if image is None:
        return
    if image.present:
        findings.add(obs.node, "image", OK, f"{job.container_image} is on the node")
    elif image.pullable:
        findings.add(obs.node, "image", OK, f"{job.container_image} can be pulled (fab train pulls it)")
    elif image.pullable is None:
        findings.add(obs.node, "image", OK, f"{job.container_image} is pulled by fab train ({box.runtime})")
    else:
        error = classify_pull_error(image.error or "")
        level = WARN if job.container_login and error.kind == "auth" else ERROR
        note = (
            " (the doctor does not send container.credentials; fab train's pull does)"
            if level == WARN
            else ""
        )
        findings.add(obs.node, "image", level, error.line(job.container_image) + note)


def check_gpus(findings: Findings, obs: Observation) -> None:
    facts = obs.facts
    assert facts is not None
    if not facts.nvidia_smi:
        findings.add(obs.node, "gpus", OK, "no GPU reader (NVML or nvidia-smi): no GPUs")
        return
    index = {g.uuid: g.index for g in facts.gpus}
    others = [p for p in facts.gpu_procs if p.user != obs.user]
    if not others:
        findings.add(obs.node, "gpus", OK, f"{len(facts.gpus)} GPU(s), none used by other users")
        return
    parts = []
    for proc in others:
        gpu = index.get(proc.gpu)
        where = f"GPU {gpu}" if gpu is not None else f"GPU {proc.gpu[:20]}"
        memory = f"{proc.mem_mib} MiB" if proc.mem_mib is not None else "? MiB"
        parts.append(f"{where}: {proc.user or 'unknown user'} pid {proc.pid} {memory}")
    busy = len({p.gpu for p in others})
    findings.add(
        obs.node, "gpus", WARN, f"{busy} GPU(s) busy with other users' processes: {'; '.join(parts)}"
    )


def check_gpu_health(findings: Findings, nodes: Sequence[Observation]) -> None:
    """GPU health per node and per GPU (``launch.rules.gpu_health``), one line each."""
    probed = {o.node: o for o in nodes if o.facts is not None and o.facts.gpu_health is not None}
    if not probed:
        return
    verdicts = gpu_health.judge_fleet(
        {n: o.facts.gpu_health for n, o in probed.items() if o.facts and o.facts.gpu_health},
        expected={n: o.gpus_expected for n, o in probed.items()},
        indices={n: o.gpu_indices for n, o in probed.items()},
        fabric={n: o.fabric_devices for n, o in probed.items()},
    )
    for node, found in verdicts.items():
        for verdict in found:
            findings.add(node, verdict.label, GPU_LEVEL[verdict.level], verdict.message)
    for node, obs in probed.items():
        if obs.facts and obs.facts.gpu_health and obs.facts.gpu_health.smi:
            findings.gpu_readers[node] = obs.facts.gpu_health.answered


def check_gpu_diag(
    findings: Findings, reports: Mapping[str, gpu_diag.DiagReport | str], order: Sequence[str]
) -> None:
    """``fab doctor --gpu-diag``: DCGM's diagnostic per node (``gpu-diag``) and per GPU with a
    failed test (``gpu3``, after that GPU's health line), then the verdicts in node order again."""
    for node, report in reports.items():
        if isinstance(report, str):
            findings.add(node, "gpu-diag", WARN, f"unknown: dcgm diag: {report}")
            continue
        for verdict in gpu_diag.judge_diag(report):
            check = "gpu-diag" if verdict.gpu is None else verdict.label
            findings.add(node, check, GPU_LEVEL[verdict.level], verdict.message)
    rank = {name: i for i, name in enumerate(order)}
    findings.verdicts.sort(key=lambda v: (rank.get(v.node, len(rank)), check_order(v.check)))


def check_interfaces(findings: Findings, nodes: Sequence[Observation]) -> None:
    """The interface holding each node's private address, its MTU the same as most nodes'."""
    probed = [o for o in nodes if o.facts is not None and o.facts.full]
    mtus = [o.facts.mtu for o in probed if o.facts and o.facts.mtu]
    usual = _majority(mtus) if mtus else None
    for obs in probed:
        facts = obs.facts
        assert facts is not None
        if facts.iface is None:
            findings.add(
                obs.node,
                "interface",
                ERROR,
                f"no interface holds the private address {obs.private_address}",
            )
        elif usual is not None and facts.mtu is not None and facts.mtu != usual:
            findings.add(obs.node, "interface", ERROR, f"{facts.iface} MTU {facts.mtu}, other nodes {usual}")
        else:
            findings.add(obs.node, "interface", OK, f"{facts.iface} MTU {facts.mtu}")


def check_clocks(findings: Findings, nodes: Sequence[Observation], head: str) -> None:
    offsets = {o.node: o.clock_offset_s for o in nodes if o.clock_offset_s is not None}
    if head not in offsets:
        return
    for node, offset in offsets.items():
        skew = offset - offsets[head]
        if abs(skew) > CLOCK_SKEW_S:
            ahead = "ahead of" if skew > 0 else "behind"
            findings.add(node, "clock", WARN, f"clock {abs(skew):.1f} s {ahead} the head's")
        else:
            findings.add(node, "clock", OK, f"clock within {CLOCK_SKEW_S:g} s of the head's")


def check_rendezvous(findings: Findings, nodes: Sequence[Observation], job: Job) -> None:
    """The head's port free (naming who holds it) and, when tested, reachable from each worker."""
    by_name = {o.node: o for o in nodes}
    head = by_name.get(job.head)
    if head is None or head.facts is None:
        return
    where = f"{job.port} on {head.private_address}"
    port = head.facts.port
    if port is not None and port.in_use:
        holders = (
            ", ".join(f"{h.process} (pid {h.pid}, user {h.user or '?'})" for h in port.holders[:4])
            or "a process of another user (not visible)"
        )
        findings.add(
            job.head,
            "rdzv-port",
            ERROR,
            f"{where} already in use by {holders} (so the workers' connect test was skipped)",
        )
    elif port is not None:
        findings.add(job.head, "rdzv-port", OK, f"{where} free")
    for obs in nodes:
        if obs.node == job.head or obs.facts is None or obs.rdzv_reach is None:
            continue
        if obs.rdzv_reach == "ok":
            findings.add(obs.node, "rdzv-port", OK, f"{where} reachable")
        else:
            findings.add(
                obs.node, "rdzv-port", ERROR, f"{where} not reachable from {obs.node} ({obs.rdzv_reach})"
            )


def judge(nodes: Sequence[Observation], job: Job) -> Findings:
    """Every verdict for every node, in the order the checks are listed (``CHECKS``)."""
    findings = Findings()
    reached = [o for o in nodes if check_reach(findings, o)]
    check_versions(findings, reached, job)
    for obs in reached:
        if obs.facts is not None:
            check_node(findings, obs, job)
    check_gpu_health(findings, reached)
    if job.full:
        check_interfaces(findings, reached)
        check_clocks(findings, reached, job.head)
    check_rendezvous(findings, reached, job)
    order = {name: i for i, name in enumerate(o.node for o in nodes)}
    findings.verdicts.sort(key=lambda v: (order.get(v.node, 0), check_order(v.check)))
    return findings


def summary_rows(findings: Findings, nodes: Sequence[str]) -> list[tuple[str, dict[str, str]]]:
    """Per node, the worst level of each check (for the table)."""
    rank = {OK: 0, WARN: 1, ERROR: 2}
    rows: dict[str, dict[str, str]] = {n: {} for n in nodes}
    for v in findings.verdicts:
        cells = rows.setdefault(v.node, {})
        check = v.check if v.check in CHECKS else "gpu-health"  # one column for every GPU's line
        if rank[v.level] >= rank.get(cells.get(check, OK), 0):
            cells[check] = v.level
    return list(rows.items())


def refusal(findings: Findings) -> str:
    """One message for ``fab train``: every error, one per line."""
    return "\n".join(f"{v.node}  {v.check}  ERROR  {v.message}" for v in findings.errors)


def errors_by_node(findings: Findings) -> Mapping[str, str]:
    out: dict[str, str] = {}
    for v in findings.errors:
        out[v.node] = f"{out[v.node]}; {v.message}" if v.node in out else f"{v.check}: {v.message}"
    return out


def pick_hosts(
    names: Sequence[str], problems: Mapping[str, str], count: int, least: int | None = None
) -> tuple[list[str], dict[str, str]]:
    """Spares: the first ``count`` hosts without an error, in inventory order (the head first),
    and every skipped host with its reason. ``least`` (``nodes: MIN:MAX``) is the fewest a job
    can start with; with fewer healthy hosts than that, nothing is chosen (the caller refuses
    with the verdicts). Hosts past the ones needed are not "excluded": they stay spares."""
    chosen: list[str] = []
    excluded: dict[str, str] = {}
    for name in names:
        if len(chosen) == count:
            break
        if name in problems:
            excluded[name] = problems[name]
        else:
            chosen.append(name)
    if len(chosen) < (count if least is None else least):
        return [], excluded
    return chosen, excluded
