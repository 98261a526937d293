"""A SageMaker-style script (examples/sagemaker/train.py) run unchanged on a real local fleet.

The script reads only ``SM_*`` variables and takes its hyperparameters as arguments. Two runs of
the repository's playbook (the second with another learning rate) on 2 nodes: the script's own
record of what it saw, the model it saved to ``SM_MODEL_DIR`` (pulled back), the run records'
hyperparameters, then ``fab compare`` and ``fab runs --tensorboard`` over those two real runs.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from launch.cli import app, experiments
from launch.fleets.local import LocalFleet
from launch.run.summary import RunResult
from tests.conftest import REPO, TEST_PREFIX, needs_root, quiet_console

pytestmark = needs_root()
PLAYBOOK = REPO / "playbooks" / "sagemaker-csv.yaml"


def playbook_copy(tmp_path: Path, name: str, **hyperparameters: object) -> Path:
    """The repository's playbook, its relative paths made absolute, torn down never (the fleet is shared)."""
    data = yaml.safe_load(PLAYBOOK.read_text())
    data["workdir"] = str(REPO / "examples" / "sagemaker")
    for channel in data["channels"].values():
        channel["local"] = str((PLAYBOOK.parent / channel["local"]).resolve())
    data["teardown"] = "never"
    data["tf_config"] = "chief"  # the same nodes as Vertex AI lays them out for a TF trainer
    data["hyperparameters"] = {**data["hyperparameters"], "epochs": 2, **hyperparameters}
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


def seen_by(run: Path, node: str, rank: int) -> dict:
    return json.loads((run / "nodes" / node / "output" / "data" / f"sagemaker-env-{rank}.json").read_text())


