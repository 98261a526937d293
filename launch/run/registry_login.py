"""Credentials for a private registry, read on this machine from where ``container.credentials``
points, and kept out of everything fleetrun writes.

``container.credentials`` holds only a *name* (``launch.job.container.RegistryCredentials``):
``env`` an environment variable holding ``USER:TOKEN`` (or, for NVIDIA's ``nvcr.io``, the API
key alone: its user is literally ``$oauthtoken``), or ``file`` an auth file as ``docker login`` /
``podman login`` write it (``{"auths": {"REGISTRY": {"auth": base64(USER:TOKEN)}}}``). The plan,
the dry run and the run record only ever see that name.

What goes to the nodes is an auth file for the image's registry alone (the user's other logins
stay here), on the pull script's stdin, never in a command line (``launch.planning.image_pull``).
``RegistryLogin`` hides it from ``repr``; ``redact`` takes the secret out of any node text before
it is printed or recorded.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from launch.errors import SpecError
from launch.job.container import RegistryCredentials
from launch.planning.image_pull import DOCKER_HUB
from launch.reports.safe_text import clean

MAX_AUTH_FILE_BYTES = 1 << 20
FIELD = "container.credentials"
NGC_REGISTRY = "nvcr.io"
NGC_USER = "$oauthtoken"
DOCKER_HUB_KEYS = (DOCKER_HUB, "index.docker.io", "https://index.docker.io/v1/", "registry-1.docker.io")
"""How auth files name Docker Hub: Podman writes ``docker.io``, Docker its v1 index URL."""


@dataclass(frozen=True)
class RegistryLogin:
    """A login for ``registry``: the auth file the nodes get, and where it was read (a name)."""

    registry: str
    username: str
    secret: str = field(repr=False)
    source: str = ""

    def auth_file(self) -> bytes:
        """The ``auths`` JSON for this registry alone (Docker Hub under both of its names)."""
        token = base64.b64encode(f"{self.username}:{self.secret}".encode()).decode()
        keys = (
            ("docker.io", "https://index.docker.io/v1/") if self.registry == DOCKER_HUB else (self.registry,)
        )
        return json.dumps({"auths": {key: {"auth": token} for key in keys}}).encode()

    def redact(self, text: str) -> str:
        for secret in (self.secret, base64.b64encode(f"{self.username}:{self.secret}".encode()).decode()):
            text = text.replace(secret, "[secret]")
        return text


def _where(playbook: str | Path | None) -> str:
    return f"{clean(playbook, 300)}: field '{FIELD}'" if playbook else f"field '{FIELD}'"


def _from_text(text: str, registry: str, where: str, source: str) -> tuple[str, str]:
    text = text.strip("\r\n")
    if "\n" in text or not text:
        raise SpecError(f"{where}: {source} must hold one line USER:TOKEN")
    user, colon, secret = text.partition(":")
    if not colon and registry == NGC_REGISTRY:
        return NGC_USER, text
    if not colon or not user or not secret:
        raise SpecError(
            f"{where}: {source} must hold USER:TOKEN (a token alone only for {NGC_REGISTRY}, whose user is {NGC_USER})"
        )
    return user, secret


def _from_auth_file(data: bytes, registry: str, where: str, source: str) -> tuple[str, str]:
    try:
        auths = json.loads(data).get("auths")
    except (ValueError, AttributeError, RecursionError):
        raise SpecError(f"{where}: {source} is not an auth file (JSON with an 'auths' object)") from None
    if not isinstance(auths, dict):
        raise SpecError(f"{where}: {source} is not an auth file (JSON with an 'auths' object)")
    keys = (
        DOCKER_HUB_KEYS if registry == DOCKER_HUB else (registry, f"https://{registry}", f"http://{registry}")
    )
    entry = next((auths[k] for k in keys if isinstance(auths.get(k), dict) and "auth" in auths[k]), None)
    if entry is None:
        raise SpecError(
            f"{where}: {source} holds no login for {clean(registry, 200)} (a credential helper's logins "
            "cannot be sent: log in with --authfile, or name an environment variable)"
        )
    token = entry.get("auth")
    try:
        user, colon, secret = base64.b64decode(str(token), validate=True).decode().partition(":")
    except (binascii.Error, UnicodeDecodeError):
        colon = ""
    if not colon or not user or not secret:
        raise SpecError(
            f"{where}: {source}: the login for {clean(registry, 200)} is not base64 of USER:TOKEN"
        )
    return user, secret


def read_login(
    credentials: RegistryCredentials,
    registry: str,
    playbook: str | Path | None = None,
    environ: dict[str, str] | None = None,
) -> RegistryLogin:
    """The login ``credentials`` points to for ``registry``, or a ``SpecError`` naming the
    playbook, the field and what is wrong (unset, unreadable, malformed), never the secret."""
    env = os.environ if environ is None else environ
    where = _where(playbook)
    if credentials.env is not None:
        name = credentials.env
        source = f"the environment variable {name}"
        if name not in env:
            raise SpecError(f"{where}: {source} is not set on this machine")
        user, secret = _from_text(env[name], registry, where, source)
        return RegistryLogin(registry, user, secret, source)
    assert credentials.file is not None
    path = Path(credentials.file).expanduser()
    source = f"file {clean(path, 300)}"
    try:
        with path.open("rb") as handle:
            data = handle.read(MAX_AUTH_FILE_BYTES + 1)
    except OSError as exc:
        raise SpecError(f"{where}: cannot read {clean(path, 300)}: {clean(exc.strerror or exc)}") from None
    if len(data) > MAX_AUTH_FILE_BYTES:
        raise SpecError(f"{where}: {source} is larger than {MAX_AUTH_FILE_BYTES} bytes")
    user, secret = _from_auth_file(data, registry, where, source)
    return RegistryLogin(registry, user, secret, source)
