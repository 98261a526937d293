"""The local fleet's container image: its own Python (``/opt/fleetrun/image/venv``, torch CPU) as
an OCI image in the machine's shared image store, which every ``containers=True`` fleet node reads
(``launch.fleets.local.containers``); ``LocalFleet.up(containers=True)`` makes sure it is there,
as a lab's admin keeps the lab's images in its store. No registry is reachable here, so it is
built locally.

A minimal root file system: Debian's ``python3.11`` and its standard library, the shared
libraries that it and the venv's extension modules link (as ``ldd`` lists them), ``sh`` and a few
tools, an ``/etc/passwd``, and the venv itself at the same path it has on the nodes; imported by
root's podman into the shared store (``podman import``), ``PATH`` leading to the venv. Built
once per content (the tag carries a digest of the recipe and the venv), like ``/opt/fleetrun``
itself, under a lock so two sessions never build it at once.

Every file of the image is owned by the first id of the node users' one subordinate range
(``containers.SHARED_SUBIDS``), not by root: root's uid 0 is not mapped in a node user's rootless
namespace, and overlay cannot copy up a file whose owner is unmapped (a mount point such as
``/home/<user>`` could not be made: EOVERFLOW), while the range's first id is container uid 1 in
every node user's namespace. The image also carries an empty ``/run/.containerenv``, which
podman otherwise creates at each start. On a real machine each user pulls the image into their
own store, which maps it; the shared store and range are the local fleet's test arrangement.
"""

from __future__ import annotations

import fcntl
import hashlib
import io
import os
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path

from launch.errors import LocalFleetError
from launch.fleets.local.containers import IMAGE_RUNROOT, IMAGE_STORE, SHARED_SUBIDS
from launch.fleets.local.prereqs import image_dir

RECIPE = "fleetrun-test-image-v5"
IMAGE_NAME = "localhost/fleetrun-test"
LATEST = f"{IMAGE_NAME}:latest"
TOOLS = (
    "sh",
    "dash",
    "env",
    "id",
    "cat",
    "mkdir",
    "sleep",
    "ls",
    "rm",
    "nproc",
    "true",
    "grep",
    "head",
    "tee",
    "ssh",
)
"""``tee`` keeps a Horovod rank's own log and ``ssh`` is the client horovodrun starts the other nodes'
ranks with, from inside the head's container (``launch.planning.launchers.horovod``), as an image
that serves ``launcher: horovod`` must have them."""
VENV_PATH = "/opt/fleetrun/image/venv/bin"


