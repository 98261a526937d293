"""A Slurm cluster: machines for each run come from an allocation made through the login host.

The inventory is the user's file (untrusted), ``--inventory slurm:cluster.yaml``::

    slurm:
      login: {address: login.lab.example, user: alice, key: ~/.ssh/id_ed25519,
              host_key: "ssh-ed25519 AAAA..."}
      partition: gpu
      account: ml            # optional, as are qos, gres, constraint, exclude, drain_on_fault
      gres: "gpu:8"
      time_limit: "04:00:00" # required and finite: the allocation's end when the laptop is gone
    defaults: {user: alice, key: ~/.ssh/id_ed25519, proxy_jump: {...the login host...}}
    hosts:                   # the nodes Slurm may give, each with its pinned host key
      - {name: gpu1, address: 10.1.0.11, host_key: "ssh-ed25519 AAAA..."}

``fab train`` submits a holding job for the playbook's ``nodes`` (``launch.fleets.slurm.commands``
says why ``sbatch`` and not ``salloc``), waits in Slurm's queue with ``--wait`` (without it, a
job that would queue is cancelled and the run refused, as with busy lab machines), and runs on
the nodes it got, over SSH with their pinned keys (the site lets users SSH into the nodes of their
own allocation: the node agent, watchdog and checkpoints then work as on any fleet, and
``pam_slurm_adopt`` where the site has it puts those processes under the job's cgroup). The run's
teardown, after its artifacts are safe, is ``scancel`` of the allocations it made, confirmed gone
from ``squeue``; each node's watchdog, its last step with the laptop gone, runs the same
``scancel`` (its ``~/.fleetrun/poweroff`` hook); the time limit ends it at the latest. Nothing is
ever powered off, and no job fleetrun did not submit is touched.

A lost node is replaced by a new one-node allocation that excludes it and every node of the run
(``replace``); a ``gpu_fault`` node the same way (``renew``), drained for the site first when the
inventory says ``drain_on_fault: true``. The extra allocations' ids are kept beside the run's
first one (``$FLEETRUN_HOME/slurm/<first id>.jobs``), so the teardown and the watchdogs cancel them.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from pydantic import ValidationError

from launch.errors import FleetrunError, SpecError
from launch.fleets.kinds.base import Probe, Say, SiteMachines, TeardownOutcome, TeardownState
from launch.fleets.kinds.refs import SlurmFleetRef
from launch.fleets.slurm import allocation, answers, commands
from launch.job.inventory import REFUSED_KEYS, Host, Inventory, lab_inventory_from_mapping
from launch.job.validation import describe_validation_error, load_yaml_mapping
from launch.paths import fleetrun_home, known_hosts_file
from launch.planning.remote_layout import NO_POWEROFF_HOOK
from launch.reports.safe_text import clean

if TYPE_CHECKING:
    from launch.fleets.slurm.commands import SlurmShell

SELECTOR = "slurm"
SECTION = "slurm"
"""The file's top-level key holding the cluster's settings (the rest is a lab inventory)."""
FLEETRUN_ONLY = ("job_ids", "kind", "nodes")
"""Reference fields the file may not set: the jobs fleetrun made, the kind, the node list (``hosts``)."""
JOB_TAG = "fleetrun:slurm-jobs"
MAX_EXTRA_JOBS = 63
DRAIN_REASON_CHARS = 120
DOCTOR_NODE_LINES = 64
"""``fab doctor`` says this many of the inventory's nodes one line each, then counts the rest."""


def extra_jobs_file(first: int) -> Path:
    return fleetrun_home() / "slurm" / f"{first}.jobs"


def read_extra_jobs(first: int) -> tuple[int, ...]:
    """The allocations a run made after its first (replacements), from fleetrun's own file."""
    try:
        text = extra_jobs_file(first).read_text(encoding="ascii")[:4096]
    except (OSError, UnicodeDecodeError):
        return ()
    ids = [int(word) for word in text.split() if word.isdigit() and len(word) <= 10]
    return tuple(dict.fromkeys(ids))[:MAX_EXTRA_JOBS]


def add_extra_job(first: int, job_id: int) -> None:
    path = extra_jobs_file(first)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="ascii") as out:
        out.write(f"{job_id}\n")


