"""``fab logs --follow``'s pure part: only complete lines, exact byte offsets, strict answers, and
the node-side command run for real against a growing file."""

from __future__ import annotations

import base64
import os
import subprocess
from pathlib import Path

import pytest

from launch.reports.log_follow import (
    MARK,
    Chunk,
    complete_lines,
    dump_offsets,
    follow_command,
    load_offsets,
    parse_answer,
)


def answer(data: bytes, ended: bool = False, size: int = 0) -> str:
    return f"{MARK} ended={int(ended)} size={size}\n{base64.b64encode(data).decode()}\n"


def test_a_partial_last_line_waits_for_its_newline() -> None:
    lines, offset, done = complete_lines(parse_answer(answer(b"one\ntwo\nthr", size=11)), 0)
    assert (lines, offset, done) == ([b"one", b"two"], 8, False)
    lines, offset, done = complete_lines(parse_answer(answer(b"three\n", size=14)), offset)
    assert (lines, offset, done) == ([b"three"], 14, False)


def test_an_ended_log_prints_its_unterminated_last_line_and_is_done() -> None:
    chunk = Chunk(ended=True, size=9, data=b"a\nno-eol")
    assert complete_lines(chunk, 1) == ([b"a", b"no-eol"], 9, True)
    assert complete_lines(Chunk(ended=True, size=9, data=b""), 9) == ([], 9, True)
    # ended, but this chunk was cut short by the bound: not done, partial line kept
    assert complete_lines(Chunk(ended=True, size=100, data=b"x\ny"), 0) == ([b"x"], 2, False)


def test_one_huge_line_moves_in_pieces_instead_of_stalling() -> None:
    lines, offset, done = complete_lines(Chunk(False, 0, b"z" * 16), 5, max_bytes=16)
    assert (lines, offset, done) == ([b"z" * 16], 21, False)


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "garbage\n",
        f"{MARK} ended=2 size=1\n\n",
        f"{MARK} ended=1 size=-1\n\n",
        f"{MARK} ended=1 size=1; rm -rf /\n\n",
        f"{MARK} ended=0 size=1\n!!notbase64!!\n",
        f"{MARK} ended=0 size=1\n" + "QUFB" * 10 + "\n",
    ],
)
def test_malformed_answers_are_refused(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_answer(bad, max_bytes=16)


def test_offsets_file_is_validated_and_round_trips() -> None:
    assert load_offsets(dump_offsets({"n0": 12, "n1": 0}), ["n0", "n1", "n2"]) == {"n0": 12, "n1": 0, "n2": 0}
    hostile = '{"n0": -5, "n1": true, "n2": "7", "n3": 1e30, "x": 3}'
    assert load_offsets(hostile, ["n0", "n1", "n2", "n3"]) == {"n0": 0, "n1": 0, "n2": 0, "n3": 0}
    assert load_offsets("[1, 2]", ["n0"]) == {"n0": 0} and load_offsets("{", ["n0"]) == {"n0": 0}


def test_the_node_command_reads_exact_bytes_from_the_offset(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    log = run / "node.log"
    payload = "é line\n".encode() + b"\xff\xfe raw\n" + b"partial"
    log.write_bytes(payload)

    def poll(offset: int) -> Chunk:
        out = subprocess.run(
            ["sh", "-c", follow_command("run/node.log", "run/rc", offset)],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "HOME": str(tmp_path)},
        ).stdout
        return parse_answer(out)

    first = poll(0)
    assert (first.ended, first.size, first.data) == (False, len(payload), payload)
    lines, offset, done = complete_lines(first, 0)
    assert lines == ["é line".encode(), b"\xff\xfe raw"] and not done
    with log.open("ab") as fh:
        fh.write(b" done\nlast")
    (run / "rc").write_text("0")
    second = poll(offset)
    assert complete_lines(second, offset) == ([b"partial done", b"last"], len(payload) + 10, True)
    missing = subprocess.run(
        ["sh", "-c", follow_command("nope/node.log", "nope/rc", 0)],
        capture_output=True,
        text=True,
        env={**os.environ, "HOME": str(tmp_path)},
    ).stdout
    assert parse_answer(missing) == Chunk(False, 0, b""), "no log yet: nothing, and not done"
