"""bench/scale.py runs end to end on a small local fleet (fleetrun and its baselines both work).

No timing assertions: the goals are printed by the bench itself, not tested.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, needs_root


@needs_root()
@pytest.mark.fleet
def test_scale_bench_quick(tmp_path: Path) -> None:
    out = tmp_path / "scale.json"
    env = {**os.environ, "FLEETRUN_HOME": str(tmp_path / "home")}
    env.pop("FLEETRUN_RUNS", None)
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "scale.py"), "--quick", "--skip-train", "--out", str(out)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=540,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["errors"] == []
    assert [row["nodes"] for row in data["rows"]] == [4]
    for row in data["rows"]:
        for section, baseline in (
            ("exec_true", "pdsh"),
            ("sync_first", "rsync loop"),
            ("sync_unchanged", "rsync loop"),
        ):
            for tool in ("fleetrun", baseline):
                assert row[section][tool]["median_s"] > 0, (section, tool)
                assert all(t > 0 for t in row[section][tool]["runs_s"]), (section, tool)
            assert row[section]["ratio"] > 0
        assert row["poll_round"]["median_s"] > 0
        assert len(row["poll_round"]["runs_s"]) >= 5
    assert data["machine"]["cpu_count"] and data["machine"]["memory_gb"] > 0
