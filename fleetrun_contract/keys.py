"""The shape of an OpenSSH public key, as both sides accept it.

``infra`` takes the operator's public key from the stack config and installs it on every node;
``launch`` pins each node's host key from an inventory or the stack's outputs. One pattern, so a
key one side accepts the other does too (``launch.job.inventory`` further decodes the blob).
"""

from __future__ import annotations

import re

PUBLIC_KEY_RE = re.compile(
    r"(ssh-ed25519|ssh-rsa|ecdsa-sha2-nistp(256|384|521)) [A-Za-z0-9+/=]{1,4096}( [^\x00-\x1f\x7f]*)?"
)
"""Use with ``fullmatch``: type, base64 blob, optional comment without control characters."""
