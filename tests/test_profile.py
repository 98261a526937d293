"""The playbook's ``profile:``: its validation, the env the plan sets, the node helper's step and
rank selection, and (with the local fleet's image, which has torch) a real torch.profiler trace."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from launch.errors import SpecError
from launch.job.inventory import Host, Inventory
from launch.job.spec import load_job_spec
from launch.nodelib import fleetrun_profile as fp
from launch.planning.launchers import get_launcher
from launch.planning.launchers.horovod import HorovodLauncher
from tests.conftest import REPO
from tests.test_horovod_plan import FAKE_KEY

IMAGE_PYTHON = Path("/opt/fleetrun/image/venv/bin/python")


def _playbook(tmp_path: Path, profile: str) -> Path:
    (tmp_path / "w").mkdir(exist_ok=True)
    path = tmp_path / "job.yaml"
    path.write_text(f"name: p\nworkdir: w\nentrypoint: python train.py\nnodes: 2\nprofile: {profile}\n")
    return path


@pytest.mark.parametrize(
    ("profile", "steps", "ranks"),
    [
        ('{steps: "20-30"}', "20-30", [0]),
        ('{steps: "20 - 30", ranks: [3, 0]}', "20-30", [0, 3]),
        ("{steps: 25}", "25-25", [0]),
        ('{steps: "0-99", ranks: [1]}', "0-99", [1]),
    ],
)
def test_valid_profile_sections(tmp_path: Path, profile: str, steps: str, ranks: list[int]) -> None:
    spec = load_job_spec(_playbook(tmp_path, profile))
    assert spec.profile is not None
    assert spec.profile.steps == steps and spec.profile.ranks == ranks
    assert spec.profile.first_step == int(steps.split("-")[0])


@pytest.mark.parametrize(
    ("profile", "message"),
    [
        ('{steps: "30-20"}', "field 'profile.steps': the range 30-20 ends before it starts"),
        ("{steps: twenty}", "field 'profile.steps': expected a step range like \"20-30\""),
        ('{steps: "1-500"}', "field 'profile.steps': 500 steps is more than 100"),
        ('{steps: "-5"}', "field 'profile.steps': expected a step range"),
        ('{steps: "5", ranks: []}', "field 'profile.ranks'"),
        ('{steps: "5", ranks: [0, 0]}', "field 'profile.ranks': a rank is listed twice"),
        ('{steps: "5", ranks: [-1]}', "field 'profile.ranks': expected global ranks from 0, got -1"),
        ('{steps: "5", ranks: ["0"]}', "field 'profile.ranks[0]'"),
        ('{steps: "5", rank: [0]}', "field 'profile.rank': unknown field"),
        ("{ranks: [0]}", "field 'profile.steps': this field is required"),
        ("[20, 30]", "field 'profile'"),
    ],
)
def test_bad_profile_sections_name_the_field(tmp_path: Path, profile: str, message: str) -> None:
    with pytest.raises(SpecError) as caught:
        load_job_spec(_playbook(tmp_path, profile))
    assert message in str(caught.value)
    assert str(tmp_path / "job.yaml") in str(caught.value)


def _inventory(n: int) -> Inventory:
    hosts = [
        Host(
            name=f"n{i}",
            address=f"10.0.0.{i + 1}",
            private_address=f"10.0.0.{i + 1}",
            user="u",
            host_key="ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBvKNUBLuZdJgAgI0mhN7mq1q3wZrv3YzhaSTOc2bOEU",
        )
        for i in range(n)
    ]
    return Inventory(hosts=hosts)


@pytest.mark.parametrize("launcher", ["torchrun", "horovod"])
def test_every_node_gets_the_profile_env(tmp_path: Path, launcher: str) -> None:
    path = _playbook(tmp_path, '{steps: "20-30", ranks: [0, 1]}')
    path.write_text(path.read_text() + f"launcher: {launcher}\n")
    spec = load_job_spec(path)
    maker = HorovodLauncher(FAKE_KEY, "echo install\n") if launcher == "horovod" else get_launcher(launcher)
    plan = maker.plan(spec, _inventory(2), "p-run")
    for node in plan.nodes:
        assert node.env["FLEETRUN_PROFILE_STEPS"] == "20-30"
        assert node.env["FLEETRUN_PROFILE_RANKS"] == "0,1"
    assert "export FLEETRUN_PROFILE_STEPS=20-30" in plan.render()


def test_no_profile_no_env(tmp_path: Path) -> None:
    (tmp_path / "w").mkdir()
    (tmp_path / "job.yaml").write_text("name: p\nworkdir: w\nentrypoint: python train.py\n")
    plan = get_launcher("torchrun").plan(load_job_spec(tmp_path / "job.yaml"), _inventory(1), "r")
    assert not any(k.startswith("FLEETRUN_PROFILE") for k in plan.nodes[0].env)


@pytest.mark.parametrize(
    ("steps", "ranks", "rank", "expected"),
    [
        ("20-30", "0", 0, (20, 30)),
        ("20-30", "0", 1, None),
        ("20-30", "1,3", 3, (20, 30)),
        ("20-30", "", 0, None),
        ("", "0", 0, None),
        ("30-20", "0", 0, None),
        ("1-1000", "0", 0, None),
        ("a-b", "0", 0, None),
        ("5-5", " 0 , x", 0, (5, 5)),
    ],
)
def test_which_ranks_profile_which_steps(
    steps: str, ranks: str, rank: int, expected: tuple[int, int] | None
) -> None:
    assert fp.wanted(rank, {fp.ENV_STEPS: steps, fp.ENV_RANKS: ranks}) == expected


def test_without_a_profile_nothing_starts(tmp_path: Path) -> None:
    assert fp.for_rank(7, str(tmp_path), {fp.ENV_STEPS: "1-2", fp.ENV_RANKS: "0"}) is None
    assert not (tmp_path / "profile").exists()


# The loop below runs in the local fleet's image (torch CPU): the profiler is real.
LOOP = """
import json, sys
sys.path.insert(0, {lib!r})
import torch
from fleetrun_metrics import Metrics
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
metrics = Metrics(run_dir={run_dir!r}, rank={rank})
for step in range(1, {steps} + 1):
    loss = model(torch.randn(8, 16)).square().mean()
    opt.zero_grad(); loss.backward(); opt.step()
    metrics.log(step=step, loss=float(loss))
    if step % 10 == 0:
        metrics.log(step=step, val_loss=float(loss))  # the same step logged again
{finish}
"""


def _run_loop(
    tmp_path: Path, rank: int, steps_env: str, ranks_env: str, steps: int = 40, finish: bool = True
) -> Path:
    if not IMAGE_PYTHON.exists():
        pytest.skip("the local fleet image (torch) is not built: make setup as root builds it")
    run_dir = tmp_path / f"run{rank}"
    code = LOOP.format(
        lib=str(REPO / "launch" / "nodelib"),
        run_dir=str(run_dir),
        rank=rank,
        steps=steps,
        finish="metrics.finish('succeeded')" if finish else "",
    )
    env = {
        **os.environ,
        fp.ENV_STEPS: steps_env,
        fp.ENV_RANKS: ranks_env,
        "FLEETRUN_RUN_ID": "p-run",
        "OMP_NUM_THREADS": "1",
    }
    env.pop("FLEETRUN_RUN_DIR", None)
    proc = subprocess.run(
        [str(IMAGE_PYTHON), "-c", code], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return run_dir


def _step_regions(trace: Path) -> list[int]:
    events = json.loads(trace.read_text())["traceEvents"]
    return sorted(
        {int(e["name"].split("#")[1]) for e in events if str(e.get("name", "")).startswith("ProfilerStep#")}
    )


def test_a_profiled_rank_records_exactly_its_steps_with_the_models_operators(tmp_path: Path) -> None:
    run_dir = _run_loop(tmp_path, rank=0, steps_env="20-30", ranks_env="0")
    profile = run_dir / "profile"
    chrome = profile / "trace-rank0-steps20-30.json"
    (board,) = list((profile / "plugins" / "profile" / "p-run").glob("rank0.*.pt.trace.json"))
    assert chrome.read_bytes() == board.read_bytes()
    names = {e.get("name") for e in json.loads(chrome.read_text())["traceEvents"]}
    assert {"aten::linear", "aten::addmm"} <= names, "the model's operators are in the trace"
    assert _step_regions(chrome) == list(range(20, 31)), "steps 20..30 and no other"
    assert "aten::addmm" in (profile / "ops-rank0.txt").read_text()
    assert not list(profile.glob("error-*"))


def test_a_rank_not_listed_is_not_profiled(tmp_path: Path) -> None:
    run_dir = _run_loop(tmp_path, rank=1, steps_env="20-30", ranks_env="0")
    assert not (run_dir / "profile").exists()


def test_a_range_from_the_first_step_and_a_run_ending_inside_it(tmp_path: Path) -> None:
    """Step 1 starts at once; a loop that stops at step 12 of 1-20 still leaves its trace (at exit),
    with what ran after the last logged step as region 13."""
    run_dir = _run_loop(tmp_path, rank=2, steps_env="1-20", ranks_env="2", steps=12, finish=False)
    chrome = run_dir / "profile" / "trace-rank2-steps1-20.json"
    assert _step_regions(chrome) == list(range(1, 14))
    names = {e.get("name") for e in json.loads(chrome.read_text())["traceEvents"]}
    assert "aten::linear" in names


def test_fab_show_lists_each_nodes_traces_and_tensorboard_folder() -> None:
    from launch.reports.views import profile_traces, render_text, show_run
    from launch.run.records import RunRecord

    artifacts = [
        "metrics.jsonl",
        "nodes/n0/profile/trace-rank0-steps20-30.json",
        "nodes/n0/profile/ops-rank0.txt",
        "nodes/n0/profile/plugins/profile/r1/rank0.1700000000.pt.trace.json",
        "nodes/n1/profile/trace-rank1-steps20-30.json",
        "nodes/n1/profile/plugins/profile/r1/rank1.1700000001.pt.trace.json",
        "nodes/n1/outputs/trace-rank9-steps1-2.json",  # the job's own file, not a profile
    ]
    traces, boards = profile_traces(artifacts)
    assert traces == [artifacts[1], artifacts[4]]
    assert boards == ["nodes/n0/profile", "nodes/n1/profile"]
    record = RunRecord(
        id="r1",
        playbook_path="p.yaml",
        playbook_name="p",
        playbook_hash=None,
        git_commit=None,
        inventory={},
        launcher="torchrun",
        started_at=0.0,
        ended_at=1.0,
        state="succeeded",
        stop_rule=None,
        stop_reason=None,
        exit_codes={},
        last_metrics={},
        cost_usd=None,
        run_dir="/runs/r1",
        artifacts=artifacts,
    )
    shown = render_text(show_run(record), width=200)
    assert "/runs/r1/nodes/n0/profile/trace-rank0-steps20-30.json" in shown
    assert "tensorboard --logdir /runs/r1/nodes/n1/profile" in shown
    without = render_text(
        show_run(RunRecord(**{**record.__dict__, "artifacts": ["metrics.jsonl"]})), width=200
    )
    assert "profile" not in without


def test_a_rank_past_the_jobs_processes_is_refused(tmp_path: Path) -> None:
    path = _playbook(tmp_path, '{steps: "5-6", ranks: [0, 4]}')
    path.write_text(path.read_text() + "procs_per_node: 2\n")
    with pytest.raises(SpecError, match=r"field 'profile': .*rank 4 does not exist: the job has 4 processes"):
        load_job_spec(path)
    path.write_text(path.read_text().replace("ranks: [0, 4]", "ranks: [0, 3]"))
    assert load_job_spec(path).profile is not None
