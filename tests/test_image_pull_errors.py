"""The pull error classifier on real runtime output (``tests/container_captures``: each capture
beside a ``.source`` naming where it came from and the kind it must get)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from launch.rules.image_pull import KINDS, classify_pull_error, deciding_line

CAPTURES = Path(__file__).parent / "container_captures"
CAPTURE_FILES = sorted(CAPTURES.glob("*.txt"))


def expected_kind(capture: Path) -> str:
    source = capture.with_suffix(".source").read_text()
    match = re.search(r"expected kind: (\w+)", source)
    assert match, f"{capture.name}: its .source does not say the expected kind"
    return match.group(1)


def test_every_capture_has_a_source() -> None:
    assert len(CAPTURE_FILES) >= 12
    for capture in CAPTURE_FILES:
        source = capture.with_suffix(".source").read_text()
        assert "github.com" in source or "captured on this machine" in source, capture.name
        assert expected_kind(capture) in KINDS


@pytest.mark.parametrize("capture", CAPTURE_FILES, ids=lambda p: p.stem)
def test_real_capture_is_classified(capture: Path) -> None:
    error = classify_pull_error(capture.read_text())
    assert error.kind == expected_kind(capture)
    assert "\n" not in error.line("registry.example/lab/img:1")


def test_every_kind_but_unknown_has_captures_from_two_runtimes_or_here() -> None:
    kinds = {expected_kind(c) for c in CAPTURE_FILES}
    assert kinds == {"auth", "not_found", "no_space", "network"}
    runtimes = {c.stem.split("_")[0] for c in CAPTURE_FILES}
    assert runtimes == {"podman", "docker", "apptainer"}


def test_deciding_line_is_the_runtime_error_not_the_progress() -> None:
    text = (CAPTURES / "podman_connection_refused.txt").read_text()
    line = deciding_line(text)
    assert line.startswith("Error: initializing source")
    assert "retrying" not in line


def test_a_permission_denied_socket_is_network_not_auth() -> None:
    # "socket: permission denied" in a DNS failure must not read as a registry's refusal
    assert classify_pull_error((CAPTURES / "podman_dns_refused.txt").read_text()).kind == "network"


def test_unmatched_text_is_unknown_and_escaped() -> None:
    error = classify_pull_error(b"Error: something odd \x1b[31mred\x1b[0m happened\n")
    assert error.kind == "unknown"
    assert "\x1b" not in error.detail
    assert "image-pull.log" in error.hint


def test_only_the_tail_is_read() -> None:
    noise = "Copying blob 0123abcd done\n" * 100_000
    error = classify_pull_error(noise + "Error: reading manifest 1 in r/x: manifest unknown\n")
    assert error.kind == "not_found"
