"""What the commands do, independent of Fabric's task syntax (tasks and tests call these).

``train`` reads like the run it starts: a request, its preparation, the life cycle
(``launch.run.opening``, ``launch.run.lifecycle``). ``doctor`` runs the checks. Errors the user
can act on are ``FleetrunError``.
"""

from __future__ import annotations

import secrets
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.text import Text

from launch.errors import SpecError
from launch.fleets.kinds.registry import fleet_kind
from launch.fleets.select import load_inventory, local_fleet
from launch.job.overrides import parse_overrides
from launch.job.spec import JobSpec, load_job_spec
from launch.paths import known_hosts_file
from launch.planning.plan import LaunchPlan
from launch.reports.safe_text import clean
from launch.rules.preflight import errors_by_node, pick_hosts
from launch.run import opening
from launch.run.opening import RunRequest, make_plan, only_hosts
from launch.run.reporter import Reporter, RichReporter
from launch.run.state import AskKeepRunning
from launch.run.summary import RunResult
from launch.settings import current

__all__ = ["doctor", "load_inventory", "local_fleet", "make_plan", "only_hosts", "train"]

DEFAULT_RDZV_PORT = JobSpec.model_fields["rdzv_port"].default


def train(
    playbook: str | Path,
    *,
    dry_run: bool = False,
    console: Console | None = None,
    ask_on_interrupt: bool = True,
    **request: Any,
) -> RunResult | LaunchPlan:
    """``fab train``: the run's request (``request``: the fields of ``launch.run.opening.RunRequest``,
    which says what each does) handed to the run's front door (``opening.run``): its preparation
    (hosts, plan), then its life cycle from the queue turn to the last hook. ``--dry-run`` prints
    the plan and stops. What to do on Ctrl-C is asked on this terminal."""
    reporter = RichReporter(console or Console())
    ask = ask_keep_running_on_terminal(reporter) if ask_on_interrupt else None
    return opening.run(RunRequest.of(playbook, **request), reporter, ask, dry_run=dry_run)


def doctor(
    playbook: str | Path | None = None,
    inventory: str | None = None,
    console: Console | None = None,
    port: int | None = None,
    verbose: bool = False,
    collective: bool = False,
    overrides: Sequence[str] = (),
    gpu_diag: int = 0,
    allow_paths: tuple[Path, ...] = (),
) -> bool:
    """``fab doctor``: every check on every node (the playbook's first ``nodes`` hosts when one is
    given: its port, and whether its setup installs torch). True when nothing would break a job.
    Verdict lines are printed for warnings and errors (every check with ``verbose``), then the table.
    ``gpu_diag`` (1, 2 or 3): then DCGM's diagnostic ``dcgmi diag -r N`` on every reachable node
    at once, a line per GPU with a failed test. ``collective``: then an all-reduce and matmul test
    through torchrun on the hosts a job would get, in one launch: the fleet, then a ring of pairs
    that names the slow node or link (``launch.run.collective``), kept under the runs folder."""
    from launch.reports.doctor_view import print_findings
    from launch.run import doctor as checks
    from launch.transport.ssh import Fleet

    console = console or Console()
    if port is not None and not 1 <= port <= 65535:
        # checked before anything is read or connected to: Python's socket would raise OverflowError
        raise SpecError(f"--port {port}: expected a TCP port, 1 to 65535")
    if overrides and playbook is None:
        raise SpecError(
            "--set changes a playbook's field: name the playbook too (fab doctor --playbook FILE --set ...)"
        )
    if gpu_diag and gpu_diag not in checks.DIAG_LEVELS:
        raise SpecError(f"--gpu-diag {gpu_diag}: expected 1 (seconds), 2 (about 2 minutes) or 3 (about 15)")
    # the playbook first: bad input is refused before the inventory is read or anything contacted
    spec = load_job_spec(playbook, parse_overrides(overrides), allowed=allow_paths) if playbook else None
    inv = load_inventory(inventory)
    fleet_ok = True
    site: list[str] = []
    for level, line in fleet_kind(inv.fleet).health():  # a scheduler's login host and partition
        style = {"ok": "green", "warning": "yellow"}.get(level, "bold red")
        console.print(Text(f"{level:<7} ", style=style) + Text(clean(line, 600)))
        fleet_ok = fleet_ok and level != "error"
        site.append(level)
    brings_torch = False
    rdzv_port = DEFAULT_RDZV_PORT
    nodes = None
    container = None
    if spec is not None:
        nodes = spec.nodes
        inv = inv if len(inv.hosts) > spec.nodes else inv.first(spec.nodes)
        rdzv_port = spec.rdzv_port
        brings_torch = checks.torch_from_setup(spec.requirements_text(), spec.setup)
        container = checks.ContainerCheck.of(spec)
    if port is not None:
        rdzv_port = port
    if not isinstance(rdzv_port, int):
        # ``rdzv_port: auto``: each run gets a port the head's kernel hands out from its ephemeral
        # range, so test reachability on one port drawn from that range (Linux's default range)
        rdzv_port = secrets.SystemRandom().randint(32768, 60999)
        console.print(f"rdzv_port is auto: testing port {rdzv_port}, one from the range runs draw from")
    known_hosts = inv.write_known_hosts(known_hosts_file(inv.fingerprint()))
    with Fleet(inv.hosts, known_hosts, max_parallel=current().fanout) as fleet:
        observations, findings = checks.doctor(fleet, inv.hosts, rdzv_port, brings_torch, container)
        if gpu_diag:
            diag_check(
                console,
                fleet,
                [h for h, o in zip(inv.hosts, observations, strict=True) if o.error is None],
                findings,
                gpu_diag,
                [h.name for h in inv.hosts],
            )
        if collective:
            collective_check(console, fleet, inv.hosts, findings, nodes, rdzv_port)
    print_findings(console, findings, [h.name for h in inv.hosts], verbose=verbose, site=site)
    if nodes is not None and len(inv.hosts) > nodes:
        # spares: a job needs only ``nodes`` healthy hosts; the others' errors do not fail it
        chosen, excluded = pick_hosts([h.name for h in inv.hosts], errors_by_node(findings), nodes)
        for name, why in excluded.items():
            console.print(Text(clean(f"a job would skip {name}: {why}", 600)))
        if not chosen:
            console.print(Text(f"fewer than {nodes} healthy hosts: a job would not start", style="bold red"))
            return False
        console.print(Text(clean(f"a job of {nodes} node(s) would get: {', '.join(chosen)}", 2000)))
        return fleet_ok
    return fleet_ok and not findings.failed


