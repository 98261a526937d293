"""fleetrun next to a real peer on the same machines: Ray's cluster launcher, and torchrun by pdsh.

One VM-like local fleet (``LocalFleet.up(vm=True)``: one user on every node, as Ray's ``ssh_user``
needs), the digits DDP job, and three ways to run it, measured from outside, each going first in
turn (medians of ``--repeat``):
  * fleetrun: ``fab train`` (no daemon: its cold and warm start are the same command);
  * Ray: ``ray up`` with the ``local`` provider (head_ip, worker_ips, ssh_user, ssh_private_key),
    the job through ``ray job submit`` of a driver that runs the same torchrun command on every node
    (one Ray task per node, pinned), then ``ray down``. Cold = ``ray up`` + submit; warm = submit to
    a running cluster;
  * torchrun started by hand with one pdsh command (the floor).
For each: start to the first logged step; ``kill -9`` of rank 1's worker to the tool reporting the
job failed *and* no process of the job left on any node; and what each tool's teardown leaves on the
nodes (processes, files in the node's own /tmp, listening ports).

Ray's SSH: ``ray/autoscaler/_private/command_runner.py`` (``SSHOptions``) passes
``-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null`` on the command line, where no
``ssh_config`` can override them, and offers no setting for it. Here Ray runs with an ``ssh`` shim
first in its PATH (on this machine and, through the nodes' ``~/.bashrc``, on the head, whose
autoscaler SSHes to the workers) that rewrites exactly those two options to strict checking against
the fleet's pinned known_hosts; the table records the finding.

Usage (root): .venv/bin/python bench/peers.py [--nodes 3] [--repeat 3] [--only fleetrun pdsh ray]
Ray is installed (pinned, ``RAY_VERSION``) into its own venv, ``/opt/fleetrun/peers/ray-venv``,
never into fleetrun's: ``pip install -e '.[peers]'`` installs the same pin where wanted.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
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

REPO = Path(__file__).resolve().parent.parent
WORKDIR = REPO / "examples" / "digits"
"""The job's code: outside the generated playbook's folder, so each `fab train` names it (`--allow-path`)."""
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from scale import BenchError, fab_binary, machine, pdsh_argv, pdsh_env, tail  # noqa: E402

from launch.fleets.local import LocalFleet  # noqa: E402
from launch.fleets.local.mountns import node_tmp  # noqa: E402
from launch.job.inventory import Inventory  # noqa: E402
from launch.paths import known_hosts_file, runs_dir  # noqa: E402

RAY_VERSION = "2.60.0"
PEERS_DIR = Path("/opt/fleetrun/peers")
RAY_VENV = PEERS_DIR / "ray-venv"
PREFIX = os.environ.get("FLEETRUN_BENCH_PEERS_PREFIX", "frr")
SUBNET = int(os.environ.get("FLEETRUN_BENCH_PEERS_SUBNET", "12"))
JOB = "bench-peers"
RDZV_PORT = 29541
START_EPOCHS, KILL_EPOCHS = 1, 400
DEADLINE_S = 300
SHIM = """#!/bin/sh
# Ray passes -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null; verify instead.
for a; do
  case "$a" in
    StrictHostKeyChecking=no) a=StrictHostKeyChecking=yes ;;
    UserKnownHostsFile=/dev/null) a=UserKnownHostsFile={known_hosts} ;;
  esac
  set -- "$@" "$a"; shift
done
exec /usr/bin/ssh "$@"
"""
SUBMIT = '''"""ray job submit, then wait for a final status (the CLI's log tail can end early)."""
import sys, time
from ray.job_submission import JobStatus, JobSubmissionClient

address, workdir, *entrypoint = sys.argv[1:]
client = JobSubmissionClient(address)
job = client.submit_job(entrypoint=" ".join(entrypoint), runtime_env={"working_dir": workdir})
while (status := client.get_job_status(job)) not in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED):
    time.sleep(0.1)
