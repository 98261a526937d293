"""Ranks forked from torchrun's agent (``fleetrun_torchrun``, the playbook's ``rank_start: fork``)
see what a rank started by torchrun itself sees, and fleetrun's process rules still tell a rank
from its agent.

Real torch (the node image's interpreter) and real torchrun rendezvous on this machine; the same
job is run by ``torch.distributed.run`` (each rank a new interpreter) and by ``fleetrun_torchrun``
(each rank forked once torch is imported), and what each rank reports about itself is compared."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from launch.nodelib import fleetrun_procs

ROOT = Path(__file__).resolve().parent.parent
NODELIB = ROOT / "launch" / "nodelib"
IMAGE_PYTHON = Path("/opt/fleetrun/image/venv/bin/python")
pytestmark = pytest.mark.skipif(
    not IMAGE_PYTHON.exists(), reason="the node image's python (with torch) is not here"
)

JOB = r"""
import atexit, json, logging, os, signal, sys, time
import torch
import torch.distributed as dist

rank = os.environ["RANK"]
out = os.path.join(os.environ["REPORT_DIR"], f"rank{rank}")
with open(f"/proc/{os.getpid()}/cmdline", "rb") as fh:
    cmdline = [w.decode() for w in fh.read().split(b"\0") if w]
with open(f"/proc/{os.getpid()}/environ", "rb") as fh:
    proc_env = dict(w.decode().split("=", 1) for w in fh.read().split(b"\0") if w)
import ctypes
getenv = ctypes.CDLL(None).getenv
getenv.restype = ctypes.c_char_p
facts = {
    "argv": sys.argv,
    "path0": sys.path[0],
    "name": __name__,
    "main_file": getattr(sys.modules["__main__"], "__file__", None),
    "sigterm": str(signal.getsignal(signal.SIGTERM)),
    "sigint": getattr(signal.getsignal(signal.SIGINT), "__name__", str(signal.getsignal(signal.SIGINT))),
    "write_through": sys.stdout.write_through,
    "root_handlers": len(logging.root.handlers),
    "threads": torch.get_num_threads(),
    "cmdline_tail": cmdline[1:],
    "comm": open("/proc/self/comm").read().strip(),
    "proc_env_keys": sorted(proc_env),
    "dynamo_at_start": "torch._dynamo" in sys.modules,
    "proc_local_rank": proc_env.get("LOCAL_RANK"),
    "c_env_same": all((getenv(k.encode()) or b"").decode() == v for k, v in os.environ.items()),
}
import multiprocessing
facts["mp_parent"] = multiprocessing.parent_process() is None
facts["mp_name"] = multiprocessing.current_process().name
multiprocessing.set_start_method("spawn")  # refused once a start method was fixed
facts["mp_method"] = multiprocessing.get_start_method()
libc = ctypes.CDLL(None)
libc.printf(b"from C, no newline")  # unbuffered C stdout (python -u): never lost at the end
dist.init_process_group("gloo")
t = torch.ones(1)
dist.all_reduce(t)
facts["world"] = int(t.item())
atexit.register(lambda: open(out + ".atexit", "w").write(os.path.basename(sys.modules["__main__"].__file__)))
print("half a line with no newline", end="")  # unbuffered (-u): on the log even if killed now
if os.environ.get("HOLD"):
    open(out + ".ready", "w").write(str(os.getpid()))
    while not os.path.exists(os.environ["HOLD"]):
        time.sleep(0.05)
dist.destroy_process_group()
with open(out + ".json", "w") as fh:
    json.dump(facts, fh)
if os.environ.get("FAIL_RANK") == rank:
    sys.exit(7)
if os.environ.get("HARD_EXIT"):
    os._exit(0)  # no return to torch's wrapper: counted done by its exit code, as a new interpreter's
