"""A job that leaves traps in its run directory, on the real local fleet: the pull brings back no
secret, no device or FIFO, no setuid bit and no file owned by the node's user, ``fab logs`` shows
no ``/dev/zero``, and the run still records its outcome."""

from __future__ import annotations

import json
import os
import shlex
import stat
import subprocess
from pathlib import Path

import pytest

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


WRITE_STEP = """
import hashlib, json, os, sys
step_dir, listed, extra = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
os.makedirs(step_dir, exist_ok=True)
files = {}
for name, size in {**listed, **extra}.items():
    with open(os.path.join(step_dir, name), "wb") as fh:
        fh.write(b"w" * size)
for name, size in listed.items():
    files[name] = {"size": size, "sha256": hashlib.sha256(b"w" * size).hexdigest()}
for name, size in json.loads(sys.argv[4]).items():  # a listed file grown past its claim
    with open(os.path.join(step_dir, name), "ab") as fh:
        fh.write(b"x" * size)
data = json.dumps({"step": 7, "files": files, "created": 1.0}).encode()
with open(os.path.join(step_dir, "MANIFEST.json"), "wb") as fh:
    fh.write(data)
print(hashlib.sha256(data).hexdigest())
"""


def test_a_checkpoint_copy_moves_exactly_the_listed_files_at_their_sizes(
    fleet: LocalFleet, tmp_path: Path
) -> None:
    """A holder's ``step-N/`` with files its manifest does not list (a job's, or bytes smuggled
    past the copy cap): only the listed files reach the other node; a listed file bigger than its
    claim is refused naming it, and nothing is placed."""
    from launch.errors import HostError
    from launch.run.checkpoints import checkpoint_dir, copy_step, ssh_run

    inventory = fleet.inventory()
    holder, target = inventory.hosts[0], inventory.hosts[1]
    known = inventory.write_known_hosts(tmp_path / "known_hosts")
    run_on = ssh_run(known)
    run_id = "copy-listed"
    step_dir = f"$HOME/{checkpoint_dir(run_id)}/step-7"

    def lay(listed: dict[str, int], extra: dict[str, int], grown: dict[str, int]) -> str:
        ok, out = run_on(holder, f'rm -rf "{step_dir}"', 60)
        assert ok, out
        args = " ".join(shlex.quote(json.dumps(a)) for a in (listed, extra, grown))
        ok, out = run_on(
            holder, f'{shlex.quote(holder.python)} -c {shlex.quote(WRITE_STEP)} "{step_dir}" {args}', 60
        )
        assert ok, out
        return out.strip().splitlines()[-1]

    def on_target() -> list[str]:
        ok, out = run_on(target, f'ls -A "{step_dir}" 2>/dev/null || true', 60)
        assert ok, out
        return sorted(out.split())

    try:
        digest = lay({"model.pt": 1024, "optim.pt": 3000}, {"smuggled.bin": 4 << 20, "notes.txt": 10}, {})
        failed = copy_step(holder, [target], run_id, 7, known, tmp_path / "s1", run_on, manifest=digest)
        assert failed == {}
        assert on_target() == ["MANIFEST.json", "model.pt", "optim.pt"], "only the listed files"

        run_on(target, f'rm -rf "{step_dir}"', 60)
        digest = lay({"model.pt": 1024, "optim.pt": 3000}, {}, {"model.pt": 4 << 20})
        with pytest.raises(HostError, match=r"model\.pt: .*but its manifest lists 1024 bytes"):
            copy_step(holder, [target], run_id, 7, known, tmp_path / "s2", run_on, manifest=digest)
        # grown, yet within its size group's cap (1024 and 2000 pulled together): refused after
        digest = lay({"model.pt": 1024, "optim.pt": 2000}, {}, {"model.pt": 476})
        with pytest.raises(HostError, match=r"model\.pt: 1500 bytes, but its manifest lists 1024 bytes"):
            copy_step(holder, [target], run_id, 7, known, tmp_path / "s3", run_on, manifest=digest)
        assert on_target() == [], "nothing placed from a refused copy"
    finally:
        for host in (holder, target):
            run_on(host, f'rm -rf "$HOME/{checkpoint_dir(run_id)}"', 60)
