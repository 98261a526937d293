"""SageMaker's conventions in the plan: hyperparameters, channels, SM_* per node, SM_TRAINING_ENV.

The values are checked against what sagemaker-training-toolkit documents and writes (its
ENVIRONMENT_VARIABLES.md and ``mapping.to_cmd_args``/``to_env_vars``), and the launch script's
node-side lines are run in a real ``sh`` with the node library's ``fleetrun_sagemaker``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from launch.errors import FleetrunError, SpecError
from launch.job.sagemaker import hyperparameter_args, hyperparameter_env
from launch.job.spec import JobSpec, load_job_spec
from launch.nodelib.fleetrun_sagemaker import training_env
from launch.planning.launchers.horovod import HorovodLauncher
from launch.planning.launchers.torchrun import TorchrunLauncher
from launch.planning.plan import LaunchPlan
from tests.conftest import REPO, sample_inventory

HPS = {"epochs": 3, "batch-size": 64, "learning-rate": 0.01, "arch": "mlp", "x": True}


def playbook(tmp_path: Path, **fields: object) -> Path:
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    (tmp_path / "data" / "test").mkdir(parents=True, exist_ok=True)
    data: dict[str, object] = {
        "name": "smjob",
        "workdir": "work",
        "entrypoint": "python train.py --seed 1",
        "nodes": 2,
        "procs_per_node": 1,
        "hyperparameters": HPS,
        "channels": {"training": "/data/train", "test": {"local": "data/test"}},
    }
    data.update(fields)
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def torchrun_plan(tmp_path: Path, **fields: object) -> LaunchPlan:
    return TorchrunLauncher().plan(load_job_spec(playbook(tmp_path, **fields)), sample_inventory(2), "run-1")


# ------------------------------------------------------------------ SageMaker's encodings


def test_hyperparameters_are_encoded_as_sagemaker_does() -> None:
    # mapping.to_cmd_args: sorted names, '--name' ('-x' for one letter), values with str()
    assert hyperparameter_args(HPS) == [
        "--arch", "mlp", "--batch-size", "64", "--epochs", "3", "--learning-rate", "0.01", "-x", "True",
    ]  # fmt: skip
    # mapping.to_env_vars: SM_HP_<NAME upper>, strings as they are, others as JSON
    env = hyperparameter_env(HPS)
    assert env["SM_HP_BATCH-SIZE"] == "64" and env["SM_HP_X"] == "true" and env["SM_HP_ARCH"] == "mlp"
    assert json.loads(env["SM_HPS"]) == HPS


# ------------------------------------------------------------------ playbook validation


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        (
            {"hyperparameters": {"-lr": 1}},
            "field 'hyperparameters': '-lr' is not a valid hyperparameter name",
        ),
        ({"hyperparameters": {"lr": 1, "LR": 2}}, "would both be SM_HP_LR"),
        # SageMaker takes a list (issue 23 item 4); null or a nested list is named in one line
        (
            {"hyperparameters": {"lr": None}},
            "field 'hyperparameters': lr: expected a number, a string, true/false, or a list or mapping "
            "of those, got null",
        ),
        ({"hyperparameters": {"lr": [[1]]}}, "lr: expected a number, a string"),
        ({"hyperparameters": {"lr": float("nan")}}, "lr: expected a finite number"),
        ({"hyperparameters": {"tag": "a\nb"}}, "tag: a value must be one line"),
        ({"hyperparameters": {"api-token": "t"}}, "'api-token' looks like a credential"),
        ({"channels": {"train set": "/data"}}, "'train set' is not a valid channel name"),
        ({"channels": {"..": "/data"}}, "'..' is not a valid channel name"),
        ({"channels": {"test": {"path": "/a", "local": "data/test"}}}, "expected exactly one of 'path'"),
        ({"channels": {"test": {"s3": "x"}}}, "field 'channels.test.s3'"),
        ({"channels": {"test": {"local": "missing"}}}, "field 'channels.test.local': directory"),
        ({"channels": {"test": {"local": "/"}}}, "is the root or home directory"),
        ({"data_dir": "/data", "channels": {"training": "/x"}}, "data_dir is the 'training' channel"),
    ],
)
def test_bad_hyperparameters_and_channels_name_the_field(
    tmp_path: Path, fields: dict[str, object], expected: str
) -> None:
    with pytest.raises(SpecError) as err:
        load_job_spec(playbook(tmp_path, **fields))
    assert "job.yaml" in str(err.value) and expected in str(err.value)


def test_local_channel_is_resolved_from_the_playbook(tmp_path: Path) -> None:
    spec = load_job_spec(playbook(tmp_path))
    assert spec.channels["test"].local == str(tmp_path / "data" / "test")
    assert spec.channels["training"].path == "/data/train"
    assert spec.entry_command() == (
        "python train.py --seed 1 --arch mlp --batch-size 64 --epochs 3 --learning-rate 0.01 -x True"
    )


def test_data_dir_is_the_training_channel(tmp_path: Path) -> None:
    spec = JobSpec(name="j", workdir=tmp_path, entrypoint="python t.py", data_dir="/data/digits")
    assert list(spec.all_channels()) == ["training"] and spec.entry_command() == "python t.py"
    env = TorchrunLauncher().plan(spec, sample_inventory(1), "r").nodes[0].env
    assert env["SM_CHANNEL_TRAINING"] == "/data/digits" == env["FLEETRUN_DATA_DIR"]
    assert env["SM_CHANNELS"] == '["training"]' and env["SM_HPS"] == "{}" and env["SM_USER_ARGS"] == "[]"


# ------------------------------------------------------------------ the plan, per node


def test_each_node_gets_sagemakers_values(tmp_path: Path) -> None:
    plan = torchrun_plan(tmp_path)
    head, worker = (n.env for n in plan.nodes)
    assert head["SM_HOSTS"] == worker["SM_HOSTS"] == '["algo-1","algo-2"]'
    assert (head["SM_CURRENT_HOST"], worker["SM_CURRENT_HOST"]) == ("algo-1", "algo-2")
    assert json.loads(worker["SM_RESOURCE_CONFIG"]) == {
        "current_host": "algo-2",
        "hosts": ["algo-1", "algo-2"],
    }
    assert worker["SM_CHANNELS"] == '["test","training"]'
    assert worker["SM_CHANNEL_TRAINING"] == "/data/train"
    assert worker["SM_CHANNEL_TEST"] == "$HOME/.fleetrun/data/smjob/test"
    assert worker["SM_MODEL_DIR"] == "$HOME/.fleetrun/runs/run-1/outputs" == worker["FLEETRUN_OUTPUT_DIR"]
    assert worker["SM_OUTPUT_DATA_DIR"] == "$HOME/.fleetrun/runs/run-1/output/data"
    assert worker["SM_HP_EPOCHS"] == "3"
    assert "SM_HP_BATCH-SIZE" not in worker, "not a name sh can export: passed by env on the exec line"
    assert json.loads(worker["SM_USER_ARGS"])[:2] == ["--arch", "mlp"]
    script = plan.nodes[1].launch_script or ""
    assert 'export SM_CHANNEL_TEST="$HOME"/.fleetrun/data/smjob/test' in script
    assert plan.notes == [
        f"data channel test: {tmp_path}/data/test on this machine, copied to ~/.fleetrun/data/smjob/test on every node"
    ]
    exec_line = script.strip().splitlines()[-1]
    assert exec_line.startswith(
        "exec env SM_HP_BATCH-SIZE=64 SM_HP_LEARNING-RATE=0.01 python -m torch.distributed.run"
    )
    assert exec_line.endswith(
        "train.py --seed 1 --arch mlp --batch-size 64 --epochs 3 --learning-rate 0.01 -x True"
    )


def test_known_gpus_are_planned_unknown_are_counted_on_the_node(tmp_path: Path) -> None:
    spec = load_job_spec(playbook(tmp_path))
    inventory = sample_inventory(2)
    hosts = [
        inventory.hosts[0].model_copy(update={"gpus": [2, 3]}),
        inventory.hosts[1].model_copy(update={"gpus": None}),
    ]
    plan = TorchrunLauncher().plan(spec, inventory.model_copy(update={"hosts": hosts}), "r")
    assert plan.nodes[0].env["SM_NUM_GPUS"] == "2"
    assert "SM_NUM_GPUS" not in plan.nodes[1].env
    assert "nvidia-smi -L" in (plan.nodes[1].launch_script or "")


def test_the_playbooks_env_wins(tmp_path: Path) -> None:
    plan = torchrun_plan(tmp_path, env={"SM_CURRENT_HOST": "mine", "SM_CHANNEL_TEST": "$HOME/x"})
    script = plan.nodes[1].launch_script or ""
    assert plan.nodes[1].env["SM_CURRENT_HOST"] == "mine"
    assert "export SM_CHANNEL_TEST='$HOME/x'" in script, "the playbook's own values are literal"


def test_horovod_ranks_get_the_same_environment(tmp_path: Path) -> None:
    from launch.planning.cluster_ssh import ClusterKey

    spec = load_job_spec(playbook(tmp_path, launcher="horovod"))
    key = ClusterKey(private_key="k", public_key="ssh-ed25519 AAAA t", tag="t")
    plan = HorovodLauncher(key, "#!/bin/sh\n").plan(spec, sample_inventory(2), "run-1")
    rank = next(f for f in plan.nodes[1].files if f.path.endswith("rank.sh")).content
    assert "export SM_CURRENT_HOST=algo-2" in rank
    assert "SM_TRAINING_ENV=$(python -m fleetrun_sagemaker)" in rank
    assert "env SM_HP_BATCH-SIZE=64 SM_HP_LEARNING-RATE=0.01 python train.py --seed 1 --arch mlp" in rank


# ------------------------------------------------------------------ on the node: sh + fleetrun_sagemaker


def test_launch_script_gives_the_script_sagemakers_environment(tmp_path: Path) -> None:
    """The worker's real launch script in sh, up to the command: what the training script sees."""
    plan = torchrun_plan(tmp_path)
    home = tmp_path / "node"
    env_bin = home / ".fleetrun" / "envs" / "smjob" / "bin"
    env_bin.mkdir(parents=True)
    (env_bin / "activate").write_text("true\n")
    (home / ".fleetrun" / "work" / "smjob").mkdir(parents=True)
    (home / ".fleetrun" / "lib").mkdir(parents=True)
    shutil.copy(REPO / "launch" / "nodelib" / "fleetrun_sagemaker.py", home / ".fleetrun" / "lib")
    (home / ".fleetrun" / "runs" / "run-1").mkdir(parents=True)
    (home / ".fleetrun" / "runs" / "run-1" / "rdzv_port").write_text("29555\n")
    lines = (plan.nodes[1].launch_script or "").strip().splitlines()
    lines[-1] = lines[-1].split(" python -m torch.distributed.run")[0] + " env"  # keep the env prefix
    script = tmp_path / "launch.sh"
    script.write_text("\n".join(lines) + "\n")
    path = f"{Path(os.__file__).parent.parent.parent / 'bin'}:{os.environ['PATH']}"
    proc = subprocess.run(
        ["sh", str(script)], env={"HOME": str(home), "PATH": path}, capture_output=True, text=True, timeout=30
    )
    assert proc.returncode == 0, proc.stderr
    seen = dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)
    assert seen["SM_HP_BATCH-SIZE"] == "64" and seen["SM_HP_LEARNING-RATE"] == "0.01"
    assert seen["SM_CHANNEL_TEST"] == f"{home}/.fleetrun/data/smjob/test"
    assert int(seen["SM_NUM_CPUS"]) >= 1 and seen["SM_NUM_GPUS"] == "0"
    assert Path(seen["SM_OUTPUT_DATA_DIR"]).is_dir()
    env = json.loads(seen["SM_TRAINING_ENV"])
    assert env["current_host"] == "algo-2" and env["hosts"] == ["algo-1", "algo-2"]
    assert env["master_hostname"] == "algo-1" and env["is_master"] is False
    assert env["hyperparameters"] == HPS
    assert env["channel_input_dirs"] == {"test": seen["SM_CHANNEL_TEST"], "training": "/data/train"}
    assert env["model_dir"] == f"{home}/.fleetrun/runs/run-1/outputs"
    assert env["output_data_dir"] == seen["SM_OUTPUT_DATA_DIR"] and env["num_cpus"] == int(
        seen["SM_NUM_CPUS"]
    )
    assert env["job_name"] == "run-1" and env["network_interface_name"] == "ens5"
    assert set(env["input_data_config"]) == {"test", "training"}


