"""Checks on the shell text a playbook carries (entrypoint, setup lines, env values). Pure.

The entrypoint is kept as the shell text the user wrote (so ``$FLEETRUN_OUTPUT_DIR`` and quoting
mean what they mean in a terminal), but fleetrun puts it after ``exec`` and after torchrun's own
arguments, and judges the run by its exit code. A shell *control operator* there changes what
that exit code means: ``python train.py | tee log`` exits with tee's status, so a failed rank
reads as a success; ``a && b``, ``a; b`` and ``a &`` run things torchrun never sees. Those belong
in a script the entrypoint runs, and the check below says so. Redirections (``> log``,
``2>&1``) and command substitutions (``$(date +%s)``) do not change the exit status and stay
allowed.
"""

from __future__ import annotations

import re

CONTROL_CHARS = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f]")
"""C0/C1 controls other than TAB: a newline in a one-line field is a second command."""


def control_operators(text: str) -> list[str]:
    """The shell control operators in ``text`` outside quotes and substitutions, in order.

    A small scanner for POSIX sh words: single and double quotes, backslash escapes,
    ``$(...)``/backquote substitutions and ``${...}`` are skipped; what remains is checked
    for ``|``, ``||``, ``&``, ``&&``, ``;``, ``;;``, ``(``, ``)`` and newlines. ``>&``/``<&``
    (descriptor duplication) and ``>|`` are redirections, not operators.
    """
    found: list[str] = []
    i, n = 0, len(text)
    while i < n:
        skipped = _skip_quoting(text, i)
        if skipped != i:
            i = skipped
            continue
        c = text[i]
        if c == "`":
            end = text.find("`", i + 1)
            i = n if end < 0 else end + 1
            continue
        if c == "$" and i + 1 < n and text[i + 1] in "({":
            i = _skip_balanced(text, i + 1)
            continue
        if c in "|&;()\n":
            prev = text[i - 1] if i else ""
            if c == "&" and prev in "<>":
                i += 1
                continue
            if c == "|" and prev == ">":
                i += 1
                continue
            op = c
            if i + 1 < n and text[i + 1] == c and c in "|&;":
                op += c
            found.append("newline" if op == "\n" else op)
            i += len(op)
            continue
        i += 1
    return found


def _skip_quoting(text: str, i: int) -> int:
    """The index after a backslash escape or a quoted string starting at ``i``; ``i`` when none does."""
    c = text[i]
    if c == "\\":
        return i + 2
    if c == "'":
        end = text.find("'", i + 1)
        return len(text) if end < 0 else end + 1
    if c == '"':
        return _skip_double_quoted(text, i + 1)
    return i


def _skip_double_quoted(text: str, i: int) -> int:
    n = len(text)
    while i < n:
        c = text[i]
        if c == "\\":
            i += 2
        elif c == '"':
            return i + 1
        elif c == "$" and i + 1 < n and text[i + 1] in "({":
            i = _skip_balanced(text, i + 1)
        elif c == "`":
            end = text.find("`", i + 1)
            i = n if end < 0 else end + 1
        else:
            i += 1
    return n


def _skip_balanced(text: str, i: int) -> int:
    """From an opening ``(`` or ``{`` at ``i``, the index after its match (quotes respected)."""
    opening = text[i]
    closing = ")" if opening == "(" else "}"
    depth, n = 0, len(text)
    while i < n:
        skipped = _skip_quoting(text, i)
        if skipped != i:
            i = skipped
            continue
        c = text[i]
        if c == opening:
            depth += 1
        elif c == closing:
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return n
