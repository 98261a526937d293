"""A fake fleet FOR TESTS: in-memory nodes that answer the life cycle, the watcher and the wrap-up.

``FakeFleet`` implements the fleet port (``launch.transport.port.FleetPort``: ``hosts``, ``map``
returning ``NodeResults``, ``subset``, ``reconnect``, ``close``), checked by the type checker;
``FakeConnection`` implements ``NodeLink``. The rsync steps (``Transfers``: sync, pull, the
checkpoint copy before a later attempt) are in memory too. A scripted job runs instead of SSH:

* the job logs one metric record per poll round (on the head), then exits 0 on every node and
  writes ``status.json``, unless the script says otherwise: a node exits non-zero at a step, the
  loss turns NaN, the metrics stall, the job finishes with a message of its own;
* a node can be unreachable, hang (every call costs its full timeout on the fake clock, and a call
  with no timeout fails the test, because on a real fleet it would block forever), or answer
  garbage; the preflight, sync, setup, start, stop and pull can fail per node.

* attempts: a fault can hold in one attempt only (``NodeScript.in_attempt``); a node's start
  bundle of a later attempt starts it again, resumed from ``FLEETRUN_RESUME_FROM``'s step; the job
  writes a complete checkpoint every ``JobScript.checkpoint_every`` steps on every running node.

Time is a ``FakeClock`` passed in through the run context (``RunContext.clock``), so stall and
unreachable timeouts of minutes take milliseconds and no assertion depends on real time.
"""

from __future__ import annotations

import base64
import copy
import json
import math
import shlex
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from time import struct_time
from typing import Any, TypeVar

import pytest
from rich.console import Console

from launch.errors import HostError
from launch.job.inventory import Host, Inventory
from launch.nodelib.fleetrun_protocol import FileBundle, StartAnswer, StopAnswer
from launch.planning.launchers.base import ATTEMPT_FILE, RESUME_FILE
from launch.run.checkpoints import Spread
from launch.run.run_folder import RunFolder
from launch.run.transfers import Transfers
from launch.transport.jump import JumpHosts
from launch.transport.port import CommandResult, FleetPort, NodeResults
from launch.transport.sync import SyncResult

T = TypeVar("T")


class FakeClock:
    """Unix time that moves only when slept on; also an operator's Ctrl-C at a given time."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self.now = start
        self.interrupt_at: float | None = None

    def time(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += max(0.0, seconds)
        if self.interrupt_at is not None and self.now >= self.interrupt_at:
            self.interrupt_at = None
            raise KeyboardInterrupt

    def strftime(self, fmt: str, t: Any = None) -> str:
        return time.strftime(fmt, time.gmtime(self.now))

    def gmtime(self, t: float | None = None) -> struct_time:
        return time.gmtime(self.now if t is None else t)

    def install(self, monkeypatch: pytest.MonkeyPatch) -> FakeClock:
        """Also the ``time`` of the modules that read the clock outside the run context (the
        watcher's and the wrap-up's defaults, for callers that build them by hand)."""
        import launch.run.watch
        import launch.run.wrapup

        for module in (launch.run.watch, launch.run.wrapup):
            monkeypatch.setattr(module, "time", self)
        return self


@dataclass
class NodeScript:
    """What goes wrong on one node, and when (job steps; None = never)."""

    exit_at_step: int | None = None
    exit_code: int = 1
    unreachable_from_step: int | None = None
    hang_from_step: int | None = None
    garbage_from_step: int | None = None
    fail_preflight: bool = False
    fail_sync: bool = False
    fail_setup: bool = False
    fail_stop: bool = False
    blocked_at_stop: bool = False
    """At the recovery's stop no rank of this node stepped since the loss: its agent kills them
    without the grace and says so (``StopAnswer.grace_cut``)."""
    fail_pull: bool = False
    container_facts: dict[str, Any] | None = None
    """The probe's ``container`` answer when asked about a playbook's ``container:`` (None: a node
    with podman, no GPU hook, the image pullable)."""
    pull_error: str | None = None
    """The container runtime's output when this node's image pull fails (None: the pull works)."""
    pull_progress: tuple[int, ...] = ()
    """Bytes received, one progress line each, that the pull prints before its result."""
    busy_gpu_user: str | None = None
    """Another user whose process the node's nvidia-smi shows on GPU 0 (None: idle GPUs)."""
    in_attempt: int | None = None
    """The attempt the faults above hold in (None: every attempt)."""
    comes_back: bool = False
    """A lost lab host whose sshd answers again when recovery waits for it (``FleetPort.answers``)."""
    bad_gpu_at_probe: bool = False
    """The doctor probe's GPU reading shows uncorrectable ECC (a machine bad before any attempt)."""
    gpu_fault_from_step: int | None = None
    """The node's GPU readings (the agent's ``gpu``) show an uncorrectable ECC count that grew
    from this step on (the ``gpu_fault`` rule); None: the node reports no GPU reading."""


