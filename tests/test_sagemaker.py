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
        ({"hyperparameters": {"opt": {"m": [1]}}}, "opt: expected a number, a string, true/false, or a list"),
        ({"hyperparameters": {"opt": {1: 2}}}, "opt: a mapping's keys must be strings, got int"),
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


def test_resource_config_takes_the_instance_type_from_the_inventory(tmp_path: Path) -> None:
    """Issue 32 item 7: a stack's hosts carry their machine type; one type is SageMaker's one
    ``homogeneousCluster`` group, several types a group each; a host known to have GPUs and no
    type is ``local_gpu``, as SageMaker's local mode says."""
    spec = load_job_spec(playbook(tmp_path, nodes=3))
    inventory = sample_inventory(3, gpus=8)
    typed = inventory.model_copy(
        update={"hosts": [h.model_copy(update={"instance_type": "p4d.24xlarge"}) for h in inventory.hosts]}
    )
    configs = [
        json.loads(n.env["SM_RESOURCE_CONFIG"]) for n in TorchrunLauncher().plan(spec, typed, "r").nodes
    ]
    assert [c["current_instance_type"] for c in configs] == ["p4d.24xlarge"] * 3
    assert {c["current_group_name"] for c in configs} == {"homogeneousCluster"}
    assert configs[2]["instance_groups"] == [
        {
            "instance_group_name": "homogeneousCluster",
            "instance_type": "p4d.24xlarge",
            "hosts": ["algo-1", "algo-2", "algo-3"],
        }
    ]
    mixed = typed.model_copy(
        update={"hosts": [*typed.hosts[:2], typed.hosts[2].model_copy(update={"instance_type": None})]}
    )
    configs = [
        json.loads(n.env["SM_RESOURCE_CONFIG"]) for n in TorchrunLauncher().plan(spec, mixed, "r").nodes
    ]
    assert [(c["current_instance_type"], c["current_group_name"]) for c in configs] == [
        ("p4d.24xlarge", "p4d.24xlarge"),
        ("p4d.24xlarge", "p4d.24xlarge"),
        ("local_gpu", "local_gpu"),
    ]
    assert [g["hosts"] for g in configs[0]["instance_groups"]] == [["algo-1", "algo-2"], ["algo-3"]]


