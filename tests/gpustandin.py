"""Put the scripted ``nvidia-smi``, ``dmesg`` and ``dcgmi`` stand-ins of ``tests/gpu_standin/`` somewhere.

The scripts print NVIDIA's documented formats from a scenario file beside them; ``install`` copies
them into a folder (a node's ``~/fakebin``, or a temporary folder put first on ``PATH``) and
``write_scenario`` rewrites the file, which the stand-ins re-read at every call. ``nvidia-smi`` and
``dmesg`` are ``answer.sh`` in front of the Python script (``NAME.script``): it renders an answer once
per arguments and scenario content, since Python's start-up at every call was most of the doctor's
GPU cost on the shared local fleet. ``replay`` makes a scenario that answers with a real capture
from ``tests/gpu_captures`` instead of the scripted rendering.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

SOURCE = Path(__file__).resolve().parent / "gpu_standin"
SCENARIO = "gpu-standin.json"
FRONTED = ("nvidia-smi", "dmesg")
"""Installed as ``answer.sh`` (which keeps each answer, see there) in front of ``NAME.script``."""
ANSWERS = ".answers"


def install(
    folder: Path,
    scenario: dict[str, Any] | None = None,
    owner: tuple[int, int] | None = None,
    dcgm: bool = False,
) -> Path:
    """The stand-ins in ``folder``; ``dcgmi`` too with ``dcgm`` (a node without DCGM otherwise:
    most labs have only the driver's tools)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in FRONTED:
        shutil.copy(SOURCE / "answer.sh", folder / name)
        shutil.copy(SOURCE / f"{name}.script", folder / f"{name}.script")
        (folder / name).chmod(0o755)
    if dcgm:
        shutil.copy(SOURCE / "dcgmi", folder / "dcgmi")
        (folder / "dcgmi").chmod(0o755)
    shutil.rmtree(folder / ANSWERS, ignore_errors=True)
    write_scenario(folder, scenario or {"count": 8})
    if owner is not None:
        for path in (folder, *folder.iterdir()):
            os.chown(path, *owner)
    return folder


CAPTURES = Path(__file__).resolve().parent / "gpu_captures"


def replay(
    folder: Path,
    q: str | None = None,
    text: str | None = None,
    query: str | None = None,
    error: tuple[str, str, int] | None = None,
) -> dict[str, Any]:
    """A scenario that answers ``nvidia-smi -q`` with a real capture (``q``: its folder under
    ``tests/gpu_captures``, e.g. ``smi-q/h100-sxm-565.57.01``), copied beside the stand-in; with
    ``text``, that text instead of the capture's, for a derived fault (the caller marks it so).
    With ``query`` (a ``query-csv`` capture's folder), a ``--query-gpu`` for any of the fields that
    capture was made with is answered with those columns of it (``project`` in the stand-in).
    With ``error`` (a ``smi-error`` capture's folder, the stream and the exit status it was
    printed with), every nvidia-smi command answers with that capture instead.
    Every other nvidia-smi command is refused (no capture answers it), and the kernel log holds no
    Xid line."""
    replayed: dict[str, Any] = {}
    folder.mkdir(parents=True, exist_ok=True)
    if q is not None:
        body = text if text is not None else (CAPTURES / q / "output.txt").read_text()
        # named by its content: the scenario changes with it, so no answer kept for another is given
        name = f"capture-q-{hashlib.sha256(body.encode()).hexdigest()[:16]}.txt"
        (folder / name).write_text(body)
        (folder / name).chmod(0o644)
        replayed["q"] = name
    if query is not None:
        table = (CAPTURES / query / "output.csv").read_bytes()
        name = f"capture-query-{hashlib.sha256(table).hexdigest()[:16]}.csv"
        (folder / name).write_bytes(table)
        (folder / name).chmod(0o644)
        fields = (CAPTURES / query / "query.txt").read_text().strip()
        replayed["query"] = {"fields": fields, "file": name, "project": True}
    if error is not None:
        capture, stream, code = error
        said = (CAPTURES / capture / "output.txt").read_bytes()
        name = f"capture-error-{hashlib.sha256(said).hexdigest()[:16]}.txt"
        (folder / name).write_bytes(said)
        (folder / name).chmod(0o644)
        replayed["error"] = {"file": name, "stream": stream, "exit": code}
    return {"replay": replayed}


def write_scenario(folder: Path, scenario: dict[str, Any]) -> None:
    tmp = folder / (SCENARIO + ".tmp")
    tmp.write_text(json.dumps(scenario))
    tmp.chmod(0o644)
    tmp.replace(folder / SCENARIO)


def xid(gpu: int, code: int, at: str, text: str) -> dict[str, Any]:
    """An Xid line of GPU ``gpu`` (its stand-in bus id), as the kernel would log it."""
    return {"bus": f"0000:{0x18 + 0x10 * gpu:02x}:00", "code": code, "at": at, "text": text}


def node_path(folder: Path) -> str:
    """``PATH`` for running the reader in this process as a node would: the stand-ins first, then
    the system's folders only. A local-fleet node's user has no pyenv shim on its PATH, so the
    stand-ins start on ``/usr/bin/python3`` (some 20 ms); through root's pyenv shim each start
    costs some 0.3 s of CPU, and five reads at once on a loaded 2-core machine ran past the
    reader's 8 s tool timeout (a suite run, 2026-11-25: GPU facts 'unknown' instead of the
    scripted Xid)."""
    return f"{folder}:/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin"
