"""A profiled run on the real local fleet: the unchanged digits example, ``profile:`` in the playbook,
2 nodes; each profiled rank's Chrome trace (with the model's operators) and its TensorBoard-layout
copy are pulled to the laptop, and ``fab show`` lists them."""

from __future__ import annotations

import json
from pathlib import Path

from launch.fleets.local import LocalFleet
from tests.conftest import TEST_PREFIX, fab, needs_root, write_playbook

pytestmark = needs_root()


def test_profiled_run_pulls_traces_with_the_models_operators(
    fleet: LocalFleet, fleetrun_home: Path, digits_workdir: Path, tmp_path: Path
) -> None:
    playbook = write_playbook(
        tmp_path / "prof.yaml",
        digits_workdir,
        name="t-prof",
        nodes=2,
        entrypoint="python -m trainer.task --epochs 2",
        profile={"steps": "20-30", "ranks": [0, 1]},
    )
    runs = tmp_path / "runs"
    proc = fab(
        "train",
        str(playbook),
        "--inventory",
        f"local:{TEST_PREFIX}",
        home=fleetrun_home,
        runs=runs,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (run,) = list(runs.iterdir())
    world = json.loads((run / "summary.json").read_text())["world"]
    node_of_rank = {r["rank"]: r["host"] for r in world["ranks"]}
    assert set(node_of_rank) == {0, 1}
    for rank, node in node_of_rank.items():
        profile = run / "nodes" / node / "profile"
        chrome = profile / f"trace-rank{rank}-steps20-30.json"
        events = json.loads(chrome.read_text())["traceEvents"]
        names = {e.get("name") for e in events}
        assert "aten::addmm" in names or "aten::linear" in names, f"rank {rank}: no model operator"
        steps = {e["name"] for e in events if str(e.get("name", "")).startswith("ProfilerStep#")}
        assert steps == {f"ProfilerStep#{s}" for s in range(20, 31)}
        (board,) = list(profile.glob(f"plugins/profile/*/rank{rank}.*.pt.trace.json"))
        assert board.stat().st_size == chrome.stat().st_size
        assert not list(profile.glob("error-*"))
    show = fab("show", run.name, home=fleetrun_home, runs=runs, timeout=120, columns=500)
    assert show.returncode == 0, show.stderr
    shown = show.stdout
    for rank, node in node_of_rank.items():
        assert f"nodes/{node}/profile/trace-rank{rank}-steps20-30.json" in shown
        assert f"tensorboard --logdir {run}/nodes/{node}/profile" in shown