def test_each_node_gets_sagemakers_values(tmp_path: Path) -> None:
    plan = torchrun_plan(tmp_path)
    head, worker = (n.env for n in plan.nodes)
    assert head["SM_HOSTS"] == worker["SM_HOSTS"] == '["algo-1","algo-2"]'
    assert (head["SM_CURRENT_HOST"], worker["SM_CURRENT_HOST"]) == ("algo-1", "algo-2")
    assert json.loads(worker["SM_RESOURCE_CONFIG"]) == {
        "current_host": "algo-2",
        "current_instance_type": "local",  # gpus: 0 and no type in the inventory: SageMaker local mode's
        "current_group_name": "homogeneousCluster",
        "hosts": ["algo-1", "algo-2"],
        "instance_groups": [
            {
                "instance_group_name": "homogeneousCluster",
                "instance_type": "local",
                "hosts": ["algo-1", "algo-2"],
            }
        ],
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
        "exec env SM_HP_BATCH-SIZE=64 SM_HP_LEARNING-RATE=0.01 python -m fleetrun_torchrun"
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
    # fleetrun_sagemaker sees the names sh cannot export too (a channel named train-set: issue 23)
    assert (
        "SM_TRAINING_ENV=$(env SM_HP_BATCH-SIZE=64 SM_HP_LEARNING-RATE=0.01 python -m fleetrun_sagemaker)"
        in rank
    )
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
    lines[-1] = lines[-1].split(" python -m fleetrun_torchrun")[0] + " env"  # keep the env prefix
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


# ------------------------------------------------------------------ issue 23: what a migrator no longer edits


def test_list_and_mapping_hyperparameters_pass_as_sagemaker_passes_them(tmp_path: Path) -> None:
    """``layers: [64, 32]`` is ``--layers '[64, 32]'`` (the toolkit's ``str``), ``SM_HP_LAYERS`` compact
    JSON, typed in ``SM_HPS``; YAML's ``lr: 1e-3`` (no dot) is the number 0.001, as in YAML 1.2."""
    (tmp_path / "work").mkdir()
    path = tmp_path / "job.yaml"
    path.write_text(
        "name: hp\nworkdir: work\nentrypoint: python train.py\nprocs_per_node: 1\n"
        "hyperparameters:\n  layers: [64, 32]\n  lr: 1e-3\n  opt: {momentum: 0.9, name: sgd}\n  tag: '1e-3'\n"
    )
    spec = load_job_spec(path)
    assert spec.hyperparameters["lr"] == 0.001 and spec.hyperparameters["tag"] == "1e-3"
    assert hyperparameter_args(spec.hyperparameters) == [
        "--layers", "[64, 32]", "--lr", "0.001", "--opt", "momentum=0.9,name=sgd", "--tag", "1e-3",
    ]  # fmt: skip
    env = TorchrunLauncher().plan(spec, sample_inventory(1), "r").nodes[0].env
    assert env["SM_HP_LAYERS"] == "[64,32]" and env["SM_HP_LR"] == "0.001"
    assert json.loads(env["SM_HPS"]) == {
        "layers": [64, 32],
        "lr": 0.001,
        "opt": {"momentum": 0.9, "name": "sgd"},
        "tag": "1e-3",
    }
    assert "--layers '[64, 32]' --lr 0.001" in spec.entry_command()


def test_channel_names_with_dash_and_dot_are_sagemakers(tmp_path: Path) -> None:
    """SageMaker takes ``train-set``; its toolkit names the variable ``SM_CHANNEL_TRAIN-SET``,
    which sh cannot export: passed by ``env`` on the exec line, a copied one's ``$HOME`` live."""
    (tmp_path / "data" / "v").mkdir(parents=True)
    plan = torchrun_plan(tmp_path, channels={"train-set": "/data/t", "val.v2": {"local": "data/v"}})
    script = plan.nodes[0].launch_script or ""
    assert "SM_CHANNEL_TRAIN-SET" not in plan.nodes[0].env, "not a name sh can export"
    assert plan.nodes[0].env["SM_CHANNELS"] == '["train-set","val.v2"]'
    assert '"SM_CHANNEL_VAL.V2=$HOME"/.fleetrun/data/smjob/val.v2' in script.strip().splitlines()[-1]
    seen, home = run_launch_script_env(tmp_path, plan, 0)
    assert seen["SM_CHANNEL_TRAIN-SET"] == "/data/t"
    assert seen["SM_CHANNEL_VAL.V2"] == f"{home}/.fleetrun/data/smjob/val.v2"
    assert json.loads(seen["SM_TRAINING_ENV"])["channel_input_dirs"]["val.v2"] == seen["SM_CHANNEL_VAL.V2"]


@pytest.mark.parametrize(
    ("entrypoint", "expected"),
    [
        ("python train.py --x 1", ("train.py", "train")),
        ("python3 src/train.py", ("src/train.py", "src/train")),
        ("python -m trainer.task --epochs 3", ("trainer.task", "trainer.task")),
        ("sh run.sh", ("run.sh", "run.sh")),
        ("./train", ("./train", "./train")),
    ],
)
def test_entry_point_and_module_name(entrypoint: str, expected: tuple[str, str]) -> None:
    from launch.planning.launchers.sagemaker import entry_point

    assert entry_point(entrypoint) == expected


def run_launch_script_env(tmp_path: Path, plan: LaunchPlan, node: int) -> tuple[dict[str, str], Path]:
    """Node ``node``'s real launch script in sh, its command replaced by ``env``: what the script sees."""
    home = tmp_path / f"node{node}"
    env_bin = home / ".fleetrun" / "envs" / plan.job / "bin"
    env_bin.mkdir(parents=True)
    (env_bin / "activate").write_text("true\n")
    (home / ".fleetrun" / "work" / plan.job).mkdir(parents=True)
    (home / ".fleetrun" / "lib").mkdir(parents=True)
    shutil.copy(REPO / "launch" / "nodelib" / "fleetrun_sagemaker.py", home / ".fleetrun" / "lib")
    (home / ".fleetrun" / "runs" / plan.run_id).mkdir(parents=True)
    (home / ".fleetrun" / "runs" / plan.run_id / "rdzv_port").write_text("29555\n")
    lines = (plan.nodes[node].launch_script or "").strip().splitlines()
    lines[-1] = lines[-1].split(" python -m fleetrun_torchrun")[0] + " env"  # keep the env prefix
    script = tmp_path / f"launch-{node}.sh"
    script.write_text("\n".join(lines) + "\n")
    path = f"{Path(os.__file__).parent.parent.parent / 'bin'}:{os.environ['PATH']}"
    proc = subprocess.run(
        ["sh", str(script)], env={"HOME": str(home), "PATH": path}, capture_output=True, text=True, timeout=30
    )
    assert proc.returncode == 0, proc.stderr
    return dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line), home


