"""The environment a SageMaker training script expects, per node, so it runs unchanged.

What SageMaker's training toolkit sets (its ``ENVIRONMENT_VARIABLES.md``), with fleetrun's values:

* ``SM_HOSTS``: ``["algo-1", ..., "algo-N"]``, SageMaker's container names, in node-rank order
  (``algo-1`` is the head, node rank 0, as SageMaker's leader is ``algo-1``); ``SM_CURRENT_HOST``
  is this node's. Scripts compare the two (``current_host == hosts[0]``) or take the index as
  the node rank; both give fleetrun's ``NODE_RANK``. The inventory's own names stay in
  ``FLEETRUN_NODE_IPS`` and the run records.
* ``SM_MODEL_DIR`` (the playbook's ``outputs``), ``SM_OUTPUT_DIR``/``SM_OUTPUT_DATA_DIR`` (under
  the run directory, which is pulled back whole), ``SM_CHANNELS`` and ``SM_CHANNEL_<NAME>``,
  ``SM_HPS``/``SM_HP_<NAME>`` and ``SM_USER_ARGS``, ``SM_LOG_LEVEL``, ``SM_RESOURCE_CONFIG``.
* What only the node knows is set by its launch script: ``SM_NUM_CPUS`` (``nproc``),
  ``SM_NUM_GPUS`` (the host's GPUs when the inventory says, else ``nvidia-smi``),
  ``SM_NETWORK_INTERFACE_NAME`` (the cluster interface), and ``SM_TRAINING_ENV``, the JSON of all
  of it, written by ``fleetrun_sagemaker`` (node library) from those variables.

* What SageMaker puts under ``/opt/ml/input``: ``SM_INPUT_DIR`` and ``SM_INPUT_CONFIG_DIR`` (under
  the run directory), ``SM_INPUT_DATA_CONFIG`` (``inputdataconfig.json``'s JSON), and the files
  ``hyperparameters.json`` (each value JSON-encoded, as the PyTorch estimator writes it, with its
  ``sagemaker_*`` keys), ``inputdataconfig.json`` and ``resourceconfig.json`` in the config
  folder, written on the node by ``fleetrun_sagemaker``; ``SM_USER_ENTRY_POINT`` and
  ``SM_MODULE_NAME`` (the entrypoint's script or module), ``SM_MODULE_DIR`` (the synced workdir)
  and ``SM_FRAMEWORK_PARAMS`` (the ``sagemaker_*`` parameters of the launcher's distribution).

A hyperparameter named like ``batch-size`` gives ``SM_HP_BATCH-SIZE`` and a channel ``train-set``
``SM_CHANNEL_TRAIN-SET``, as on SageMaker; a POSIX shell cannot ``export`` such a name, so those
few are passed by ``env`` on the command that starts the job. Pure: text and dictionaries only.
"""

from __future__ import annotations

import shlex

from launch.job.inventory import Host, Inventory
from launch.job.sagemaker import Channel, hyperparameter_args, hyperparameter_env, json_text
from launch.job.spec import ENV_NAME_RE, JobSpec
from launch.planning import remote_layout as layout

SM_TRAINING_ENV_MODULE = "fleetrun_sagemaker"
LOG_LEVEL_INFO = "20"
DATA_CONFIG = {
    "RecordWrapperType": "None",
    "S3DistributionType": "FullyReplicated",
    "TrainingInputMode": "File",
}
"""What ``inputdataconfig.json`` says of each channel: every node has all of it, as files."""
HOMOGENEOUS_GROUP = "homogeneousCluster"
"""SageMaker's name for the one instance group of a job that asked for one instance type."""
PYTHONS = ("python", "python3")
SHELLS = ("sh", "bash")


def host_names(count: int) -> list[str]:
    """SageMaker's container names for ``count`` nodes, in node-rank order."""
    return [f"algo-{i + 1}" for i in range(count)]


def channel_dir(job: str, name: str) -> str:
    """Where a ``local`` or ``bucket`` channel is copied on every node (relative to the home)."""
    return f"{layout.ROOT}/data/{job}/{name}"


def channel_value(job: str, name: str, channel: Channel) -> str:
    """``SM_CHANNEL_<NAME>``: the node path as given, or ``$HOME/...`` for a copied folder."""
    if channel.copied:
        return layout.home(channel_dir(job, name))
    assert channel.path is not None
    return channel.path