@dataclass
class JobScript:
    """The training job: ``steps`` metric records, one per poll round, then success."""

    steps: int = 4
    nan_at_step: int | None = None
    stall_at_step: int | None = None
    finish_status: str = "succeeded"
    finish_message: str = ""
    finish_exit_code: int | None = None
    """Every node's exit code at the end; default 0 after success, 1 after a failure."""
    world: object = None
    """A ``world`` event logged before the first step (None: no event)."""
    checkpoint_every: int | None = None
    """Every running node holds a complete checkpoint of every ``checkpoint_every``-th step."""
    gpu_power_w: float | None = None
    """Each running node's one GPU draws this much (its poll answer's ``gpu`` reading); None: no GPU."""
    nodes: dict[str, NodeScript] = field(default_factory=dict)

    def node(self, name: str) -> NodeScript:
        return self.nodes.get(name, NodeScript())


def gpu_reading(ecc: int) -> dict[str, Any]:
    """A node agent's GPU reading (``fleetrun_gpu.read_health``'s shape): one GPU, ``ecc``
    uncorrectable errors since the driver loaded."""
    gpu = {"index": 0, "uuid": "GPU-aaaa", "bus_id": "00000000:18:00.0", "ecc_volatile": ecc}
    return {"smi": True, "queried": True, "health_fields": True, "gpus": [gpu], "xids": []}


