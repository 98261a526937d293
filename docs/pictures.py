"""The docs' pictures, taken from real runs on the local fleet: ``make docs-pictures`` (as root).

Why real: a screenshot drawn by hand drifts from what the commands print. This brings up a
3-node local fleet, runs ``fab doctor`` on it healthy and then with one node's MTU lowered (a
real misconfiguration the doctor names), trains the example (the final frame of the live table
and the end-of-run report), copies that run's loss plot, and tears the fleet down. Terminal
output is captured with colours and written as SVG by Rich (``Console.save_svg``).

Writes ``docs/img/{doctor-healthy,doctor-fault,train}.svg`` and ``docs/img/loss.png``;
``tests/test_docs.py`` checks they exist and are pictures.
"""

from __future__ import annotations

import os
import pty
import select
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pyte
from rich.console import Console
from rich.style import Style
from rich.text import Text

REPO = Path(__file__).resolve().parent.parent
IMG = REPO / "docs" / "img"
FAB = Path(sys.executable).parent / "fab"
PREFIX = "frdoc"
SUBNET = "230"
WIDTH = 110
HEIGHT = 400
"""Rows of the emulated terminal: tall enough that nothing a command prints scrolls away."""


def fab(args: list[str], env: dict[str, str]) -> pyte.Screen:
    """``fab ARGS`` in a real terminal (a pty, emulated by pyte), as a user sees it: the live
    table redraws in place and the screen at the end is what was left on the terminal."""
    screen = pyte.Screen(WIDTH, HEIGHT)
    stream = pyte.ByteStream(screen)
    pid, fd = pty.fork()
    if pid == 0:  # the child: fab on the pty
        os.chdir(REPO)
        os.execve(str(FAB), [str(FAB), *args], {**env, "COLUMNS": str(WIDTH), "LINES": str(HEIGHT)})
    while True:
        ready, _, _ = select.select([fd], [], [], 1.0)
        if not ready:
            continue
        try:
            data = os.read(fd, 65536)
        except OSError:  # the child closed the pty
            break
        if not data:
            break
        stream.feed(data)
    os.waitpid(pid, 0)
    os.close(fd)
    return screen


def _style(char: pyte.screens.Char) -> Style:
    color = None if char.fg == "default" else char.fg
    if color and len(color) == 6 and all(c in "0123456789abcdef" for c in color):
        color = f"#{color}"
    color = {"brown": "yellow"}.get(color or "", color)
    try:
        return Style(color=color, bold=char.bold, italic=char.italics, underline=char.underscore)
    except Exception:  # noqa: BLE001 - an odd colour name: the character, unstyled
        return Style(bold=char.bold)


def save_svg(screen: pyte.Screen, title: str, path: Path) -> None:
    rows = [screen.buffer[y] for y in range(screen.lines)]
    last = max((y for y, row in enumerate(rows) if any(row[x].data.strip() for x in range(WIDTH))), default=0)
    text = Text()
    for y in range(last + 1):
        for x in range(WIDTH):
            char = rows[y][x]
            text.append(char.data, _style(char))
        text.append("\n")
    console = Console(record=True, width=WIDTH, force_terminal=True, file=open(os.devnull, "w"))  # noqa: SIM115
    console.print(text, end="")
    console.save_svg(str(path), title=title)
    print(f"wrote {path.relative_to(REPO)}")


def main() -> int:
    if os.geteuid() != 0:
        print("docs/pictures.py: the local fleet needs root", file=sys.stderr)
        return 2
    IMG.mkdir(parents=True, exist_ok=True)
    home = Path(tempfile.mkdtemp(prefix="fleetrun-pictures-"))
    env = {
        **os.environ,
        "FLEETRUN_HOME": str(home),
        "FLEETRUN_LOCAL_PREFIX": PREFIX,
        "FLEETRUN_LOCAL_SUBNET": SUBNET,
    }
    inventory = f"local:{PREFIX}"
    try:
        fab(["local.up", "--nodes", "3"], env)
        save_svg(fab(["doctor", "--inventory", inventory], env), "fab doctor", IMG / "doctor-healthy.svg")
        # A real fault: node 1's interface MTU lowered, as a misconfigured lab switch port would.
        netns = f"{PREFIX}-node1"
        subprocess.run(
            ["ip", "netns", "exec", netns, "ip", "link", "set", "eth0", "mtu", "1400"], check=False
        )
        save_svg(fab(["doctor", "--inventory", inventory], env), "fab doctor", IMG / "doctor-fault.svg")
        subprocess.run(
            ["ip", "netns", "exec", netns, "ip", "link", "set", "eth0", "mtu", "1500"], check=False
        )
        save_svg(
            fab(["train", "playbooks/digits-ddp.yaml", "--inventory", inventory], env),
            "fab train",
            IMG / "train.svg",
        )
        plots = sorted(home.glob("runs/*/loss.png"))
        if plots:
            shutil.copyfile(plots[-1], IMG / "loss.png")
            print(f"wrote {(IMG / 'loss.png').relative_to(REPO)}")
    finally:
        fab(["local.down"], env)
        shutil.rmtree(home, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
