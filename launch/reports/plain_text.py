"""``clean``: text from a node, a job or a file made printable, without Rich.

The rule and its reasons are ``launch.reports.safe_text``'s (which re-exports this); it lives
apart so that a command chosen for its start-up time (``fab exec``'s OpenSSH path) can escape a
node's output without importing Rich. Pure: no I/O.
"""

from __future__ import annotations

import re

MAX_FIELD_CHARS = 2_000
"""Default cap for one field (a reason, a node state, a metric key, a file name)."""

MAX_LINE_CHARS = 8_000
"""Cap for one log line shown by ``fab logs``."""

# C0 controls except TAB and LF, DEL, C1 controls, and the Unicode bidirectional overrides and
# isolates that can make a line read differently from what it is ("Trojan Source").
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_CONTROL_NO_NEWLINE = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def clean(value: object, limit: int = MAX_FIELD_CHARS, *, multiline: bool = False) -> str:
    """``value`` as printable text: controls replaced by ``?``, at most ``limit`` characters.

    Non-strings are converted with ``str`` (bytes are decoded as UTF-8 with replacement), so
    a caller can pass whatever a node sent without checking its type first.
    """
    if isinstance(value, bytes | bytearray):
        text = bytes(value[: limit * 4 + 4]).decode("utf-8", errors="replace")
    elif isinstance(value, str):
        text = value
    else:
        try:
            text = str(value)
        except Exception:  # noqa: BLE001 - a hostile __str__ must not break printing
            text = f"<unprintable {type(value).__name__}>"
    cut = 0
    if len(text) > limit:
        cut = len(text) - limit
        text = text[:limit]
    text = (_CONTROL if multiline else _CONTROL_NO_NEWLINE).sub("?", text)
    if cut:
        text += f"... ({cut} more characters)"
    return text
