"""Pulumi entry point (``main: infra/`` in Pulumi.yaml): settings in, cluster and outputs out."""

from __future__ import annotations

import sys
from pathlib import Path

# Pulumi runs this directory as a script with infra/ as the working directory and first on
# sys.path. Import from the repository root instead (``infra.*``, ``launch.job.stack_outputs``), and
# keep infra/'s module names (config, settings...) from shadowing anything else's.
_ROOT = Path(__file__).resolve().parent.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _ROOT / "infra"]
sys.path.insert(0, str(_ROOT))

from infra.config import load_settings  # noqa: E402
from infra.program import build_fleet  # noqa: E402

build_fleet(load_settings())