def forget_extra_jobs(first: int | None) -> None:
    """The replacements' file goes once every allocation of the run is gone (squeue confirmed):
    the run's record keeps their ids; a teardown that failed keeps the file to try again."""
    if first is not None:
        extra_jobs_file(first).unlink(missing_ok=True)


def drop_extra_job(first: int, job_id: int) -> None:
    """Forget a replacement that never held a node and is cancelled (the record names only the
    allocations the run held; the teardown has nothing left to cancel of it)."""
    kept = [j for j in read_extra_jobs(first) if j != job_id]
    extra_jobs_file(first).write_text("".join(f"{j}\n" for j in kept), encoding="ascii")


class SlurmKind(SiteMachines):
    name: ClassVar[str] = "slurm"

    def __init__(self, ref: SlurmFleetRef, shell: SlurmShell | None = None) -> None:
        self.ref = ref
        self._shell = shell

    # -- the login host ---------------------------------------------------------------------
    def shell(self) -> SlurmShell:
        if self._shell is None:
            fingerprint = self.ref.login.known_hosts_line().encode().hex()[-24:]
            self._shell = commands.LoginShell(self.ref, known_hosts_file(f"slurm-login-{fingerprint}"))
        return self._shell

    def job_ids(self) -> tuple[int, ...]:
        """Every allocation of this run: the first, then the replacements."""
        first = self.ref.job_id
        if first is None:
            return ()
        return tuple(dict.fromkeys((*self.ref.job_ids, *read_extra_jobs(first))))

    # -- the FleetKind interface ------------------------------------------------------------
    def holding(self) -> SlurmFleetRef:
        """The reference naming every allocation of the run (the first, then the replacements')."""
        jobs = self.job_ids()[: MAX_EXTRA_JOBS + 1]
        return self.ref if jobs == self.ref.job_ids else self.ref.model_copy(update={"job_ids": jobs})

    def describe(self) -> str:
        jobs = self.job_ids()
        held = f", job {', '.join(map(str, jobs))}" if jobs else ""
        return f"Slurm partition {self.ref.partition} via {self.ref.login.label}{held}"

    def poweroff_hook(self) -> str:
        """The watchdog's last step: cancel this run's own allocations (never a power-off)."""
        jobs = self.job_ids()
        if not jobs:
            return NO_POWEROFF_HOOK
        return (
            "# Slurm: the run ended unwatched; give back fleetrun's own allocations, never power off\n"
            f"scancel {' '.join(map(str, jobs))} || true\n"
        )

    def tags(self) -> dict[str, str]:
        jobs = self.job_ids()
        return {JOB_TAG: ",".join(map(str, jobs))} if jobs else {}

    def acquire(self, inventory: Inventory, nodes: int, job_name: str, say: Say, wait: bool) -> Inventory:
        """Submit the holding job, wait for it (with ``wait``), and the inventory of its nodes."""
        if nodes > len(self.ref.nodes):
            raise SpecError(
                f"playbook field 'nodes': the job asks for {nodes} nodes but inventory {inventory.source} "
                f"lists only {len(self.ref.nodes)} Slurm node(s)"
            )
        shell = self.shell()
        job_id = allocation.submit(shell, self.ref, nodes, job_name)
        say(f"slurm job {job_id}: submitted for {nodes} node(s) of partition {self.ref.partition}")
        held = SlurmFleetRef.model_validate({**self.ref.model_dump(), "job_ids": (job_id,)})
        try:
            granted = allocation.wait_granted(shell, self.ref, job_id, say, wait=wait)
            hosts = self._known(granted.nodes)
        except BaseException:
            allocation.cancel(shell, (job_id,))
            raise
        say(f"slurm job {job_id}: running on {', '.join(granted.nodes)}")
        return inventory.model_copy(update={"hosts": hosts, "fleet": held})

    def release(self, say: Say) -> None:
        jobs = self.job_ids()
        if jobs:
            allocation.cancel(self.shell(), jobs)
            say(f"slurm job {', '.join(map(str, jobs))}: cancelled (the run did not start)")

    def tear_down(self, say: Say) -> TeardownOutcome:
        """``scancel`` of the run's own allocations, then ``squeue`` confirms none holds nodes."""
        jobs = self.job_ids()
        if not jobs:
            return TeardownOutcome(TeardownState.DONE, "no Slurm allocation was made")
        shell = self.shell()
        allocation.cancel(shell, jobs)
        held = allocation.still_held(shell, jobs)
        named = ", ".join(map(str, jobs))
        if held:
            return TeardownOutcome(
                TeardownState.FAILED, f"scancel {named}: squeue still shows job {', '.join(map(str, held))}"
            )
        say(f"slurm job {named}: cancelled; the nodes are back in partition {self.ref.partition}")
        forget_extra_jobs(self.ref.job_id)
        return TeardownOutcome(
            TeardownState.DONE, f"Slurm job {named} cancelled; no allocation of this run is left"
        )

    def replace(self, host: Host, say: Say, timeout_s: float, probe: Probe | None = None) -> Host | None:
        """A node of a new one-node allocation that excludes ``host`` (the run's other nodes are
        its own exclusive allocation's), within ``timeout_s``; None when Slurm gives none in time."""
        return self._another(host, say, timeout_s)

    def renew(self, host: Host, say: Say, timeout_s: float, probe: Probe | None = None) -> Host | None:
        """As ``replace`` for a node that still answers (a ``gpu_fault``); drained for the site
        first when the inventory allows it (``drain_on_fault``), else only excluded."""
        if self.ref.drain_on_fault:
            reason = clean(f"fleetrun: gpu_fault in run job {self.ref.job_id}", DRAIN_REASON_CHARS)
            try:
                allocation.run_checked(self.shell(), commands.drain_argv(host.name, reason))
                say(f"{host.name}: drained for the site (scontrol update state=drain)")
            except FleetrunError as exc:
                say(f"{host.name}: not drained ({clean(exc, 200)}); excluded from the new allocation")
        return self._another(host, say, timeout_s)

    def _another(self, host: Host, say: Say, timeout_s: float) -> Host | None:
        first = self.ref.job_id
        if first is None or len(self.job_ids()) > MAX_EXTRA_JOBS:
            return None
        shell = self.shell()
        job_id = allocation.submit(shell, self.ref, 1, f"replace-{first}", exclude=(host.name,))
        add_extra_job(first, job_id)  # recorded before the wait: the teardown cancels it either way
        say(f"{host.name}: lost; slurm job {job_id} asks for a node in its place (excluding it)")
        try:
            granted = allocation.wait_granted(shell, self.ref, job_id, say, wait=True, timeout_s=timeout_s)
            if len(granted.nodes) != 1:  # Slurm's answer, not ours: a 1-node job on any other count
                raise FleetrunError(f"slurm job {job_id}: {len(granted.nodes)} nodes for a 1-node job")
            (new,) = self._known(granted.nodes)
        except FleetrunError as exc:
            say(f"{host.name}: no replacement from Slurm: {clean(exc, 300)}")
            allocation.cancel(shell, (job_id,))  # raises when not cancelled: the teardown tries again
            drop_extra_job(first, job_id)
            return None
        say(f"{host.name}: replaced by {new.name} (slurm job {job_id})")
        return new

    def health(self) -> list[tuple[str, str]]:
        """The login host (its pinned key, Slurm's commands there), the partition in ``sinfo``
        (its nodes, their states and gres) and the inventory's nodes against it."""
        ref, lines = self.ref, []
        try:
            version = allocation.run_checked(self.shell(), ["sinfo", "--version"]).strip()
            lines.append(
                ("ok", f"login host {ref.login.label}: reached with its pinned key ({clean(version, 80)})")
            )
            states = answers.node_states(
                allocation.run_checked(self.shell(), commands.node_states_argv(partition=ref.partition))
            )
        except FleetrunError as exc:
            return [*lines, ("error", f"login host {ref.login.label}: {clean(exc, 400)}")]
        if not states:
            return [
                *lines,
                ("error", f"partition {ref.partition}: sinfo shows no such partition or no node in it"),
            ]
        counts: dict[str, int] = {}
        for node in states.values():
            counts[node.state] = counts.get(node.state, 0) + 1
        shown = ", ".join(f"{n} {clean(state, 30)}" for state, n in sorted(counts.items()))
        lines.append(("ok", f"partition {ref.partition}: {len(states)} node(s): {shown}"))
        if ref.gres:
            kind = ref.gres.split(":")[0]
            without = sorted(n.name for n in states.values() if f"{kind}:" not in n.gres)
            if without:
                lines.append(
                    ("error", f"partition {ref.partition}: no {kind} gres on {', '.join(without[:20])}")
                )
        lines += self._node_lines(states)
        listed = {h.name for h in ref.nodes}
        unlisted = sorted(set(states) - listed - set(ref.exclude))
        if unlisted:
            lines.append(
                (
                    "error",
                    f"partition {ref.partition} has node(s) the inventory does not list with a pinned key: "
                    f"{', '.join(unlisted[:20])} (add them to 'hosts' or to 'slurm.exclude')",
                )
            )
        return lines

    def _node_lines(self, states: dict[str, answers.NodeState]) -> list[tuple[str, str]]:
        """One line per node the inventory gives (the first ``DOCTOR_NODE_LINES``, then one
        line counting the rest): Slurm's state of it in the partition, or why no run gets it."""
        ref, lines = self.ref, []
        counts = {"ok": 0, "warning": 0}
        for i, host in enumerate(ref.nodes):
            node = states.get(host.name)
            if host.name in ref.exclude:
                level, line = "ok", f"node {host.name}: excluded (slurm.exclude): never asked for"
            elif node is None:
                level, line = "warning", f"node {host.name}: not in partition {ref.partition}: no run gets it"
            elif node.lost:
                level, line = "warning", f"node {host.name}: {node.state}: Slurm gives it to no run"
            else:
                level, line = (
                    "ok",
                    f"node {host.name}: {node.state} in partition {ref.partition} ({node.gres or 'no gres'})",
                )
            counts[level] += 1
            if i < DOCTOR_NODE_LINES:
                lines.append((level, line))
        rest = len(ref.nodes) - DOCTOR_NODE_LINES
        if rest > 0:
            lines.append(
                ("ok", f"and {rest} more node(s); in all {counts['ok']} usable, {counts['warning']} not")
            )
        return lines

    def lost_nodes(self, names: list[str]) -> dict[str, str]:
        """Nodes of the run Slurm marks DOWN/DRAIN/FAIL: name -> Slurm's state."""
        return allocation.lost_nodes(self.shell(), names)

    def _known(self, names: list[str]) -> list[Host]:
        """The inventory's pinned hosts for Slurm's node names, in Slurm's order; an allocated
        node the inventory does not list has no pinned key: refused."""
        by_name = {h.name: h for h in self.ref.nodes}
        unknown = [n for n in names if n not in by_name]
        if unknown:
            raise FleetrunError(
                f"Slurm allocated {clean(', '.join(unknown[:20]), 400)}, which the inventory does not list with a pinned "
                "host key; add it to 'hosts' or to 'slurm.exclude'"
            )
        return [by_name[n] for n in names]


