"""Cloud ML Engine and Vertex AI conventions in the plan: ``tf_config:`` layouts, ``CLUSTER_SPEC``,
``AIP_*`` and ``job_dir:`` (issue 23 item 5).

Each node's ``TF_CONFIG`` is compared with what the service gives that replica (the shapes of
Vertex's "distributed training" and Cloud ML Engine's ``TF_CONFIG`` pages, ``job`` left out), and a
trainer that decides its role the way TensorFlow's multi-worker strategies do (a ``chief`` or
``master`` task, else ``worker`` 0) is run with every node's variables: exactly one chief.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from launch.errors import SpecError
from launch.job.spec import load_job_spec
from launch.planning.launchers.base import RDZV_PORT_FILE
from launch.planning.launchers.horovod import HorovodLauncher
from launch.planning.launchers.torchrun import TorchrunLauncher
from launch.planning.plan import LaunchPlan
from tests.conftest import REPO, sample_inventory

IPS = ["10.0.0.1:2222", "10.0.0.2:2222", "10.0.0.3:2222"]

# A trainer package as the services' samples write it: the role from TF_CONFIG, as TensorFlow's
# MultiWorkerMirroredStrategy (``multi_worker_util.is_chief``) decides it.
TF_TRAINER = """
import json, os
tf = json.loads(os.environ["TF_CONFIG"])
task, cluster = tf["task"], tf["cluster"]
if "chief" in cluster or "master" in cluster:
    chief = task["type"] in ("chief", "master")
else:
    chief = task["type"] == "worker" and task["index"] == 0
