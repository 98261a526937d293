"""Remote text is data: no markup errors, no terminal control sequences, bounded length."""

from __future__ import annotations

from rich.console import Console

from launch.reports.safe_text import clean, markup_safe, safe_text
from tests.conftest import quiet_console

HOSTILE = [
    "could not open [/data/shard-7]",
    "[bold red]fake[/]",
    "\x1b]0;pwned title\x07",
    "\x1b[2J\x1b[H cleared",
    "\x1b]8;;http://evil.example\x1b\\link\x1b]8;;\x1b\\",
    "carriage\rreturn",
    "c1 \x9b31m control",
    "trojan \u202e esrever",
    "nul \x00 byte",
]


def test_clean_strips_every_control_but_tab() -> None:
    for value in HOSTILE:
        out = clean(value + "\tx")
        assert "\t" in out
        assert not any(ord(c) < 0x20 and c != "\t" for c in out), repr(out)
        assert not any(0x7F <= ord(c) <= 0x9F for c in out), repr(out)
        assert "\u202e" not in out


def test_clean_keeps_newlines_only_when_multiline() -> None:
    assert clean("a\nb") == "a?b"
    assert clean("a\nb", multiline=True) == "a\nb"


def test_clean_caps_length_and_says_so() -> None:
    out = clean("x" * 10_000, 100)
    assert out.startswith("x" * 100) and out.endswith("(9900 more characters)")


def test_clean_accepts_any_type() -> None:
    class Hostile:
        def __str__(self) -> str:
            raise RuntimeError("no")

    assert clean(b"\xff\xfe bytes") == "\ufffd\ufffd bytes"
    assert clean(None) == "None"
    assert clean(Hostile()) == "<unprintable Hostile>"


def test_markup_and_text_print_literally_without_controls() -> None:
    console, buf = quiet_console()
    for value in HOSTILE:
        console.print(f"[red]reason:[/] {markup_safe(value)}")
        console.print(safe_text(value, style="bold"))
    out = buf.getvalue()
    assert "could not open [/data/shard-7]" in out
    assert "[bold red]fake[/]" in out
    assert "\x1b" not in out and "\x07" not in out and "\x9b" not in out


def test_a_real_terminal_gets_no_control_from_remote_text() -> None:
    import io

    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, color_system=None, width=200)
    for value in HOSTILE:
        console.print(safe_text(value))
    assert "\x1b]" not in buf.getvalue() and "\x07" not in buf.getvalue()