def test_sagemakers_inputs_and_config_files_on_the_node(tmp_path: Path) -> None:
    """SM_INPUT_DIR & co., SM_USER_ENTRY_POINT, SM_MODULE_NAME, SM_FRAMEWORK_PARAMS and
    ``hyperparameters.json`` in SM_INPUT_CONFIG_DIR, as sagemaker-training-toolkit reads them."""
    plan = torchrun_plan(tmp_path, hyperparameters={**HPS, "layers": [64, 32]})
    seen, home = run_launch_script_env(tmp_path, plan, 1)
    run = home / ".fleetrun" / "runs" / "run-1"
    assert seen["SM_INPUT_DIR"] == f"{run}/input" and seen["SM_INPUT_CONFIG_DIR"] == f"{run}/input/config"
    assert seen["SM_USER_ENTRY_POINT"] == "train.py" and seen["SM_MODULE_NAME"] == "train"
    assert seen["SM_MODULE_DIR"] == f"{home}/.fleetrun/work/smjob"
    assert json.loads(seen["SM_FRAMEWORK_PARAMS"]) == {"sagemaker_torch_distributed_enabled": True}
    data_config = json.loads(seen["SM_INPUT_DATA_CONFIG"])
    assert set(data_config) == {"test", "training"}
    assert data_config["test"] == {
        "RecordWrapperType": "None",
        "S3DistributionType": "FullyReplicated",
        "TrainingInputMode": "File",
    }
    config = Path(seen["SM_INPUT_CONFIG_DIR"])
    # the PyTorch estimator's hyperparameters.json: every value a JSON-encoded string
    hps = json.loads((config / "hyperparameters.json").read_text())
    assert hps["epochs"] == "3" and hps["arch"] == '"mlp"' and hps["layers"] == "[64, 32]"
    assert hps["sagemaker_program"] == '"train.py"' and hps["sagemaker_job_name"] == '"run-1"'
    assert {k: json.loads(v) for k, v in hps.items() if not k.startswith("sagemaker_")} == {
        **HPS,
        "layers": [64, 32],
    }, "the toolkit's json.loads of each value gives SM_HPS back"
    assert json.loads((config / "inputdataconfig.json").read_text()) == data_config
    resource = json.loads((config / "resourceconfig.json").read_text())
    assert resource == {
        "current_host": "algo-2",
        "current_instance_type": "local",
        "current_group_name": "homogeneousCluster",
        "hosts": ["algo-1", "algo-2"],
        "instance_groups": [
            {
                "instance_group_name": "homogeneousCluster",
                "instance_type": "local",
                "hosts": ["algo-1", "algo-2"],
            }
        ],
        "network_interface_name": "ens5",
    }, "issue 32 item 7: every key SageMaker writes"
    # what a SageMaker script indexes (sagemaker_training.environment reads these)
    group = next(
        g for g in resource["instance_groups"] if g["instance_group_name"] == resource["current_group_name"]
    )
    assert (
        resource["current_host"] in group["hosts"]
        and group["instance_type"] == resource["current_instance_type"]
    )
    env = json.loads(seen["SM_TRAINING_ENV"])
    assert env["input_dir"] == seen["SM_INPUT_DIR"] and env["input_config_dir"] == str(config)
    assert env["module_name"] == "train" and env["user_entry_point"] == "train.py"
    assert env["additional_framework_parameters"] == {"sagemaker_torch_distributed_enabled": True}
    assert env["input_data_config"] == data_config and env["hyperparameters"]["layers"] == [64, 32]
    # framework_module names SageMaker's container code (sagemaker_pytorch_container...): none here
    assert [k for k, v in env.items() if v in ("", None)] == ["framework_module"]


def test_config_files_survive_an_unwritable_folder(tmp_path: Path) -> None:
    from launch.nodelib.fleetrun_sagemaker import write_config_files

    blocker = tmp_path / "file"
    blocker.write_text("x")
    write_config_files({"SM_INPUT_CONFIG_DIR": str(blocker / "config"), "SM_HPS": "{}"})  # no raise
    write_config_files({"SM_INPUT_CONFIG_DIR": str(tmp_path / "c"), "SM_HPS": "not json"})
    assert json.loads((tmp_path / "c" / "hyperparameters.json").read_text())["sagemaker_program"] == '""'