assert cluster[task["type"]][task["index"]], "the task is in the cluster"
print(json.dumps({"chief": chief, "workers": len(cluster.get("worker", []))}))
"""


def plan_for(tmp_path: Path, nodes: int = 3, **fields: object) -> LaunchPlan:
    (tmp_path / "work").mkdir(parents=True, exist_ok=True)
    data: dict[str, object] = {
        "name": "tfjob",
        "workdir": "work",
        "entrypoint": "python -m trainer.task --epochs 2",
        "nodes": nodes,
        "procs_per_node": 1,
        **fields,
    }
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(data))
    return TorchrunLauncher().plan(load_job_spec(path), sample_inventory(nodes), "run-1")


def tf_configs(plan: LaunchPlan) -> list[dict]:
    return [json.loads(node.env["TF_CONFIG"]) for node in plan.nodes]


def test_chief_is_what_vertex_gives_each_replica(tmp_path: Path) -> None:
    configs = tf_configs(plan_for(tmp_path, tf_config="chief"))
    cluster = {"chief": IPS[:1], "worker": IPS[1:]}
    assert configs == [
        {"cluster": cluster, "environment": "cloud", "task": {"type": "chief", "index": 0}},
        {"cluster": cluster, "environment": "cloud", "task": {"type": "worker", "index": 0}},
        {"cluster": cluster, "environment": "cloud", "task": {"type": "worker", "index": 1}},
    ]


def test_master_is_what_cloud_ml_engine_gives_each_replica(tmp_path: Path) -> None:
    configs = tf_configs(plan_for(tmp_path, tf_config="master"))
    cluster = {"master": IPS[:1], "worker": IPS[1:]}
    assert [c["task"] for c in configs] == [
        {"type": "master", "index": 0},
        {"type": "worker", "index": 0},
        {"type": "worker", "index": 1},
    ]
    assert all(c["cluster"] == cluster and c["environment"] == "cloud" for c in configs)


def test_workers_stays_the_default_and_one_node_has_no_worker_list(tmp_path: Path) -> None:
    configs = tf_configs(plan_for(tmp_path))
    assert configs[2] == {"cluster": {"worker": IPS}, "task": {"type": "worker", "index": 2}}
    (single,) = tf_configs(plan_for(tmp_path / "one", nodes=1, tf_config="chief"))
    assert single["cluster"] == {"chief": IPS[:1]} and single["task"] == {"type": "chief", "index": 0}


@pytest.mark.parametrize("layout", ["workers", "chief", "master"])
def test_a_tf_trainer_finds_exactly_one_chief(tmp_path: Path, layout: str) -> None:
    plan = plan_for(tmp_path, tf_config=layout)
    roles = []
    for node in plan.nodes:
        out = subprocess.run(
            [sys.executable, "-c", TF_TRAINER],
            env={**os.environ, "TF_CONFIG": node.env["TF_CONFIG"]},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        roles.append(json.loads(out))
    assert [r["chief"] for r in roles] == [True, False, False], "node 0 leads, as fleetrun's head does"
    assert {r["workers"] for r in roles} == {3 if layout == "workers" else 2}


def test_vertex_cluster_spec_and_aip_folders(tmp_path: Path) -> None:
    plan = plan_for(tmp_path, tf_config="chief", outputs="model")
    specs = [json.loads(n.env["CLUSTER_SPEC"]) for n in plan.nodes]
    pools = {"workerpool0": IPS[:1], "workerpool1": IPS[1:]}
    assert [s["task"] for s in specs] == [
        {"type": "workerpool0", "index": 0},
        {"type": "workerpool1", "index": 0},
        {"type": "workerpool1", "index": 1},
    ]
    assert all(s["cluster"] == pools and s["environment"] == "cloud" for s in specs)
    for node in plan.nodes:
        env = node.env
        assert env["AIP_MODEL_DIR"] == "$HOME/.fleetrun/runs/run-1/model" == env["SM_MODEL_DIR"]
        assert env["AIP_CHECKPOINT_DIR"] == env["FLEETRUN_CHECKPOINT_DIR"]
        assert env["AIP_TENSORBOARD_LOG_DIR"] == "$HOME/.fleetrun/runs/run-1/logs"
        script = node.launch_script or ""
        assert 'export AIP_MODEL_DIR="$HOME"/.fleetrun/runs/run-1/model' in script, "expanded on the node"


def test_job_dir_is_passed_as_the_seeds_expect_and_stays_in_the_run(tmp_path: Path) -> None:
    plan = plan_for(tmp_path, job_dir="job", hyperparameters={"lr": 0.1})
    head = plan.nodes[0]
    assert head.env["FLEETRUN_JOB_DIR"] == "$HOME/.fleetrun/runs/run-1/job"
    script = head.launch_script or ""
    assert 'export FLEETRUN_JOB_DIR="$HOME"/.fleetrun/runs/run-1/job' in script
    assert 'mkdir -p "$FLEETRUN_OUTPUT_DIR" "$TMPDIR" "$FLEETRUN_JOB_DIR"' in script
    assert script.rstrip().endswith('-m trainer.task --epochs 2 --lr 0.1 --job-dir "$FLEETRUN_JOB_DIR"')
    # what the trainer's argparse gets, through a real sh
    words = subprocess.run(
        [
            "sh",
            "-c",
            'FLEETRUN_JOB_DIR=/home/u/.fleetrun/runs/run-1/job; printf "%s\\n" '
            + head.command.split(" trainer.task ")[-1],
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert words[-2:] == ["--job-dir", "/home/u/.fleetrun/runs/run-1/job"]


def test_horovod_ranks_get_job_dir_and_tf_config(tmp_path: Path) -> None:
    from launch.planning.cluster_ssh import ClusterKey

    (tmp_path / "work").mkdir()
    path = tmp_path / "job.yaml"
    path.write_text(
        "name: hvd\nworkdir: work\nentrypoint: python train.py\nlauncher: horovod\nnodes: 2\n"
        "procs_per_node: 1\ntf_config: master\njob_dir: out/job\n"
    )
    key = ClusterKey(private_key="k", public_key="ssh-ed25519 AAAA t", tag="t")
    plan = HorovodLauncher(key, "#!/bin/sh\n").plan(load_job_spec(path), sample_inventory(2), "run-1")
    rank = next(f for f in plan.nodes[1].files if f.path.endswith("rank.sh")).content
    assert '"$FLEETRUN_JOB_DIR"' in rank and 'python train.py --job-dir "$FLEETRUN_JOB_DIR"' in rank
    assert json.loads(plan.nodes[1].env["TF_CONFIG"])["task"] == {"type": "worker", "index": 0}
    assert json.loads(plan.nodes[1].env["SM_FRAMEWORK_PARAMS"]) == {"sagemaker_mpi_enabled": True}


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"tf_config": "ps"}, "field 'tf_config': expected one of 'workers', 'chief' or 'master'"),
        ({"job_dir": "../up"}, "field 'job_dir': expected a relative path inside the run directory"),
        ({"job_dir": "gs://bucket/x"}, "field 'job_dir': expected a relative path"),
        ({"job_dir": "/abs"}, "field 'job_dir': expected a relative path"),
        ({"job_dir": "tmp/job"}, "field 'job_dir': 'tmp/' is the job's scratch folder"),
    ],
)
def test_bad_fields_are_named(tmp_path: Path, fields: dict[str, object], expected: str) -> None:
    with pytest.raises(SpecError, match=expected):
        plan_for(tmp_path, **fields)


def test_the_scratch_folder_is_the_layouts() -> None:
    from launch.job.cloudml import SCRATCH
    from launch.planning import remote_layout

    assert SCRATCH == remote_layout.RUN_TMP


def test_the_aip_folders_exist_when_the_trainer_starts(tmp_path: Path) -> None:
    """Issue 32 item 8: on Vertex ``AIP_CHECKPOINT_DIR`` and ``AIP_TENSORBOARD_LOG_DIR`` are bucket
    prefixes a trainer writes into at once; here they are folders, made before it starts, as
    ``AIP_MODEL_DIR`` is. The head's launch script runs in a stand-in home, its last line (the
    ``exec`` of torchrun) replaced by a look at the folders; a URL the playbook sets is left alone."""
    plan = plan_for(tmp_path, tf_config="chief", env={"AIP_TENSORBOARD_LOG_DIR": "gs://lab/tb"})
    home = tmp_path / "home"
    (home / ".fleetrun" / "work" / "tfjob").mkdir(parents=True)
    run_dir = home / ".fleetrun" / "runs" / "run-1"
    run_dir.mkdir(parents=True)
    (run_dir / RDZV_PORT_FILE).write_text("29500\n")  # what the laptop sends with the script
    venv = home / ".fleetrun" / "envs" / "tfjob" / "bin"
    venv.mkdir(parents=True)
    (venv / "activate").write_text("")
    shutil.copytree(REPO / "launch" / "nodelib", home / ".fleetrun" / "lib")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").symlink_to(sys.executable)
    lines = (plan.nodes[0].launch_script or "").splitlines()
    assert lines[-1].startswith("exec ")
    look = "import json, os; print(json.dumps({k: os.path.isdir(os.environ[k]) for k in os.environ if k.startswith('AIP_')}))"
    script = "\n".join([*lines[:-1], f"exec python -c {shlex.quote(look)}"]) + "\n"
    proc = subprocess.run(
        ["sh", "-c", script],
        env={"HOME": str(home), "PATH": f"{bin_dir}:/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    made = json.loads(proc.stdout.strip().splitlines()[-1])
    assert made == {"AIP_MODEL_DIR": True, "AIP_CHECKPOINT_DIR": True, "AIP_TENSORBOARD_LOG_DIR": False}
    assert not (tmp_path / "gs:").exists() and not (home / "gs:").exists()


def tf2_validate(tf: dict) -> None:
    """TensorFlow 2's check of ``TF_CONFIG`` before ``MultiWorkerMirroredStrategy`` starts
    (``tensorflow/python/distribute/multi_worker_util.py``, ``_validate_cluster_spec``)."""
    task_type, task_id, cluster = tf["task"]["type"], tf["task"]["index"], tf["cluster"]
    if task_type not in ("chief", "worker", "evaluator", "ps"):
        raise ValueError(f"Unrecognized task_type: {task_type!r}")
    if task_type not in cluster:
        raise ValueError(f"`task_type` {task_type!r} not found in cluster_spec.")
    if len(cluster.get("chief", [])) > 1:
        raise ValueError("There must be at most one 'chief' job.")
    if task_id >= len(cluster[task_type]):
        raise ValueError(f"The `task_id` {task_id} exceeds the maximum id of {task_type}.")


def test_the_docs_say_which_layout_a_tf2_trainer_wants(tmp_path: Path) -> None:
    """Issue 32 item 9: TF 2's strategy refuses ``master`` on node 0 and takes ``chief`` and
    ``workers``; the migration page says so, and that a TF 2 trainer wants ``tf_config: chief``."""
    refused = {}
    for layout in ("workers", "chief", "master"):
        for tf in tf_configs(plan_for(tmp_path / layout, tf_config=layout)):
            try:
                tf2_validate(tf)
            except ValueError as exc:
                refused.setdefault(layout, str(exc))
    assert refused == {"master": "Unrecognized task_type: 'master'"}
    page = " ".join((REPO / "docs" / "migration-cloudml.md").read_text().split())
    assert "A TensorFlow 2 trainer wants `tf_config: chief`." in page
    assert "`MultiWorkerMirroredStrategy` refuses `master`" in page
