"""Load the digits dataset shipped beside this package; split it the same way on every rank."""

from __future__ import annotations

import csv
import gzip
import os

import torch
from torch.utils.data import TensorDataset

HERE = os.path.dirname(os.path.abspath(__file__))


def load_digits(data_dir: str | None = None) -> tuple[TensorDataset, TensorDataset]:
    path = os.path.join(data_dir or os.path.join(HERE, "data"), "digits.csv.gz")
    with gzip.open(path, "rt") as fh:
        rows = [[int(v) for v in row] for row in csv.reader(fh) if row]
    data = torch.tensor(rows, dtype=torch.float32)
    features = data[:, :64] / 16.0
    labels = data[:, 64].long()
    order = torch.randperm(len(rows), generator=torch.Generator().manual_seed(1234))
    cut = int(0.8 * len(rows))
    train_idx, test_idx = order[:cut], order[cut:]
    return (
        TensorDataset(features[train_idx], labels[train_idx]),
        TensorDataset(features[test_idx], labels[test_idx]),
    )