class FakeNode:
    """One node: its files (``put_file``), its agent's answers, and what was asked of it."""

    def __init__(self, fleet: FakeFleet, host: Host) -> None:
        self.fleet = fleet
        self.host = host
        self.files: dict[str, str] = {}
        self.commands: list[str] = []
        self.guard: dict[str, Any] | None = None
        self.launched = False
        self.stopped = False
        self.metrics = bytearray()
        self.exited_rc: int | None = None
        self.exited_at: float | None = None
        self.checkpoints: list[int] = []
        self.attempts: list[str] = []
        """The ``attempt`` of each start bundle this node got."""
        self.gpu_readings: list[float] = []
        """When this node's poll answers carried a GPU reading (``JobScript.gpu_power_w``)."""
        self.warm_timers: list[str] = []
        """The seconds of each keep-warm timer the laptop started on this node."""
        self.pull_inputs: list[bytes] = []
        """What each image pull got on its stdin (the registry auth file, or nothing)."""

    @property
    def script(self) -> NodeScript:
        """The node's faults, or none outside the attempt they hold in."""
        s = self.fleet.job.node(self.host.name)
        if s.in_attempt is not None and s.in_attempt != self.fleet.attempt:
            return NodeScript()
        return s

    @property
    def is_head(self) -> bool:
        return self.host.name == self.fleet.hosts[0].name

    def reachable_check(self, timeout: float | None) -> None:
        step = self.fleet.step
        s = self.script
        if s.unreachable_from_step is not None and step >= s.unreachable_from_step:
            raise HostError(self.host.name, f"unreachable at {self.host.address}: fake link down")
        if s.hang_from_step is not None and step >= s.hang_from_step:
            if timeout is None:
                raise AssertionError(
                    f"{self.host.name}: a call without a timeout on a hung node blocks forever"
                )
            self.fleet.clock.now += timeout
            raise HostError(self.host.name, f"no answer within {timeout:.0f} s (fake hang)")

    # -- the agent's answers ------------------------------------------------------------------
    def poll_answer(self) -> str:
        s = self.script
        step = self.fleet.step
        if s.garbage_from_step is not None and step >= s.garbage_from_step:
            return "\x1b]0;pwned\x07 this is not JSON [/red]"
        if not self.launched:
            return json.dumps({"state": "absent", "rc": None, "offset": 0, "metrics_b64": "", "status": None})
        state = "running"
        if self.exited_rc is not None:
            state = "exited"
        answer: dict[str, Any] = {
            "state": state,
            "rc": self.exited_rc,
            "exited_at": self.exited_at,
            "offset": len(self.metrics),
            "metrics_b64": base64.b64encode(
                bytes(self.metrics[self.fleet.offsets.get(self.host.name, 0) :])
            ).decode(),
            "status": self.fleet.status if self.is_head else None,
            "log_tail": f"step {step}",
            "gpu_util": None,
        }
        if s.gpu_fault_from_step is not None:
            answer["gpu"] = gpu_reading(ecc=2 if step >= s.gpu_fault_from_step else 0)
        watts = self.fleet.job.gpu_power_w
        if watts is not None and state == "running":
            gpu = {
                "index": 0,
                "uuid": f"GPU-{self.host.name}",
                "bus_id": "00000000:18:00.0",
                "power_w": watts,
            }
            answer["gpu"] = {"smi": True, "queried": True, "gpus": [gpu]}
            self.gpu_readings.append(self.fleet.clock.now)
        self.fleet.offsets[self.host.name] = len(self.metrics)
        return json.dumps(answer)

    def start_attempt(self, attempt: str, resume_from: str | None) -> None:
        """A start bundle: a later attempt starts the node's processes again (the head resumes
        the job from the checkpoint's step)."""
        self.attempts.append(attempt)
        if attempt == "1" or not self.is_head:
            self.exited_rc = self.exited_at = None
            return
        fleet = self.fleet
        fleet.status = None
        fleet.step = int(resume_from.rsplit("step-", 1)[1]) if resume_from else 0
        fleet.offsets = {}
        for node in fleet.nodes.values():  # the attempt's files moved to attempt-<n>/
            node.exited_rc = node.exited_at = None
            node.metrics = bytearray()

    def exit(self, rc: int) -> None:
        if self.exited_rc is None:
            self.exited_rc = rc
            self.exited_at = self.fleet.clock.now


