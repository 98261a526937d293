"""The image pull stage of the run life cycle on the fake fleet: once per node before anything
is synced or started, a failure named in one line with the node and the cause and nothing
started anywhere; a private registry's login reaches the nodes on stdin only."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from launch.run.lifecycle import execute  # noqa: F401 - the life cycle these runs go through
from tests.fakefleet import JobScript, NodeScript, run_on_fake_fleet

CAPTURES = Path(__file__).parent / "container_captures"
IMAGE = "10.60.0.1:5000/lab/digits:1"
SECRET = "pull-secret-8d1e4b"


def pulls(run) -> dict[str, int]:  # type: ignore[no-untyped-def]
    return {name: len(node.pull_inputs) for name, node in run.fleet.nodes.items()}


def test_without_container_nothing_is_pulled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = run_on_fake_fleet(tmp_path, monkeypatch)
    assert run.summary.outcome == "succeeded"
    assert set(pulls(run).values()) == {0}
    assert "pull" not in run.summary.timings


def test_the_image_is_pulled_once_per_node_before_the_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = run_on_fake_fleet(tmp_path, monkeypatch, container={"image": IMAGE})
    assert run.summary.outcome == "succeeded"
    assert pulls(run) == {"n0": 1, "n1": 1}
    assert "pull" in run.summary.timings
    assert "n1: image pulled (podman)" in run.reporter.text
    for node in run.fleet.nodes.values():  # before the sync and the start
        kinds = [
            "pull" if "FLEETRUN_PULL=" in c else "start" if " start " in c else "" for c in node.commands
        ]
        kinds = [k for k in kinds if k]
        assert kinds[0] == "pull"


@pytest.mark.parametrize(
    ("capture", "kind"),
    [
        ("podman_manifest_unknown", "not found"),
        ("podman_unauthorized", "auth"),
        ("podman_no_space", "no space"),
        ("podman_connection_refused", "network"),
    ],
)
def test_a_failed_pull_on_one_node_is_named_and_nothing_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capture: str, kind: str
) -> None:
    output = (CAPTURES / f"{capture}.txt").read_text()
    job = JobScript(nodes={"n1": NodeScript(pull_error=output)})
    run = run_on_fake_fleet(tmp_path, monkeypatch, job, container={"image": IMAGE})
    assert (run.summary.outcome, run.summary.rule, run.summary.failed_nodes) == (
        "failed",
        "pull_failed",
        ("n1",),
    )
    reason = run.summary.reason
    assert reason.startswith(f"pull failed on n1: n1: pulling {IMAGE} failed ({kind}): ")
    assert "\n" not in reason
    assert not any(node.launched for node in run.fleet.nodes.values())
    assert not any(
        " start " in c or "setup.sh" in c for node in run.fleet.nodes.values() for c in node.commands
    )
    assert run.records.get("fake-run-1").state == "failed"


def test_private_registry_secret_reaches_the_nodes_on_stdin_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LAB_REGISTRY_LOGIN", f"lab:{SECRET}")
    container = {"image": IMAGE, "credentials": "$LAB_REGISTRY_LOGIN"}
    run = run_on_fake_fleet(tmp_path, monkeypatch, container=container)
    assert run.summary.outcome == "succeeded"
    token = base64.b64encode(f"lab:{SECRET}".encode()).decode()
    for node in run.fleet.nodes.values():  # delivered: the auth file for this registry, on stdin
        (sent,) = node.pull_inputs
        assert json.loads(sent) == {"auths": {"10.60.0.1:5000": {"auth": token}}}
    leaks = [SECRET, token]
    said = run.reporter.text
    argv = "\n".join(c for node in run.fleet.nodes.values() for c in node.commands)
    shipped = "\n".join(text for node in run.fleet.nodes.values() for text in node.files.values())
    recorded = [p.read_bytes() for p in run.folder.rglob("*") if p.is_file()]
    recorded.append((tmp_path / "runs.db").read_bytes())
    plan = (run.folder / "plan.txt").read_text()  # what --dry-run prints
    for leak in leaks:
        assert leak not in said and leak not in argv and leak not in shipped and leak not in plan
        assert not any(leak.encode() in data for data in recorded)


def test_a_login_the_node_refuses_is_reported_without_the_secret(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LAB_REGISTRY_LOGIN", f"lab:{SECRET}")
    echo = f"Error: reading manifest 1 in 10.60.0.1:5000/lab/digits: unauthorized: authentication required ({SECRET})"
    job = JobScript(nodes={"n0": NodeScript(pull_error=echo)})
    container = {"image": IMAGE, "credentials": "$LAB_REGISTRY_LOGIN"}
    run = run_on_fake_fleet(tmp_path, monkeypatch, job, container=container)
    assert run.summary.rule == "pull_failed"
    assert "(auth)" in run.summary.reason and "[secret]" in run.summary.reason
    assert SECRET not in run.summary.reason and SECRET not in run.reporter.text


def test_each_nodes_row_shows_the_bytes_its_pull_received(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The progress lines a node's pull prints while it runs reach that node's row (here they
    come split across chunks, as a channel may cut them)."""
    from launch.run import pull_progress

    boards: list[pull_progress.PullProgress] = []
    real = pull_progress.PullProgress

    def keep(*args, **kwargs):  # type: ignore[no-untyped-def]
        boards.append(real(*args, **kwargs))
        return boards[-1]

    monkeypatch.setattr("launch.run.stages.PullProgress", keep)
    job = JobScript(nodes={"n0": NodeScript(pull_progress=(0, 5_000_000, 412_000_000))})
    run = run_on_fake_fleet(tmp_path, monkeypatch, container={"image": IMAGE}, job=job)
    assert run.summary.outcome == "succeeded", run.summary.reason
    (board,) = boards
    assert board.received == {"n0": 412_000_000}, "n1 printed no progress"
    assert board.finished == {"n0": "pulled", "n1": "pulled"}
    assert board.progress.tasks[board.rows["n0"]].fields["status"] == "pulled, 412.0 MB"
