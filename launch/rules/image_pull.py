"""Why an image pull failed on a node, from what the runtime printed: auth, not found, no space,
network (or unknown), each with what to do about it.

The texts are the runtimes' own: Podman (and Buildah/Skopeo, which share containers/image),
Docker's daemon answers and Apptainer's ``FATAL:`` lines. ``tests/container_captures`` holds real
captures of each kind, with where each came from, and the tests classify every one of them.
A node's output is untrusted: it is clipped and cleaned before it is printed, and a text that
matches nothing is ``unknown``, never a guess. Pure.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_CONTROL = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def clean(text: str, limit: int) -> str:
    """One printable line: control characters (ESC, CR, newlines, bidi overrides) made ``?``,
    at most ``limit`` characters (the views' ``safe_text.clean`` is a layer up; the caller
    cleans again before printing)."""
    cut = text[:limit] + ("..." if len(text) > limit else "")
    return _CONTROL.sub("?", cut)


MAX_PULL_OUTPUT = 64 * 1024
"""Only the tail of a pull's output is read (a pull prints a line per layer)."""

KINDS = ("auth", "not_found", "no_space", "network", "unknown")

_NO_SPACE = ("no space left on device", "disk quota exceeded", "not enough space")
_NOT_FOUND = (
    "manifest unknown",
    "name unknown",
    "repo not found",
    "not found: manifest",
    "image not known",
    "no such image file",
)
_AUTH = (
    "unauthorized",
    "authentication required",
    "invalid username/password",
    "incorrect username or password",
    "pull access denied",
    "requested access to the resource is denied",
    "requesting bearer token",
    "403 forbidden",
    "401 unauthorized",
    "access denied",
)
_NETWORK = (
    "connection refused",
    "no such host",
    "i/o timeout",
    "network is unreachable",
    "no route to host",
    "tls handshake timeout",
    "server gave http response to https client",
    "connection reset by peer",
    "timeout exceeded while awaiting headers",
    "temporary failure in name resolution",
    "dial tcp",
    "dial udp",
    "x509:",
    "certificate signed by unknown authority",
)

HINTS = {
    "auth": (
        "the registry wants credentials or refused them (some registries say this for an image "
        "that does not exist): name them in container.credentials"
    ),
    "not_found": "the registry has no such image or tag: check container.image",
    "no_space": "the node's disk is full where the runtime keeps images: free space there",
    "network": (
        "the node cannot reach the registry: check its address, DNS and proxy, and mark a "
        "plain-HTTP registry insecure in the node's registries.conf"
    ),
    "unknown": "see the node's image-pull.log in the run directory",
}

_ERROR_LINE = re.compile(
    r"^\s*(Error:|Error response from daemon:|FATAL:|failed to register layer|error pulling)", re.I
)


@dataclass(frozen=True)
class PullError:
    """One node's failed pull: its kind (``KINDS``), the runtime's deciding line, what to do."""

    kind: str
    detail: str

    @property
    def hint(self) -> str:
        return HINTS[self.kind]

    def line(self, image: str) -> str:
        """One line for the operator (the node's name is put before it by the caller)."""
        label = self.kind.replace("_", " ")
        return f"pulling {clean(image, 200)} failed ({label}): {self.detail} -- {self.hint}"


def _kind(text: str) -> str:
    lowered = text.lower()
    for kind, needles in (
        ("no_space", _NO_SPACE),
        ("not_found", _NOT_FOUND),
        ("auth", _AUTH),
        ("network", _NETWORK),
    ):
        if any(n in lowered for n in needles):
            return kind
    # Docker's "manifest for X not found" without the registry's code
    if re.search(r"manifest for \S+ not found", lowered):
        return "not_found"
    return "unknown"


def deciding_line(text: str) -> str:
    """The runtime's own error line (its last ``Error:``/``FATAL:`` line), else the last
    non-empty line; cleaned and clipped for one line of output."""
    lines = [line for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if _ERROR_LINE.match(line)]
    chosen = (errors or lines or ["(no output)"])[-1].strip()
    return clean(chosen, 300)


def classify_pull_error(output: str | bytes) -> PullError:
    """The kind of a failed pull from the runtime's output (its tail, ``MAX_PULL_OUTPUT``)."""
    if isinstance(output, bytes):
        output = output.decode("utf-8", "replace")
    tail = output[-MAX_PULL_OUTPUT:]
    return PullError(_kind(tail), deciding_line(tail))
