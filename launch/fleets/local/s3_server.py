"""The local fleet's S3 server process: moto's S3 backend alone, every request signed with the fleet's key.

``python -m launch.fleets.local.s3_server ADDRESS PORT USER`` (started by ``launch.fleets.local.bucket``,
the fleet's secret key in ``FLEETRUN_S3_SECRET``): it listens, warms moto up (its modules import
lazily, and the interpreter may live where only root reads), then drops to ``USER`` (no groups)
before it serves anything. Why not
``python -m moto.server``: that serves every service moto emulates to anyone who reaches the port,
and its Batch emulation asks the machine's Docker daemon for privileged containers (root on this
machine). Here only the S3 backend's app is built (``create_backend_app("s3")``), and a request
reaches it only when it carries an AWS Signature Version 4 for service ``s3`` made with the
fleet's own access key and secret (checked with botocore's signer, as moto's own IAM check does):
anything else, another service's call or a request signed with other credentials or none, is
refused with 403 before moto sees it.
"""

from __future__ import annotations

import hmac
import os
import sys
from collections.abc import Callable, Iterable
from typing import Any

ACCESS_KEY = "fleetrun-local"
"""The access key id every node uses; the secret is the fleet's own (``bucket.secret``)."""
SECRET_ENV = "FLEETRUN_S3_SECRET"
MAX_AUTH_CHARS = 8192

StartResponse = Callable[..., Any]


def _between(text: str, first: str, second: str) -> str:
    return text.partition(first)[2].partition(second)[0]


def signed_by(environ: dict[str, Any], access_key: str, secret: str) -> str | None:
    """Why the request is refused ('' when it is signed for S3 with ``access_key``/``secret``)."""
    from botocore.auth import S3SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    auth = str(environ.get("HTTP_AUTHORIZATION", ""))
    if not auth.startswith("AWS4-HMAC-SHA256 ") or len(auth) > MAX_AUTH_CHARS:
        return "not signed with AWS Signature Version 4"
    scope = _between(auth, "Credential=", ",").split("/")
    if len(scope) != 5 or scope[4] != "aws4_request":
        return "a malformed credential scope"
    key, _date, region, service, _end = scope
    if service != "s3":
        return f"service {service[:40]!r}: this server is S3 only"
    if not hmac.compare_digest(key.encode(), access_key.encode()):
        return "an access key that is not the fleet's"
    signed = _between(auth, "SignedHeaders=", ",").split(";")
    headers = {}
    for name, value in environ.items():
        if name.startswith("HTTP_"):
            header = name[5:].replace("_", "-").lower()
        elif name in ("CONTENT_TYPE", "CONTENT_LENGTH"):
            header = name.replace("_", "-").lower()
        else:
            continue
        if header in signed:
            headers[header] = value
    if "x-amz-date" not in headers or "host" not in headers:
        return "the signature does not cover the date and host"
    path = environ.get("RAW_URI") or environ.get("REQUEST_URI") or environ.get("PATH_INFO", "/")
    url = f"http://{headers['host']}{path}"
    request = AWSRequest(method=environ.get("REQUEST_METHOD", "GET"), url=url, headers=headers)
    request.context["timestamp"] = headers["x-amz-date"]
    signer = S3SigV4Auth(Credentials(access_key, secret), "s3", region)
    expected = signer.signature(signer.string_to_sign(request, signer.canonical_request(request)), request)
    given = auth.partition("Signature=")[2].strip()
    if not hmac.compare_digest(expected.encode(), given.encode()):
        return "a signature not made with the fleet's secret key"
    return ""


class SignedOnly:
    """WSGI middleware: the wrapped app sees only requests ``signed_by`` the fleet's key."""

    def __init__(self, app: Callable[..., Iterable[bytes]], access_key: str, secret: str) -> None:
        self.app, self.access_key, self.secret = app, access_key, secret

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        try:
            why = signed_by(environ, self.access_key, self.secret)
        except Exception as exc:  # noqa: BLE001 - a malformed request is refused, never served
            why = f"a request that could not be checked ({type(exc).__name__})"
        if why:
            body = f"<Error><Code>AccessDenied</Code><Message>{why}</Message></Error>".encode()
            start_response(
                "403 Forbidden", [("Content-Type", "application/xml"), ("Content-Length", str(len(body)))]
            )
            return [body]
        return self.app(environ, start_response)


def s3_app(secret: str) -> SignedOnly:
    """moto's S3 backend alone, behind the signature check."""
    from moto.moto_server.werkzeug_app import create_backend_app

    return SignedOnly(create_backend_app("s3"), ACCESS_KEY, secret)


def warm_up(app: SignedOnly) -> None:
    """One of each request the nodes make, straight to moto's app (and a refused one through the
    check), so every module they need is imported while this process can still read them all."""
    from werkzeug.test import Client

    inner = Client(app.app)
    for method, path, data in (
        ("PUT", "/fleetrun-warm-up", b""),
        ("PUT", "/fleetrun-warm-up/a/b", b"x"),
        ("HEAD", "/fleetrun-warm-up/a/b", b""),
        ("GET", "/fleetrun-warm-up/a/b", b""),
        ("GET", "/fleetrun-warm-up?list-type=2&prefix=a/", b""),
        ("DELETE", "/fleetrun-warm-up/a/b", b""),
        ("DELETE", "/fleetrun-warm-up", b""),
    ):
        inner.open(path, method=method, data=data, headers={"Host": "localhost"})
    Client(app).get(
        "/",
        headers={"Host": "localhost", "Authorization": "AWS4-HMAC-SHA256 Credential=x/y/z/s3/aws4_request"},
    )


def drop_to(user: str) -> None:
    """Become ``user`` with its own group and no others (root only; no way back)."""
    import pwd

    entry = pwd.getpwnam(user)
    os.setgroups([])
    os.setgid(entry.pw_gid)
    os.setuid(entry.pw_uid)
    if os.getuid() == 0 or os.geteuid() == 0:
        raise SystemExit(f"could not drop root for {user}")


def main(argv: list[str]) -> int:
    import botocore.auth
    import botocore.awsrequest
    import botocore.credentials  # noqa: F401 - imported now: read while still root
    from werkzeug.serving import make_server

    address, port, user = argv[0], int(argv[1]), argv[2]
    secret = os.environ.pop(SECRET_ENV, "")
    if len(secret) < 16:
        print(f"{SECRET_ENV} is missing or too short", file=sys.stderr)
        return 2
    app = s3_app(secret)
    server = make_server(address, port, app, threaded=True)
    warm_up(app)
    if os.getuid() == 0:
        drop_to(user)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
