"""The local run folder: everything a run leaves on the operator's machine.

``<runs>/<run_id>/``: ``plan.txt`` (the exact scripts), ``nodes/<host>/`` (each node's run
directory pulled back: ``node.log``, ``launch.sh``, ``rc``, outputs), ``metrics.jsonl`` and
``status.json`` (from whichever node held global rank 0), ``summary.json`` and ``loss.png``.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launch.paths import runs_dir
from launch.rules.metrics_stream import MetricsStream, MetricsSummary


def new_run_id(job: str) -> str:
    """Unique and sortable: job, UTC time, and randomness (also the torchrun rendezvous id)."""
    return f"{job}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{secrets.token_hex(3)}"


@dataclass(frozen=True)
class RunFolder:
    path: Path

    @classmethod
    def create(cls, run_id: str, base: Path | None = None) -> RunFolder:
        path = (base or runs_dir()) / run_id
        (path / "nodes").mkdir(parents=True, exist_ok=True)
        path.chmod(0o700)  # plan.txt, logs and outputs are the operator's alone
        return cls(path)

    def node_dir(self, host: str) -> Path:
        return self.path / "nodes" / host

    def write_json(self, name: str, data: Any) -> Path:
        target = self.path / name
        tmp = target.with_suffix(target.suffix + ".tmp")
        tmp.write_text(json.dumps(data, indent=2, sort_keys=True, default=str))
        tmp.replace(target)
        return target

    def write_text(self, name: str, text: str) -> Path:
        """Written 0600 (``plan.txt`` holds the exact scripts)."""
        target = self.path / name
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        return target

    def artifacts(self, limit: int = 500) -> list[str]:
        """Files of the run folder, relative to it (for the run record)."""
        return sorted(str(p.relative_to(self.path)) for p in self.path.rglob("*") if p.is_file())[:limit]

    def read_metrics(self) -> tuple[list[dict[str, Any]], MetricsSummary]:
        """Rank 0's ``metrics.jsonl`` as pulled back, parsed whole: its records and their summary."""
        stream = MetricsStream()
        metrics = self.path / "metrics.jsonl"
        records = stream.feed(metrics.read_bytes()) + stream.flush() if metrics.exists() else []
        return records, stream.summary()

    def collect_rank0_files(self) -> str | None:
        """Copy metrics.jsonl/status.json from the node that held rank 0 to the top; return that node."""
        best: tuple[int, str] | None = None
        for node_dir in sorted((self.path / "nodes").iterdir()) if (self.path / "nodes").exists() else []:
            metrics = node_dir / "metrics.jsonl"
            if metrics.exists() and (best is None or metrics.stat().st_size > best[0]):
                best = (metrics.stat().st_size, node_dir.name)
        if best is None:
            return None
        source = self.node_dir(best[1])
        for name in ("metrics.jsonl", "status.json"):
            if (source / name).exists():
                shutil.copyfile(source / name, self.path / name)
        return best[1]
