"""fleetrun next to the classic tools, side by side on the same local fleet, as N grows.

For each fleet size N (one local fleet per size, prefix frp):
  * `true` on every node: the whole `fab exec true --inventory local:frp` process, next to
    `pdsh -R ssh -f N -w user@host,... true` with the same strict OpenSSH options;
  * syncing a tree of small files (default 5,000, plus a .gitignore), first time and unchanged:
    `fab train`'s sync step (`launch.transport.sync_relay.sync_fleet` over the run's open connections, the
    node library skipped where the connect step found it current, through the head above the
    playbook default `relay_sync_above: 16`) next to a plain loop of `rsync -az`, one per node,
    all in parallel;
  * one watcher poll round over open connections (fleetrun only: no classic tool does this).
And once, at a small N (default 3, fleet prefix frq): from `fab train` on a ready fleet to the
first logged step, next to torchrun started on the nodes by hand with one pdsh command.

Usage (root): .venv/bin/python bench/scale.py [--sizes 4 16 32 64] [--repeat 5] [--files 5000]
              [--skip-train] [--train-nodes 3] [--quick] [--exec-only] [--out bench/results/scale.json]
Prints a table and writes JSON (machine, medians, ratios fleetrun/baseline, goals met or missed).
Timing goals are printed here, never asserted (tests/test_bench_smoke.py only checks it runs).
"""

from __future__ import annotations

import argparse
import compileall
import io
import json
import math
import os
import platform
import random
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from launch.fleets.local import LocalFleet  # noqa: E402
from launch.job.inventory import Host, Inventory  # noqa: E402
from launch.job.spec import JobSpec, StopRules  # noqa: E402
from launch.paths import known_hosts_file, runs_dir  # noqa: E402
from launch.run.watch import Watcher, WatchTarget  # noqa: E402
from launch.transport.ssh import Fleet, openssh_command  # noqa: E402
from launch.transport.sync import LIB_DIR, SyncResult, lib_is_current  # noqa: E402
from launch.transport.sync_relay import sync_fleet  # noqa: E402

# Fleet names and subnets; overridable so that two checkouts on one machine do not share a fleet.
PREFIX = os.environ.get("FLEETRUN_BENCH_PREFIX", "frp")
SUBNET = int(os.environ.get("FLEETRUN_BENCH_SUBNET", "10"))
TRAIN_PREFIX = os.environ.get("FLEETRUN_BENCH_TRAIN_PREFIX", "frq")
TRAIN_SUBNET = int(os.environ.get("FLEETRUN_BENCH_TRAIN_SUBNET", "11"))
JOB = "bench-scale"
PLAIN_DIR = "bench-rsync"  # the rsync loop's remote dir, apart from fleetrun's ~/.fleetrun/work/<job>
PLAIN_RDZV_PORT = 29531
EPOCHS = 3
FILES_PER_DIR = 100
COMMAND_TIMEOUT = 600
VOCABULARY = (
    "import def return self class for in if else elif while with as from None True False "
    "tensor model loss step batch rank world size data loader optimizer grad epoch node"
)

# Goals from the issue: printed as met / missed next to the ratios, never asserted.
GOAL_EXEC_RATIO = 0.75  # fan-out `true` at 32 and 64 nodes: fleetrun <= 0.75x pdsh
GOAL_EXEC_SMALL_RATIO = 1.0  # `fab exec true` at 4 nodes: at most pdsh's time
GOAL_RESYNC_RATIO = 1.2  # unchanged re-sync at 16 nodes: fleetrun <= 1.2x the rsync loop
GOAL_POLL_S = 0.5  # one watcher poll round at 64 nodes, connections open
POLL_ROUNDS = 10
GOAL_LAUNCH_OVERHEAD_S = 2.0  # first step: fleetrun within 2 s of hand-started torchrun


class BenchError(RuntimeError):
    """A measurement that did not do what it claims (a failed node, a missing file): no timing."""


def quiet(_message: str) -> None:
    pass


def fab_binary() -> str:
    beside = Path(sys.executable).with_name("fab")
    return str(beside if beside.exists() else REPO / ".venv" / "bin" / "fab")


def tail(text: str, lines: int = 8) -> str:
    return " / ".join(text.strip().splitlines()[-lines:])


def median(values: list[float]) -> float:
    return statistics.median(values)


def timed(
    argv: list[str], env: dict[str, str] | None = None
) -> tuple[float, subprocess.CompletedProcess[str]]:
    """Wall clock of one whole process, as a shell would see it."""
    started = time.monotonic()
    proc = subprocess.run(
        argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=COMMAND_TIMEOUT, check=False
    )
    return time.monotonic() - started, proc


