"""The node-side image pull before a run starts: one shell script per node, run by ``sh -c``.

The script picks the runtime (``auto``: the first of ``RUNTIME_ORDER`` the node has), answers at
once when the image is already there (``podman image exists``, ``docker image inspect``, the
Apptainer SIF file), else pulls it, its output kept in ``image-pull.log`` in the run directory
and its tail on stderr for the laptop to classify (``launch.rules.image_pull``). The last line
of stdout says what happened: ``FLEETRUN_PULL=present RUNTIME`` or ``FLEETRUN_PULL=pulled
RUNTIME``; while Podman pulls, a ``FLEETRUN_PULL_BYTES=N`` line every ``PROGRESS_EVERY_S``
seconds says how much it has received (``launch.run.pull_progress`` shows it per node).

Credentials for a private registry never travel in the script (which is a command line every
user of the machine can read in ``ps``): an auth file for the image's registry alone (the
``auths`` JSON ``docker login`` writes, which Podman's and Apptainer's ``--authfile`` and Docker's
``--config`` read) arrives on the script's stdin, is written into a ``0700`` folder of the run
directory, and is removed on every way out of the script. An image that is an Apptainer file on
the nodes (``/path/image.sif``) is not pulled: the script checks it is there. Pure: text in, text
out.
"""

from __future__ import annotations

import re
import shlex

from launch.planning import remote_layout as layout

RUNTIMES = ("podman", "docker", "apptainer")
RUNTIME_ORDER = RUNTIMES
"""``runtime: auto`` takes the first of these the node has (Podman: daemonless, per user)."""
PULL_LOG = "image-pull.log"
AUTH_DIR = ".registry-auth"
"""In the run directory, ``0700``; holds the runtime's auth file during the pull only."""
SIF_DIR = f"{layout.ROOT}/images"
"""Apptainer's pulled images (SIF files), one per image reference, kept across runs."""
PULL_TIMEOUT_S = 3600
"""An NGC image is 10-20 GB: an hour on a slow link, and the pull answers as soon as it ends."""
RESULT_PREFIX = "FLEETRUN_PULL="
PROGRESS_PREFIX = "FLEETRUN_PULL_BYTES="
"""A line of a podman pull's progress: the bytes of the image received on the node so far."""
PROGRESS_EVERY_S = 2
MAX_PROGRESS_BYTES = 1 << 50
"""A node's progress line above this (1 PiB) is not believed."""
NO_RUNTIME_EXIT = 3
"""The script's exit code when the node has no usable runtime (not a pull failure)."""
DOCKER_HUB = "docker.io"


def registry_of(image: str) -> str:
    """The registry host of an image reference, as the runtimes read it: the first path
    component when it has a dot or a port or is ``localhost``, else Docker Hub."""
    first, slash, _ = image.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost"):
        return first
    return DOCKER_HUB


