"""Print ``SM_TRAINING_ENV``, SageMaker's JSON of the whole training environment, from ``SM_*``.

Run by each node's launch script (``SM_TRAINING_ENV=$(python -m fleetrun_sagemaker)``) after the
plan's ``SM_*`` variables are exported and the node-only ones (``SM_NUM_CPUS``, ``SM_NUM_GPUS``,
``SM_NETWORK_INTERFACE_NAME``) are known, so the JSON and the single variables cannot disagree
and hold the node's real paths (``$HOME`` expanded). The fields are those sagemaker-training-
toolkit writes. Standard library only: it runs on the nodes.

It also writes what SageMaker puts in ``/opt/ml/input/config`` into ``$SM_INPUT_CONFIG_DIR``:
``hyperparameters.json`` (each value JSON-encoded, as SageMaker's framework estimators send them,
with the ``sagemaker_*`` keys the estimator adds), ``inputdataconfig.json`` and
``resourceconfig.json``. A failure to write them is said on stderr and never stops the launch
(the variables are set either way).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from typing import Any

HOMOGENEOUS_GROUP = "homogeneousCluster"
DATA_CONFIG = {
    "RecordWrapperType": "None",
    "S3DistributionType": "FullyReplicated",
    "TrainingInputMode": "File",
}


def _json(env: Mapping[str, str], name: str, default: Any) -> Any:
    try:
        return json.loads(env.get(name, ""))
    except ValueError:
        return default


def _int(env: Mapping[str, str], name: str) -> int:
    try:
        return int(env.get(name, "0").strip() or 0)
    except ValueError:
        return 0


def _none_if_empty(value: str) -> str | None:
    return value or None


def resource_config(env: Mapping[str, str]) -> dict[str, Any]:
    """``SM_RESOURCE_CONFIG`` with every key SageMaker writes in ``resourceconfig.json``
    (``current_instance_type``, ``current_group_name``, ``instance_groups``,
    ``network_interface_name``): the plan's values, and where a key is missing (a pod's entry
    wrapper, an older plan) SageMaker local mode's (``local``/``local_gpu`` by ``SM_NUM_GPUS``) in
    one ``homogeneousCluster`` group, so a script that indexes them finds them."""
    config = _json(env, "SM_RESOURCE_CONFIG", {})
    if not isinstance(config, dict):
        config = {}
    hosts = config.get("hosts")
    if not isinstance(hosts, list):
        hosts = _json(env, "SM_HOSTS", [])
    config.setdefault("current_host", env.get("SM_CURRENT_HOST", ""))
    config.setdefault("hosts", hosts)
    kind = config.setdefault(
        "current_instance_type", "local_gpu" if _int(env, "SM_NUM_GPUS") > 0 else "local"
    )
    group = config.setdefault("current_group_name", HOMOGENEOUS_GROUP)
    config.setdefault(
        "instance_groups", [{"instance_group_name": group, "instance_type": kind, "hosts": hosts}]
    )
    config["network_interface_name"] = env.get("SM_NETWORK_INTERFACE_NAME", "")
    return config


def training_env(env: Mapping[str, str]) -> dict[str, Any]:
    hosts = _json(env, "SM_HOSTS", [])
    current = env.get("SM_CURRENT_HOST", "")
    channels = _json(env, "SM_CHANNELS", [])
    if not isinstance(channels, list):
        channels = []
    channel_dirs = {name: env.get(f"SM_CHANNEL_{str(name).upper()}", "") for name in channels}
    output_dir = env.get("SM_OUTPUT_DIR", "")
    data_config = _json(env, "SM_INPUT_DATA_CONFIG", None)
    if not isinstance(data_config, dict):
        data_config = {name: dict(DATA_CONFIG) for name in channels}
    return {
        "additional_framework_parameters": _json(env, "SM_FRAMEWORK_PARAMS", {}),
        "channel_input_dirs": channel_dirs,
        "current_host": current,
        "framework_module": None,
        "hosts": hosts,
        "hyperparameters": _json(env, "SM_HPS", {}),
        "input_config_dir": env.get("SM_INPUT_CONFIG_DIR", ""),
        "input_data_config": data_config,
        "input_dir": env.get("SM_INPUT_DIR", ""),
        "is_master": bool(hosts) and current == hosts[0],
        "job_name": env.get("FLEETRUN_RUN_ID", ""),
        "log_level": _int(env, "SM_LOG_LEVEL"),
        "master_hostname": hosts[0] if hosts else "",
        "model_dir": env.get("SM_MODEL_DIR", ""),
        "module_dir": env.get("SM_MODULE_DIR") or os.getcwd(),
        "module_name": _none_if_empty(env.get("SM_MODULE_NAME", "")),
        "network_interface_name": env.get("SM_NETWORK_INTERFACE_NAME", ""),
        "num_cpus": _int(env, "SM_NUM_CPUS"),
        "num_gpus": _int(env, "SM_NUM_GPUS"),
        "num_neurons": 0,
        "output_data_dir": env.get("SM_OUTPUT_DATA_DIR", ""),
        "output_dir": output_dir,
        "output_intermediate_dir": env.get("SM_OUTPUT_INTERMEDIATE_DIR")
        or (f"{output_dir}/intermediate" if output_dir else ""),
        "resource_config": resource_config(env),
        "user_entry_point": _none_if_empty(env.get("SM_USER_ENTRY_POINT", "")),
    }


def config_files(env: Mapping[str, str]) -> dict[str, Any]:
    """The contents of ``hyperparameters.json``, ``inputdataconfig.json`` and ``resourceconfig.json``.

    ``hyperparameters.json`` is what a SageMaker framework estimator (PyTorch, TensorFlow) sends:
    every value JSON-encoded into a string (``"epochs": "3"``, ``"arch": "\"mlp\""``), plus
    ``sagemaker_program``, ``sagemaker_submit_directory``, ``sagemaker_container_log_level``,
    ``sagemaker_job_name`` and the distribution's parameters (``SM_FRAMEWORK_PARAMS``); the
    toolkit decodes each value with ``json.loads``, which is how ``SM_HPS`` gets its types.
    """
    info = training_env(env)
    hyperparameters = info["hyperparameters"] if isinstance(info["hyperparameters"], dict) else {}
    framework = info["additional_framework_parameters"]
    sagemaker = {
        "sagemaker_program": info["user_entry_point"] or "",
        "sagemaker_submit_directory": info["module_dir"],
        "sagemaker_container_log_level": info["log_level"],
        "sagemaker_job_name": info["job_name"],
        **(framework if isinstance(framework, dict) else {}),
    }
    return {
        "hyperparameters.json": {str(k): json.dumps(v) for k, v in {**hyperparameters, **sagemaker}.items()},
        "inputdataconfig.json": info["input_data_config"],
        "resourceconfig.json": info["resource_config"],
    }


def write_config_files(env: Mapping[str, str]) -> None:
    """The config files into ``$SM_INPUT_CONFIG_DIR`` (when set); a failure is a line on stderr."""
    folder = env.get("SM_INPUT_CONFIG_DIR", "")
    if not folder:
        return
    try:
        os.makedirs(folder, exist_ok=True)
        for name, content in config_files(env).items():
            with open(os.path.join(folder, name), "w") as handle:
                json.dump(content, handle, sort_keys=True)
    except OSError as exc:
        print(f"fleetrun_sagemaker: could not write {folder}: {exc}", file=sys.stderr)


def main() -> None:
    write_config_files(os.environ)
    print(json.dumps(training_env(os.environ), sort_keys=True, separators=(",", ":")))


if __name__ == "__main__":
    main()
