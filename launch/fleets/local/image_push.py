"""The test image into the fleet's registry (``launch.fleets.local.registry``), through the
registry's own HTTP API (the OCI Distribution spec: a blob upload per layer, then the manifest).

Why not ``podman push``: it pushes from an image store, and an image in root's shared store is
one every node already reads (``additionalimagestores``), so the nodes' pull would find its layer
there and copy nothing. The registry's copy is also not the shared store's: there every file is
owned by the first id of the node users' shared subordinate range (see
``launch.fleets.local.container_image``), which a node user's rootless podman cannot unpack from a
registry (its namespace maps 65536 ids from 0; that id is not one of them), so here every file is
root's, as in any image a registry serves, and lands as the pulling user's own.

The layer is the same root file system as the shared store's image (``build_rootfs_tar``), gzip
level 1 (what a registry serves is compressed; level 1 keeps the build quick), built once per
content under ``PUSHABLE`` (its name carries the image's tag digest, as the store's image does)
and kept, like the image. ``random_layer`` adds a layer of incompressible bytes of a given size
(``bench/container_pull.py``'s 1 GB image).
"""

from __future__ import annotations

import fcntl
import gzip
import hashlib
import http.client
import io
import json
import os
import shutil
import tarfile
import tempfile
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from launch.errors import LocalFleetError
from launch.fleets.local.container_image import VENV_PATH, build_rootfs_tar, image_tag
from launch.fleets.local.containers import IMAGE_STORE

PUSHABLE = IMAGE_STORE.parent / "pushable"
"""Root-owned layers of the test image, one folder per image tag (kept across fleets)."""
LAYER_TYPE = "application/vnd.oci.image.layer.v1.tar+gzip"
CONFIG_TYPE = "application/vnd.oci.image.config.v1+json"
MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
CHUNK = 1 << 20
IMAGE_ENV = f"PATH={VENV_PATH}:/usr/local/bin:/usr/bin:/bin"


@dataclass(frozen=True)
class Layer:
    """One gzip layer on this machine: its file, its digest and size (of the gzip), and its
    ``diff_id`` (the digest of the tar inside, which the image's config lists)."""

    path: Path
    digest: str
    size: int
    diff_id: str

    def to_json(self) -> dict[str, object]:
        return {"file": self.path.name, "digest": self.digest, "size": self.size, "diff_id": self.diff_id}


def _gzip_tar(tar: Path, out: Path) -> Layer:
    """``tar`` gzipped into ``out``; both digests computed on the way."""
    inner, outer = hashlib.sha256(), hashlib.sha256()

    class Hashing(io.RawIOBase):
        def __init__(self, sink: io.BufferedWriter) -> None:
            self.sink = sink

        def writable(self) -> bool:
            return True

        def write(self, data: bytes) -> int:  # type: ignore[override]
            outer.update(data)
            return self.sink.write(data)

    with open(tar, "rb") as src, open(out, "wb") as sink:
        hashing = Hashing(sink)
        with gzip.GzipFile(fileobj=hashing, mode="wb", compresslevel=1, mtime=0) as zipped:
            while chunk := src.read(CHUNK):
                inner.update(chunk)
                zipped.write(chunk)
    return Layer(out, f"sha256:{outer.hexdigest()}", out.stat().st_size, f"sha256:{inner.hexdigest()}")