"""


def torchrun(
    module: str, tmp_path: Path, *args: str, env: dict[str, str] | None = None, procs: int = 2
) -> subprocess.Popen[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("MASTER_", "RANK", "WORLD_", "LOCAL_"))}
    # as on a node (``node_env``): the preloaded dynamo would set it in the agent otherwise
    base.update(TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"))
    base.update(PYTHONPATH=str(NODELIB), OMP_NUM_THREADS="1", REPORT_DIR=str(tmp_path / "out"), **(env or {}))
    (tmp_path / "out").mkdir(exist_ok=True)
    argv = [
        str(IMAGE_PYTHON),
        "-m",
        module,
        "--standalone",
        "--nnodes=1",
        f"--nproc-per-node={procs}",
        "--max-restarts=0",
    ]
    return subprocess.Popen(
        [*argv, *args], cwd=tmp_path, env=base, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def facts(tmp_path: Path, rank: int) -> dict:
    return json.loads((tmp_path / "out" / f"rank{rank}.json").read_text())


def finish(proc: subprocess.Popen[str]) -> tuple[int, str]:
    out, _ = proc.communicate(timeout=240)
    return proc.returncode, out


def test_a_forked_rank_sees_what_a_rank_torchrun_started_sees(tmp_path: Path) -> None:
    exec_dir, fork_dir = tmp_path / "exec", tmp_path / "fork"
    for folder in (exec_dir, fork_dir):
        folder.mkdir()
        (folder / "job.py").write_text(JOB)
    rc, out = finish(torchrun("torch.distributed.run", exec_dir, "job.py", "--lr", "0.1"))
    assert rc == 0, out[-3000:]
    rc, out = finish(torchrun("fleetrun_torchrun", fork_dir, "job.py", "--lr", "0.1"))
    assert rc == 0, out[-3000:]
    for rank in (0, 1):
        plain, forked = facts(exec_dir, rank), facts(fork_dir, rank)
        for key in (
            "argv",
            "name",
            "sigterm",
            "sigint",
            "write_through",
            "root_handlers",
            "threads",
            "world",
            "cmdline_tail",
            "comm",
            "proc_env_keys",
            "proc_local_rank",
            "c_env_same",
            "mp_parent",
            "mp_name",
            "mp_method",
        ):
            if isinstance(plain[key], list) and forked[key] != plain[key]:
                raise AssertionError((key, sorted(set(forked[key]) ^ set(plain[key]))))
            assert forked[key] == plain[key], (key, forked[key], plain[key])
        assert plain["path0"] == str(exec_dir) and forked["path0"] == str(fork_dir)
        assert forked["main_file"] == "job.py" or forked["main_file"].endswith("/job.py")
        assert forked["cmdline_tail"] == ["-u", "job.py", "--lr", "0.1"]
        assert forked["proc_local_rank"] == str(rank) and forked["c_env_same"] is True
        # what DDP's construction imports (2 s of CPU per rank) was preloaded by the agent
        assert (plain["dynamo_at_start"], forked["dynamo_at_start"]) == (False, True)
        assert "FLEETRUN_ENV_ROOM" not in forked["proc_env_keys"]
        # the job's atexit handlers ran, with the job's module still __main__
        assert (fork_dir / "out" / f"rank{rank}.atexit").read_text() == "job.py"
        assert (forked["mp_parent"], forked["mp_name"], forked["mp_method"]) == (True, "MainProcess", "spawn")
    assert out.count("half a line with no newline") == 2, out[-3000:]
    assert out.count("from C, no newline") == 2, out[-3000:]
    assert "start_method: fork" not in out  # nothing failed


def test_a_forked_module_rank_gets_the_module_as_main_and_the_working_directory_first(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "task.py").write_text(JOB)
    rc, out = finish(torchrun("fleetrun_torchrun", tmp_path, "-m", "pkg.task", "x", procs=1))
    assert rc == 0, out[-3000:]
    got = facts(tmp_path, 0)
    assert got["argv"] == [str(tmp_path / "pkg" / "task.py"), "x"] and got["path0"] == str(tmp_path)
    assert got["cmdline_tail"] == ["-u", "-m", "pkg.task", "x"] and got["name"] == "__main__"


def test_a_forked_rank_is_a_rank_to_fleetruns_stop_and_its_exit_code_is_the_jobs(tmp_path: Path) -> None:
    """The rank watch finds the ranks under the agent (``torchrun_ranks``); the stop's
    ``holds_nothing`` lets the agent go at once but gives a rank its grace; a rank's
    ``sys.exit(7)`` is its exit code, and torchrun fails with it."""
    (tmp_path / "job.py").write_text(JOB)
    hold = tmp_path / "go"
    proc = torchrun("fleetrun_torchrun", tmp_path, "job.py", env={"HOLD": str(hold), "FAIL_RANK": "1"})
    try:
        ready = [tmp_path / "out" / f"rank{r}.ready" for r in (0, 1)]
        for _ in range(2400):
            if all(p.exists() for p in ready) or proc.poll() is not None:
                break
            time.sleep(0.05)
        assert all(p.exists() for p in ready), "the ranks did not start"
        pids = sorted(int(p.read_text()) for p in ready)
        assert sorted(fleetrun_procs.torchrun_ranks(proc.pid)) == pids
        assert fleetrun_procs.holds_nothing(proc.pid, "unused"), "the agent holds nothing"
        for pid in pids:
            assert not fleetrun_procs.holds_nothing(pid, "unused"), "a rank may still save"
        hold.write_text("")
        rc, out = finish(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert rc != 0 and "exitcode: 7" in out, out[-3000:]
    assert facts(tmp_path, 0)["world"] == 2


def test_a_rank_that_ends_without_returning_is_done_by_its_exit_code(tmp_path: Path) -> None:
    """``os._exit(0)`` (a job skipping a slow teardown) never hands torch's wrapper a value; torch
    waits for one from every forked rank, so the node would never end. It ends, succeeded."""
    (tmp_path / "job.py").write_text(JOB)
    rc, out = finish(torchrun("fleetrun_torchrun", tmp_path, "job.py", env={"HARD_EXIT": "1"}))
    assert rc == 0, out[-3000:]
    assert facts(tmp_path, 0)["world"] == 2 and facts(tmp_path, 1)["world"] == 2


def test_a_non_python_entrypoint_is_left_to_torchrun(tmp_path: Path) -> None:
    """``--no-python``: nothing to fork; torchrun starts the command itself."""
    proc = torchrun("fleetrun_torchrun", tmp_path, "--no-python", "sh", "-c", 'echo "ranked $RANK"', procs=1)
    rc, out = finish(proc)
    assert rc == 0 and "ranked 0" in out, out[-3000:]


def test_the_agent_module_is_importable_without_torch() -> None:
    """The node library's other helpers import nothing of it; importing it alone costs no torch."""
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            f"import sys; sys.path.insert(0, {str(NODELIB)!r}); import fleetrun_torchrun; "
            "print('torch' in sys.modules)",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert out.stdout.strip() == "False"


