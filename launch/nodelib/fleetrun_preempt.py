"""Preemption notices: poll the cloud's metadata server, tell the ranks. Standard library only.

A spot/preemptible VM gets a short notice before the cloud takes it (EC2: 120 s, GCE: 30 s).
Jobs rarely hear it: the notice is an HTTP answer on the metadata server, not a signal. The
watchdog (``fleetrun_guard``) polls it every second with the poller the laptop's cloud module
named in ``guard.json`` (``POLLERS``: one small table, no cloud logic anywhere else on the node),
and on a notice writes ``preempt.json`` (the checkpoint helper's ``should_save()`` flag), sends
SIGTERM to the ranks and waits for a checkpoint to be in the bucket.

Everything a metadata server answers is untrusted and bounded: a short timeout per request, at
most ``MAX_ANSWER`` bytes read, and any error is "no notice" (noted for the log), never an
exception out of ``poll``: a broken metadata server must not take the watchdog down.
"""

from __future__ import annotations

import calendar
import http.client
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if not __package__:  # on a node, beside the other files in ~/.fleetrun/lib (not as launch.nodelib)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
if TYPE_CHECKING or __package__:  # one module per file: launch.nodelib.X here, X on a node
    from launch.nodelib import fleetrun_protocol as protocol
else:
    import fleetrun_protocol as protocol  # noqa: E402 - beside this file in ~/.fleetrun/lib

REQUEST_TIMEOUT_S = 1.0
MAX_ANSWER = 4096
TOKEN_TTL_S = 21600
RANK_VARIABLES = (b"LOCAL_RANK=", b"RANK=", b"HOROVOD_RANK=", b"OMPI_COMM_WORLD_RANK=", b"PMI_RANK=")
"""A process carrying one of these is a rank (torchrun and horovod set them for their workers)."""


@dataclass(frozen=True)
class Notice:
    """``deadline``: when the cloud says it takes the node (EC2's ``time``), None when it does not
    say (GCE: its 30 s window from the notice)."""

    detail: str
    deadline: float | None = None


def notice_deadline(body: str) -> float | None:
    """EC2's ``{"action": ..., "time": "2026-11-25T17:02:00Z"}``: the time as unix seconds, or
    None when the answer does not carry one that parses (the window from the notice applies)."""
    try:
        data = json.loads(body)
        text = data.get("time") if isinstance(data, dict) else None
        if not isinstance(text, str) or len(text) > 40:
            return None
        return float(calendar.timegm(time.strptime(text, "%Y-%m-%dT%H:%M:%SZ")))
    except (ValueError, OverflowError):
        return None


def deadline_of(notice: Notice, noticed: float, window: float) -> float:
    """When the node goes: the notice's own time when it lies within the window after the notice
    (a clock off by minutes, or a time already past, cannot stretch or empty the drain), else
    the notice plus the cloud's window."""
    if notice.deadline is not None and noticed < notice.deadline <= noticed + window:
        return notice.deadline
    return noticed + window


def _split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":") if address.count(":") == 1 else (address, "", "")
    return (host, int(port)) if port.isdigit() and 0 < int(port) < 65536 else (address, 80)


def _request(
    address: str, method: str, path: str, headers: dict[str, str]
) -> tuple[int, bytes, dict[str, str]]:
    host, port = _split(address)
    conn = http.client.HTTPConnection(host, port, timeout=REQUEST_TIMEOUT_S)
    try:
        conn.request(method, path, headers=headers)
        response = conn.getresponse()
        body = response.read(MAX_ANSWER)
        return response.status, body, {k.lower(): v for k, v in response.getheaders()[:64]}
    finally:
        conn.close()