def channel_notes(spec: JobSpec) -> list[str]:
    """Plan notes for the channels fleetrun copies before the start (the dry run shows them)."""
    notes = []
    for name, channel in sorted(spec.all_channels().items()):
        where = f"~/{channel_dir(spec.name, name)} on every node"
        if channel.local is not None:
            notes.append(f"data channel {name}: {channel.local} on this machine, copied to {where}")
        elif channel.bucket is not None:
            notes.append(
                f"data channel {name}: {channel.bucket} in the fleet's bucket, copied by each node to {where}"
            )
    return notes


def gpu_count(host: Host) -> int | None:
    return len(host.gpu_indices) if host.gpu_indices is not None else host.gpu_count


def instance_type(host: Host) -> str:
    """The host's machine type as ``resourceconfig.json`` names it: the inventory's (a stack sets
    it), else what SageMaker's local mode writes (``local_gpu`` for a host known to have GPUs,
    else ``local``)."""
    if host.instance_type:
        return host.instance_type
    return "local_gpu" if (gpu_count(host) or 0) > 0 else "local"


def resource_config(inventory: Inventory, rank: int) -> dict[str, object]:
    """``SM_RESOURCE_CONFIG`` (and ``resourceconfig.json`` less its interface) of node ``rank``, in
    SageMaker's shape: ``current_host``, ``hosts``, ``current_instance_type``,
    ``current_group_name`` and ``instance_groups``. One instance type is SageMaker's one group,
    ``homogeneousCluster``; an inventory of several types gets a group per type, named by it."""
    hosts = host_names(len(inventory.hosts))
    types = [instance_type(h) for h in inventory.hosts]
    order = list(dict.fromkeys(types))
    names = {t: (HOMOGENEOUS_GROUP if len(order) == 1 else t) for t in order}
    groups = [
        {
            "instance_group_name": names[t],
            "instance_type": t,
            "hosts": [h for h, ht in zip(hosts, types, strict=True) if ht == t],
        }
        for t in order
    ]
    return {
        "current_host": hosts[rank],
        "current_instance_type": types[rank],
        "current_group_name": names[types[rank]],
        "hosts": hosts,
        "instance_groups": groups,
    }


def entry_point(entrypoint: str) -> tuple[str, str]:
    """(``SM_USER_ENTRY_POINT``, ``SM_MODULE_NAME``) of an entrypoint: the script (``train.py`` ->
    ``train``, as the toolkit strips ``.py``), the module of ``python -m pkg.mod``, or the script a
    shell runs (``sh run.sh``); otherwise the command's first word."""
    argv = shlex.split(entrypoint)
    program = argv[0]
    if argv[0] in PYTHONS and len(argv) >= 2:
        program = argv[2] if argv[1] == "-m" and len(argv) >= 3 else argv[1]
    elif argv[0] in SHELLS and len(argv) >= 2 and not argv[1].startswith("-"):
        program = argv[1]
    return program, program.removesuffix(".py")


def all_sagemaker_env(
    spec: JobSpec, inventory: Inventory, rank: int, run_dir: str, framework_params: dict[str, object]
) -> dict[str, str]:
    """Every planned ``SM_*`` variable of node ``rank``, shell-exportable names or not."""
    hosts = host_names(len(inventory.hosts))
    channels = spec.all_channels()
    program, module = entry_point(spec.entrypoint)
    env = {
        "SM_HOSTS": json_text(hosts),
        "SM_CURRENT_HOST": hosts[rank],
        "SM_RESOURCE_CONFIG": json_text(resource_config(inventory, rank)),
        "SM_MODEL_DIR": f"{run_dir}/{spec.outputs}",
        "SM_OUTPUT_DIR": f"{run_dir}/output",
        "SM_OUTPUT_DATA_DIR": f"{run_dir}/output/data",
        "SM_OUTPUT_INTERMEDIATE_DIR": f"{run_dir}/output/intermediate",
        "SM_INPUT_DIR": f"{run_dir}/input",
        "SM_INPUT_CONFIG_DIR": f"{run_dir}/input/config",
        "SM_INPUT_DATA_CONFIG": json_text({name: DATA_CONFIG for name in channels}),
        "SM_CHANNELS": json_text(sorted(channels)),
        "SM_LOG_LEVEL": LOG_LEVEL_INFO,
        "SM_USER_ARGS": json_text(hyperparameter_args(spec.hyperparameters)),
        "SM_USER_ENTRY_POINT": program,
        "SM_MODULE_NAME": module,
        "SM_MODULE_DIR": layout.home(layout.workdir(spec.name)),
        "SM_FRAMEWORK_PARAMS": json_text(framework_params),
    }
    count = gpu_count(inventory.hosts[rank])
    if count is not None:
        env["SM_NUM_GPUS"] = str(count)
    for name, channel in channels.items():
        env[f"SM_CHANNEL_{name.upper()}"] = channel_value(spec.name, name, channel)
    env.update(hyperparameter_env(spec.hyperparameters))
    return env