def diag_check(
    console: Console, fleet: Any, hosts: list[Any], findings: Any, level: int, order: list[str]
) -> None:
    """``fab doctor --gpu-diag LEVEL`` on the reachable hosts, its lines added to the findings."""
    from launch.rules.preflight import check_gpu_diag
    from launch.run import doctor as checks

    if not hosts:
        return
    bound = checks.diag_timeout(level)
    console.print(
        f"gpu diag: dcgmi diag -r {level} on {len(hosts)} node(s) at once (at most {bound / 60:.0f} min) ..."
    )
    check_gpu_diag(findings, checks.gpu_diag(fleet, hosts, level), order)


def collective_check(
    console: Console, fleet: Any, hosts: list[Any], findings: Any, nodes: int | None, port: int
) -> None:
    """``fab doctor --collective`` on the hosts a job would get (reachable, no error), its lines
    added to the doctor's findings and its figures saved as ``collective/<time>.json`` in the runs
    folder; then compared with the results saved before (``launch.rules.collective.compare_history``):
    a fleet or node figure far under its history's median is a warning."""
    import os
    import time

    from launch.paths import runs_dir
    from launch.rules.collective import verdict_lines
    from launch.run import collective as test

    # the hosts a job would get; without a playbook, every host without an error (two at least)
    names = [h.name for h in hosts]
    chosen, _excluded = pick_hosts(names, errors_by_node(findings), nodes or len(hosts), None if nodes else 2)
    usable = [h for h in hosts if h.name in chosen]
    if len(usable) < 2:
        console.print(Text("collective: fewer than two healthy nodes, nothing to measure", style="yellow"))
        return
    console.print(f"collective: all-reduce and matmul on {len(usable)} nodes through torchrun ...")
    sizes = {
        k: v
        for k in ("FLEETRUN_COLLECTIVE_MB", "FLEETRUN_COLLECTIVE_REPS", "FLEETRUN_COLLECTIVE_CONFIRM_REPS")
        if (v := os.environ.get(k, ""))
    }
    sizes = {k: v for k, v in sizes.items() if v.replace(".", "", 1).isdigit() and len(v) < 10}
    report, seconds = test.check(fleet, usable, port, sizes)
    level = {"ok": "ok", "warn": "warn", "error": "error"}
    for node, lv, message in verdict_lines(report):
        if node == "fleet":
            console.print(
                Text(clean(f"collective fleet: {message}", 600), style="red" if lv == "error" else "")
            )
            if lv == "error":
                findings.add(usable[0].name, "collective", level[lv], message)
        else:
            findings.add(node, "collective", level[lv], message)
    path, compared, notes = test.keep_and_compare(
        runs_dir() / "collective", report, [h.name for h in usable], seconds, time.time()
    )
    for finding in compared:
        text = f"fleet {finding.message}" if finding.fleet else finding.message
        if finding.level == "warn":  # the fleet's figure goes with the first node, as its error does
            findings.add(usable[0].name if finding.fleet else finding.node, "collective", "warn", text)
        else:
            console.print(Text(clean(f"collective history: {finding.node}: {finding.message}", 600)))
    for note in notes:
        console.print(Text(clean(f"collective history: {note}", 600), style="yellow"))
    console.print(
        Text(
            clean(
                f"collective: {seconds:.1f} s, {len(report.measured)} measurement(s); figures in {path}", 600
            )
        )
    )


def collective_history(console: Console) -> None:
    """``fab doctor --collective-history``: the saved collective results over time, per fleet and
    per node, each against the median of the runs before it. Nothing is contacted."""
    from launch.paths import runs_dir
    from launch.reports.collective_view import history_view
    from launch.run.collective import read_history

    folder = runs_dir() / "collective"
    history = read_history(folder)
    for note in history.bounded_notes():
        console.print(Text(clean(note, 600), style="yellow"))
    if history.older_left_out:
        console.print(Text(f"{history.older_left_out} older result(s) in {clean(folder, 300)} not read"))
    console.print(history_view([r for _p, r in history.results]))


def ask_keep_running_on_terminal(reporter: Reporter) -> AskKeepRunning:
    """The Ctrl-C prompt: keep the job (the on-node watchdog guards it) or stop it and wrap up?"""

    def ask(run_id: str) -> bool:
        if not sys.stdin.isatty():
            return False
        reporter.console.print(
            Text("\nInterrupted. ", style="bold")
            + Text(
                f"[k]eep the job running (re-attach with 'fab watch {clean(run_id)}'; the on-node watchdog "
                "keeps enforcing the stop rules) or [s]top it and wrap up? [s] "
            ),
            end="",
        )
        return input().strip().lower().startswith("k")

    return ask
