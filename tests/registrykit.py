"""An image registry FOR TESTS: Debian's ``docker-registry`` (distribution 2.8) on a given address,
plain HTTP, its storage in a temporary folder, optionally behind an htpasswd login.

``LocalRegistry`` is a context manager: it starts the registry, waits for ``/v2/`` to answer,
and on the way out stops it (its process, by pid) and removes its storage: nothing is left.
``podman_env`` gives a Podman of its own (storage, registries.conf naming the registry as
insecure) so the tests never touch another user's images. ``tiny_image`` makes a one-file image
with ``podman import`` and pushes it.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tarfile
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from tests.s3server import free_port

REGISTRY_BIN = "docker-registry"


def have_registry() -> bool:
    return shutil.which(REGISTRY_BIN) is not None and shutil.which("podman") is not None


def registries_conf(*locations: str) -> str:
    """A registries.conf that lets Podman use each ``host:port`` over plain HTTP."""
    return "".join(f'[[registry]]\nlocation = "{loc}"\ninsecure = true\n\n' for loc in locations)


def storage_conf(root: Path) -> str:
    """Podman storage in ``root`` (vfs: no overlay or fuse needed, nothing shared)."""
    return f'[storage]\ndriver = "vfs"\ngraphroot = "{root}/graph"\nrunroot = "{root}/run"\n'


def podman_env(root: Path, *registries: str) -> dict[str, str]:
    """The environment of a Podman whose images live in ``root`` and which reaches
    ``registries`` over plain HTTP."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "registries.conf").write_text(registries_conf(*registries))
    (root / "storage.conf").write_text(storage_conf(root))
    return {
        **os.environ,
        "CONTAINERS_REGISTRIES_CONF": str(root / "registries.conf"),
        "CONTAINERS_STORAGE_CONF": str(root / "storage.conf"),
    }


class LocalRegistry:
    """``docker-registry serve`` on ``address`` (a free port), until the ``with`` block ends."""

    def __init__(
        self, address: str = "127.0.0.1", port: int | None = None, users: dict[str, str] | None = None
    ):
        self.address = address
        self.port = port or free_port(address)
        self.users = users or {}
        self.folder = Path(tempfile.mkdtemp(prefix="fleetrun-registry-"))
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def location(self) -> str:
        return f"{self.address}:{self.port}"

    def config(self) -> str:
        text = (
            "version: 0.1\n"
            "log: {level: error}\n"
            f"storage: {{filesystem: {{rootdirectory: {self.folder}/data}}, delete: {{enabled: true}}}}\n"
            f"http: {{addr: '{self.location}'}}\n"
        )
        if self.users:
            import bcrypt

            lines = [
                f"{u}:{bcrypt.hashpw(p.encode(), bcrypt.gensalt(rounds=5)).decode()}"
                for u, p in self.users.items()
            ]
            (self.folder / "htpasswd").write_text("\n".join(lines) + "\n")
            text += f"auth: {{htpasswd: {{realm: fleetrun-tests, path: {self.folder}/htpasswd}}}}\n"
        return text

    def __enter__(self) -> LocalRegistry:
        (self.folder / "config.yml").write_text(self.config())
        log = (self.folder / "registry.log").open("wb")
        self.process = subprocess.Popen(
            [REGISTRY_BIN, "serve", str(self.folder / "config.yml")],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"http://{self.location}/v2/", timeout=2).close()
                break
            except urllib.error.HTTPError:  # 401 behind a login: it answers
                break
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    tail = (self.folder / "registry.log").read_text()[-2000:]
                    self.stop()
                    raise RuntimeError(f"docker-registry did not start on {self.location}: {tail}") from None
                time.sleep(0.1)
        return self

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(10)
        self.process = None
        shutil.rmtree(self.folder, ignore_errors=True)

    def __exit__(self, *exc: object) -> None:
        self.stop()


def tiny_image(env: dict[str, str], work: Path, target: str, creds: tuple[str, str] | None = None) -> None:
    """A one-file image made with ``podman import`` and pushed to ``target`` (then removed from
    the local store, so a pull has to fetch it)."""
    work.mkdir(parents=True, exist_ok=True)
    payload = work / "hello.txt"
    payload.write_text("fleetrun pull test\n")
    archive = work / "rootfs.tar"
    with tarfile.open(archive, "w") as tar:
        tar.add(payload, arcname="hello.txt")
    local = "localhost/fleetrun-pulltest:1"
    subprocess.run(["podman", "import", "-q", str(archive), local], env=env, check=True, capture_output=True)
    push = ["podman", "push", "-q", "--tls-verify=false"]
    if creds is not None:
        push += ["--creds", f"{creds[0]}:{creds[1]}"]
    subprocess.run([*push, local, target], env=env, check=True, capture_output=True)
    subprocess.run(["podman", "rmi", "-f", local, target], env=env, check=False, capture_output=True)