def sif_name(image: str) -> str:
    """The SIF file name Apptainer's pull of ``image`` is kept under: the reference with every
    character outside ``[A-Za-z0-9._-]`` made ``_`` (``nvcr.io/nvidia/pytorch:24.05-py3`` ->
    ``nvcr.io_nvidia_pytorch_24.05-py3.sif``)."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", image)[:200] + ".sif"


def sif_path(image: str) -> str:
    """Home-relative path of the SIF file for ``image`` (``layout.home`` makes it shell text)."""
    return f"{SIF_DIR}/{sif_name(image)}"


def is_sif_file(image: str) -> bool:
    """``container.image`` naming an Apptainer image file on the nodes (nothing to pull)."""
    return image.startswith("/") and image.endswith(".sif")


def pull_script(image: str, runtime: str, run_id: str, *, login: bool) -> str:
    """The POSIX sh script that makes ``image`` present on one node (see the module's doc).

    ``runtime``: ``auto`` or one of ``RUNTIMES``. ``login``: an auth file (the ``auths`` JSON of
    ``docker login``/``podman login``, for this image's registry only) comes on stdin.
    """
    if runtime != "auto" and runtime not in RUNTIMES:
        raise ValueError(f"runtime {runtime!r}: expected auto or one of {', '.join(RUNTIMES)}")
    sif_file = is_sif_file(image)
    if sif_file:
        wanted: tuple[str, ...] = ("apptainer",)
    else:
        wanted = RUNTIME_ORDER if runtime == "auto" else (runtime,)
    q = shlex.quote
    run_dir = layout.home(layout.rundir(run_id))
    lines = [
        "set -u",
        "umask 077",
        f"image={q(image)}",
        "runtime=''",
        f"for r in {' '.join(wanted)}; do",
        '  if command -v "$r" >/dev/null 2>&1; then runtime=$r; break; fi',
        "done",
        'if [ -z "$runtime" ]; then',
        f"  echo {q('no container runtime on this node: looked for ' + ', '.join(wanted))} >&2",
        f"  exit {NO_RUNTIME_EXIT}",
        "fi",
    ]
    if sif_file:
        return (
            "\n".join(
                lines
                + [
                    f'if [ -s "$image" ]; then echo "{RESULT_PREFIX}present $runtime"; exit 0; fi',
                    'echo "Error: $image: no such image file on this node: not found" >&2',
                    "exit 1",
                ]
            )
            + "\n"
        )
    lines += [
        f'dir="{run_dir}"',
        f'sif="{layout.home(sif_path(image))}"',
        'mkdir -p "$dir" || exit 1',
        f'auth="$dir/{AUTH_DIR}"',
        f'log="$dir/{PULL_LOG}"',
        "trap 'rm -rf \"$auth\"' EXIT",
        "trap 'rm -rf \"$auth\"; exit 130' INT TERM HUP",
        'case "$runtime" in',
        '  podman) present() { podman image exists "$image"; } ;;',
        '  docker) present() { docker image inspect "$image" >/dev/null 2>&1; } ;;',
        '  apptainer) present() { test -s "$sif"; } ;;',
        "esac",
        f'if present; then echo "{RESULT_PREFIX}present $runtime"; exit 0; fi',
        ': >"$log"',
    ]
    if login:
        # the auth file: docker's config.json format, which podman and apptainer read too
        lines += [
            'mkdir -p "$auth" && cat >"$auth/config.json" || exit 1',
            'set -- --authfile "$auth/config.json"',
        ]
    else:
        lines.append("set --")
    docker = 'docker --config "$auth" pull' if login else "docker pull"
    # podman says nothing of a layer's bytes when its output is not a terminal: how far a pull
    # got is the size of the blobs it is downloading, in its big-files folder ($TMPDIR, else
    # /var/tmp: storage*/ of this user, newer than this pull's log). Only stdout stays the
    # channel's: a sleep left by the kill must not hold the command's end back.
    lines += [
        "progress() {",
        "  exec </dev/null 2>/dev/null",
        '  tmp="${TMPDIR:-/var/tmp}"; me=$(id -u)',
        f"  while sleep {PROGRESS_EVERY_S} >/dev/null; do",
        '    kb=$(find "$tmp" -maxdepth 2 -path "$tmp/storage*" -type f -user "$me" -newer "$log" '
        # du may run in several batches, each with its own total: the sum of every total
        "-exec du -ck {} + 2>/dev/null | awk '$2 == \"total\" {s += $1} END {print s + 0}')",
        f'    echo "{PROGRESS_PREFIX}$(( ${{kb:-0}} * 1024 ))"',
        "  done",
        "}",
        "watcher=''",
        'if [ "$runtime" = podman ]; then progress & watcher=$!; fi',
        'trap \'rm -rf "$auth"; [ -z "$watcher" ] || kill "$watcher" 2>/dev/null\' EXIT',
        'case "$runtime" in',
        '  podman) podman pull "$@" "$image" >>"$log" 2>&1 ;;',
        f'  docker) {docker} "$image" >>"$log" 2>&1 ;;',
        f'  apptainer) mkdir -p "$HOME/{SIF_DIR}" && apptainer pull --force "$@" "$sif.part" '
        '"docker://$image" >>"$log" 2>&1 && mv -f "$sif.part" "$sif" ;;',
        "esac",
        "rc=$?",
        'if [ -n "$watcher" ]; then kill "$watcher" 2>/dev/null; wait "$watcher" 2>/dev/null; watcher=""; fi',
        'if [ "$rc" -ne 0 ]; then rm -f "$sif.part"; tail -c 4000 "$log" >&2; exit "$rc"; fi',
        f'echo "{RESULT_PREFIX}pulled $runtime"',
    ]
    return "\n".join(lines) + "\n"


def pull_command(script: str) -> str:
    """The command line that runs ``script`` (no secret is ever part of it)."""
    return f"sh -c {shlex.quote(script)}"


def parse_progress(line: str) -> int | None:
    """The bytes received so far from one progress line of the script (None: not one, or not
    believable: the node's output is untrusted)."""
    if not line.startswith(PROGRESS_PREFIX):
        return None
    digits = line[len(PROGRESS_PREFIX) :].strip()
    if not digits.isascii() or not digits.isdigit() or len(digits) > 16:
        return None
    value = int(digits)
    return value if value <= MAX_PROGRESS_BYTES else None


def parse_pull_result(stdout: str) -> tuple[str, str] | None:
    """``(what, runtime)`` from the script's last result line (``present``/``pulled``), or None."""
    for line in reversed(stdout.splitlines()[-50:]):
        if line.startswith(RESULT_PREFIX):
            parts = line[len(RESULT_PREFIX) :].split()
            if len(parts) == 2 and parts[0] in ("present", "pulled") and parts[1] in RUNTIMES:
                return parts[0], parts[1]
    return None
