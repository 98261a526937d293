"""The watchdog's own files of a node that cannot be pulled, from the node's copy in the bucket.

When a node's watchdog ends the run with the laptop gone, it runs the playbook's ``before_stop``
hook, uploads the run directory to the fleet's bucket and powers the node off
(``launch.nodelib.fleetrun_guard.shut_down``). The laptop's pull of that node then fails (the
node is gone), so ``fab watch`` and ``fab pull`` fetch what the watchdog wrote from the bucket
instead: the hook's output and result, and the watchdog's outcome and log. Only these named
files, each read through the fleet's own copy command to standard output, bounded: the bucket
copy is written by the node (and the job), so its size is not trusted. The rest of the run
directory (outputs, checkpoints) stays in the bucket; the pull error still stands.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterable

from launch.fleets.clouds import fill
from launch.fleets.kinds.registry import fleet_kind
from launch.job.inventory import Inventory
from launch.reports.safe_text import clean
from launch.run.run_folder import RunFolder
from launch.run.target import bucket_dest

WATCHDOG_FILES = ("before-stop.log", "before-stop-result.json", "guard-outcome.json", "guard.log")
"""What the watchdog writes in the run directory when it ends the run (``fleetrun_guard``)."""
MAX_FILE_BYTES = 8 * 1024**2
"""A file past this is not brought back (a hook's output can be anything the job printed)."""
COPY_TIMEOUT_S = 120.0


def fetch_watchdog_files(
    inventory: Inventory,
    run_id: str,
    folder: RunFolder,
    nodes: Iterable[str],
    say: Callable[[str], None],
    max_bytes: int = MAX_FILE_BYTES,
) -> dict[str, list[str]]:
    """For each of ``nodes`` (those whose pull failed), the watchdog's files from its bucket copy
    into ``nodes/<node>/`` of the run folder, where the pull would have put them; a file the pull
    brought is kept. Returns the names fetched per node; says what came back and what was too
    large. A fleet without a bucket: nothing (its nodes are never powered off with only a
    bucket copy left)."""
    kind = fleet_kind(inventory.fleet)
    fetched: dict[str, list[str]] = {}
    for node in nodes:
        commands = kind.bucket_commands(bucket_dest(run_id, node))
        if commands is None:
            return {}
        target = folder.node_dir(node)
        env = {**os.environ, **commands.env}
        for name in WATCHDOG_FILES:
            if (target / name).exists():
                continue
            argv = fill(commands.copy, src=f"{commands.url}/{name}", dest="-")
            body = _read_bounded(argv, env, max_bytes)
            if body is None:
                continue  # not in the bucket: this watchdog did not end the run, or wrote no such file
            if len(body) > max_bytes:
                say(f"  {clean(node, 100)}: {name} in the bucket is over {max_bytes} bytes: not brought back")
                continue
            target.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=target, prefix=f".{name}.", delete=False) as out:
                out.write(body)
            os.replace(out.name, target / name)
            fetched.setdefault(node, []).append(name)
        if node in fetched:
            say(f"  {clean(node, 100)}: {', '.join(fetched[node])} fetched from the bucket (the watchdog's)")
    return fetched


def _read_bounded(argv: list[str], env: dict[str, str], max_bytes: int) -> bytes | None:
    """The copy command's standard output, at most ``max_bytes + 1`` bytes of it (then the copy
    is killed); None when it failed (no such object, no bucket access) or did not end within
    ``COPY_TIMEOUT_S`` (it is killed then, output or not)."""
    try:
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env
        )
    except OSError:
        return None  # the copy program is not installed here
    assert proc.stdout is not None
    deadline = threading.Timer(COPY_TIMEOUT_S, proc.kill)
    deadline.start()
    chunks: list[bytes] = []
    size = 0
    try:
        while size <= max_bytes and (chunk := proc.stdout.read(min(1 << 16, max_bytes + 1 - size))):
            chunks.append(chunk)
            size += len(chunk)
        if size > max_bytes:
            proc.kill()
        code = proc.wait()
    finally:
        deadline.cancel()
        proc.stdout.close()
    if size > max_bytes:
        return b"".join(chunks)
    return b"".join(chunks) if code == 0 else None