def podman_root(*args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    """Root's podman on the shared store."""
    argv = [
        "podman",
        "--root",
        str(IMAGE_STORE),
        "--runroot",
        str(IMAGE_RUNROOT),
        "--storage-driver",
        "overlay",
    ]
    return subprocess.run([*argv, *args], capture_output=True, text=True, timeout=timeout, check=False)


def image_tag() -> str:
    """The image's reference: the recipe and the venv's installed packages decide it."""
    venv = image_dir() / "venv"
    digest = hashlib.sha256(RECIPE.encode())
    site = sorted((venv / "lib").glob("python3*/site-packages/*.dist-info"))
    for entry in site:
        digest.update(entry.name.encode())
    digest.update(Path("/usr/bin/python3").resolve().name.encode())
    return f"{IMAGE_NAME}:{digest.hexdigest()[:12]}"


def _libraries(paths: list[Path]) -> set[str]:
    """The shared libraries ``paths`` link, by absolute path (``ldd``)."""
    found: set[str] = set()
    for start in range(0, len(paths), 200):
        proc = subprocess.run(
            ["ldd", *map(str, paths[start : start + 200])], capture_output=True, text=True, check=False
        )
        for line in proc.stdout.splitlines():
            for word in line.split():
                if word.startswith("/") and "(" not in word and os.path.exists(word):
                    found.add(word)
    return found


def _real_dir(path: Path) -> Path:
    """``path`` with its folders resolved (``/lib`` is a link to ``usr/lib`` on merged-/usr
    Debian): a file under a linked folder cannot be unpacked."""
    return Path(os.path.realpath(path.parent)) / path.name


OWNER = SHARED_SUBIDS[0]
"""The owner of every file of the image (see the module docstring)."""


def owned_by(owner: int) -> Callable[[tarfile.TarInfo], tarfile.TarInfo]:
    """A tar filter that makes every entry ``owner``'s (uid and gid)."""

    def owned(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid = info.gid = owner
        info.uname = info.gname = ""
        return info

    return owned


def _add(tar: tarfile.TarFile, path: str, owned: Callable[[tarfile.TarInfo], tarfile.TarInfo]) -> None:
    """``path`` and, if it is a link, what it points to (links kept as links)."""
    seen = set(tar.getnames())
    current = _real_dir(Path(path))
    while True:
        name = str(current).lstrip("/")
        if name not in seen:
            for parent in reversed(current.parents[:-1]):
                parent_name = str(parent).lstrip("/")
                if parent_name and parent_name not in seen:
                    tar.add(str(parent), arcname=parent_name, recursive=False, filter=owned)
                    seen.add(parent_name)
            tar.add(str(current), arcname=name, recursive=False, filter=owned)
            seen.add(name)
        if not current.is_symlink():
            return
        target = os.readlink(current)
        current = _real_dir(Path(os.path.normpath(current.parent / target)))


def build_rootfs_tar(out: Path, owner: int = OWNER) -> None:
    """The image's root file system as a tar, every file ``owner``'s (see the module docstring;
    the registry's copy is root's, ``launch.fleets.local.image_push``)."""
    owned = owned_by(owner)
    venv = image_dir() / "venv"
    python = Path("/usr/bin/python3").resolve()
    binaries = [python, *(Path(p) for t in TOOLS if (p := shutil.which(t, path="/usr/bin:/bin")))]
    extensions = [p for p in venv.rglob("*.so*") if p.is_file() and not p.is_symlink()]
    stdlib = python.parent.parent / "lib" / python.name
    libs = _libraries([*binaries, *extensions, *stdlib.glob("lib-dynload/*.so")])
    with tempfile.TemporaryDirectory() as tmp:
        etc = Path(tmp) / "etc"
        etc.mkdir()
        (etc / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534::/:/bin/sh\n")
        (etc / "group").write_text("root:x:0:\nnogroup:x:65534:\n")
        # What podman binds or links in /etc at each start: rootless podman cannot create them in
        # a root-made store's layer ("creating /etc/mtab symlink: permission denied").
        for name in ("hosts", "resolv.conf", "hostname"):
            (etc / name).write_text("")
        (etc / "mtab").symlink_to("/proc/mounts")
        with tarfile.open(out, "w") as tar:
            for top in ("/bin", "/sbin", "/lib", "/lib64"):
                if os.path.islink(top):  # merged /usr: the links themselves
                    tar.add(top, arcname=top.lstrip("/"), recursive=False, filter=owned)
            for path in sorted({*map(str, binaries), *libs}):
                _add(tar, path, owned)
            for link in ("/usr/bin/python3", "/usr/bin/sh"):
                _add(tar, link, owned)
            # A library ``ldd`` listed may sit in the stdlib or the venv (torch's own libraries link
            # each other): already in the tar, and podman refuses a layer with a path twice.
            seen = set(tar.getnames())

            # one entry at a time, never a recursive add: a filter that drops a folder already in
            # the tar (the venv's, when ldd listed a library inside it) drops all it holds too
            def tree(top: Path, arcname: str) -> None:
                for root, dirs, files in os.walk(top):
                    dirs.sort()
                    for name in [
                        root,
                        *(os.path.join(root, f) for f in sorted(files)),
                        *(os.path.join(root, d) for d in dirs if os.path.islink(os.path.join(root, d))),
                    ]:
                        entry = arcname + name[len(str(top)) :]
                        if entry not in seen:
                            seen.add(entry)
                            tar.add(name, arcname=entry, recursive=False, filter=owned)

            tree(stdlib, str(stdlib).lstrip("/"))
            for parent in reversed(venv.parents[:-1]):
                if str(parent).lstrip("/") not in seen:
                    seen.add(str(parent).lstrip("/"))
                    tar.add(str(parent), arcname=str(parent).lstrip("/"), recursive=False, filter=owned)
            tree(venv, str(venv).lstrip("/"))
            tree(etc, "etc")
            for empty in ("tmp", "root", "dev", "proc", "sys", "run"):
                info = tarfile.TarInfo(empty)
                info.type = tarfile.DIRTYPE
                info.mode = 0o1777 if empty == "tmp" else 0o755
                tar.addfile(owned(info))
            marker = tarfile.TarInfo("run/.containerenv")  # podman fills it at each start
            marker.mode = 0o644
            tar.addfile(owned(marker), io.BytesIO(b""))


def _share_store() -> None:
    """Make the store's metadata readable by the node users; the layers' own files keep their modes."""
    for root, dirs, files in os.walk(IMAGE_STORE):
        if os.path.basename(root) == "diff":
            dirs[:] = []
            continue
        os.chmod(root, os.stat(root).st_mode | 0o555)
        for name in files:
            path = os.path.join(root, name)
            if not os.path.islink(path):
                os.chmod(path, os.stat(path).st_mode | 0o444)
    for folder in [IMAGE_STORE, *IMAGE_STORE.parents]:
        if folder == Path("/"):
            break
        os.chmod(folder, os.stat(folder).st_mode | 0o555)


def ensure_container_image() -> str:
    """The image's reference, built into the shared store if it is not there yet."""
    tag = image_tag()
    IMAGE_STORE.parent.mkdir(parents=True, exist_ok=True)
    with open(IMAGE_STORE.parent / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if podman_root("image", "exists", tag, timeout=120).returncode != 0:
            with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp:
                tar = Path(tmp) / "rootfs.tar"
                build_rootfs_tar(tar)
                change = f"ENV PATH={VENV_PATH}:/usr/local/bin:/usr/bin:/bin"
                done = podman_root("import", "--change", change, str(tar), tag)
                if done.returncode != 0:
                    raise LocalFleetError(
                        f"--containers: podman import of the image failed: {done.stderr[-2000:]}"
                    )
        # the name a how-to can show (docs/howto/containers.md): the newest build, whatever its digest
        podman_root("tag", tag, LATEST, timeout=120)
        _share_store()
    return tag