def sagemaker_env(
    spec: JobSpec,
    inventory: Inventory,
    rank: int,
    run_dir: str,
    framework_params: dict[str, object] | None = None,
) -> dict[str, str]:
    """The planned ``SM_*`` variables of node ``rank``; shell-exportable names only (the others
    are passed by ``exec_env_prefix``)."""
    env = all_sagemaker_env(spec, inventory, rank, run_dir, framework_params or {})
    return {k: v for k, v in env.items() if ENV_NAME_RE.fullmatch(k)}


def home_relative_keys(spec: JobSpec) -> set[str]:
    """``SM_*`` keys whose ``$HOME/...`` values the node's shell expands (synced channels, outputs)."""
    keys = {
        "SM_MODEL_DIR",
        "SM_OUTPUT_DIR",
        "SM_OUTPUT_DATA_DIR",
        "SM_OUTPUT_INTERMEDIATE_DIR",
        "SM_INPUT_DIR",
        "SM_INPUT_CONFIG_DIR",
        "SM_MODULE_DIR",
    }
    keys |= {f"SM_CHANNEL_{name.upper()}" for name, ch in spec.all_channels().items() if ch.copied}
    return keys


def odd_names_env(spec: JobSpec) -> dict[str, str]:
    """The ``SM_*`` variables whose names ``sh`` cannot export (``SM_HP_BATCH-SIZE``,
    ``SM_CHANNEL_TRAIN-SET``), less any the playbook's ``env`` sets: the same on every node."""
    channels = {
        f"SM_CHANNEL_{name.upper()}": channel_value(spec.name, name, channel)
        for name, channel in spec.all_channels().items()
    }
    env = {**channels, **hyperparameter_env(spec.hyperparameters)}
    return {k: v for k, v in env.items() if not ENV_NAME_RE.fullmatch(k) and k not in spec.env}


def exec_env_prefix(spec: JobSpec) -> str:
    """``env 'SM_HP_BATCH-SIZE=64' `` for the variables whose names a shell cannot export, else ''.

    A copied channel's ``$HOME/...`` value stays live (``"SM_CHANNEL_X-Y=$HOME"/'rest'``)."""
    odd = odd_names_env(spec)
    if not odd:
        return ""
    words = []
    for key, value in sorted(odd.items()):
        if value.startswith("$HOME/") and key.startswith("SM_CHANNEL_"):
            words.append(f'"{key}=$HOME"/' + shlex.quote(value.removeprefix("$HOME/")))
        else:
            words.append(shlex.quote(f"{key}={value}"))
    return "env " + " ".join(words) + " "


def runtime_lines(spec: JobSpec) -> list[str]:
    """Launch-script lines (after the job's venv is active, ``IFACE`` known) for what only the node
    knows; ``fleetrun_sagemaker`` sees the variables sh cannot export too (``exec_env_prefix``)."""
    return [
        "SM_NUM_CPUS=$(nproc 2>/dev/null || getconf _NPROCESSORS_ONLN); export SM_NUM_CPUS",
        "[ -n \"${SM_NUM_GPUS:-}\" ] || SM_NUM_GPUS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true); "
        "export SM_NUM_GPUS",
        'SM_NETWORK_INTERFACE_NAME="${IFACE:-}"; export SM_NETWORK_INTERFACE_NAME',
        'mkdir -p "$SM_OUTPUT_DATA_DIR" "$SM_INPUT_CONFIG_DIR"',
        f"SM_TRAINING_ENV=$({exec_env_prefix(spec)}python -m {SM_TRAINING_ENV_MODULE}); export SM_TRAINING_ENV",
    ]
