"""Run several ``fab ...`` command lines through the real CLI in one process (tests only).

Each Python start costs about half a second; the broken-input corpus has around a hundred
cases. This runs each case exactly as ``.venv/bin/fab`` does (``launch.cli.main.fab``: fleetrun's
program, the task, its error handling) with the case's own environment, and reports what a
subprocess would have shown: the exit code, stdout and stderr. An exception that escapes the CLI
is written to that case's stderr as the traceback Python would print, so it still counts.

Input (stdin): a JSON list of ``{"argv": [...], "env": {...}}``. Output (stdout): a JSON list of
``{"code": int, "stdout": str, "stderr": str}`` in the same order.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import traceback


def run_case(argv: list[str], env: dict[str, str]) -> dict[str, object]:
    from launch.cli.main import fab

    saved = dict(os.environ)
    os.environ.update(env)
    out, err = io.StringIO(), io.StringIO()
    code = 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                fab(argv)
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
            except BaseException:  # noqa: BLE001 - what a real process would die with
                err.write("Traceback (most recent call last):\n" + traceback.format_exc())
                code = 1
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return {"code": code, "stdout": out.getvalue(), "stderr": err.getvalue()}


def main() -> None:
    cases = json.load(sys.stdin)
    results = [run_case(case["argv"], case["env"]) for case in cases]
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main()