class FakeConnection:
    """Stands in for ``NodeConnection``."""

    def __init__(self, node: FakeNode) -> None:
        self.node = node
        self.host = node.host
        self.closed = 0

    def run(self, command: str, timeout: float | None = None) -> CommandResult:
        node = self.node
        node.commands.append(command)
        node.reachable_check(timeout)
        name = self.host.name
        if command == "true":  # the wrap-up's probe of a node the watcher lost
            return CommandResult(name, 0, "", "")
        if command.startswith("tail -c ") and command.endswith('/metrics.jsonl"'):  # late saves
            return CommandResult(name, 0, bytes(node.metrics).decode(errors="replace"), "")
        if "MANIFEST.json" in command:  # the complete checkpoints this node holds
            return CommandResult(name, 0, json.dumps(sorted(node.checkpoints, reverse=True)) + "\n", "")
        if "fleetrun_warm.py" in command:  # keep warm: the node's own timer, started detached
            self.node.warm_timers.append(command.split('fleetrun_warm.py" ', 1)[1].split()[0])
            return CommandResult(name, 0, "armed\n", "")
        if "command -v rsync" in command:
            if node.script.fail_preflight:
                return CommandResult(name, 1, "", "rsync: not found")
            return CommandResult(name, 0, "ok\n", "")
        if command.startswith("echo FLEETRUN_ME="):  # the claim before the start
            port = "FLEETRUN_RDZV_PORT=40123\n" if "FLEETRUN_RDZV_PORT" in command else ""
            gpus = "G 0, GPU-aaaa\nG 1, GPU-bbbb\n" if "nvidia-smi" in command else ""
            if node.script.busy_gpu_user and gpus:
                gpus += f"A GPU-aaaa, 777, 5120, {node.script.busy_gpu_user}\n"
            return CommandResult(name, 0, f"FLEETRUN_ME={self.host.user}\n{gpus}{port}", "")
        if command.startswith("sh -c "):
            if node.script.fail_setup:
                return CommandResult(name, 1, "", "pip: could not find torch==9.9 [/simple]")
            return CommandResult(name, 0, "FLEETRUN_SETUP=ran\n", "")
        if "guard.json" in command:
            guard_text = command.split("<<'", 1)[1].split("\n", 1)[1]
            node.guard = json.loads(guard_text.split("\nFLEETRUN_EOF_")[0])
            node.launched = True
            return CommandResult(name, 0, "", "")
        if " stop " in command:
            if node.script.fail_stop:
                raise HostError(name, "stop failed: fake agent crashed [/x]")
            running = node.launched and node.exited_rc is None
            node.stopped = True
            if running:
                node.exit(-15)
            blocked = node.script.blocked_at_stop and running
            answer = StopAnswer(terminated=int(running), remaining=0, blocked=int(blocked), grace_cut=blocked)
            return CommandResult(name, 0, answer.to_json() + "\n", "")
        if command.startswith('cd "$HOME" && '):
            self.node.fleet.uploads.append((name, shlex.split(command.split("&& ", 1)[1])))
            return CommandResult(name, 0, "", "")
        raise AssertionError(f"{name}: the fake fleet does not know this command: {command[:120]!r}")

    def run_with_input(
        self, command: str, data: bytes, timeout: float, on_stdout: Callable[[bytes], None] | None = None
    ) -> CommandResult:
        """Setup and start ship their scripts on stdin as a ``FileBundle`` (never in argv)."""
        node = self.node
        node.commands.append(command)
        node.reachable_check(timeout)
        name = self.host.name
        if " - cheap " in command or " - full " in command:
            return CommandResult(name, 0, self.probe_answer(command), "")
        if command.startswith('while IFS= read -r kv; do export "$kv"; done && cd "$HOME" && '):
            self.node.fleet.uploads.append((name, shlex.split(command.split("&& ", 2)[2])))
            return CommandResult(name, 0, "", "")  # a bucket upload whose key comes on stdin
        if command.startswith("sh -c ") and "FLEETRUN_PULL=" in command:  # the container image pull
            node.pull_inputs.append(data)
            progress = "".join(f"FLEETRUN_PULL_BYTES={n}\n" for n in node.script.pull_progress)
            for line in progress.splitlines(keepends=True):
                if on_stdout is not None:  # as the node sends it: a line in two chunks
                    on_stdout(line[:7].encode())
                    on_stdout(line[7:].encode())
            if node.script.pull_error is not None:
                return CommandResult(name, 125, progress, node.script.pull_error)
            return CommandResult(name, 0, progress + "FLEETRUN_PULL=pulled podman\n", "")
        files = FileBundle.from_json(data).files
        node.files.update(files)
        if "setup.sh" in files:
            if node.script.fail_setup:
                return CommandResult(name, 1, "", "pip: could not find torch==9.9 [/simple]")
            return CommandResult(name, 0, "FLEETRUN_SETUP=ran\n", "")
        if "guard.json" in files:
            node.guard = json.loads(files["guard.json"])
            launches = " start " in command
            if launches and ATTEMPT_FILE in files:
                node.start_attempt(files[ATTEMPT_FILE], files.get(RESUME_FILE))
            node.launched = node.launched or launches
            answer = StartAnswer(pid=4242 if launches else None, guard=4343)
            return CommandResult(name, 0, answer.to_json() + "\n", "")
        raise AssertionError(f"{name}: the fake fleet does not know this command: {command[:120]!r}")

    def probe_answer(self, command: str = "") -> str:
        """The doctor probe's answer: a healthy node, but for rsync on a ``fail_preflight`` node;
        with a playbook's ``container:`` (the probe's runtime and image arguments), its facts."""
        answer = {
            "v": 1,
            "mode": "cheap",
            "python": "3.11.2",
            "hostname": self.host.name,
            "hostname_addrs": [self.host.address],
            "rsync": not self.node.script.fail_preflight,
            "home_free": 50 * 2**30,
            "lib": "",
            "time": time.time(),
        }
        if self.node.is_head:
            answer["port"] = {"in_use": False, "holders": []}
        if self.node.script.bad_gpu_at_probe:
            answer["gpu_health"] = gpu_reading(ecc=2)
        words = shlex.split(command)
        if len(words) >= 10:  # python - MODE ADDR PORT HEAD LIB RUNTIME IMAGE SIF
            answer["container"] = self.node.script.container_facts or {
                "wanted": words[7],
                "found": ["podman"],
                "runtime": "podman",
                **({"version": "podman version 4.3.1", "cdi_gpu": []} if words[2] == "full" else {}),
                **(
                    {"image": {"present": False, "pullable": True, "error": None}}
                    if words[2] == "full"
                    else {}
                ),
            }
        return json.dumps(answer) + "\n"

    def put_file(self, remote_path: str, text: str, mode: int = 0o644) -> None:
        self.node.reachable_check(30)
        self.node.files[remote_path] = text
        if remote_path.endswith("guard.json"):  # scripts shipped over SFTP
            self.node.guard = json.loads(text)

    def ask(self, command: str, request: str, timeout: float) -> str:
        if json.loads(request).get("op") == "wait":  # no event channel: the watcher polls
            raise HostError(self.host.name, "no event channel on a fake node")
        node = self.node
        node.reachable_check(timeout)
        if node.is_head:
            node.fleet.tick()
        offset = json.loads(request).get("offset")
        if isinstance(offset, int) and offset <= len(node.metrics):  # a new watcher reads from 0
            node.fleet.offsets[self.host.name] = offset
        return node.poll_answer()

    def close_sessions(self) -> None:
        pass

    def close(self) -> None:
        self.closed += 1


