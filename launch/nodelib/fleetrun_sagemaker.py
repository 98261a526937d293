"""Print ``SM_TRAINING_ENV``, SageMaker's JSON of the whole training environment, from ``SM_*``.

Run by each node's launch script (``SM_TRAINING_ENV=$(python -m fleetrun_sagemaker)``) after the
plan's ``SM_*`` variables are exported and the node-only ones (``SM_NUM_CPUS``, ``SM_NUM_GPUS``,
``SM_NETWORK_INTERFACE_NAME``) are known, so the JSON and the single variables cannot disagree
and hold the node's real paths (``$HOME`` expanded). The fields are those sagemaker-training-
toolkit writes. Standard library only: it runs on the nodes.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

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


def training_env(env: Mapping[str, str]) -> dict[str, Any]:
    hosts = _json(env, "SM_HOSTS", [])
    current = env.get("SM_CURRENT_HOST", "")
    channels = _json(env, "SM_CHANNELS", [])
    channel_dirs = {name: env.get(f"SM_CHANNEL_{str(name).upper()}", "") for name in channels}
    output_dir = env.get("SM_OUTPUT_DIR", "")
    return {
        "additional_framework_parameters": {},
        "channel_input_dirs": channel_dirs,
        "current_host": current,
        "framework_module": None,
        "hosts": hosts,
        "hyperparameters": _json(env, "SM_HPS", {}),
        "input_config_dir": "",
        "input_data_config": {name: dict(DATA_CONFIG) for name in channels},
        "input_dir": "",
        "is_master": bool(hosts) and current == hosts[0],
        "job_name": env.get("FLEETRUN_RUN_ID", ""),
        "log_level": _int(env, "SM_LOG_LEVEL"),
        "master_hostname": hosts[0] if hosts else "",
        "model_dir": env.get("SM_MODEL_DIR", ""),
        "module_dir": os.getcwd(),
        "module_name": None,
        "network_interface_name": env.get("SM_NETWORK_INTERFACE_NAME", ""),
        "num_cpus": _int(env, "SM_NUM_CPUS"),
        "num_gpus": _int(env, "SM_NUM_GPUS"),
        "num_neurons": 0,
        "output_data_dir": env.get("SM_OUTPUT_DATA_DIR", ""),
        "output_dir": output_dir,
        "output_intermediate_dir": f"{output_dir}/intermediate" if output_dir else "",
        "resource_config": _json(env, "SM_RESOURCE_CONFIG", {}),
        "user_entry_point": None,
    }


def main() -> None:
    print(json.dumps(training_env(os.environ), sort_keys=True, separators=(",", ":")))


if __name__ == "__main__":
    main()
