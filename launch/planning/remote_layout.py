"""Where fleetrun keeps things on a node. One place, so plans, sync and pulls agree.

All paths are relative to the node user's home (shell ``$HOME``), so they hold for any user:
  ~/.fleetrun/lib/            node agent and metrics helper (copied by sync)
  ~/.fleetrun/work/<job>/     the job's synced workdir
  ~/.fleetrun/envs/<job>/     the job's Python environment (setup)
  ~/.fleetrun/runs/<run_id>/  one run: launch.sh, pid, rc, node.log, metrics.jsonl, status.json, outputs/
  ~/.fleetrun/runs/<run_id>/tmp/  the job's TMPDIR: removed when the job ends, never pulled
  ~/.fleetrun/cache/torchinductor/  torch.compile's cache, kept across runs
"""

from __future__ import annotations

ROOT = ".fleetrun"
LIB = f"{ROOT}/lib"
AGENT = f"{LIB}/fleetrun_node.py"
RUN_TMP = "tmp"
"""The job's ``TMPDIR`` inside its run directory (``fleetrun_node.RUN_TMP`` says the same)."""
INDUCTOR_CACHE = f"{ROOT}/cache/torchinductor"


def workdir(job: str) -> str:
    return f"{ROOT}/work/{job}"


def envdir(job: str) -> str:
    return f"{ROOT}/envs/{job}"


def rundir(run_id: str) -> str:
    return f"{ROOT}/runs/{run_id}"


def home(path: str) -> str:
    """The shell form of a home-relative path, for use inside double quotes."""
    return f"$HOME/{path}"


NO_POWEROFF_HOOK = (
    "# lab machine: fleetrun stops the run's processes but never powers the machine off\n"
    'echo "lab machine: not powered off"\n'
)
"""``~/.fleetrun/poweroff`` of a machine fleetrun must never power off (a lab's): the default of
every plan, so that a missing hook never means a shutdown (the fleet kind gives its own)."""