def test_training_env_survives_garbage() -> None:
    env = training_env({"SM_HOSTS": "not json", "SM_NUM_CPUS": "x", "SM_CHANNELS": "[]"})
    assert env["hosts"] == [] and env["num_cpus"] == 0 and env["is_master"] is False


# ------------------------------------------------------------------ channels from the fleet's bucket


def test_bucket_channels_by_fleet_kind() -> None:
    from launch.fleets.kinds.refs import LabFleet, LocalFleetRef, StackFleetRef
    from launch.fleets.kinds.registry import fleet_kind

    aws = fleet_kind(StackFleetRef(cluster_id="c", cloud="aws", bucket="bkt"))
    gcp = fleet_kind(StackFleetRef(cluster_id="c", cloud="gcp", bucket="bkt"))
    assert aws.bucket_download_argv("data/x") == [
        "aws",
        "s3",
        "sync",
        "--only-show-errors",
        "s3://bkt/data/x",
        "{dest}",
    ]
    assert gcp.bucket_download_argv("data/x") == [
        "gcloud",
        "storage",
        "rsync",
        "--recursive",
        "gs://bkt/data/x",
        "{dest}",
    ]
    for bucketless in (LabFleet(), LocalFleetRef(prefix="fr"), StackFleetRef(cluster_id="c", cloud="aws")):
        assert fleet_kind(bucketless).bucket_download_argv("data/x") is None