class Ec2Imdsv2:
    """EC2 spot: IMDSv2 token (PUT), then ``spot/instance-action`` (404 = no notice)."""

    name = "ec2-imdsv2"
    window_s = 120.0

    def __init__(self, address: str) -> None:
        self.address = address
        self.token = ""
        self.token_until = 0.0

    def _token(self) -> str:
        if not self.token or time.monotonic() > self.token_until:
            status, body, _ = _request(
                self.address,
                "PUT",
                "/latest/api/token",
                {"X-aws-ec2-metadata-token-ttl-seconds": str(TOKEN_TTL_S)},
            )
            token = body.decode("ascii", errors="replace").strip()
            if status != 200 or not token or len(token) > 1024 or not token.isprintable():
                raise ValueError(f"token request answered {status}")
            self.token, self.token_until = token, time.monotonic() + TOKEN_TTL_S - 60
        return self.token

    def check(self) -> Notice | None:
        for _ in range(2):
            status, body, _ = _request(
                self.address,
                "GET",
                "/latest/meta-data/spot/instance-action",
                {"X-aws-ec2-metadata-token": self._token()},
            )
            if status == 401:  # the token expired early: one fresh one
                self.token = ""
                continue
            if status == 404:
                return None
            if status != 200:
                raise ValueError(f"instance-action answered {status}")
            text = body.decode("utf-8", errors="replace")[:300]
            return Notice(text, notice_deadline(text))
        raise ValueError("instance-action refused a fresh token")


class GceMetadata:
    """GCE spot/preemptible: ``instance/preempted`` with ``Metadata-Flavor: Google``, "TRUE"."""

    name = "gce-metadata"
    window_s = 30.0

    def __init__(self, address: str) -> None:
        self.address = address

    def check(self) -> Notice | None:
        flavor = "Google"
        status, body, headers = _request(
            self.address, "GET", "/computeMetadata/v1/instance/preempted", {"Metadata-Flavor": flavor}
        )
        if status != 200:
            raise ValueError(f"instance/preempted answered {status}")
        if headers.get("metadata-flavor") != flavor:
            raise ValueError("the answer lacks the Metadata-Flavor header: not a metadata server")
        text = body.decode("ascii", errors="replace").strip()
        return Notice("instance/preempted: TRUE") if text == "TRUE" else None


POLLERS: dict[str, Callable[[str], Ec2Imdsv2 | GceMetadata]] = {
    Ec2Imdsv2.name: Ec2Imdsv2,
    GceMetadata.name: GceMetadata,
}


class Watch:
    """One poller, polled at most every ``interval`` s; errors are counted, never raised."""

    def __init__(self, poller: str, address: str, interval: float = 1.0) -> None:
        self.poller = POLLERS[poller](address)
        self.interval = interval
        self.next_at = 0.0
        self.errors = 0
        self.last_error = ""

    @property
    def window_s(self) -> float:
        return self.poller.window_s

    def poll(self, now: float) -> Notice | None:
        """``now`` is the watchdog's wall clock: a clock stepped back (NTP on a fresh VM) polls at
        once, where ``now < next_at`` alone would stop polling for as long as the step."""
        if self.next_at - self.interval <= now < self.next_at:
            return None
        self.next_at = now + self.interval
        try:
            notice = self.poller.check()
        except Exception as exc:  # noqa: BLE001 - a bad metadata answer is "no notice", counted
            self.errors += 1
            self.last_error = f"{type(exc).__name__}: {exc}"[:300]
            return None
        self.last_error = ""
        return notice


def _parent(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as fh:
            return int(fh.read(4096).rsplit(")", 1)[-1].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def rank_pids(run_id: str) -> list[int]:
    """This node's rank processes of the run: carrying ``FLEETRUN_RUN_ID`` and a rank variable.

    Only the top-most: a rank's children inherit its variables (data loader workers, the
    ``aws`` CLI uploading its checkpoint), and a SIGTERM to the upload would lose the checkpoint.
    """
    marker = f"FLEETRUN_RUN_ID={run_id}".encode()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                env = fh.read(1 << 20).split(b"\0")
        except OSError:
            continue
        ours = marker in env and b"FLEETRUN_GUARD=1" not in env
        if ours and any(var.startswith(RANK_VARIABLES) for var in env):
            pids.append(int(entry))
    ranks = set(pids)
    return [pid for pid in pids if _parent(pid) not in ranks]


def signal_ranks(run_id: str, spare: tuple[int, ...] = ()) -> int:
    """SIGTERM every rank of the run on this node (the helper turns it into ``should_save``)."""
    sent = 0
    for pid in rank_pids(run_id):
        if pid in spare:
            continue
        try:
            os.kill(pid, signal.SIGTERM)
            sent += 1
        except OSError:
            pass
    return sent


def write_notice(run_dir: str, notice: protocol.PreemptionNotice) -> None:
    """``preempt.json``, atomically: the helper's flag and the laptop's evidence."""
    tmp = os.path.join(run_dir, "preempt.json.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(notice.to_json())
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, os.path.join(run_dir, "preempt.json"))