def test_sagemaker_script_runs_unchanged_and_runs_compare(
    fleet: LocalFleet, fleetrun_home: Path, tmp_path: Path
) -> None:
    console, out = quiet_console()
    results = []
    for name, lr in (("a.yaml", 0.05), ("b.yaml", 0.005)):
        result = app.train(
            playbook_copy(tmp_path, name, **{"learning-rate": lr}),
            inventory=f"local:{TEST_PREFIX}",
            console=console,
            poll_interval=0.3,
            ask_on_interrupt=False,
        )
        assert isinstance(result, RunResult) and result.ok, out.getvalue()[-3000:]
        results.append(result)
    run = results[0].folder
    head, worker = fleet.node_name(0), fleet.node_name(1)

    head_view, worker_view = seen_by(run, head, 0), seen_by(run, worker, 1)
    # the cluster, as SageMaker names it: algo-1 is the head
    assert head_view["args"]["hosts"] == ["algo-1", "algo-2"] == worker_view["args"]["hosts"]
    assert head_view["args"]["current_host"] == "algo-1" and worker_view["args"]["current_host"] == "algo-2"
    assert head_view["world_size"] == 2 and worker_view["rank"] == 1
    # the hyperparameters came as arguments (argparse parsed them) and as SM_HPS / SM_HP_<NAME>
    assert head_view["args"]["learning_rate"] == 0.05 and head_view["args"]["epochs"] == 2
    assert head_view["args"]["batch_size"] == 32
    assert json.loads(head_view["sm"]["SM_HPS"]) == {
        "batch-size": 32,
        "epochs": 2,
        "hidden": 16,
        "learning-rate": 0.05,
    }
    assert head_view["sm"]["SM_HP_EPOCHS"] == "2" and head_view["sm"]["SM_HP_LEARNING-RATE"] == "0.05"
    # channels: both folders were copied from this machine; every row arrived on every node
    assert worker_view["train_rows"] == 1200 and worker_view["validation_rows"] == 300
    assert json.loads(head_view["sm"]["SM_CHANNELS"]) == ["training", "validation"]
    assert worker_view["args"]["train"].endswith("/.fleetrun/data/sagemaker-csv/training")
    # SM_TRAINING_ENV agrees with the single variables, with this node's real paths and counts
    env = worker_view["training_env"]
    assert env["hosts"] == ["algo-1", "algo-2"] and env["current_host"] == "algo-2" and not env["is_master"]
    assert env["hyperparameters"]["learning-rate"] == 0.05
    assert env["channel_input_dirs"]["validation"] == worker_view["args"]["validation"]
    assert env["model_dir"] == worker_view["args"]["model_dir"] and env["num_cpus"] >= 1
    assert env["num_gpus"] == 0 and worker_view["sm"]["SM_NUM_GPUS"] == "0"
    # SageMaker's inputs (issue 23): the variables and hyperparameters.json, as the toolkit decodes it
    for view, host in ((head_view, "algo-1"), (worker_view, "algo-2")):
        inputs = view["inputs"]
        assert inputs["SM_INPUT_CONFIG_DIR"] == inputs["SM_INPUT_DIR"] + "/config"
        assert inputs["SM_INPUT_DIR"].endswith(f"/.fleetrun/runs/{results[0].run_id}/input")
        assert json.loads(inputs["SM_INPUT_DATA_CONFIG"])["validation"]["TrainingInputMode"] == "File"
        assert inputs["SM_USER_ENTRY_POINT"] == "train.py" and inputs["SM_MODULE_NAME"] == "train"
        assert json.loads(inputs["SM_FRAMEWORK_PARAMS"]) == {"sagemaker_torch_distributed_enabled": True}
        assert json.loads(inputs["SM_RESOURCE_CONFIG"])["current_host"] == host
        assert int(inputs["SM_NUM_CPUS"]) >= 1 and inputs["SM_NETWORK_INTERFACE_NAME"]
        hps = view["hyperparameters_json"]
        assert {k: v for k, v in hps.items() if not k.startswith("sagemaker_")} == json.loads(
            view["sm"]["SM_HPS"]
        )
        assert hps["sagemaker_program"] == "train.py" and hps["sagemaker_job_name"] == results[0].run_id
        training = view["training_env"]
        assert (training["input_dir"], training["module_name"]) == (inputs["SM_INPUT_DIR"], "train")
    assert (run / "nodes" / worker / "input" / "config" / "hyperparameters.json").is_file(), "pulled back"

    # tf_config: chief, as Vertex AI gives it: the head is the chief, the worker is worker 0
    tf_head, tf_worker = (json.loads(v["cloudml"]["TF_CONFIG"]) for v in (head_view, worker_view))
    assert tf_head["cluster"] == tf_worker["cluster"] and set(tf_head["cluster"]) == {"chief", "worker"}
    assert tf_head["task"] == {"type": "chief", "index": 0} and tf_worker["task"] == {
        "type": "worker",
        "index": 0,
    }
    assert tf_head["cluster"]["chief"] == [f"{fleet.address(0)}:2222"]
    assert json.loads(worker_view["cloudml"]["CLUSTER_SPEC"])["task"] == {"type": "workerpool1", "index": 0}
    assert worker_view["cloudml"]["AIP_MODEL_DIR"] == worker_view["args"]["model_dir"]

    # the model the leader saved to SM_MODEL_DIR was pulled back
    assert (run / "nodes" / head / "model" / "model.pth").stat().st_size > 500
    assert not (run / "nodes" / worker / "model" / "model.pth").exists()

    # the records hold the hyperparameters; fab compare puts the two runs side by side
    compare_console, compare_out = quiet_console()
    plot = tmp_path / "compare.png"
    compared = experiments.compare(compare_console, "all", playbook="sagemaker-csv", plot=str(plot))
    assert [c.record.hyperparameters["learning-rate"] for c in compared] == [0.05, 0.005]
    assert all(len(c.metrics.loss_curve) >= 20 and "val_accuracy" in c.metrics.best for c in compared)
    table = compare_out.getvalue()
    assert "learning-rate" in table and "0.005" in table and "val_accuracy" in table
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # fab runs --tensorboard: each run's event files (with its hyperparameters) under one folder
    logdir = tmp_path / "tb"
    linked = experiments.link_tensorboard([c.record for c in compared], logdir)
    assert sorted(linked) == sorted(c.record.id for c in compared)
    from tensorboard.backend.event_processing.event_multiplexer import EventMultiplexer

    mux = EventMultiplexer()
    mux.AddRunsFromDirectory(str(logdir))
    mux.Reload()
    assert sorted(mux.Runs()) == sorted(f"{c.record.id}/tensorboard" for c in compared)
    for name in mux.Runs():
        assert "loss" in mux.Runs()[name]["scalars"]
        assert "_hparams_/session_start_info" in mux.PluginRunToTagToContent("hparams")[name]