def machine() -> dict[str, Any]:
    mem_kb = 0
    with open("/proc/meminfo", encoding="utf-8") as fh:
        for line in fh:
            if line.startswith("MemTotal:"):
                mem_kb = int(line.split()[1])

    def version(argv: list[str]) -> str:
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False)
        except OSError as exc:
            return f"unavailable ({exc})"
        lines = (proc.stdout + proc.stderr).strip().splitlines()
        return lines[0] if lines else ""

    return {
        "cpu_count": os.cpu_count(),
        "memory_gb": round(mem_kb / 1024 / 1024, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "load_average_start": os.getloadavg(),
        "pdsh": version(["pdsh", "-V"]),
        "rsync": version(["rsync", "--version"]),
        "openssh": version(["ssh", "-V"]),
    }


# -- the tree to sync -----------------------------------------------------------------------------
def make_tree(root: Path, files: int, seed: int = 0) -> int:
    """``files`` small source-like files (200-2000 bytes) in dirs of 100, a .gitignore, and a few
    ignored files; returns how many files a sync must ship (the tree and the .gitignore)."""
    rng = random.Random(seed)
    words = VOCABULARY.split()
    made = 0
    for d in range(max(1, math.ceil(files / FILES_PER_DIR))):
        sub = root / f"pkg{d:03d}"
        sub.mkdir(parents=True)
        for f in range(min(FILES_PER_DIR, files - made)):
            size = rng.randint(200, 2000)
            text = " ".join(rng.choices(words, k=size // 3))
            (sub / f"mod{f:03d}.py").write_text(text[: size - 1] + "\n")
            made += 1
    (root / ".gitignore").write_text("*.log\nbuild/\n")
    (root / "build").mkdir()
    for i in range(20):
        (root / "build" / f"artifact{i}.bin").write_bytes(rng.randbytes(4096))
    for i in range(10):
        (root / f"run{i}.log").write_text("ignored\n" * 50)
    return made + 1


def count_files(path: Path) -> int:
    return sum(len(names) for _dir, _subdirs, names in os.walk(path))


# -- pdsh -----------------------------------------------------------------------------------------
def pdsh_env(hosts: list[Host], known_hosts: Path) -> dict[str, str]:
    """pdsh's ssh module with exactly fleetrun's strict OpenSSH options (pinned known_hosts, no
    global file, BatchMode, the operator key only). ``-l%u`` takes each node's own user from the
    ``user@host`` targets (every local-fleet node has a different user)."""
    options = openssh_command(hosts[0], known_hosts)[1:]  # drop "ssh": pdsh runs ssh itself
    for host in hosts:
        if openssh_command(host, known_hosts)[1:] != options:
            raise BenchError("pdsh takes one set of ssh options: nodes differ in port or key")
    if any(not word or any(c.isspace() for c in word) for word in options):
        raise BenchError(f"PDSH_SSH_ARGS is split on whitespace; an option has some: {options}")
    return {**os.environ, "PDSH_RCMD_TYPE": "ssh", "PDSH_SSH_ARGS": " ".join([*options, "-l%u", "%h"])}


def pdsh_argv(hosts: list[Host], command: str) -> list[str]:
    # -S: exit with the largest remote exit code (and 255 when ssh itself failed on a node).
    targets = ",".join(f"{h.user}@{h.address}" for h in hosts)
    return ["pdsh", "-S", "-R", "ssh", "-f", str(len(hosts)), "-w", targets, command]


def pdsh_run(hosts: list[Host], env: dict[str, str], command: str) -> tuple[float, str]:
    """One pdsh over all hosts; any node failing (exit code or a message on stderr) is an error."""
    seconds, proc = timed(pdsh_argv(hosts, command), env)
    if proc.returncode != 0 or proc.stderr.strip():
        raise BenchError(f"pdsh {command!r} failed ({proc.returncode}): {tail(proc.stderr or proc.stdout)}")
    return seconds, proc.stdout


def check_pdsh(hosts: list[Host], env: dict[str, str]) -> None:
    """Every node answers pdsh as its own user (untimed; also warms both sides up)."""
    _s, out = pdsh_run(hosts, env, "echo pdsh-ok $(whoami)")
    want = {f"{h.address}: pdsh-ok {h.user}" for h in hosts}
    got = set(out.strip().splitlines())
    if got != want:
        raise BenchError(f"pdsh answered {sorted(got)[:4]}..., expected {len(want)} lines like {min(want)}")


# -- fab exec -------------------------------------------------------------------------------------
def fab_exec(command: str, prefix: str = PREFIX) -> tuple[float, str]:
    seconds, proc = timed([fab_binary(), "exec", command, "--inventory", f"local:{prefix}"])
    if proc.returncode != 0:
        raise BenchError(
            f"fab exec {command!r} failed ({proc.returncode}): {tail(proc.stdout + proc.stderr)}"
        )
    return seconds, proc.stdout


def check_fab_exec(hosts: list[Host]) -> None:
    _s, out = fab_exec("echo fab-ok $(whoami)")
    missing = [h.name for h in hosts if f"{h.name}: fab-ok {h.user}" not in out.splitlines()]
    if missing:
        raise BenchError(f"fab exec: no answer from {missing[:4]} (of {len(missing)}); output: {tail(out)}")


# -- sync -----------------------------------------------------------------------------------------
def relay_threshold() -> int:
    """The playbook default, so the bench syncs the way `fab train` does without a setting."""
    default = JobSpec.model_fields["relay_sync_above"].default
    assert isinstance(default, int)
    return default


def fleetrun_sync(fleet: Fleet, tree: Path, known_hosts: Path) -> dict[str, Any]:
    """`fab train`'s sync step: its connect step (untimed here) has hashed each node's library
    (``fleetrun_probe.library_digest``, as the preflight's probe does)."""
    digest = (
        f'python3 -c "import sys; sys.path.insert(0, sys.argv[1]); import fleetrun_probe; '
        f'print(fleetrun_probe.library_digest(sys.argv[1]))" "$HOME/{LIB_DIR}" 2>/dev/null; true'
    )
    versions = fleet.run(digest, timeout=60)
    current = {
        n for n, r in versions.items() if not isinstance(r, BaseException) and lib_is_current(r.stdout)
    }
    started = time.monotonic()
    results = sync_fleet(fleet, tree, JOB, known_hosts, relay_above=relay_threshold(), lib_current=current)
    seconds = time.monotonic() - started
    failed = {name: str(r) for name, r in results.items() if isinstance(r, BaseException)}
    if failed:
        raise BenchError(f"sync failed on {len(failed)} node(s): {list(failed.items())[:3]}")
    synced = [r for r in results.values() if isinstance(r, SyncResult)]
    return {
        "seconds": seconds,
        "files_sent": sum(r.files_sent for r in synced),
        "via_head": sum(1 for r in synced if r.via != "laptop"),
    }


POLL_RUN = "bench-poll"
FAKE_RUN = (
    f'mkdir -p "$HOME/.fleetrun/runs/{POLL_RUN}" && cd "$HOME/.fleetrun/runs/{POLL_RUN}" && '
    """seq 1 2000 | awk '{printf "{\\"step\\": %d, \\"loss\\": 0.5}\\n", $1}' > metrics.jsonl && """
    "seq 1 200 | sed 's/^/log line /' > node.log && "
    "(nohup sleep 900 > /dev/null 2>&1 < /dev/null & echo $! > pid)"
)


def poll_rounds(inventory: Inventory, fleet: Fleet) -> dict[str, Any]:
    """The watcher's poll over open connections, on a run with a live process, 2,000 metric
    lines and a log on every node; the first round (opens the channels, reads all metrics) apart."""
    made = fleet.run(FAKE_RUN, timeout=60)
    bad = {n: str(r) for n, r in made.items() if isinstance(r, BaseException) or not r.ok}
    if bad:
        raise BenchError(f"could not set up the polled run on {list(bad.items())[:3]}")
    with tempfile.TemporaryDirectory() as folder:
        target = WatchTarget(
            run_id=POLL_RUN,
            job=JOB,
            inventory=inventory,
            starters=tuple(h.name for h in inventory.hosts),
            rules=StopRules(),
            teardown="never",
            started_at=time.time(),
            folder=Path(folder),
        )
        watcher = Watcher(target, fleet, Console(file=io.StringIO()))
        rounds = []
        try:
            for _ in range(POLL_ROUNDS + 1):
                started = time.monotonic()
                obs = watcher.poll_once()
                rounds.append(time.monotonic() - started)
                states = {n.state for n in obs.nodes}
                if states != {"running"}:
                    raise BenchError(f"polled states {states}, expected every node running")
            if watcher.metrics().records != 2000:
                raise BenchError(f"poll read {watcher.metrics().records} metric records, expected 2000")
        finally:
            watcher.close()
    return {"first_round_s": rounds[0], "median_s": median(rounds[1:]), "runs_s": rounds[1:]}


def rsync_loop(hosts: list[Host], tree: Path, known_hosts: Path) -> dict[str, float]:
    """What a user writes by hand: one `rsync -az` per node, all started at once, then wait.
    Same .gitignore filter and --delete as fleetrun, so both ship the same files."""
    started = time.monotonic()
    procs = []
    for host in hosts:
        argv = [
            "rsync",
            "-az",
            "--delete",
            "--filter=:- .gitignore",
            "-e",
            shlex.join(openssh_command(host, known_hosts)),
            f"{tree}/",
            f"{host.user}@{host.address}:{PLAIN_DIR}/",
        ]
        procs.append(
            (host, subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
        )
    failed = {}
    for host, proc in procs:
        _out, err = proc.communicate(timeout=COMMAND_TIMEOUT)
        if proc.returncode != 0:
            failed[host.name] = f"rsync exit {proc.returncode}: {tail(err, 2)}"
    seconds = time.monotonic() - started
    if failed:
        raise BenchError(f"rsync loop failed on {len(failed)} node(s): {list(failed.items())[:3]}")
    return {"seconds": seconds}


def clear_remote(hosts: list[Host], env: dict[str, str]) -> None:
    """Both tools' remote copies gone on every node (untimed), so the next sync is a first one."""
    pdsh_run(hosts, env, f"rm -rf ~/.fleetrun ~/{PLAIN_DIR}")


def check_synced(hosts: list[Host], shipped: int) -> None:
    """Both copies hold exactly the files that should ship (local fleet: homes are local dirs)."""
    for host in hosts:
        home = Path("/home") / host.user
        for where in (home / ".fleetrun" / "work" / JOB, home / PLAIN_DIR):
            found = count_files(where)
            if found != shipped:
                raise BenchError(f"{host.name}: {where} holds {found} files, expected {shipped}")


# -- one fleet size -------------------------------------------------------------------------------
def section(runs: dict[str, list[Any]], base: str) -> dict[str, Any]:
    """Medians per tool, and ``ratio``: fleetrun's (``fab``) median over the baseline's."""
    seconds = {k: [r if isinstance(r, float) else r["seconds"] for r in v] for k, v in runs.items()}
    out: dict[str, Any] = {k: {"median_s": median(v), "runs_s": v} for k, v in seconds.items()}
    out["ratio"] = out["fleetrun"]["median_s"] / out[base]["median_s"]
    return out


def in_turn(rep: int, first: Callable[[], None], second: Callable[[], None]) -> None:
    """Alternate which tool goes first, so neither always pays for (or profits from) the other."""
    for step in (first, second) if rep % 2 == 0 else (second, first):
        step()


def fleetrun_binary() -> str | None:
    """The ``fleetrun`` console script (the same tasks on Invoke's Program, without Fabric's CLI)."""
    beside = Path(sys.executable).with_name("fleetrun")
    return str(beside) if beside.exists() else None


def fleetrun_exec(command: str, binary: str, prefix: str = PREFIX) -> float:
    seconds, proc = timed([binary, "exec", command, "--inventory", f"local:{prefix}"])
    if proc.returncode != 0:
        raise BenchError(
            f"fleetrun exec {command!r} failed ({proc.returncode}): {tail(proc.stdout + proc.stderr)}"
        )
    return seconds


def mem_available_gb() -> float:
    with open("/proc/meminfo", encoding="utf-8") as fh:
        for line in fh:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024 / 1024
    return 0.0


def measure_size(
    size: int, repeat: int, tree: Path, shipped: int, exec_only: bool = False, light: bool = False
) -> dict[str, Any]:
    """One fleet size. ``light`` (big sizes): the first sync once per tool (it prepares the
    unchanged re-sync, which is timed ``repeat`` times like the rest)."""
    fleet = LocalFleet(prefix=PREFIX, subnet=SUBNET)
    mem_before = mem_available_gb()
    started = time.monotonic()
    try:
        inventory = fleet.up(size, say=quiet, build_image=False)
        up_s = time.monotonic() - started
        mem_up = mem_available_gb()
        hosts = inventory.hosts
        known_hosts = inventory.write_known_hosts(known_hosts_file(inventory.fingerprint()))
        env = pdsh_env(hosts, known_hosts)
        check_pdsh(hosts, env)
        check_fab_exec(hosts)

        exec_runs: dict[str, list[float]] = {"fleetrun": [], "pdsh": []}
        entry = fleetrun_binary()
        for rep in range(repeat):
            in_turn(
                rep,
                lambda: exec_runs["fleetrun"].append(fab_exec("true")[0]),
                lambda: exec_runs["pdsh"].append(pdsh_run(hosts, env, "true")[0]),
            )
            if entry is not None:  # the other entry point, after both (the figure is `fab exec`)
                exec_runs.setdefault("fleetrun exec", []).append(fleetrun_exec("true", entry))
        row: dict[str, Any] = {"nodes": size, "fleet_up_s": up_s, "exec_true": section(exec_runs, "pdsh")}
        row |= {"light": light, "mem_available_gb": {"before_up": mem_before, "after_up": mem_up}}
        if not exec_only:
            first: dict[str, list[dict[str, Any]]] = {"fleetrun": [], "rsync loop": []}
            again: dict[str, list[dict[str, Any]]] = {"fleetrun": [], "rsync loop": []}
            with Fleet(hosts, known_hosts, max_parallel=64) as conns:
                conns.run("true", timeout=60)  # `fab train` connects before it syncs
                for rep in range(repeat):
                    if not light or rep == 0:
                        clear_remote(hosts, env)
                        in_turn(
                            rep,
                            lambda: first["fleetrun"].append(fleetrun_sync(conns, tree, known_hosts)),
                            lambda: first["rsync loop"].append(rsync_loop(hosts, tree, known_hosts)),
                        )
                        if rep == 0:
                            check_synced(hosts, shipped)
                    in_turn(
                        rep,
                        lambda: again["fleetrun"].append(fleetrun_sync(conns, tree, known_hosts)),
                        lambda: again["rsync loop"].append(rsync_loop(hosts, tree, known_hosts)),
                    )
                resent = [r["files_sent"] for r in again["fleetrun"]]
                if any(resent):
                    raise BenchError(f"unchanged re-sync sent files again: {resent}")
                poll = poll_rounds(inventory, conns)
                row["mem_available_gb"]["after_poll"] = mem_available_gb()
            row |= {
                "sync_first": section(first, "rsync loop"),
                "sync_unchanged": section(again, "rsync loop"),
                "sync_via_head": max(r["via_head"] for r in first["fleetrun"]),
                "poll_round": poll,
            }
    finally:
        left = fleet.down(say=quiet)
    if any(left.values()):
        raise BenchError(f"fleet {PREFIX} left things behind: {left}")
    return row


# -- first step -----------------------------------------------------------------------------------
def write_playbook(path: Path, nodes: int) -> Path:
    path.write_text(
        "\n".join(
            [
                f"name: {JOB}",
                f"workdir: {REPO / 'examples' / 'digits'}",
                f"nodes: {nodes}",
                "procs_per_node: 1",
                f"entrypoint: python -m trainer.task --epochs {EPOCHS}",
                "env: {OMP_NUM_THREADS: '1'}",
                "teardown: never",
            ]
        )
        + "\n"
    )
    return path


def first_step_time(metrics: Path) -> float | None:
    for line in metrics.read_text().splitlines():
        record = json.loads(line)
        if "step" in record:
            return float(record["time"])
    return None


def fab_train_once(playbook: Path) -> dict[str, float]:
    """The whole `fab train` process, as typed in a shell; the first step from its run folder."""
    runs = runs_dir()
    before = set(runs.iterdir()) if runs.exists() else set()
    started = time.time()
    _s, proc = timed([fab_binary(), "train", f"--playbook={playbook}", f"--inventory=local:{TRAIN_PREFIX}"])
    ended = time.time()
    if proc.returncode != 0:
        raise BenchError(f"fab train failed ({proc.returncode}): {tail(proc.stdout + proc.stderr)}")
    new = [p for p in runs.iterdir() if p not in before and p.name.startswith(JOB)]
    if len(new) != 1:
        raise BenchError(f"fab train: expected one new run folder in {runs}, found {new}")
    first = first_step_time(new[0] / "metrics.jsonl")
    if first is None:
        raise BenchError(f"fab train: no step logged in {new[0] / 'metrics.jsonl'}")
    return {"to_first_step_s": first - started, "wall_s": ended - started}


def pdsh_torchrun_once(inventory: Inventory, env: dict[str, str], nodes: int) -> dict[str, float]:
    """torchrun started by hand with ONE pdsh command over all nodes (what a lab types).

    The command is the same text on every node, so per-node values are looked up on the node:
    ``$SSH_CONNECTION``'s third field is the address pdsh connected to, and a ``case`` maps it to
    the node's rank and private address (for ``--local-addr`` and the rendezvous host flag). One
    pdsh rather than one per node: that is how pdsh is used, and it keeps the launch as cheap as a
    hand-typed one can be. Same job, environment and rendezvous shape as fleetrun's torchrun plan.
    """
    hosts = inventory.hosts[:nodes]
    head = hosts[0]
    run_id = f"plain-{int(time.time() * 1000)}"
    cases = " ".join(f"{h.address}) RANK={i} ADDR={h.private_address};;" for i, h in enumerate(hosts))
    remote = (
        f'set -- $SSH_CONNECTION; case "$3" in {cases} *) echo "unknown node $3" >&2; exit 9;; esac; '
        'if [ "$RANK" = 0 ]; then IS_HOST=1; else IS_HOST=0; fi; '
        f"cd ~/.fleetrun/work/{JOB} && . ~/.fleetrun/envs/{JOB}/bin/activate && mkdir -p ~/plain/{run_id} && "
        f"FLEETRUN_RUN_DIR=~/plain/{run_id} OMP_NUM_THREADS=1 PYTHONPATH=~/.fleetrun/lib "
        f"python -m torch.distributed.run --nnodes={nodes} --nproc-per-node=1 --rdzv-backend=c10d "
        f"--rdzv-endpoint={head.private_address}:{PLAIN_RDZV_PORT} --rdzv-id={run_id} "
        f'--rdzv-conf=is_host=$IS_HOST --local-addr="$ADDR" -m trainer.task --epochs {EPOCHS}'
    )
    started = time.time()
    _s, proc = timed(pdsh_argv(hosts, remote), env)
    ended = time.time()
    if proc.returncode != 0:
        raise BenchError(f"pdsh torchrun failed ({proc.returncode}): {tail(proc.stderr or proc.stdout)}")
    metrics = [Path(f"/home/{h.user}/plain/{run_id}/metrics.jsonl") for h in hosts]
    found = [m for m in metrics if m.exists()]
    first = first_step_time(found[0]) if found else None
    if first is None:
        raise BenchError(f"pdsh torchrun: no step logged in any of {metrics}")
    return {"to_first_step_s": first - started, "wall_s": ended - started}


def measure_first_step(nodes: int, repeat: int) -> dict[str, Any]:
    fleet = LocalFleet(prefix=TRAIN_PREFIX, subnet=TRAIN_SUBNET)
    try:
        inventory = fleet.up(nodes, say=quiet)
        known_hosts = inventory.write_known_hosts(known_hosts_file(inventory.fingerprint()))
        env = pdsh_env(inventory.hosts, known_hosts)
        check_pdsh(inventory.hosts, env)
        with tempfile.TemporaryDirectory() as tmp:
            playbook = write_playbook(Path(tmp) / f"{JOB}.yaml", nodes)
            warm = fab_train_once(playbook)  # builds the environments: afterwards the fleet is "ready"
            runs: dict[str, list[dict[str, float]]] = {"fleetrun": [], "pdsh torchrun": []}
            for rep in range(repeat):
                in_turn(
                    rep,
                    lambda: runs["fleetrun"].append(fab_train_once(playbook)),
                    lambda: runs["pdsh torchrun"].append(pdsh_torchrun_once(inventory, env, nodes)),
                )
    finally:
        left = fleet.down(say=quiet)
    if any(left.values()):
        raise BenchError(f"fleet {TRAIN_PREFIX} left things behind: {left}")
    out: dict[str, Any] = {"nodes": nodes, "first_run_building_envs": warm}
    for name, values in runs.items():
        out[name] = {key: median([r[key] for r in values]) for key in ("to_first_step_s", "wall_s")} | {
            "runs": values
        }
    fleetrun_s, plain_s = out["fleetrun"]["to_first_step_s"], out["pdsh torchrun"]["to_first_step_s"]
    out["overhead_s"] = fleetrun_s - plain_s
    out["ratio"] = fleetrun_s / plain_s
    return out


# -- summary --------------------------------------------------------------------------------------
SECTIONS = (("exec_true", "pdsh"), ("sync_first", "rsync loop"), ("sync_unchanged", "rsync loop"))


def growth(rows: list[dict[str, Any]]) -> dict[str, dict[str, float | None]]:
    """Least-squares slope of each median against N: milliseconds per extra node."""
    out: dict[str, dict[str, float | None]] = {}
    for key, base in SECTIONS:
        out[key] = {}
        for tool in ("fleetrun", base):
            points = [(r["nodes"], r[key][tool]["median_s"]) for r in rows if key in r]
            if len({n for n, _ in points}) < 2:
                out[key][tool] = None
                continue
            mean_n = statistics.fmean(n for n, _ in points)
            mean_s = statistics.fmean(s for _, s in points)
            num = sum((n - mean_n) * (s - mean_s) for n, s in points)
            den = sum((n - mean_n) ** 2 for n, _ in points)
            out[key][tool] = 1000 * num / den
    return out


def goal(text: str, value: float | None, fmt: str, limit: float, strict: bool = False) -> dict[str, Any]:
    """One goal line: the measured value (None: not measured), how it prints, whether it is met."""
    met = None if value is None else (value < limit if strict else value <= limit)
    return {"goal": text, "value": value, "shown": "-" if value is None else fmt.format(value), "met": met}


def goals(rows: list[dict[str, Any]], first: dict[str, Any] | None) -> list[dict[str, Any]]:
    by_n = {r["nodes"]: r for r in rows}

    def at(n: int, *keys: str) -> float | None:
        if n not in by_n:
            return None
        value: Any = by_n[n]
        for key in keys:
            if key not in value:
                return None
            value = value[key]
        return float(value)

    out = [
        goal(
            f"`fab exec true` at 4: <= {GOAL_EXEC_SMALL_RATIO}x pdsh",
            at(4, "exec_true", "ratio"),
            "{:.2f}x",
            GOAL_EXEC_SMALL_RATIO,
        )
    ]
    out += [
        goal(
            f"fan-out `true` at {n}: fleetrun <= {GOAL_EXEC_RATIO}x pdsh",
            at(n, "exec_true", "ratio"),
            "{:.2f}x",
            GOAL_EXEC_RATIO,
        )
        for n in (32, 64)
    ]
    out += [
        goal(
            f"first sync at {n}: fleetrun <= 1.0x rsync loop",
            at(n, "sync_first", "ratio"),
            "{:.2f}x",
            1.0,
        )
        for n in (4, 16)
    ]
    out.append(
        goal(
            f"unchanged re-sync at 16: fleetrun <= {GOAL_RESYNC_RATIO}x rsync loop",
            at(16, "sync_unchanged", "ratio"),
            "{:.2f}x",
            GOAL_RESYNC_RATIO,
        )
    )
    out.append(
        goal(
            f"watcher poll round at 64 nodes < {GOAL_POLL_S} s",
            at(64, "poll_round", "median_s"),
            "{:.3f} s",
            GOAL_POLL_S,
            strict=True,
        )
    )
    out.append(
        goal(
            f"first step: fleetrun within {GOAL_LAUNCH_OVERHEAD_S:.0f} s of pdsh-started torchrun",
            first["overhead_s"] if first else None,
            "{:+.2f} s",
            GOAL_LAUNCH_OVERHEAD_S,
        )
    )
    return out


def print_report(result: dict[str, Any]) -> None:
    rows, first = result["rows"], result["first_step"]
    print(
        f"\nmedian of {result['repeat']} run(s); files to sync: "
        f"{', '.join(sorted({str(r.get('files', result['files'])) for r in rows}))}; "
        f"{result['machine']['cpu_count']} CPUs, load {result['machine']['load_average_start'][0]:.2f} at start"
    )
    print(
        f"{'':>5} {'':>6} | {'`true` on every node (s)':^25} | {'first sync (s)':^25} | "
        f"{'unchanged re-sync (s)':^25} | {'poll (s)':^8}"
    )
    print(
        f"{'nodes':>5} {'up(s)':>6} | {'fleetrun':>8} {'pdsh':>8} {'ratio':>7} | "
        f"{'fleetrun':>8} {'rsync':>8} {'ratio':>7} | {'fleetrun':>8} {'rsync':>8} {'ratio':>7} | {'round':>8}"
    )
    for r in rows:
        cells = []
        for key, base in SECTIONS:
            s = r.get(key)
            cells.append(
                f"{s['fleetrun']['median_s']:8.2f} {s[base]['median_s']:8.2f} {s['ratio']:6.2f}x"
                if s
                else f"{'-':>25}"
            )
        cells.append(f"{r['poll_round']['median_s']:8.3f}" if "poll_round" in r else f"{'-':>8}")
        print(f"{r['nodes']:>5} {r['fleet_up_s']:6.1f} | " + " | ".join(cells))
    for r in rows:
        other = r["exec_true"].get("fleetrun exec")
        if other:
            print(
                f"  {r['nodes']} nodes: `fleetrun exec true` (the console script) {other['median_s']:.2f} s, "
                f"{other['median_s'] / r['exec_true']['pdsh']['median_s']:.2f}x pdsh"
            )
    grow = result["growth"]
    if any(v is not None for section in grow.values() for v in section.values()):
        cells = []
        for key, base in SECTIONS:
            f, b = grow[key]["fleetrun"], grow[key][base]
            cells.append(f"{f:8.1f} {b:8.1f} {'':>7}" if f is not None and b is not None else f"{'-':>25}")
        print(f"{'ms per node':>12} | " + " | ".join(cells))
    if first:
        print(
            f"\nfirst logged step, {first['nodes']} nodes: fab train {first['fleetrun']['to_first_step_s']:.2f} s, "
            f"pdsh torchrun {first['pdsh torchrun']['to_first_step_s']:.2f} s "
            f"(overhead {first['overhead_s']:+.2f} s, {first['ratio']:.2f}x); whole job "
            f"{first['fleetrun']['wall_s']:.2f} s vs {first['pdsh torchrun']['wall_s']:.2f} s; "
            f"first run, building envs: {first['first_run_building_envs']['to_first_step_s']:.1f} s"
        )
    print("\ngoals (not asserted):")
    for g in result["goals"]:
        verdict = {True: "met", False: "MISSED", None: "not measured"}[g["met"]]
        print(f"  {g['goal']:<62} {g['shown']:>9}  {verdict}")
    for e in result["errors"]:
        print(f"ERROR in {e['where']}: {e['error']}")


def compile_checkout() -> str:
    """Byte-compile the checkout's packages before timing any ``fab`` process.

    pip compiles a package when it installs it; a checkout run with ``PYTHONDONTWRITEBYTECODE``
    set (as on the machine these figures were first taken on) recompiled fleetrun's modules from
    source in every ``fab`` process, about a tenth of a second that no installed copy pays."""
    for package in ("launch", "fleetrun_contract"):
        compileall.compile_dir(REPO / package, quiet=1)
    compileall.compile_file(REPO / "fabfile.py", quiet=1)
    flag = "set" if os.environ.get("PYTHONDONTWRITEBYTECODE") else "not set"
    return f"compiled before timing (compileall), as pip does on install; PYTHONDONTWRITEBYTECODE {flag}"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", type=int, nargs="+", default=[4, 16, 32, 64, 256], help="fleet sizes N")
    parser.add_argument(
        "--light-above",
        type=int,
        default=128,
        help="bigger sizes: first sync once per tool, a tree of --big-files files",
    )
    parser.add_argument("--big-files", type=int, default=1000, help="files in the tree of the big sizes")
    parser.add_argument("--repeat", type=int, default=5, help="runs per measurement (medians)")
    parser.add_argument("--files", type=int, default=5000, help="small files in the tree to sync")
    parser.add_argument("--skip-train", action="store_true", help="skip the first-step section")
    parser.add_argument("--train-nodes", type=int, default=3, help="fleet size of the first-step section")
    parser.add_argument("--quick", action="store_true", help="smoke test: sizes 4, repeat 1, files 200")
    parser.add_argument(
        "--exec-only", action="store_true", help="only `true` on every node (fab exec, fleetrun exec, pdsh)"
    )
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "scale.json")
    args = parser.parse_args()
    if args.quick:
        args.sizes, args.repeat, args.files = [4], 1, 200
    if shutil.which("pdsh") is None:
        print("pdsh not found: install it (make system-deps)", file=sys.stderr)
        return 2
    own_home = "FLEETRUN_HOME" not in os.environ
    if own_home:
        os.environ["FLEETRUN_HOME"] = tempfile.mkdtemp(prefix="fleetrun-bench-")

    result: dict[str, Any] = {
        "command": "python bench/scale.py " + shlex.join(sys.argv[1:]),
        "bytecode": compile_checkout(),
        "machine": machine(),
        "sizes": args.sizes,
        "repeat": args.repeat,
        "files": args.files,
        "rows": [],
        "first_step": None,
        "errors": [],
    }
    try:
        with tempfile.TemporaryDirectory(prefix="scale-tree-") as tmp:
            tree = Path(tmp) / "tree"
            shipped = make_tree(tree, args.files)
            big_tree = Path(tmp) / "big-tree"
            big_shipped = make_tree(big_tree, args.big_files)
            for size in args.sizes:
                print(f"{size} nodes ...", flush=True)
                light = size > args.light_above
                try:
                    if light:
                        row = measure_size(
                            size, args.repeat, big_tree, big_shipped, args.exec_only, light=True
                        )
                        row["files"] = args.big_files
                    else:
                        row = measure_size(size, args.repeat, tree, shipped, args.exec_only)
                        row["files"] = args.files
                    result["rows"].append(row)
                except Exception as exc:  # noqa: BLE001 - recorded, the other sizes still run
                    result["errors"].append(
                        {"where": f"{size} nodes", "error": str(exc), "traceback": traceback.format_exc()}
                    )
        if not (args.skip_train or args.exec_only):
            print(f"first step, {args.train_nodes} nodes ...", flush=True)
            try:
                result["first_step"] = measure_first_step(args.train_nodes, args.repeat)
            except Exception as exc:  # noqa: BLE001
                result["errors"].append(
                    {"where": "first step", "error": str(exc), "traceback": traceback.format_exc()}
                )
    finally:
        if own_home:
            shutil.rmtree(os.environ["FLEETRUN_HOME"], ignore_errors=True)
    result["growth"] = growth(result["rows"])
    result["goals"] = goals(result["rows"], result["first_step"])
    result["machine"]["load_average_end"] = os.getloadavg()
    print_report(result)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")
    return 1 if result["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
