"""A job that leaves traps in its run directory, on the real local fleet: the pull brings back no
secret, no device or FIFO, no setuid bit and no file owned by the node's user, ``fab logs`` shows
no ``/dev/zero``, and the run still records its outcome."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

from launch.fleets.local import LocalFleet
from tests.conftest import REPO, needs_root, write_playbook

pytestmark = needs_root()

HOSTILE = """
import os, sys
run, out, secret = os.environ["FLEETRUN_RUN_DIR"], os.environ["FLEETRUN_OUTPUT_DIR"], sys.argv[1]
os.makedirs(out, exist_ok=True)
os.symlink(secret, os.path.join(out, "stolen.txt"))
os.symlink("/dev/zero", os.path.join(out, "zeros"))
os.mkfifo(os.path.join(out, "pipe"))
with open(os.path.join(out, "suid.bin"), "w") as fh:
    fh.write("#!/bin/sh\\nid\\n")
os.chmod(os.path.join(out, "suid.bin"), 0o6755)
with open(os.path.join(out, "model.txt"), "w") as fh:
    fh.write("weights\\n")
os.symlink(secret, os.path.join(run, "metrics.jsonl.tmp"))
os.replace(os.path.join(run, "metrics.jsonl.tmp"), os.path.join(run, "metrics.jsonl"))
os.symlink("/dev/zero", os.path.join(run, "node.log.tmp"))
os.replace(os.path.join(run, "node.log.tmp"), os.path.join(run, "node.log"))
print("traps laid")
"""


def test_pull_of_a_hostile_run_directory_is_safe(
    fleet: LocalFleet, fleetrun_home: Path, tmp_path: Path
) -> None:
    secret = tmp_path / "laptop-secret.txt"
    secret.write_text("aws_secret_access_key = must-not-be-copied\n")
    workdir = tmp_path / "hostile"
    workdir.mkdir()
    (workdir / "hostile.py").write_text(HOSTILE)
    playbook = write_playbook(
        tmp_path / "job.yaml", workdir, name="t-hostile", nodes=2, entrypoint=f"python hostile.py {secret}"
    )
    runs = tmp_path / "runs"
    env = {**os.environ, "FLEETRUN_HOME": str(fleetrun_home), "FLEETRUN_RUNS": str(runs)}
    fab = str(REPO / ".venv" / "bin" / "fab")
    proc = subprocess.run(
        [fab, "train", str(playbook), "--inventory", f"local:{fleet.prefix}"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    (run,) = list(runs.iterdir())
    summary = json.loads((run / "summary.json").read_text())
    assert summary["outcome"] in ("succeeded", "failed", "stopped"), proc.stdout[-3000:]
    assert summary["pull_errors"] == {}, summary["pull_errors"]
    head = run / "nodes" / fleet.node_name(0)
    assert (head / "outputs" / "model.txt").read_text() == "weights\n", "ordinary outputs came back"
    for path in run.rglob("*"):
        info = path.lstat()
        assert stat.S_ISREG(info.st_mode) or stat.S_ISDIR(info.st_mode) or stat.S_ISLNK(info.st_mode), path
        assert not info.st_mode & (stat.S_ISUID | stat.S_ISGID), f"{path} kept a setuid/setgid bit"
        assert info.st_uid == os.getuid(), f"{path} is owned by the node's user"
        if stat.S_ISLNK(info.st_mode):
            assert not path.exists(), f"{path} is a link that resolves here ({os.readlink(path)})"
        elif stat.S_ISREG(info.st_mode):
            assert b"must-not-be-copied" not in path.read_bytes(), f"the secret was copied into {path}"
    assert not (head / "outputs" / "pipe").exists() and not (head / "outputs" / "pipe").is_symlink()
    assert not (run / "metrics.jsonl").exists(), "a linked metrics.jsonl is not rank 0's metrics"
    logs = subprocess.run(
        [fab, "logs", run.name], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    assert logs.returncode == 0, logs.stderr[-2000:]
    assert "node.log: not read" in logs.stdout and len(logs.stdout) < 100_000
