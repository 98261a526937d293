"""Credentials for a private registry, read on this machine from what ``container.credentials``
names, and kept out of everything fleetrun writes.

``container.credentials`` is the *name* of where the secret lives, never the secret: an
environment variable (``NGC_API_KEY``-like, upper case) or a file (any other text: a path,
``~`` expanded). Either holds ``USER:SECRET`` on one line, as ``docker login`` takes them (for
NVIDIA's NGC the user is literally ``$oauthtoken`` and the secret the API key). The plan, the
dry run and the run record only ever see the name.

The secret goes to each node on the pull script's stdin (``launch.planning.image_pull``), never
in a command line; ``RegistryLogin`` hides it from ``repr`` and ``redact`` takes it out of any
node text before it is printed or recorded.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from launch.errors import SpecError
from launch.reports.safe_text import clean

ENV_NAME = re.compile(r"[A-Z_][A-Z0-9_]{0,127}")
MAX_CREDENTIALS_BYTES = 16 * 1024
FIELD = "container.credentials"


@dataclass(frozen=True)
class RegistryLogin:
    """A user and secret for ``registry``; ``source`` says where they were read (a name only)."""

    registry: str
    username: str
    secret: str = field(repr=False)
    source: str = ""

    def stdin(self) -> bytes:
        """What the pull script reads: the user name on the first line, then the secret."""
        return f"{self.username}\n{self.secret}".encode()

    def redact(self, text: str) -> str:
        return text.replace(self.secret, "[secret]") if self.secret else text


def _where(playbook: str | Path | None) -> str:
    return f"{clean(playbook, 300)}: field '{FIELD}'" if playbook else f"field '{FIELD}'"


def read_login(
    credentials: str, registry: str, playbook: str | Path | None = None, environ: dict[str, str] | None = None
) -> RegistryLogin:
    """The login ``credentials`` names, or a ``SpecError`` naming the playbook, the field and
    what is wrong (unset, unreadable, not ``USER:SECRET``), never the secret itself."""
    env = os.environ if environ is None else environ
    where = _where(playbook)
    if ENV_NAME.fullmatch(credentials):
        if credentials not in env:
            raise SpecError(f"{where}: the environment variable {credentials} is not set on this machine")
        text, source = env[credentials], f"environment variable {credentials}"
    else:
        path = Path(credentials).expanduser()
        try:
            with path.open("rb") as handle:
                data = handle.read(MAX_CREDENTIALS_BYTES + 1)
        except OSError as exc:
            raise SpecError(
                f"{where}: cannot read {clean(path, 300)}: {clean(exc.strerror or exc)}"
            ) from None
        if len(data) > MAX_CREDENTIALS_BYTES:
            raise SpecError(f"{where}: {clean(path, 300)} is larger than {MAX_CREDENTIALS_BYTES} bytes")
        text, source = data.decode("utf-8", "replace"), f"file {clean(path, 300)}"
    text = text.strip("\r\n")
    user, colon, secret = text.partition(":")
    if not colon or not user or not secret or "\n" in text:
        raise SpecError(
            f"{where}: {source} must hold one line USER:SECRET (e.g. $oauthtoken:KEY for nvcr.io)"
        )
    return RegistryLogin(registry, user, secret, source)