def test_what_is_forked_and_what_is_left_to_torchrun() -> None:
    """Only a Python script or module run by this interpreter is forked; a GPU count torchrun
    asks CUDA for (``gpu``, ``auto``) would leave CUDA loaded in the agent, where a fork cannot
    use it, so those ranks are new interpreters, as are another interpreter's (``PYTHON_EXEC``)."""
    from types import SimpleNamespace

    from launch.nodelib import fleetrun_torchrun as frt

    def config() -> SimpleNamespace:
        return SimpleNamespace(start_method="spawn")

    got = frt.forked(config(), sys.executable, ["-u", "train.py", "--lr", "1"], nproc="2")
    assert (got[0].start_method, got[1], got[2]) == ("fork", frt.run_rank, ["", "train.py", "--lr", "1"])
    got = frt.forked(config(), sys.executable, ["-u", "-m", "pkg.task"], nproc="1")
    assert got[1:] == (frt.run_rank, ["-m", "pkg.task"])
    for nproc in ("gpu", "auto"):
        got = frt.forked(config(), sys.executable, ["-u", "train.py"], nproc=nproc)
        assert got[0].start_method == "spawn" and got[1] == sys.executable, nproc
    got = frt.forked(config(), "sh", ["-c", "true"], nproc="1")
    assert got[1:] == ("sh", ["-c", "true"]) and got[0].start_method == "spawn"
    assert not frt.cuda_touched(), "this test process never loads CUDA"


def test_the_rendezvous_is_read_ten_times_a_second_on_a_small_fleet_and_at_torchs_pace_on_a_big_one() -> None:
    """torch's c10d rendezvous reads its state every second (and caches it for one): the agents
    that joined first saw the last join up to 1.5 s late. ``fleetrun_torchrun`` polls at 0.1 s per
    16 nodes, never slower than torch."""
    code = (
        "import sys, time; sys.path.insert(0, sys.argv[1]); import fleetrun_torchrun as f; f._import_torchrun(); "
        "from torch.distributed.elastic.rendezvous import dynamic_rendezvous as r; "
        "f._poll_rendezvous_faster(sys.argv[2]); "
        "h = r._BackendRendezvousStateHolder(object(), object()); "
        "asked = []; time.sleep = asked.append; r._delay(seconds=1); "
        "print(h._cache_duration, asked[0])"
    )
    for nodes, cache in (("3", 0.1), ("2:64", 0.4), ("1000", 1.0)):
        out = subprocess.run(
            [str(IMAGE_PYTHON), "-c", code, str(NODELIB), nodes], capture_output=True, text=True, timeout=120
        )
        assert out.returncode == 0, out.stderr[-2000:]
        duration, slept = out.stdout.split()
        assert float(duration) == cache and float(slept) == cache, (nodes, out.stdout)
