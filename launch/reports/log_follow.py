"""``fab logs RUN --follow``: merge every node's log, each line once, across lost connections.

Pure: the shell text each poll runs on a node, the parsing of its answer, the split into complete
lines, and the offsets file. Per node, the *offset* is the byte count of the log already printed
as complete lines. A poll asks for the bytes from that offset on (bounded, base64 so the byte
count is exact whatever the encoding); only complete lines are printed and the offset moves past
them; a partial last line is asked for again next poll, until its newline has arrived. The
offsets are saved after each printed batch, so a follower killed with its connection (or the
laptop's) continues where it stopped when run again, without losing or repeating a line.

The end: a node's log is complete when its ``rc`` file existed *before* the size was read (the
job wrote its last byte before ``rc`` appeared) and the offset reached that size. A last line
without a newline is then printed as it is.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from dataclasses import dataclass

MARK = "#FLEETRUN-LOG"
MAX_CHUNK_BYTES = 1024 * 1024
"""Bytes a poll reads from one node; a line longer than this is printed in pieces."""
MAX_NODES = 100_000
_HEADER_RE = re.compile(rf"{MARK} ended=([01]) size=(\d{{1,15}})")


def follow_command(log_path: str, rc_path: str, offset: int, max_bytes: int = MAX_CHUNK_BYTES) -> str:
    """One poll on one node (paths relative to the node user's home, made by fleetrun)."""
    log, rc = f'"$HOME/{log_path}"', f'"$HOME/{rc_path}"'
    return (
        f"E=0; test -e {rc} && E=1; S=$(wc -c < {log} 2>/dev/null || echo 0); "
        f'echo "{MARK} ended=$E size=$S"; '
        f"tail -c +{int(offset) + 1} {log} 2>/dev/null | head -c {int(max_bytes)} | base64 | tr -d '\\n'; echo"
    )


@dataclass(frozen=True)
class Chunk:
    ended: bool
    size: int
    data: bytes


def parse_answer(stdout: str, max_bytes: int = MAX_CHUNK_BYTES) -> Chunk:
    """The poll's answer, strictly: a header line, then one base64 line of at most ``max_bytes``."""
    lines = stdout.split("\n")
    header = next((i for i, line in enumerate(lines) if line.startswith(MARK)), None)
    if header is None:
        raise ValueError("no log header in the node's answer")
    match = _HEADER_RE.fullmatch(lines[header].strip())
    if match is None:
        raise ValueError("malformed log header")
    encoded = lines[header + 1].strip() if header + 1 < len(lines) else ""
    if len(encoded) > (max_bytes + 2) // 3 * 4:
        raise ValueError("more log bytes than asked for")
    try:
        data = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("the log bytes are not base64") from None
    return Chunk(ended=match.group(1) == "1", size=int(match.group(2)), data=data)


def complete_lines(
    chunk: Chunk, offset: int, max_bytes: int = MAX_CHUNK_BYTES
) -> tuple[list[bytes], int, bool]:
    """(lines to print, the new offset, whether this node's log is done).

    Only lines ending in a newline are printed, except: a chunk of ``max_bytes`` holding no
    newline (one huge line: printed in pieces, or it would never move), and the last line of an
    ended log.
    """
    data = chunk.data
    cut = data.rfind(b"\n") + 1
    final = chunk.ended and offset + len(data) >= chunk.size
    if final or (cut == 0 and len(data) >= max_bytes):
        cut = len(data)
    lines = data[:cut].splitlines()
    new_offset = offset + cut
    return lines, new_offset, chunk.ended and new_offset >= chunk.size


def prefix(node: str, rank: int) -> str:
    return f"{node}/{rank}"


def load_offsets(text: str | None, nodes: list[str]) -> dict[str, int]:
    """Saved offsets for ``nodes`` (0 for a node not saved); anything malformed counts as 0."""
    offsets = dict.fromkeys(nodes, 0)
    if not text:
        return offsets
    try:
        data = json.loads(text)
    except ValueError:
        return offsets
    if not isinstance(data, dict):
        return offsets
    for name in nodes:
        value = data.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**53:
            offsets[name] = value
    return offsets


def dump_offsets(offsets: dict[str, int]) -> str:
    return json.dumps(dict(list(offsets.items())[:MAX_NODES]), sort_keys=True)