def load_slurm_inventory(arg: str | None, save_keys: bool = True) -> Inventory:
    """``--inventory slurm:PATH``: the file's ``slurm`` section with its ``hosts`` (a lab
    inventory's ``defaults`` and ``hosts``, validated the same way). One-line errors name the
    file and the field."""
    if not arg:
        raise SpecError("--inventory slurm:PATH: name the Slurm inventory file (e.g. slurm:cluster.yaml)")
    path = Path(arg)
    data = load_yaml_mapping(path, "inventory")
    section = data.pop(SECTION, None)
    if not isinstance(section, dict):
        raise SpecError(f"{path}: field {SECTION!r}: expected a mapping (login, partition, time_limit, ...)")
    for key in FLEETRUN_ONLY:
        if key in section:
            raise SpecError(
                f"{path}: field '{SECTION}.{key}': not allowed (only fleetrun sets it; list the nodes under 'hosts')"
            )
    for key in data:
        if key in REFUSED_KEYS:
            raise SpecError(f"{path}: field {key!r}: not allowed in a Slurm inventory")
    lab = lab_inventory_from_mapping(path, data)  # defaults and hosts: a lab inventory's checks
    login: object = section.get("login")
    if isinstance(login, dict) and isinstance(login.get("key"), str):
        key_path = Path(login["key"]).expanduser()
        login = {**login, "key": key_path if key_path.is_absolute() else (path.parent / key_path).resolve()}
    try:
        ref = SlurmFleetRef.model_validate({**section, "login": login, "nodes": lab.hosts})
    except ValidationError as exc:
        where = describe_validation_error(str(path), exc)
        raise SpecError(where.replace(": field '", f": field '{SECTION}.")) from None
    return lab.model_copy(update={"fleet": ref, "source": str(path)})
