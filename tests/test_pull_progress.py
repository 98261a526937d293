"""The image pull's live rows (``launch.run.pull_progress``): a node's progress lines, however
its channel cuts them, reach that node's row; what is not a progress line, or is too long, is
dropped; a node name is never read as markup; a large fleet gets the stage's row alone, naming
the slowest node."""

from __future__ import annotations

import io

from rich.console import Console

from launch.run.pull_progress import MAX_LINE, NODE_ROWS, PullProgress, human


def board(nodes: list[str]) -> PullProgress:
    return PullProgress(Console(file=io.StringIO(), force_terminal=False, width=120), nodes)


def status(progress: PullProgress, node: str) -> str:
    return str(progress.progress.tasks[progress.rows[node]].fields["status"])


def test_lines_cut_anywhere_reach_the_nodes_row() -> None:
    rows = board(["a", "b"])
    feed = rows.on_output("a")
    for chunk in (b"FLEETRUN_PULL", b"_BYTES=1200", b"000\nFLEETRUN_PULL_BYTES=2500000\nFLEET"):
        feed(chunk)
    assert rows.received == {"a": 2_500_000}
    assert status(rows, "a") == "2.5 MB received"
    assert status(rows, "b") == "checking"
    stage = str(rows.progress.tasks[rows.stage].fields["status"])
    assert stage == "0/2 nodes, 2.5 MB received"


def test_other_output_and_overlong_lines_are_dropped() -> None:
    rows = board(["a"])
    feed = rows.on_output("a")
    feed(b"Copying blob sha256:abc\nFLEETRUN_PULL_BYTES=12x\n")
    feed(b"FLEETRUN_PULL_BYTES=" + b"1" * (2 * MAX_LINE))
    feed(b"7\n")  # the end of the overlong line: not believed as a line of its own
    assert rows.received == {}
    feed(b"FLEETRUN_PULL_BYTES=7\n")
    assert rows.received == {"a": 7}


def test_a_finished_node_keeps_its_last_size_and_later_lines_change_nothing() -> None:
    rows = board(["a", "b"])
    rows.on_output("a")(b"FLEETRUN_PULL_BYTES=412000000\n")
    rows.done("a", "pulled")
    rows.on_output("a")(b"FLEETRUN_PULL_BYTES=5\n")
    rows.done("b", "present")
    assert status(rows, "a") == "pulled, 412.0 MB" and status(rows, "b") == "present"
    assert rows.progress.tasks[rows.stage].completed == 2


def test_a_node_name_is_not_markup() -> None:
    rows = board(["[red]n0"])
    assert rows.progress.tasks[rows.rows["[red]n0"]].description == "  \\[red]n0"


def test_a_large_fleet_has_the_stages_row_naming_the_slowest_node() -> None:
    nodes = [f"n{i}" for i in range(NODE_ROWS + 1)]
    rows = board(nodes)
    assert rows.rows == {}
    for i, node in enumerate(nodes):
        rows.on_output(node)(f"FLEETRUN_PULL_BYTES={(i + 1) * 1_000_000}\n".encode())
    rows.done("n0", "pulled")
    stage = str(rows.progress.tasks[rows.stage].fields["status"])
    assert stage == f"1/{NODE_ROWS + 1} nodes, 153.0 MB received, slowest n1 2.0 MB", stage


def test_human_sizes() -> None:
    assert [human(n) for n in (0, 999, 1000, 2_500_000, 1_300_000_000, 20_000_000_000_000)] == [
        "0 B",
        "999 B",
        "1.0 KB",
        "2.5 MB",
        "1.3 GB",
        "20000.0 GB",
    ]