class FakeFleet:
    """The fleet port (``FleetPort``) of the unit tests: sequential, deterministic fan-out."""

    def __init__(self, hosts: Iterable[Host], job: JobScript, clock: FakeClock) -> None:
        self.hosts = list(hosts)
        self.job = job
        self.clock = clock
        self.max_parallel = 32
        self.known_hosts = Path("/nonexistent/known_hosts")
        self.jumps: JumpHosts | None = None  # no fake host sits behind a jump host
        self.attempt = 1
        """Counted up when a recovery reconnects for its next attempt."""
        self.replaced: list[Host] = []
        """The new machines recovery connected to (a ``Host`` that differs from the lost one)."""
        self.visited: list[Host] = []
        """The machines recovery checked before taking them (``outside``), in order."""
        self.nodes = {h.name: FakeNode(self, h) for h in self.hosts}
        self.connections = {h.name: FakeConnection(self.nodes[h.name]) for h in self.hosts}
        self.step = 0
        self.status: dict[str, Any] | None = None
        self.offsets: dict[str, int] = {}
        self.uploads: list[tuple[str, list[str]]] = []
        self.pulled: list[str] = []
        self.synced: list[list[str]] = []
        """The nodes of each sync, in order."""
        self.closed = 0

    @property
    def head(self) -> FakeNode:
        return self.nodes[self.hosts[0].name]

    def tick(self) -> None:
        """One poll round of the job: the head logs a step, a node may exit, the job may finish."""
        job = self.job
        head = self.head
        if not head.launched or self.status is not None or head.exited_rc is not None:
            return
        if self.step == 0 and job.world is not None:
            head.metrics += (
                json.dumps({"event": "world", "time": self.clock.now, **_as_fields(job.world)}) + "\n"
            ).encode()
        stalled = job.stall_at_step is not None and self.step >= job.stall_at_step
        if not stalled:
            self.step += 1
            loss = (
                math.nan if job.nan_at_step is not None and self.step >= job.nan_at_step else 2.0 / self.step
            )
            record = {"step": self.step, "time": self.clock.now, "loss": loss}
            head.metrics += (json.dumps(record, allow_nan=True) + "\n").encode()
            if job.checkpoint_every and self.step % job.checkpoint_every == 0:
                for node in self.nodes.values():
                    if node.launched and node.exited_rc is None and node.script.unreachable_from_step is None:
                        node.checkpoints.append(self.step)
        for node in self.nodes.values():
            s = node.script
            if s.exit_at_step is not None and self.step >= s.exit_at_step:
                node.exit(s.exit_code)
        if not stalled and self.step >= job.steps:
            self.status = {
                "status": job.finish_status,
                "time": self.clock.now,
                "step": self.step,
                "message": job.finish_message,
            }
            rc = job.finish_exit_code
            for node in self.nodes.values():
                node.exit(rc if rc is not None else 0 if job.finish_status == "succeeded" else 1)

    def map(
        self,
        fn: Callable[[FakeConnection], T],
        hosts: Iterable[Host] | None = None,
        on_done: Callable[[str, T | BaseException], None] | None = None,
        deadline: float | None = None,
    ) -> NodeResults[T]:
        results = NodeResults[T]()
        for host in list(hosts) if hosts is not None else self.hosts:
            try:
                value: T | BaseException = fn(self.connections[host.name])
            except Exception as exc:  # noqa: BLE001 - per host, as parallel_map does
                value = exc
            results[host.name] = value
            if on_done is not None:
                on_done(host.name, value)
        return results

    def subset(self, names: Collection[str]) -> FakeFleet:
        """The same nodes and connections, narrowed to ``names`` (``FleetPort.subset``)."""
        view = copy.copy(self)
        view.hosts = [h for h in self.hosts if h.name in names]
        return view

    def reconnect(self, hosts: list[Host], known_hosts: Path) -> FakeFleet:
        """A later attempt's nodes (``FleetPort.reconnect``): a ``Host`` that changed (a new
        machine) is a fresh node with nothing on its disk; the attempt counter moves on."""
        self.attempt += 1
        self.known_hosts = known_hosts
        for host in hosts:
            node = self.nodes.get(host.name)
            if node is None or node.host != host:
                self.replaced.append(host)
                self.nodes[host.name] = FakeNode(self, host)
                self.connections[host.name] = FakeConnection(self.nodes[host.name])
        self.hosts = list(hosts)
        return self

    def outside(self, hosts: list[Host], known_hosts: Path) -> FakeFleet:
        """Machines not (yet) the run's (``FleetPort.outside``): a view of this fleet whose nodes
        are the run's own where the ``Host`` is the same, else fresh ones that are not the run's
        (a later ``reconnect`` makes its own); each one is kept in ``visited``, in order."""
        view = copy.copy(self)
        view.hosts = list(hosts)
        view.nodes = {}
        for host in hosts:
            node = self.nodes.get(host.name)
            view.nodes[host.name] = node if node is not None and node.host == host else FakeNode(view, host)
            self.visited.append(host)
        view.connections = {name: FakeConnection(node) for name, node in view.nodes.items()}
        return view

    def answers(self, host: Host, timeout: float) -> bool:
        """``FleetPort.answers``: no fake node listens on a port; a lost lab host answers again
        only when its script says it ``comes_back``."""
        return self.job.node(host.name).comes_back

    def close(self) -> None:
        self.closed += 1

    # -- the rsync steps ---------------------------------------------------------------------
    def transfers(self) -> Transfers:
        return Transfers(sync=self._sync, pull=self._pull, spread_checkpoint=self._spread)

    def _sync(self, fleet: Any, workdir: Path, job: str, known_hosts: Path, **kwargs: Any) -> dict[str, Any]:
        on_done = kwargs.get("on_done")
        out: dict[str, Any] = {}
        self.synced.append([h.name for h in fleet.hosts])
        for host in fleet.hosts:  # the port passed in: a later attempt syncs its new nodes only
            res: Any = (
                HostError(host.name, "rsync exited 12: connection unexpectedly closed [/tmp]")
                if self.job.node(host.name).fail_sync
                else SyncResult(host.name, files_sent=3, bytes_sent=1234)
            )
            out[host.name] = res
            if on_done is not None:
                on_done(host.name, res)
        return out

    def _spread(
        self, fleet: Any, hosts: list[Host], run_id: str, known_hosts: Path, staging: Path, **_: Any
    ) -> Spread:
        """``spread_latest`` in memory: the newest checkpoint any node holds, copied to the rest."""
        from launch.run.checkpoints import checkpoint_dir, complete_steps, newest

        found = newest(complete_steps(fleet, hosts, run_id))
        if found is None:
            said = "no complete checkpoint on any node: the next attempt starts from the beginning"
            return Spread(None, said, "the beginning (no complete checkpoint on any node)")
        step, holder = found
        lacking = [h.name for h in hosts if step not in self.nodes[h.name].checkpoints]
        for name in lacking:
            self.nodes[name].checkpoints.append(step)
        remote = f"{checkpoint_dir(run_id)}/step-{step}"
        if not lacking:
            return Spread(
                remote, f"every node holds checkpoint step {step}", f"step {step}, held by every node"
            )
        return Spread(
            remote,
            f"checkpoint step {step} copied from {holder} to {', '.join(lacking)} (no bucket holds it)",
            f"step {step}, copied from {holder}",
        )

    def _pull(
        self, fleet: Any, run_id: str, folder: RunFolder, known_hosts: Path, console: Console
    ) -> dict[str, str]:
        errors: dict[str, str] = {}
        for host in fleet.hosts:  # the fleet passed in: the wrap-up leaves lost nodes out of it
            node = self.nodes[host.name]
            try:
                node.reachable_check(3600)
            except HostError as exc:
                errors[host.name] = str(exc)
                continue
            if node.script.fail_pull:
                errors[host.name] = f"{host.name}: rsync: opendir failed: Permission denied (13)"
                continue
            target = folder.node_dir(host.name)
            target.mkdir(parents=True, exist_ok=True)
            (target / "node.log").write_text(f"log of {host.name}\n\x1b[2J[bold]not markup[/bold]\n")
            if node.exited_rc is not None:
                (target / "rc").write_text(f"{node.exited_rc}\n")
            if node.metrics:
                (target / "metrics.jsonl").write_bytes(bytes(node.metrics))
            if node.is_head and self.status is not None:
                (target / "status.json").write_text(json.dumps(self.status))
            self.pulled.append(host.name)
        return errors


