"""Image references as the registries read them: ``fab export --image`` is checked here, so a
name Kubernetes would leave in ``InvalidImageName`` (``ghcr.io/Lab/Digits:1``, ``name@sha256:abc``)
is refused before a manifest is written.

The grammar is distribution/reference's (the one Docker, containerd and the kubelet apply): a
lowercase path of components under an optional registry ``host[:port]``, an optional tag, an
optional digest; the name at most 255 characters; a digest the registry can verify
(``sha256``/``sha384``/``sha512`` with exactly 64/96/128 lowercase hex digits). Pure.
"""

from __future__ import annotations

import re

_ALNUM = r"[a-z0-9]+"
_SEPARATOR = r"(?:[._]|__|[-]+)"
_PATH_COMPONENT = rf"{_ALNUM}(?:{_SEPARATOR}{_ALNUM})*"
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_HOST = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[a-fA-F0-9:]+\])"
_DOMAIN = rf"{_HOST}(?::[0-9]+)?"
_TAG = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"
IMAGE_REFERENCE_RE = re.compile(
    rf"(?P<name>(?:{_DOMAIN}/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*)"
    rf"(?::(?P<tag>{_TAG}))?(?:@(?P<digest>{_DIGEST}))?"
)
MAX_IMAGE_NAME = 255
DIGEST_HEX_LENGTHS = {"sha256": 64, "sha384": 96, "sha512": 128}
"""The digest algorithms registries verify, and their hex lengths (lowercase hex only)."""


def image_problem(image: str) -> str | None:
    """Why ``image`` is not an image reference a registry would take, or None when it is one.

    The grammar of ``IMAGE_REFERENCE_RE``, the name's length limit, and a digest the registry can
    verify (``sha256:`` and 64 lowercase hex digits): ``ghcr.io/Lab/Digits:1`` or
    ``name@sha256:abc`` would leave every pod in ``InvalidImageName``.
    """
    match = IMAGE_REFERENCE_RE.fullmatch(image)
    name, at, digest = image.rpartition("@")
    if match is None and at and IMAGE_REFERENCE_RE.fullmatch(name):
        match = IMAGE_REFERENCE_RE.fullmatch(f"{name}@{digest.partition(':')[0]}:{'0' * 64}")
        if match is None or ":" not in digest:
            return "the digest after '@' is not algorithm:hex (sha256:<64 lowercase hex digits>)"
        return _digest_problem(digest)
    if match is None:
        if image.lower() != image and IMAGE_REFERENCE_RE.fullmatch(image.lower()):
            return "the repository path must be lowercase (registry/name:tag, e.g. ghcr.io/lab/digits:1)"
        return "expected an image reference like registry/name:tag or registry/name@sha256:<64 hex digits>"
    if len(match.group("name")) > MAX_IMAGE_NAME:
        return f"the repository name is longer than {MAX_IMAGE_NAME} characters"
    return _digest_problem(match.group("digest"))


def _digest_problem(digest: str | None) -> str | None:
    """Why a registry could not verify ``digest`` (``algorithm:hex``), or None."""
    if digest is None:
        return None
    algorithm, _, hex_digits = digest.partition(":")
    length = DIGEST_HEX_LENGTHS.get(algorithm)
    if length is None:
        return f"digest algorithm {algorithm[:20]!r}: expected one of {', '.join(DIGEST_HEX_LENGTHS)}"
    if len(hex_digits) != length or not re.fullmatch(r"[0-9a-f]*", hex_digits):
        return f"a {algorithm} digest is {length} lowercase hex digits (this one has {len(hex_digits)} characters)"
    return None