def test_image_layer() -> Layer:
    """The test image's root file system, root-owned, as a gzip layer (built once per content)."""
    folder = PUSHABLE / image_tag().rpartition(":")[2]
    PUSHABLE.mkdir(parents=True, exist_ok=True, mode=0o700)
    with open(PUSHABLE / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        meta = folder / "layer.json"
        if not meta.exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir(mode=0o700)
            with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp:
                tar = Path(tmp) / "rootfs.tar"
                build_rootfs_tar(tar, owner=0)
                layer = _gzip_tar(tar, folder / "layer.tar.gz")
            meta.write_text(json.dumps(layer.to_json()))
        data = json.loads(meta.read_text())
        return Layer(folder / data["file"], data["digest"], int(data["size"]), data["diff_id"])


def random_layer(megabytes: int, folder: Path) -> Layer:
    """A layer of one file, ``/opt/fleetrun-pull-bench/filler``, of ``megabytes`` MiB of random
    bytes (incompressible: the pull moves all of it), gzipped into ``folder``."""
    tar = folder / "filler.tar"
    with tarfile.open(tar, "w") as out:
        for name in ("opt", "opt/fleetrun-pull-bench"):
            info = tarfile.TarInfo(name)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            out.addfile(info)
        info = tarfile.TarInfo("opt/fleetrun-pull-bench/filler")
        info.size, info.mode = megabytes * CHUNK, 0o644
        out.addfile(info, _RandomReader(info.size))
    layer = _gzip_tar(tar, folder / "filler.tar.gz")
    tar.unlink()
    return layer


class _RandomReader(io.RawIOBase):
    """``size`` random bytes, read as a file."""

    def __init__(self, size: int) -> None:
        self.left = size

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:  # type: ignore[override]
        n = self.left if n < 0 else min(n, self.left)
        self.left -= n
        return os.urandom(n)


def image_config(layers: list[Layer]) -> bytes:
    """The image's OCI config: the layers' ``diff_id``s and the ``PATH`` leading to the venv."""
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Env": [IMAGE_ENV]},
        "rootfs": {"type": "layers", "diff_ids": [layer.diff_id for layer in layers]},
    }
    return json.dumps(config, sort_keys=True).encode()


def manifest(config: bytes, layers: list[Layer]) -> bytes:
    return json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": MANIFEST_TYPE,
            "config": {
                "mediaType": CONFIG_TYPE,
                "digest": f"sha256:{hashlib.sha256(config).hexdigest()}",
                "size": len(config),
            },
            "layers": [{"mediaType": LAYER_TYPE, "digest": x.digest, "size": x.size} for x in layers],
        }
    ).encode()


class _Registry:
    """Requests to one plain-HTTP registry."""

    def __init__(self, location: str, repository: str) -> None:
        self.location, self.repository = location, repository

    def request(
        self,
        method: str,
        path: str,
        body: bytes | BinaryIO | None = None,
        headers: dict[str, str] | None = None,
    ) -> http.client.HTTPResponse:
        conn = http.client.HTTPConnection(self.location, timeout=300)
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        response.read(65536)
        conn.close()
        return response

    def has_blob(self, digest: str) -> bool:
        return self.request("HEAD", f"/v2/{self.repository}/blobs/{digest}").status == 200

    def upload(self, digest: str, size: int, body: bytes | BinaryIO) -> None:
        started = self.request("POST", f"/v2/{self.repository}/blobs/uploads/")
        where = started.getheader("Location")
        if started.status != 202 or not where:
            raise LocalFleetError(f"registry {self.location}: upload not started ({started.status})")
        url = urllib.parse.urlsplit(where)
        query = f"{url.query}&" if url.query else ""
        path = f"{url.path}?{query}digest={urllib.parse.quote(digest)}"
        headers = {"Content-Length": str(size), "Content-Type": "application/octet-stream"}
        done = self.request("PUT", path, body, headers)
        if done.status != 201:
            raise LocalFleetError(f"registry {self.location}: upload of {digest} refused ({done.status})")


def push(location: str, repository: str, tag: str, layers: list[Layer]) -> str:
    """``layers`` as image ``location/repository:tag`` (a blob the registry has is not sent again);
    the reference."""
    registry = _Registry(location, repository)
    for layer in layers:
        if not registry.has_blob(layer.digest):
            with open(layer.path, "rb") as blob:
                registry.upload(layer.digest, layer.size, blob)
    config = image_config(layers)
    digest = f"sha256:{hashlib.sha256(config).hexdigest()}"
    if not registry.has_blob(digest):
        registry.upload(digest, len(config), config)
    body = manifest(config, layers)
    done = registry.request("PUT", f"/v2/{repository}/manifests/{tag}", body, {"Content-Type": MANIFEST_TYPE})
    if done.status != 201:
        raise LocalFleetError(f"registry {location}: manifest {repository}:{tag} refused ({done.status})")
    return f"{location}/{repository}:{tag}"