def _as_fields(world: object) -> dict[str, Any]:
    return world if isinstance(world, dict) else {"world_size": world}


def fake_hosts(n: int, instance_type: str | None = None) -> list[Host]:
    from tests.conftest import SAMPLE_HOST_KEYS

    return [
        Host(
            name=f"n{i}",
            address=f"203.0.113.{i + 1}",
            private_address=f"10.0.0.{i + 1}",
            user="trainer",
            host_key=SAMPLE_HOST_KEYS[i],
            gpus=1,
            instance_type=instance_type,
        )
        for i in range(n)
    ]


def fake_inventory(n: int = 2, instance_type: str | None = None, **fields: Any) -> Inventory:
    return Inventory(hosts=fake_hosts(n, instance_type), source="fake fleet", **fields)


@dataclass
class FakeRun:
    """One run of the real life cycle on a fake fleet; what it returned and what the nodes saw."""

    summary: Any
    fleet: FakeFleet
    records: Any
    reporter: Any
    folder: Path
    clock: FakeClock | None = None
    playbook: Path | None = None


def _fake_port(fleet: FakeFleet) -> FleetPort:
    return fleet  # the type checker proves the fake fleet implements the port


def fake_spec(tmp_path: Path, nodes: int, **fields: Any) -> Any:
    """The 2-node torchrun job of these tests, as a playbook file (``playbook.yaml``) and its spec."""
    import yaml

    from launch.job.spec import load_job_spec

    workdir = tmp_path / "work"
    workdir.mkdir(exist_ok=True)
    data = {
        "name": "fake-job",
        "workdir": str(workdir),
        "entrypoint": "python train.py",
        "nodes": f"{fields.pop('min_nodes')}:{nodes}" if fields.get("min_nodes") else nodes,
        "procs_per_node": 1,
        **{k: v for k, v in fields.items() if v and k != "min_nodes"},
    }
    playbook = tmp_path / "playbook.yaml"
    playbook.write_text(yaml.safe_dump(data))
    return playbook, load_job_spec(playbook)


