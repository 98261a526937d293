"""From a preemption notice to SIGTERM on every rank (goal: at most 5 s), and to a durable checkpoint.

On a 2-node local fleet made as a user makes it (``local.up --bucket --spot``: the fleet's own
S3-compatible server as the nodes' bucket, a metadata endpoint at 169.254.169.254 in each node's
namespace, EC2's IMDSv2 flow), 2 ranks per node, the digits trainer checkpointing through the
helper. Once training runs, the laptop's ``fab train`` is killed (what follows is the nodes'
doing), and ``local.preempt``'s notice goes up on the last node. Each rank notes when its SIGTERM arrived (the checkpoint helper's ``signals/rank-<R>``);
the first time ``should_save()`` said yes, and how (``told-rank-<R>``: SIGTERM, the flag file,
or a peer through the all-reduce): the notice goes up on one node, the others hear it from their
peers. The noticed node's watchdog records when a checkpoint made after the notice was in the
bucket (``preempt.json``). One fresh fleet per trial: the watchdogs power the nodes off afterwards.

Usage (root): .venv/bin/python bench/preempt_notice.py [--trials 3]
Prints a table and writes bench/results/preempt_notice.json. The poll interval (1 s) bounds the
notice-to-signal time from below; EC2 gives 120 s of notice, GCE 30 s.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import yaml  # noqa: E402

from launch.fleets.local import LocalFleet  # noqa: E402
from launch.fleets.local.bucket import have_moto  # noqa: E402
from launch.fleets.local.spot import serve_notice  # noqa: E402
from tests.faultkit import wait_for  # noqa: E402

TAG = os.environ.get("FLEETRUN_TEST_TAG", "")
PREFIX = f"frn{TAG}"
SUBNET = 8 + int(os.environ.get("FLEETRUN_TEST_SUBNET_BASE", "0"))
NODES, PROCS = 2, 2
GOAL_S = 5.0


def playbook(tmp: Path) -> Path:
    path = tmp / "job.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "name": "bench-preempt",
                "workdir": str(REPO / "examples" / "digits"),
                "nodes": NODES,
                "procs_per_node": PROCS,
                "entrypoint": "python -m trainer.task --epochs 40 --step-sleep 0.1 --checkpoint-every 10",
                "env": {"OMP_NUM_THREADS": "1"},
                "teardown": "never",
                "stop": {"watcher_lost_after_s": 5},
            }
        )
    )
    return path


def bucket_keys(endpoint: str, bucket: str, prefix: str) -> list[str]:
    import boto3

    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id="fleetrun-bench",
        aws_secret_access_key="fleetrun-bench",
        region_name="us-east-1",
    )
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return [item["Key"] for page in pages for item in page.get("Contents", [])]


def trial(tmp: Path, home: Path) -> dict[str, object]:
    os.environ["FLEETRUN_HOME"] = str(home)  # the fleet's state and fab's, apart from the user's
    fleet = LocalFleet(prefix=PREFIX, subnet=SUBNET)
    fleet.up(NODES, say=lambda _m: None, bucket=True, spot_notices=True)
    try:
        ref = yaml.safe_load(fleet.inventory_path.read_text())["fleet"]
        bucket, endpoint = ref["bucket"], ref["s3_endpoint"]
        fab = subprocess.Popen(
            [
                str(REPO / ".venv" / "bin" / "fab"),
                "train",
                str(playbook(tmp)),
                "--inventory",
                f"local:{PREFIX}",
                "--allow-path",  # the job's code is outside the generated playbook's folder
                str(REPO / "examples" / "digits"),
            ],
            cwd=REPO,
            env={**os.environ, "FLEETRUN_HOME": str(home), "FLEETRUN_RUNS": str(tmp / "runs")},
            stdout=(tmp / "fab.log").open("wb"),
            stderr=subprocess.STDOUT,
        )
        try:
            wait_for(
                lambda: any(
                    k.endswith("/checkpoints/LATEST.json") for k in bucket_keys(endpoint, bucket, "runs/")
                ),
                180,
                "a first checkpoint",
            )
        except AssertionError:
            logs = [
                p.read_text()[-1500:]
                for i in range(NODES)
                for p in fleet.home(i).glob(".fleetrun/runs/*/*.log")
            ]
            raise AssertionError("\n".join([(tmp / "fab.log").read_text()[-3000:], *logs])) from None
        finally:
            fab.kill()
            fab.wait()
        wait_for(lambda: all(any(fleet.home(i).glob(".fleetrun/runs/*")) for i in range(NODES)), 60, "runs")
        run_dirs = [next(iter(fleet.home(i).glob(".fleetrun/runs/*"))) for i in range(NODES)]
        noticed = time.time()
        serve_notice(fleet, fleet.node_name(NODES - 1), 120)  # one node preempted, as on a cloud

        def marks(directories: list[Path], pattern: str) -> list[float]:
            return [
                float(p.read_text().split()[0]) for d in directories for p in (d / "signals").glob(pattern)
            ]

        wait_for(lambda: len(marks(run_dirs[-1:], "rank-*")) == PROCS, 60, "SIGTERM on the node's ranks")
        wait_for(lambda: len(marks(run_dirs, "told-rank-*")) == NODES * PROCS, 60, "every rank told")
        delays = sorted(t - noticed for t in marks(run_dirs[-1:], "rank-*"))
        told = sorted(t - noticed for t in marks(run_dirs, "told-rank-*"))
        record = run_dirs[-1] / "preempt.json"

        def durable_at() -> float:
            data = json.loads(record.read_text()) if record.exists() else {}
            return float(data.get("durable_at") or 0.0)

        wait_for(lambda: durable_at() > 0, 150, "a durable checkpoint")
        return {
            "ranks": NODES * PROCS,
            "notice_to_sigterm_s": delays,
            "notice_to_every_rank_told_s": told,
            "notice_to_durable_s": durable_at() - noticed,
        }
    finally:
        fleet.down(say=lambda _m: None)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--out", default=str(REPO / "bench" / "results" / "preempt_notice.json"))
    args = parser.parse_args()
    if not have_moto():
        print("cannot run: moto[server] is not installed (pip install -e '.[local-bucket]')")
        return 2
    results = []
    with tempfile.TemporaryDirectory(prefix="fleetrun-bench-preempt-") as tmpdir:
        for n in range(args.trials):
            tmp = Path(tmpdir) / f"trial{n}"
            (tmp / "home").mkdir(parents=True)
            results.append(trial(tmp, tmp / "home"))
    header = ("trial", "ranks", "SIGTERM max s", "SIGTERM mean s", "all told s", "durable s")
    print("  ".join(f"{h:>14}" for h in header))
    for n, r in enumerate(results):
        delays, told = r["notice_to_sigterm_s"], r["notice_to_every_rank_told_s"]
        assert isinstance(delays, list) and isinstance(told, list)
        row = (n + 1, r["ranks"], max(delays), statistics.mean(delays), max(told), r["notice_to_durable_s"])
        print("  ".join(f"{v:>14.2f}" if isinstance(v, float) else f"{v:>14}" for v in row))
    worst = max(max(r["notice_to_sigterm_s"]) for r in results)  # type: ignore[call-overload]
    worst_told = max(max(r["notice_to_every_rank_told_s"]) for r in results)  # type: ignore[call-overload]
    verdict = "met" if max(worst, worst_told) <= GOAL_S else "MISSED"
    print(f"notice -> SIGTERM on the noticed node's ranks: worst {worst:.2f} s")
    print(f"notice -> every rank of the job told (SIGTERM, flag or peer): worst {worst_told:.2f} s")
    print(f"goal <= {GOAL_S:.0f} s: {verdict}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "nodes": NODES,
                "procs_per_node": PROCS,
                "poll_interval_s": 1.0,
                "goal_s": GOAL_S,
                "worst_notice_to_sigterm_s": worst,
                "worst_notice_to_every_rank_told_s": worst_told,
                "trials": results,
            },
            indent=2,
        )
    )
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
