"""The sync relay's messages: what the laptop tells the head (``RelayConfig``) and what the head
reports per worker (``RelayResult``). Kept apart from ``fleetrun_protocol`` so each module stays
small; the same rules hold (bounded, typed, only ``ProtocolError`` on bad input). Standard library
only, Python 3.8 at run time; shipped to nodes beside the relay.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING or __package__:
    from launch.nodelib.fleetrun_wire import (
        MAX_ERROR,
        MAX_FILTERS,
        MAX_OFFSET,
        MAX_RELAY_CONFIG_BYTES,
        MAX_RELAY_TARGETS,
        MAX_RELAY_TRANSFERS,
        MAX_SMALL_ANSWER_BYTES,
        _arg,
        _Fields,
        _json_object,
        encode,
    )
else:  # on a node: beside this file in ~/.fleetrun/lib
    from fleetrun_wire import (  # type: ignore[no-redef]
        MAX_ERROR,
        MAX_FILTERS,
        MAX_OFFSET,
        MAX_RELAY_CONFIG_BYTES,
        MAX_RELAY_TARGETS,
        MAX_RELAY_TRANSFERS,
        MAX_SMALL_ANSWER_BYTES,
        _arg,
        _Fields,
        _json_object,
        encode,
    )


__all__ = ["RelayConfig", "RelayResult", "RelayTarget", "RelayTransfer"]


@dataclass(frozen=True)
class RelayTransfer:
    source: str
    dest: str
    filters: tuple[str, ...] = ()
    lib: bool = False


@dataclass(frozen=True)
class RelayTarget:
    name: str
    user: str
    address: str
    port: int = 22
    ship_lib: bool = True


@dataclass(frozen=True)
class RelayConfig:
    """The head's instructions for the sync relay (``fleetrun_relay.py``), written by the laptop."""

    key: str
    known_hosts: str
    transfers: tuple[RelayTransfer, ...]
    targets: tuple[RelayTarget, ...]
    parallel: int = 16
    timeout: float = 1800.0

    @classmethod
    def from_json(cls, data: bytes | bytearray | str) -> RelayConfig:
        f = _json_object(data, MAX_RELAY_CONFIG_BYTES, "relay config")
        transfers = []
        for raw in f.objects("transfers", MAX_RELAY_TRANSFERS):
            t = _Fields(raw, "relay config: transfer")
            transfers.append(
                RelayTransfer(
                    source=t.path("source"),
                    dest=t.path("dest"),
                    filters=t.strings("filters", MAX_FILTERS, _arg),
                    lib=t.boolean("lib", False),
                )
            )
        targets = []
        for raw in f.objects("targets", MAX_RELAY_TARGETS):
            t = _Fields(raw, "relay config: target")
            targets.append(
                RelayTarget(
                    name=t.name("name"),
                    user=t.name("user"),
                    address=t.address(t.data.get("address"), "address"),
                    port=t.integer("port", 1, 65535, required=False, default=22),
                    ship_lib=t.boolean("ship_lib", True),
                )
            )
        timeout = f.positive("timeout", 86400.0)
        return cls(
            key=f.path("key"),
            known_hosts=f.path("known_hosts"),
            transfers=tuple(transfers),
            targets=tuple(targets),
            parallel=f.integer("parallel", 1, 1024, required=False, default=16),
            timeout=1800.0 if timeout is None else timeout,
        )


@dataclass(frozen=True)
class RelayResult:
    """One line of the relay's output: how the copy to one worker went."""

    name: str
    ok: bool
    files: int = 0
    sent_bytes: int = 0
    error: str = ""

    def to_json(self) -> str:
        return encode(
            {
                "name": self.name,
                "ok": self.ok,
                "files": self.files,
                "bytes": self.sent_bytes,
                "error": self.error,
            }
        )

    @classmethod
    def from_json(cls, data: bytes | bytearray | str) -> RelayResult:
        f = _json_object(data, MAX_SMALL_ANSWER_BYTES, "relay result")
        return cls(
            name=f.name("name"),
            ok=f.boolean("ok", False),
            files=f.integer("files", 0, MAX_OFFSET, required=False, default=0),
            sent_bytes=f.integer("bytes", 0, MAX_OFFSET, required=False, default=0),
            error=f.text("error", MAX_ERROR),
        )
