"""A training script written the SageMaker way, run unchanged by fleetrun (playbooks/sagemaker-csv.yaml).

Everything it knows comes from SageMaker's conventions: hyperparameters as command-line arguments
(``--learning-rate 0.1``), data in the channels ``SM_CHANNEL_TRAINING``/``SM_CHANNEL_VALIDATION``,
the cluster in ``SM_HOSTS``/``SM_CURRENT_HOST``, the model saved to ``SM_MODEL_DIR``, extra output
to ``SM_OUTPUT_DATA_DIR``. Under SageMaker's ``torch_distributed`` (torchrun) and under fleetrun,
torch.distributed finds its peers in torchrun's environment; alone it trains as one process.

It trains a small MLP on CSV files (features, then a 0/1 label) and writes what it saw of the
SageMaker environment (the variables, and ``hyperparameters.json`` in ``SM_INPUT_CONFIG_DIR`` as the
training toolkit decodes it) to ``$SM_OUTPUT_DATA_DIR/sagemaker-env-<rank>.json`` (so the example
can be checked).
fleetrun's metrics helper, when present, gets the loss curve; on SageMaker the log lines serve.
"""

from __future__ import annotations

import argparse
import csv
import glob
import json
import os

import torch
import torch.distributed as dist
from torch import nn

try:  # fleetrun ships this helper to every node; SageMaker does not have it
    from fleetrun_metrics import Metrics
except ImportError:
    Metrics = None


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    # hyperparameters, as SageMaker passes them
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--learning-rate", type=float, default=0.05)
    p.add_argument("--hidden", type=int, default=16)
    # SageMaker's environment, as its examples read it
    p.add_argument("--hosts", type=json.loads, default=os.environ["SM_HOSTS"])
    p.add_argument("--current-host", default=os.environ["SM_CURRENT_HOST"])
    p.add_argument("--num-gpus", type=int, default=int(os.environ["SM_NUM_GPUS"]))
    p.add_argument("--model-dir", default=os.environ["SM_MODEL_DIR"])
    p.add_argument("--output-data-dir", default=os.environ["SM_OUTPUT_DATA_DIR"])
    p.add_argument("--train", default=os.environ["SM_CHANNEL_TRAINING"])
    p.add_argument("--validation", default=os.environ["SM_CHANNEL_VALIDATION"])
    return p.parse_args()


def load_csv(folder: str) -> tuple[torch.Tensor, torch.Tensor]:
    rows = []
    for path in sorted(glob.glob(os.path.join(folder, "*.csv"))):
        with open(path, newline="") as handle:
            reader = csv.reader(handle)
            next(reader)
            rows += [[float(v) for v in row] for row in reader]
    data = torch.tensor(rows)
    return data[:, :-1], data[:, -1].long()


def main() -> None:
    args = parse_args()
    distributed = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    if distributed:
        dist.init_process_group(backend="nccl" if args.num_gpus > 0 else "gloo")
    rank = dist.get_rank() if distributed else 0
    world = dist.get_world_size() if distributed else 1
    torch.manual_seed(0)
    torch.set_num_threads(1)

    x, y = load_csv(args.train)
    vx, vy = load_csv(args.validation)
    mine = torch.arange(rank, len(x), world)  # this rank's shard
    model = nn.Sequential(nn.Linear(x.shape[1], args.hidden), nn.ReLU(), nn.Linear(args.hidden, 2))
    if distributed:
        model = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.learning_rate, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    metrics = Metrics(rank=rank) if Metrics is not None else None
    step = 0
    for epoch in range(args.epochs):
        order = mine[torch.randperm(len(mine))]
        for start in range(0, len(order), args.batch_size):
            batch = order[start : start + args.batch_size]
            optimizer.zero_grad()
            loss = loss_fn(model(x[batch]), y[batch])
            loss.backward()
            optimizer.step()
            step += 1
            if metrics is not None:
                metrics.log(step=step, loss=float(loss), epoch=epoch)
        with torch.no_grad():
            val_loss = float(loss_fn(model(vx), vy))
            accuracy = float((model(vx).argmax(dim=1) == vy).float().mean())
        print(f"epoch {epoch} validation loss {val_loss:.4f} accuracy {accuracy:.4f}", flush=True)
        if metrics is not None:
            metrics.log(step=step, val_loss=val_loss, val_accuracy=accuracy)

    os.makedirs(args.output_data_dir, exist_ok=True)
    # what SageMaker puts under /opt/ml/input, read as the training toolkit reads it
    with open(os.path.join(os.environ["SM_INPUT_CONFIG_DIR"], "hyperparameters.json")) as handle:
        hyperparameters = {k: json.loads(v) for k, v in json.load(handle).items()}
    inputs = {
        name: os.environ[name]
        for name in (
            "SM_INPUT_DIR",
            "SM_INPUT_CONFIG_DIR",
            "SM_INPUT_DATA_CONFIG",
            "SM_MODULE_NAME",
            "SM_USER_ENTRY_POINT",
            "SM_FRAMEWORK_PARAMS",
            "SM_RESOURCE_CONFIG",
            "SM_NETWORK_INTERFACE_NAME",
            "SM_NUM_CPUS",
            "SM_LOG_LEVEL",
            "SM_USER_ARGS",
            "SM_OUTPUT_DIR",
        )
    }
    seen = {
        # what a trainer written for Cloud ML Engine / Vertex AI would read on the same node
        "cloudml": {k: os.environ.get(k) for k in ("TF_CONFIG", "CLUSTER_SPEC", "AIP_MODEL_DIR")},
        "hyperparameters_json": hyperparameters,
        "inputs": inputs,
        "args": vars(args),
        "rank": rank,
        "world_size": world,
        "training_env": json.loads(os.environ["SM_TRAINING_ENV"]),
        "sm": {k: v for k, v in os.environ.items() if k.startswith("SM_") and k != "SM_TRAINING_ENV"},
        "train_rows": len(x),
        "validation_rows": len(vx),
    }
    with open(os.path.join(args.output_data_dir, f"sagemaker-env-{rank}.json"), "w") as handle:
        json.dump(seen, handle, indent=2, sort_keys=True)
    if args.current_host == args.hosts[0] and rank == 0:  # SageMaker's leader saves the model
        os.makedirs(args.model_dir, exist_ok=True)
        state = model.module.state_dict() if distributed else model.state_dict()
        torch.save(state, os.path.join(args.model_dir, "model.pth"))
    if metrics is not None:
        metrics.finish()
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
