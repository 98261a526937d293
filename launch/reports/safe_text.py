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

from rich.markup import escape
from rich.text import Text

from launch.reports.plain_text import MAX_FIELD_CHARS, MAX_LINE_CHARS, clean

__all__ = ["MAX_FIELD_CHARS", "MAX_LINE_CHARS", "clean", "markup_safe", "safe_text"]


def markup_safe(value: object, limit: int = MAX_FIELD_CHARS, *, multiline: bool = False) -> str:
    """``clean(value)`` escaped for use inside a Rich markup string."""
    return escape(clean(value, limit, multiline=multiline))


def safe_text(
    value: object, style: str = "", limit: int = MAX_FIELD_CHARS, *, multiline: bool = False
) -> Text:
    """A Rich ``Text`` of ``clean(value)``: printed literally, never parsed as markup."""
    return Text(clean(value, limit, multiline=multiline), style=style)