def test_bucket_channel_command_runs_on_a_node(tmp_path: Path) -> None:
    """The command a node runs, with a stand-in copy tool for the cloud's CLI, in a real sh."""
    from launch.transport.channel_sync import bucket_commands

    bucket = tmp_path / "bucket" / "data" / "val"
    bucket.mkdir(parents=True)
    (bucket / "part-0.csv").write_text("x,label\n1,0\n")
    commands = bucket_commands(
        "smjob", {"val": "data/val"}, lambda src: ["cp", "-R", f"{tmp_path}/bucket/{src}/.", "{dest}"]
    )
    home = tmp_path / "node"
    home.mkdir()
    subprocess.run(
        ["sh", "-c", commands["val"]], env={"HOME": str(home), "PATH": os.environ["PATH"]}, check=True
    )
    assert (home / ".fleetrun" / "data" / "smjob" / "val" / "part-0.csv").read_text() == "x,label\n1,0\n"
    with pytest.raises(FleetrunError, match="channel 'val' is taken from the fleet's bucket"):
        bucket_commands("smjob", {"val": "data/val"}, lambda _src: None)


def test_bucket_channel_in_the_plan_and_on_a_bucketless_fleet(tmp_path: Path) -> None:
    from launch.run.channels import copy_channels
    from launch.run.reporter import RecordingReporter
    from launch.run.transfers import Transfers

    plan = torchrun_plan(tmp_path, channels={"val": {"bucket": "datasets/val/"}})
    assert plan.nodes[0].env["SM_CHANNEL_VAL"] == "$HOME/.fleetrun/data/smjob/val"
    assert "data channel val: datasets/val/ in the fleet's bucket, copied by each node" in plan.render()
    assert 'export SM_CHANNEL_VAL="$HOME"/.fleetrun/data/smjob/val' in (plan.nodes[0].launch_script or "")
    spec = load_job_spec(playbook(tmp_path, channels={"val": {"bucket": "datasets/val"}}))
    inventory = sample_inventory(2)  # lab machines: no bucket
    errors = copy_channels(spec, inventory, None, tmp_path, Transfers(), 4, RecordingReporter())  # type: ignore[arg-type]
    assert list(errors) == [inventory.hosts[0].name] and "this fleet has no bucket" in str(errors["n0"])


@pytest.mark.parametrize("prefix", ["../x", "a/../b", "s3://bkt/x", "/abs", "a b"])
def test_bucket_prefix_must_be_inside_the_fleets_bucket(tmp_path: Path, prefix: str) -> None:
    with pytest.raises(
        SpecError, match="field 'channels.val': .*is not a key prefix inside the fleet's bucket"
    ):
        load_job_spec(playbook(tmp_path, channels={"val": {"bucket": prefix}}))