print(client.get_job_logs(job)[-3000:])
print(f"job {job}: {status}")
sys.exit(0 if status == JobStatus.SUCCEEDED else 1)
'''
DRIVER = '''"""Runs the same torchrun command on every Ray node (one pinned task each); fails on the first failure."""
import subprocess, sys, time
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

ray.init()
template, head, expected = sys.argv[1], sys.argv[2], int(sys.argv[3])
while len([n for n in ray.nodes() if n["Alive"]]) < expected:  # workers join after `ray up` returns
    time.sleep(0.2)
nodes = sorted((n for n in ray.nodes() if n["Alive"]), key=lambda n: (n["NodeManagerAddress"] != head, n["NodeManagerAddress"]))

@ray.remote(num_cpus=0)
def rank(i, addr):
    return subprocess.run(["bash", "-c", template.replace("@RANK@", str(i)).replace("@ADDR@", addr)]).returncode

refs = [rank.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote(i, n["NodeManagerAddress"]) for i, n in enumerate(nodes)]
while refs:
    done, refs = ray.wait(refs, num_returns=1)
    code = ray.get(done[0])
    if code != 0:
        sys.exit(f"a rank exited {code}")
print("all ranks done")
'''


def median(values: list[float]) -> float:
    return statistics.median(values)


def sh(
    argv: list[str], env: dict[str, str] | None = None, timeout: float = DEADLINE_S
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout, check=False)


# -- Ray's installation and configuration ----------------------------------------------------------
def ensure_ray() -> Path:
    ray = RAY_VENV / "bin" / "ray"
    if ray.exists() and f"{RAY_VERSION}" in sh([str(ray), "--version"]).stdout:
        return ray
    PEERS_DIR.mkdir(parents=True, exist_ok=True)
    base = shutil.which("python3", path="/usr/bin:/usr/local/bin") or "/usr/bin/python3"
    if sh([base, "-m", "venv", str(RAY_VENV)]).returncode != 0:
        raise BenchError(f"could not make {RAY_VENV}")
    proc = sh([str(RAY_VENV / "bin" / "pip"), "install", "-q", f"ray[default]=={RAY_VERSION}"], timeout=1800)
    if proc.returncode != 0:
        raise BenchError(f"pip install ray[default]=={RAY_VERSION} failed: {tail(proc.stderr)}")
    return ray


class RayCluster:
    """``ray up``/``ray down`` of the local provider over the fleet; SSH strict through the shim."""

    def __init__(self, fleet: LocalFleet, inventory: Inventory, known_hosts: Path, workdir: Path) -> None:
        self.fleet, self.inventory, self.workdir = fleet, inventory, workdir
        self.head = inventory.hosts[0].address
        self.shim_dir = PEERS_DIR / f"shim-{fleet.prefix}"
        self.shim_dir.mkdir(parents=True, exist_ok=True)
        pinned = PEERS_DIR / f"known_hosts-{fleet.prefix}"
        shutil.copyfile(known_hosts, pinned)
        pinned.chmod(0o644)
        (self.shim_dir / "ssh").write_text(SHIM.format(known_hosts=pinned))
        (self.shim_dir / "ssh").chmod(0o755)
        # the key goes where Ray can read it (it also copies it to the head: a finding)
        self.key = PEERS_DIR / f"key-{fleet.prefix}"
        shutil.copyfile(inventory.hosts[0].key or "", self.key)
        self.key.chmod(0o600)
        path = f"{self.shim_dir}:{RAY_VENV / 'bin'}"
        self.env = {**os.environ, "PATH": f"{path}:{os.environ['PATH']}", "RAY_USAGE_STATS_ENABLED": "0"}
        self.config = workdir / "cluster.yaml"
        bashrc = f"grep -q fleetrun-peers ~/.bashrc 2>/dev/null || echo 'export PATH={path}:$PATH RAY_USAGE_STATS_ENABLED=0 # fleetrun-peers' >> ~/.bashrc"
        config = {
            "cluster_name": f"peers-{fleet.prefix}",
            "provider": {
                "type": "local",
                "head_ip": self.head,
                "worker_ips": [h.address for h in inventory.hosts[1:]],
            },
            "auth": {"ssh_user": inventory.hosts[0].user, "ssh_private_key": str(self.key)},
            "setup_commands": [bashrc],
            # no `ray stop` first (Ray's default): the nodes are fresh, and on a fleet whose nodes
            # share one PID namespace `ray stop` on a worker stops every node's Ray, the head's too
            "head_start_ray_commands": [
                # Ray 2.60's default autoscaler (v2) counts the head (same node type under the local
                # provider) toward min_workers and starts one worker of two; v1 starts them all
                f"RAY_enable_autoscaler_v2=0 ray start --head --port=6379 --dashboard-host={self.head} --autoscaling-config=~/ray_bootstrap_config.yaml",
            ],
            "worker_start_ray_commands": ["ray start --address=$RAY_HEAD_IP:6379"],
        }
        self.config.write_text(json.dumps(config))  # JSON is YAML
        (workdir / "driver").mkdir(exist_ok=True)
        (workdir / "driver" / "driver.py").write_text(DRIVER)
        (workdir / "submit.py").write_text(SUBMIT)

    def ray(self, *args: str, timeout: float = DEADLINE_S) -> subprocess.CompletedProcess[str]:
        return sh([str(RAY_VENV / "bin" / "ray"), *args], env=self.env, timeout=timeout)

    def up(self) -> None:
        proc = self.ray("up", "-y", "--no-config-cache", str(self.config))
        if proc.returncode != 0:
            raise BenchError(f"ray up failed ({proc.returncode}): {tail(proc.stdout + proc.stderr, 12)}")

    def workers_joined(self) -> bool:
        proc = self.ray("status", "--address", f"{self.head}:6379", timeout=60)
        return proc.stdout.count("node_") >= len(self.inventory.hosts)

    def down(self) -> None:
        proc = self.ray("down", "-y", str(self.config))
        if proc.returncode != 0:
            raise BenchError(f"ray down failed ({proc.returncode}): {tail(proc.stdout + proc.stderr, 12)}")

    def submit_argv(self, command: str) -> list[str]:
        return [
            str(RAY_VENV / "bin" / "python"),
            str(self.workdir / "submit.py"),
            f"http://{self.head}:8265",
            str(self.workdir / "driver"),
            "python",
            "driver.py",
            shlex.quote(command),
            self.head,
            str(len(self.inventory.hosts)),
        ]


# -- the job -----------------------------------------------------------------------------------------
def torchrun_command(inventory: Inventory, run_id: str, epochs: int) -> str:
    """The same torchrun as ``fab train`` plans, on the env fleetrun built; @RANK@/@ADDR@ per node."""
    nodes = len(inventory.hosts)
    head = inventory.hosts[0].private_address
    return (
        'if [ "@RANK@" = 0 ]; then IS_HOST=1; else IS_HOST=0; fi; '
        f"cd ~/.fleetrun/work/{JOB} && . ~/.fleetrun/envs/{JOB}/bin/activate && mkdir -p ~/peers/{run_id} && "
        f"FLEETRUN_RUN_DIR=~/peers/{run_id} OMP_NUM_THREADS=1 PYTHONPATH=~/.fleetrun/lib "
        f"python -m torch.distributed.run --nnodes={nodes} --nproc-per-node=1 --rdzv-backend=c10d "
        f"--rdzv-endpoint={head}:{RDZV_PORT} --rdzv-id={run_id} "
        f"--rdzv-conf=is_host=$IS_HOST --local-addr=@ADDR@ -m trainer.task --epochs {epochs}"
    )


def pdsh_command(inventory: Inventory, run_id: str, epochs: int) -> str:
    cases = " ".join(
        f"{h.address}) RANK={i} ADDR={h.private_address};;" for i, h in enumerate(inventory.hosts)
    )
    lookup = f'set -- $SSH_CONNECTION; case "$3" in {cases} *) exit 9;; esac; '
    return lookup + torchrun_command(inventory, run_id, epochs).replace("@RANK@", "$RANK").replace(
        "@ADDR@", "$ADDR"
    )


def first_step(paths: list[Path], since: float, until: float) -> float | None:
    """Seconds from ``since`` to the first step any node logged (waits for it up to ``until``)."""
    while time.time() < until:
        for path in paths:
            if path.exists():
                for line in path.read_text(errors="replace").splitlines():
                    try:
                        record = json.loads(line)
                    except ValueError:
                        continue
                    if "step" in record:
                        return float(record["time"]) - since
        time.sleep(0.1)
    return None


def job_pids(fleet: LocalFleet, nodes: int) -> dict[int, list[int]]:
    """Per node: processes of the job (torchrun or the trainer) in the node's network namespace."""
    out: dict[int, list[int]] = {}
    for i in range(nodes):
        pids = []
        for text in sh(["ip", "netns", "pids", fleet.netns(i)]).stdout.split():
            try:
                cmd = Path(f"/proc/{text}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if "trainer.task" in cmd or "torch.distributed.run" in cmd or "fleetrun_torchrun" in cmd:
                pids.append(int(text))
        out[i] = pids
    return out


def rank1_worker(fleet: LocalFleet) -> int | None:
    for pid in job_pids(fleet, 2)[1]:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        if "trainer.task" in cmd and "torch.distributed.run" not in cmd and "fleetrun_torchrun" not in cmd:
            return pid
    return None


class Tool:
    """One way of running the job: ``start(run_id, epochs)`` returns the process to wait on and the
    per-node metrics files."""

    name = ""

    def start(self, run_id: str, epochs: int) -> tuple[subprocess.Popen[str], list[Path]]:
        raise NotImplementedError


def metrics_paths(fleet: LocalFleet, nodes: int, run_id: str) -> list[Path]:
    return [fleet.home(i) / "peers" / run_id / "metrics.jsonl" for i in range(nodes)]


class Fleetrun(Tool):
    name = "fleetrun"

    def __init__(self, fleet: LocalFleet, playbooks: dict[int, Path], nodes: int) -> None:
        self.fleet, self.playbooks, self.nodes = fleet, playbooks, nodes
        self.before: set[Path] = set()
        self.started = 0.0

    def start(self, run_id: str, epochs: int) -> tuple[subprocess.Popen[str], list[Path]]:
        self.before = set(runs_dir().iterdir()) if runs_dir().exists() else set()
        self.started = time.time()
        proc = subprocess.Popen(
            [
                fab_binary(),
                "train",
                f"--playbook={self.playbooks[epochs]}",
                f"--inventory=local:{self.fleet.prefix}",
                f"--allow-path={WORKDIR}",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        return proc, []

    def metrics(self) -> list[Path]:
        """The run folder's copy (pulled at the end) and, while it runs, the nodes' own files."""
        new = [p for p in runs_dir().iterdir() if p not in self.before] if runs_dir().exists() else []
        nodes = [
            path
            for i in range(self.nodes)
            for path in (self.fleet.home(i) / ".fleetrun" / "runs").glob("*/metrics.jsonl")
            if path.parent.name.startswith(JOB) and path.stat().st_mtime >= self.started
        ]
        return [p / "metrics.jsonl" for p in new] + nodes


class Pdsh(Tool):
    name = "pdsh torchrun"

    def __init__(self, fleet: LocalFleet, inventory: Inventory, known_hosts: Path) -> None:
        self.fleet, self.inventory = fleet, inventory
        self.env = pdsh_env(inventory.hosts, known_hosts)

    def start(self, run_id: str, epochs: int) -> tuple[subprocess.Popen[str], list[Path]]:
        argv = pdsh_argv(self.inventory.hosts, pdsh_command(self.inventory, run_id, epochs))
        proc = subprocess.Popen(
            argv, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        return proc, metrics_paths(self.fleet, len(self.inventory.hosts), run_id)


class Ray(Tool):
    name = "ray"

    def __init__(self, fleet: LocalFleet, inventory: Inventory, cluster: RayCluster) -> None:
        self.fleet, self.inventory, self.cluster = fleet, inventory, cluster

    def start(self, run_id: str, epochs: int) -> tuple[subprocess.Popen[str], list[Path]]:
        argv = self.cluster.submit_argv(torchrun_command(self.inventory, run_id, epochs))
        proc = subprocess.Popen(
            argv, env=self.cluster.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        return proc, metrics_paths(self.fleet, len(self.inventory.hosts), run_id)


def to_first_step(tool: Tool, run_id: str, since: float) -> float:
    proc, paths = tool.start(run_id, START_EPOCHS)
    try:
        out, _ = proc.communicate(timeout=DEADLINE_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise BenchError(f"{tool.name}: no end within {DEADLINE_S} s") from None
    if proc.returncode != 0:
        raise BenchError(f"{tool.name}: job failed ({proc.returncode}): {tail(out, 12)}")
    if isinstance(tool, Fleetrun):
        paths = tool.metrics()
    seconds = first_step(paths, since, time.time() + 5)
    if seconds is None:
        raise BenchError(f"{tool.name}: no step logged in {paths}; output: {tail(out, 20)}")
    return seconds


def kill_to_failed(tool: Tool, fleet: LocalFleet, nodes: int, run_id: str) -> dict[str, float]:
    """kill -9 of rank 1's trainer once it logged a step; to the tool's failure and to no job process left."""
    started = time.time()
    proc, paths = tool.start(run_id, KILL_EPOCHS)
    deadline = time.time() + DEADLINE_S
    victim = None
    while time.time() < deadline and proc.poll() is None:
        if isinstance(tool, Fleetrun):
            paths = tool.metrics()
        if first_step(paths, started, time.time() + 0.1) is not None:
            victim = rank1_worker(fleet)
            if victim:
                break
        time.sleep(0.2)
    if victim is None:
        proc.kill()
        raise BenchError(
            f"{tool.name}: no rank 1 trainer to kill ({tail(proc.stdout.read() if proc.stdout else '')})"
        )
    killed = time.time()
    os.kill(victim, 9)
    out, _ = proc.communicate(timeout=DEADLINE_S)
    reported = time.time()
    if proc.returncode == 0:
        raise BenchError(f"{tool.name}: the job was reported successful after a rank was killed: {tail(out)}")
    while time.time() < deadline and any(job_pids(fleet, nodes).values()):
        time.sleep(0.1)
    gone = time.time()
    left = {i: p for i, p in job_pids(fleet, nodes).items() if p}
    for pids in left.values():
        for pid in pids:
            subprocess.run(["kill", "-9", str(pid)], check=False)
    return {
        "reported_failed_s": reported - killed,
        "no_process_left_s": gone - killed,
        "processes_left": float(sum(map(len, left.values()))),
    }


def node_processes(fleet: LocalFleet, i: int) -> dict[int, str]:
    """Processes in node ``i`` other than its sshd (its init, listener and sessions): pid -> command."""
    out = {}
    for text in sh(["ip", "netns", "pids", fleet.netns(i)]).stdout.split():
        try:
            cmd = (
                Path(f"/proc/{text}/cmdline")
                .read_bytes()
                .replace(b"\0", b" ")
                .decode(errors="replace")
                .strip()
            )
        except OSError:
            continue
        if cmd and not cmd.startswith("sshd") and "/sshd " not in cmd:
            out[int(text)] = cmd
    return out


def leftovers(fleet: LocalFleet, nodes: int) -> dict[str, Any]:
    """Per node: processes besides sshd, files in the node's own /tmp, listening TCP ports besides sshd's."""
    out: dict[str, Any] = {"processes": [], "tmp_files": [], "ports": []}
    for i in range(nodes):
        out["processes"] += [f"node{i}: {cmd[:80]}" for cmd in node_processes(fleet, i).values()]
        tmp = node_tmp(fleet, i)
        out["tmp_files"] += [f"node{i}: {p.name}" for p in sorted(tmp.iterdir())] if tmp.is_dir() else []
        ports = sh(["ss", "-N", fleet.netns(i), "-Hltn"]).stdout.split("\n")
        for line in ports:
            fields = line.split()
            if len(fields) >= 4 and not fields[3].endswith(":22"):
                out["ports"].append(f"node{i}: {fields[3]}")
    return out


def clean_nodes(fleet: LocalFleet, nodes: int) -> None:
    """Between tools: kill what a tool left (every process but sshd) and empty the nodes' /tmp,
    so each tool starts alike and its leftovers are its own."""
    for i in range(nodes):
        for pid in node_processes(fleet, i):
            subprocess.run(["kill", "-9", str(pid)], check=False)
    for i in range(nodes):
        tmp = node_tmp(fleet, i)
        for path in tmp.iterdir() if tmp.is_dir() else []:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)


def write_playbook(path: Path, nodes: int, epochs: int) -> Path:
    path.write_text(
        json.dumps(
            {
                "name": JOB,
                "workdir": str(WORKDIR),
                "nodes": nodes,
                "procs_per_node": 1,
                "entrypoint": f"python -m trainer.task --epochs {epochs}",
                "env": {"OMP_NUM_THREADS": "1"},
                "teardown": "never",
            }
        )
    )
    return path


def in_turn(rep: int, steps: list[Callable[[], None]]) -> None:
    """Each tool goes first in turn (rotation), so none always runs on the warmest caches."""
    for k in range(len(steps)):
        steps[(rep + k) % len(steps)]()


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--only", nargs="+", default=["fleetrun", "pdsh", "ray"], choices=["fleetrun", "pdsh", "ray"]
    )
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "peers.json")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("the local fleet needs root", file=sys.stderr)
        return 2
    own_home = "FLEETRUN_HOME" not in os.environ
    if own_home:
        os.environ["FLEETRUN_HOME"] = tempfile.mkdtemp(prefix="fleetrun-peers-")
    result: dict[str, Any] = {
        "command": "python bench/peers.py " + shlex.join(sys.argv[1:]),
        "machine": machine(),
        "nodes": args.nodes,
        "repeat": args.repeat,
        "ray_version": RAY_VERSION if "ray" in args.only else None,
        "tools": {},
        "findings": [],
        "errors": [],
    }
    timings: dict[str, dict[str, list[Any]]] = {
        t: {"cold": [], "warm": [], "kill": [], "leftovers": []} for t in args.only
    }
    fleet = LocalFleet(prefix=PREFIX, subnet=SUBNET)
    work = Path(tempfile.mkdtemp(prefix="peers-"))
    cluster: RayCluster | None = None
    try:
        inventory = fleet.up(args.nodes, say=lambda _m: None, vm=True)
        known_hosts = inventory.write_known_hosts(known_hosts_file(inventory.fingerprint()))
        playbooks = {
            e: write_playbook(work / f"job-{e}.yaml", args.nodes, e) for e in (START_EPOCHS, KILL_EPOCHS)
        }
        # one fab train first: syncs the code and builds the job's env, which all three then use
        proc = sh(
            [
                fab_binary(),
                "train",
                f"--playbook={playbooks[START_EPOCHS]}",
                f"--inventory=local:{PREFIX}",
                f"--allow-path={WORKDIR}",
            ],
            timeout=900,
        )
        if proc.returncode != 0:
            raise BenchError(f"preparing fab train failed: {tail(proc.stdout + proc.stderr, 12)}")
        tools: dict[str, Tool] = {
            "fleetrun": Fleetrun(fleet, playbooks, args.nodes),
            "pdsh": Pdsh(fleet, inventory, known_hosts),
        }
        if "ray" in args.only:
            ensure_ray()
            cluster = RayCluster(fleet, inventory, known_hosts, work)
            tools["ray"] = Ray(fleet, inventory, cluster)
            result["findings"].append(
                "Ray's SSH: StrictHostKeyChecking=no and UserKnownHostsFile=/dev/null on its command line "
                "(command_runner.SSHOptions), no setting to verify; verified here only through an ssh shim in PATH"
            )
            result["findings"].append(
                "Ray copies the operator's private key to the head (~/ray_bootstrap_key.pem)"
            )

        def one(name: str, rep: int) -> None:
            tool = tools[name]
            run_id = f"{name.split()[0]}-{rep}-{int(time.time() * 1000)}"
            try:
                if name == "ray":
                    assert cluster is not None
                    since = time.time()
                    cluster.up()
                    timings[name]["cold"].append(to_first_step(tool, run_id + "c", since))
                    timings[name]["warm"].append(to_first_step(tool, run_id + "w", time.time()))
                    timings[name]["kill"].append(kill_to_failed(tool, fleet, args.nodes, run_id + "k"))
                    cluster.down()
                else:
                    timings[name]["cold"].append(to_first_step(tool, run_id + "c", time.time()))
                    timings[name]["warm"].append(to_first_step(tool, run_id + "w", time.time()))
                    timings[name]["kill"].append(kill_to_failed(tool, fleet, args.nodes, run_id + "k"))
                time.sleep(2)
                timings[name]["leftovers"].append(leftovers(fleet, args.nodes))
            except Exception as exc:  # noqa: BLE001 - recorded; the other tools still run
                result["errors"].append(
                    {"tool": name, "rep": rep, "error": str(exc), "traceback": traceback.format_exc()}
                )
                if name == "ray" and cluster is not None:
                    with contextlib.suppress(Exception):
                        cluster.down()
            finally:
                clean_nodes(fleet, args.nodes)

        for rep in range(args.repeat):
            print(f"round {rep + 1}/{args.repeat} ...", flush=True)
            in_turn(rep, [lambda n=n, r=rep: one(n, r) for n in args.only])
    finally:
        left = fleet.down(say=lambda _m: None)
        if any(left.values()):
            result["errors"].append({"tool": "fleet", "error": f"fleet {PREFIX} left {left}"})
        shutil.rmtree(work, ignore_errors=True)
        if own_home:
            shutil.rmtree(os.environ["FLEETRUN_HOME"], ignore_errors=True)
        if cluster is not None:  # the key copy, the shim and the pinned hosts: nothing of this fleet stays
            cluster.key.unlink(missing_ok=True)
            shutil.rmtree(cluster.shim_dir, ignore_errors=True)
            (PEERS_DIR / f"known_hosts-{fleet.prefix}").unlink(missing_ok=True)
    for name, t in timings.items():
        kills = t["kill"]
        result["tools"][name] = {
            "cold_to_first_step_s": median(t["cold"]) if t["cold"] else None,
            "warm_to_first_step_s": median(t["warm"]) if t["warm"] else None,
            "kill_reported_failed_s": median([k["reported_failed_s"] for k in kills]) if kills else None,
            "kill_no_process_left_s": median([k["no_process_left_s"] for k in kills]) if kills else None,
            "processes_left_after_kill": max((k["processes_left"] for k in kills), default=None),
            "leftovers_after_teardown": t["leftovers"][-1] if t["leftovers"] else None,
            "runs": t,
        }
    result["machine"]["load_average_end"] = os.getloadavg()
    print_table(result)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")
    return 1 if result["errors"] else 0


def print_table(result: dict[str, Any]) -> None:
    def f(v: Any) -> str:
        return "-" if v is None else f"{v:.1f}"

    print(
        f"\n{result['nodes']} nodes, median of {result['repeat']}; load {result['machine'].get('load_average_start')}"
    )
    print(
        f"{'tool':<15} {'cold→step':>10} {'warm→step':>10} {'kill→failed':>12} {'kill→clean':>11}  left after teardown"
    )
    for name, row in result["tools"].items():
        left = row["leftovers_after_teardown"] or {}
        summary = ", ".join(f"{k} {len(v)}" for k, v in left.items()) or "-"
        print(
            f"{name:<15} {f(row['cold_to_first_step_s']):>10} {f(row['warm_to_first_step_s']):>10} "
            f"{f(row['kill_reported_failed_s']):>12} {f(row['kill_no_process_left_s']):>11}  {summary}"
        )
    for finding in result["findings"]:
        print(f"finding: {finding}")
    for error in result["errors"]:
        print(f"error ({error.get('tool')}): {error['error'][:300]}")


if __name__ == "__main__":
    sys.exit(main())
