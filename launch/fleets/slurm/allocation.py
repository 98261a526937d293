"""An allocation's life on the login host: submit the holding job, wait in Slurm's queue (its
position and reason said as they change), read the nodes it got, cancel it, confirm it is gone.

Only job ids fleetrun got from its own ``sbatch`` are ever cancelled. Nothing here sleeps but the
queue wait, whose clock is passed in (tests give a stand-in).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from launch.errors import FleetrunError
from launch.fleets.slurm import answers, commands
from launch.fleets.slurm.commands import SlurmShell
from launch.job.fleet_refs import SlurmFleetRef
from launch.reports.safe_text import clean

Say = Callable[[str], None]
POLL_S = 2.0
SETTLE_S = 20.0
"""Without ``--wait``: how long a job the scheduler has not looked at yet (reason ``None``) gets
before it counts as waiting in the queue (slurmctld schedules on submit, or within its cycle)."""
UNDECIDED = ("None", "")
UNKNOWN_JOB = "Invalid job id specified"
"""``squeue -j ID``'s error (exit 1) once the controller forgot the job (tests/slurm_captures)."""


class SlurmCommandFailed(FleetrunError):
    """A Slurm command on the login host exited non-zero (its stderr, escaped, in one line)."""


class QueueBusy(FleetrunError):
    """The allocation would wait in Slurm's queue and the run was not asked to (``--wait``)."""


def run_checked(
    shell: SlurmShell,
    argv: list[str],
    timeout: float = commands.COMMAND_TIMEOUT_S,
    forgotten_ok: bool = False,
) -> str:
    """The command's stdout; a non-zero exit is ``SlurmCommandFailed``. ``forgotten_ok``: an
    ``squeue -j`` the controller answers with ``UNKNOWN_JOB`` (every job named was purged after
    its end) is an empty answer, not an error."""
    result = shell.run(argv, timeout)
    if not result.ok and forgotten_ok and UNKNOWN_JOB in result.stderr:
        return ""
    if not result.ok:
        tail = (result.stderr or result.stdout).strip()[-400:]
        raise SlurmCommandFailed(f"{argv[0]} on the login host exited {result.exit_code}: {clean(tail, 400)}")
    return result.stdout


@dataclass(frozen=True)
class Granted:
    job_id: int
    nodes: list[str]
    """The allocated node names, in Slurm's order (the first is the run's head)."""


def submit(
    shell: SlurmShell, ref: SlurmFleetRef, nodes: int, job_name: str, exclude: tuple[str, ...] = ()
) -> int:
    return answers.job_id_of_sbatch(run_checked(shell, commands.sbatch_argv(ref, nodes, job_name, exclude)))


def wait_granted(
    shell: SlurmShell,
    ref: SlurmFleetRef,
    job_id: int,
    say: Say,
    *,
    wait: bool,
    timeout_s: float | None = None,
    poll_s: float = POLL_S,
    monotonic: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Granted:
    """Poll ``squeue`` until the job runs; its nodes then. While it pends: without ``wait``,
    ``QueueBusy`` (the caller cancels it); with it, a line whenever the position or reason
    changes. An ended or vanished job, or ``timeout_s`` passed, is a ``FleetrunError``. A job
    the scheduler has not looked at yet (reason ``None``) is not refused before ``SETTLE_S``."""
    started = monotonic()
    shown: tuple[object, ...] = ()
    while True:
        state = answers.job_state(run_checked(shell, commands.squeue_job_argv(job_id)), job_id)
        if state is None:
            raise FleetrunError(f"Slurm job {job_id}: squeue no longer knows it (cancelled or ended)")
        if state.running and state.nodelist:
            nodes = answers.hostnames(run_checked(shell, commands.hostnames_argv(state.nodelist)))
            return Granted(job_id, nodes)
        if state.ended:
            raise FleetrunError(f"Slurm job {job_id} ended before it ran: {state.state} ({state.reason})")
        position = answers.queue_position(
            run_checked(shell, commands.squeue_pending_argv(ref.partition)), job_id
        )
        if not wait and state.reason in UNDECIDED and monotonic() - started < SETTLE_S:
            sleep(poll_s)  # not yet looked at by the scheduler: it may well start at once
            continue
        if not wait:
            where = f", position {position[0]} of {position[1]}" if position else ""
            raise QueueBusy(
                f"Slurm job {job_id} would wait in partition {ref.partition}'s queue ({state.reason}{where}); "
                "fab train --wait waits in Slurm's queue"
            )
        now = (state.state, state.reason, position)
        undecided = state.reason in UNDECIDED and monotonic() - started < SETTLE_S
        if now != shown and not undecided:  # not yet looked at: it may well start at once
            where = f"position {position[0]} of {position[1]}" if position else "not yet ranked"
            say(
                f"slurm job {job_id}: {state.state.lower()} in partition {ref.partition}, {where} ({state.reason})"
            )
            shown = now
        if timeout_s is not None and monotonic() - started > timeout_s:
            raise FleetrunError(f"Slurm job {job_id}: not granted within {timeout_s:.0f} s")
        sleep(poll_s)


def cancel(shell: SlurmShell, job_ids: tuple[int, ...]) -> None:
    if job_ids:
        run_checked(shell, commands.scancel_argv(job_ids))


def still_held(shell: SlurmShell, job_ids: tuple[int, ...]) -> list[int]:
    """The jobs among ``job_ids`` that ``squeue`` still shows holding nodes (not ended), asked in
    one ``squeue -j`` for all of them. A job ``squeue`` leaves out (its default states are the
    live ones; a purged id among others is left out silently) or no longer knows is gone."""
    if not job_ids:
        return []
    text = run_checked(shell, commands.squeue_job_argv(*job_ids), forgotten_ok=True)
    states = [answers.job_state(text, job_id) for job_id in job_ids]
    return [state.job_id for state in states if state is not None and not state.ended]


def lost_nodes(shell: SlurmShell, nodes: list[str]) -> dict[str, str]:
    """The nodes among ``nodes`` Slurm marks DOWN, DRAIN, FAIL (or no longer lists): name -> state."""
    states = answers.node_states(run_checked(shell, commands.node_states_argv(nodes)))
    return {
        name: (states[name].state if name in states else "not listed by sinfo")
        for name in nodes
        if name not in states or states[name].lost
    }
