# shellcheck shell=sh disable=SC2089,SC2090 # SM_HOSTS & co. are JSON text: their quotes are literal
# fleetrun's entry wrapper for a job exported as a Kubeflow PyTorchJob (`fab export --to pytorchjob`).
#
# Sourced by every pod's command before torchrun (`. /opt/fleetrun/pod-env.sh && ... exec torchrun`):
# the manifest holds one pod template for all replicas, so what differs per node is derived here,
# from this pod's own environment, never copied from the head's plan. POSIX sh; it exports
#
#   FLEETRUN_NODE_RANK, NODE_RANK   the operator's PET_NODE_RANK, else its RANK (the pod's index
#                                   with a Master replica), else the pod's hostname:
#                                   <job>-master-0 is 0, <job>-worker-N is N + FLEETRUN_WORKER_RANK_OFFSET
#                                   (1 beside a Master, 0 in an elastic job of Workers only)
#   FLEETRUN_NUM_NODES, NNODES      the operator's PET_NNODES when it is one number, else the manifest's
#   FLEETRUN_HEAD_IP                the operator's MASTER_ADDR / PET_MASTER_ADDR when set
#   SM_CURRENT_HOST, SM_HOSTS,      SageMaker's names: algo-<rank+1> of algo-1..algo-<nodes>
#   SM_RESOURCE_CONFIG
#   SM_NUM_CPUS, SM_NUM_GPUS,       what only the pod knows (SM_NUM_GPUS: the manifest's GPU limit,
#   SM_NETWORK_INTERFACE_NAME       else nvidia-smi)
#   SM_TRAINING_ENV                 SageMaker's JSON of all of it (fleetrun_sagemaker, which also
#                                   writes hyperparameters.json & co. into $SM_INPUT_CONFIG_DIR)
#
# The pod's command passes the SM_* variables whose names are no shell identifier (SM_HP_BATCH-SIZE,
# SM_CHANNEL_TRAIN-SET) as its own arguments, NAME=VALUE each: dash, the image's /bin/sh, drops
# such names from its environment before anything runs, so they reach Python only through `env "$@"`
# (here, and on the command's final exec). Sourcing keeps the command's arguments as "$@".
#
# A pod that cannot tell its rank stops here with one line on stderr (exit 2), rather than run as
# a second rank 0.

_fr_fail() {
    echo "fleetrun pod: $*" >&2
    exit 2
}

_fr_is_count() {
    case "$1" in '' | *[!0-9]*) return 1 ;; *) return 0 ;; esac
}

# The pod's name: the container runtime sets HOSTNAME (Kubernetes makes it the pod name).
# shellcheck disable=SC3028
_fr_host=${HOSTNAME:-$(hostname 2>/dev/null || true)}
if _fr_is_count "${PET_NODE_RANK:-}"; then
    _fr_rank=$PET_NODE_RANK
elif _fr_is_count "${RANK:-}" && [ "${FLEETRUN_WORKER_RANK_OFFSET:-1}" = 1 ]; then
    _fr_rank=$RANK
else
    _fr_index=${_fr_host##*-}
    _fr_is_count "$_fr_index" || _fr_fail "cannot tell this pod's node rank: no PET_NODE_RANK or RANK, and the hostname '$_fr_host' does not end in -<index>"
    case "$_fr_host" in
    *-master-"$_fr_index") _fr_rank=$_fr_index ;;
    *-worker-"$_fr_index") _fr_rank=$((_fr_index + ${FLEETRUN_WORKER_RANK_OFFSET:-1})) ;;
    *) _fr_fail "cannot tell this pod's node rank: the hostname '$_fr_host' is neither <job>-master-N nor <job>-worker-N" ;;
    esac
fi

if _fr_is_count "${PET_NNODES:-}"; then
    _fr_nodes=$PET_NNODES
else
    _fr_nodes=${FLEETRUN_NUM_NODES:-1}
fi
if ! _fr_is_count "$_fr_nodes" || [ "$_fr_nodes" -lt 1 ]; then
    _fr_fail "the node count '$_fr_nodes' is not a positive number"
fi
[ "$_fr_rank" -lt "$_fr_nodes" ] || _fr_fail "node rank $_fr_rank is not below the node count $_fr_nodes"

FLEETRUN_NODE_RANK=$_fr_rank
NODE_RANK=$_fr_rank
FLEETRUN_NUM_NODES=$_fr_nodes
NNODES=$_fr_nodes
export FLEETRUN_NODE_RANK NODE_RANK FLEETRUN_NUM_NODES NNODES
_fr_head=${PET_MASTER_ADDR:-${MASTER_ADDR:-}}
if [ -n "$_fr_head" ]; then
    FLEETRUN_HEAD_IP=$_fr_head
    export FLEETRUN_HEAD_IP
fi

_fr_hosts=""
_fr_i=1
while [ "$_fr_i" -le "$_fr_nodes" ]; do
    _fr_hosts="$_fr_hosts${_fr_hosts:+,}\"algo-$_fr_i\""
    _fr_i=$((_fr_i + 1))
done
SM_CURRENT_HOST="algo-$((_fr_rank + 1))"
SM_HOSTS="[$_fr_hosts]"
export SM_CURRENT_HOST SM_HOSTS

SM_NUM_CPUS=$(nproc 2>/dev/null || getconf _NPROCESSORS_ONLN)
export SM_NUM_CPUS
if ! _fr_is_count "${SM_NUM_GPUS:-}"; then
    SM_NUM_GPUS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
fi
export SM_NUM_GPUS
# SageMaker's resource config; the pod's machine type is unknown here: what SageMaker's local mode writes
_fr_type=local
if [ "${SM_NUM_GPUS:-0}" -gt 0 ] 2>/dev/null; then _fr_type=local_gpu; fi
SM_RESOURCE_CONFIG="{\"current_group_name\":\"homogeneousCluster\",\"current_host\":\"$SM_CURRENT_HOST\",\"current_instance_type\":\"$_fr_type\",\"hosts\":$SM_HOSTS,\"instance_groups\":[{\"hosts\":$SM_HOSTS,\"instance_group_name\":\"homogeneousCluster\",\"instance_type\":\"$_fr_type\"}]}"
export SM_RESOURCE_CONFIG
SM_NETWORK_INTERFACE_NAME=""
for _fr_if in /sys/class/net/*; do
    _fr_if=${_fr_if##*/}
    [ "$_fr_if" = lo ] || [ "$_fr_if" = "*" ] || { SM_NETWORK_INTERFACE_NAME=$_fr_if; break; }
done
SM_NETWORK_INTERFACE_NAME=${SM_NETWORK_INTERFACE_NAME:-eth0}
export SM_NETWORK_INTERFACE_NAME

if [ -n "${SM_OUTPUT_DATA_DIR:-}" ]; then mkdir -p "$SM_OUTPUT_DATA_DIR"; fi
SM_TRAINING_ENV=$(env "$@" python -m fleetrun_sagemaker) || _fr_fail "python -m fleetrun_sagemaker failed (is the image's PYTHONPATH $PYTHONPATH?)"
export SM_TRAINING_ENV
unset _fr_type _fr_host _fr_index _fr_rank _fr_nodes _fr_head _fr_hosts _fr_i _fr_if
