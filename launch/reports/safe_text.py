"""Text that came from a node, a job, an inventory or a cloud is data: never markup, never control.

A training job prints ``could not open [/data/shard-7]``; Rich would read ``[/data/shard-7]`` as
a closing tag and raise ``MarkupError`` in the middle of a wrap-up. A log line may carry ESC
sequences that retitle the operator's terminal, clear it, or plant hyperlinks; a metric key may
be a megabyte long. Everything fleetrun prints that it did not write itself goes through one of
these functions first:

* ``clean(value)``: a plain ``str`` with C0/C1 control characters (ESC, BEL, CR, backspace,
  DEL, U+0080-U+009F) and Unicode bidi overrides replaced by ``?``, tabs kept, newlines kept only
  when ``multiline``, and the length capped (what was cut is said, not hidden);
* ``markup_safe(value)``: ``clean`` and then Rich-escaped, for embedding into a markup string
  such as ``f"[red]{markup_safe(reason)}[/]"``;
* ``safe_text(value, style)``: a ``rich.text.Text``, which Rich never parses as markup.

Pure: no I/O, so views and tests can use it anywhere.
"""

from __future__ import annotations

import re

from rich.markup import escape
from rich.text import Text

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


def markup_safe(value: object, limit: int = MAX_FIELD_CHARS, *, multiline: bool = False) -> str:
    """``clean(value)`` escaped for use inside a Rich markup string."""
    return escape(clean(value, limit, multiline=multiline))


def safe_text(
    value: object, style: str = "", limit: int = MAX_FIELD_CHARS, *, multiline: bool = False
) -> Text:
    """A Rich ``Text`` of ``clean(value)``: printed literally, never parsed as markup."""
    return Text(clean(value, limit, multiline=multiline), style=style)
