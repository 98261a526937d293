"""SSH identity of the cluster: the operator's key pair and one pinned host key per node.

Cloud-neutral (pulumi-tls only). Host keys are generated at deploy time and kept in the Pulumi
state as secrets, so a node that is replaced or restarted gets the same key back and the
``known_hosts`` that ``launch`` wrote stays valid. The operator key is the user's own public key
when ``fleet:ssh_public_key`` is set (nothing secret is stored then), or a generated ED25519 key
whose private half is exported only as a secret stack output.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pulumi
import pulumi_tls as tls

from infra.clouds.base import HostKey


@dataclass(frozen=True)
class SshIdentityArgs:
    node_names: Sequence[str]
    """One host key per name, in rank order; the names also name the key resources."""
    operator_public_key: str | None = None
    """The operator's OpenSSH public key; None: generate a key pair."""


class SshIdentity(pulumi.ComponentResource):
    host_keys: list[HostKey]
    authorized_key: pulumi.Output[str]
    """The public key every node authorizes for the login user."""
    operator_private_key: pulumi.Output[str] | None
    """Secret; None when the operator brought their own key."""

    def __init__(self, name: str, args: SshIdentityArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("fleetrun:index:SshIdentity", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)

        if args.operator_public_key:
            self.authorized_key = pulumi.Output.from_input(args.operator_public_key)
            self.operator_private_key = None
        else:
            operator = tls.PrivateKey(f"{name}-operator", algorithm="ED25519", opts=child)
            self.authorized_key = operator.public_key_openssh.apply(str.strip)
            self.operator_private_key = pulumi.Output.secret(operator.private_key_openssh)

        self.host_keys = []
        for node_name in args.node_names:
            key = tls.PrivateKey(f"{node_name}-hostkey", algorithm="ED25519", opts=child)
            self.host_keys.append(
                HostKey(
                    private_key_openssh=pulumi.Output.secret(key.private_key_openssh),
                    public_key_openssh=key.public_key_openssh.apply(_openssh_public),
                )
            )

        self.register_outputs(
            {
                "authorized_key": self.authorized_key,
                "host_public_keys": [k.public_key_openssh for k in self.host_keys],
            }
        )


def _openssh_public(text: str) -> str:
    """``ssh-ed25519 AAAA...`` without the trailing newline pulumi-tls adds."""
    return " ".join(text.split()[:2])