def run_on_fake_fleet(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    job: JobScript | None = None,
    *,
    inventory: Inventory | None = None,
    teardown: str = "never",
    stop: dict[str, Any] | None = None,
    reporter: Any = None,
    records: Any = None,
    transfers: Transfers | None = None,
    ask_keep_running: Callable[[str], bool] | None = None,
    clock: FakeClock | None = None,
    poll_interval: float = 5.0,
    allow_busy_gpus: bool = False,
    skip_doctor: bool = False,
    recovery: dict[str, Any] | None = None,
    min_nodes: int | None = None,
    spares: tuple[Host, ...] = (),
    keep_warm_s: float | None = None,
    container: dict[str, Any] | None = None,
    hold: Any = None,
    sweep_id: str | None = None,
    on_end: list[str] | None = None,
) -> FakeRun:
    """Plan a 2-node torchrun job for ``inventory`` and run it through the real life cycle
    (``launch.run.lifecycle.execute``), the fake fleet and the fake clock in its context
    (``hold``: the run's ``QueueHold``, or a stand-in recording what recovery asks of it)."""
    from launch.cli.app import make_plan
    from launch.run.lifecycle import execute, state_for
    from launch.run.provenance import file_sha256
    from launch.run.records import RunRecords
    from launch.run.reporter import RecordingReporter
    from launch.run.run_folder import RunFolder
    from launch.run.state import RunContext, RunOptions

    job = job or JobScript()
    clock = (clock or FakeClock()).install(monkeypatch)
    inventory = inventory or fake_inventory(2)
    playbook, spec = fake_spec(
        tmp_path,
        len(inventory.hosts),
        teardown=teardown,
        stop=stop or {},
        recovery=recovery or {},
        min_nodes=min_nodes,
        keep_warm_s=keep_warm_s,
        container=container,
        on_end=on_end,
    )
    plan = make_plan(spec, inventory, run_id="fake-run-1")
    folder = RunFolder.create(plan.run_id, base=tmp_path / "runs")
    if on_end:  # allowed, as start_run saves them after fab train --allow-local-hooks
        from launch.run.hooks import LocalHooks, save_on_end

        save_on_end(folder.path, spec, LocalHooks(True, "allowed (the tests)", str(playbook)))
    records = records or RunRecords(tmp_path / "runs.db")
    records.start(
        run_id=plan.run_id,
        playbook_path=str(playbook),
        playbook_hash=file_sha256(playbook),
        playbook_name=spec.name,
        inventory=inventory.to_yaml_data(),
        launcher=spec.launcher,
        run_dir=str(folder.path),
        started_at=clock.now,
        sweep_id=sweep_id,
    )
    fleet = FakeFleet(inventory.hosts, job, clock)
    reporter = reporter or RecordingReporter()
    ctx = RunContext(
        spec=spec,
        port=_fake_port(fleet),
        folder=folder,
        records=records,
        reporter=reporter,
        transfers=transfers or fleet.transfers(),
        options=RunOptions(
            poll_interval=poll_interval,
            completion_grace_s=10.0,
            allow_busy_gpus=allow_busy_gpus,
            skip_doctor=skip_doctor,
            spares=spares,
        ),
        clock=clock,
        ask_keep_running=ask_keep_running,
        hold=hold,
    )
    state = state_for(
        spec, plan, inventory, tmp_path / "known_hosts", folder.path, now=clock.now, sweep_id=sweep_id
    )
    summary = execute(ctx, state)
    return FakeRun(summary, fleet, records, reporter, folder.path, clock, playbook)
