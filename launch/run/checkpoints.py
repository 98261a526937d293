"""Before a later attempt starts: make the newest trusted checkpoint reachable from every node.

With a bucket, the checkpoint helper on the nodes downloads it (``fleetrun_checkpoint.latest``).
Without one (the local fleet, lab machines), the only copies are on the nodes that wrote them and
the peer copies made during the run (``launch.run.peer_copies``), and rank 0 of the next attempt
may land on a fresh replacement node or on a survivor that never held one. So the laptop asks
every node of the next attempt which complete checkpoints it holds, believes a node's claim only
for a step rank 0 recorded as saved with that very manifest (``checkpoint_saved`` in the metrics:
the sha256 of its ``MANIFEST.json``) and only within the pull's size bounds, takes the newest one
anywhere, copies it (rsync through this machine, hardened like the pull, sparse files kept
sparse) to the nodes that lack it, under a temporary name renamed into place, and tells every
node to resume from it (``FLEETRUN_RESUME_FROM``). Every claim it does not believe is named.
Nothing here ever loads a checkpoint: the laptop moves bytes, the nodes load them as data.
Sharded checkpoints (``rank-<R>/`` parts) are left to the bucket.
"""

from __future__ import annotations

import hashlib
import re
import shlex
import shutil
import stat
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from launch.errors import HostError
from launch.job.inventory import Host
from launch.nodelib.fleetrun_bucket_messages import MAX_MANIFEST_BYTES, Manifest
from launch.nodelib.fleetrun_wire import ProtocolError, decode
from launch.planning import remote_layout as layout
from launch.planning.launchers.base import CHECKPOINTS
from launch.reports.safe_text import clean
from launch.rules.metrics_stream import MetricsSummary
from launch.rules.recovery import Drained
from launch.run.artifacts import PULL_MAX_FILE_BYTES, PULL_MAX_TOTAL_BYTES, pull_argv, rsync_error
from launch.transport.openssh import jump_slot
from launch.transport.ssh import Fleet, NodeConnection, openssh_command

MAX_STEPS = 1000
MANIFEST_NAME = "MANIFEST.json"
MAX_CLAIMS_BYTES = 262144
"""A node's checkpoint listing is read within this many bytes (its last line, JSON)."""
STEP_DIR = re.compile(r"step-(\d{1,18})/?\Z")
LIST_SCRIPT = r"""
import hashlib, json, os, stat, sys
root = os.path.expanduser(sys.argv[1])
found = []
try:
    names = os.listdir(root)
except OSError:
    names = []
for name in names:
    if not name.startswith("step-") or not name[5:].isdigit():
        continue
    path = os.path.join(root, name)
    try:
        if os.path.islink(path) or not stat.S_ISREG(os.lstat(os.path.join(path, "MANIFEST.json")).st_mode):
            continue
        with open(os.path.join(path, "MANIFEST.json"), "rb") as fh:
            raw = fh.read(1 << 20)
        manifest = json.loads(raw)
        files = manifest["files"]
        size = disk = largest = 0
        ok = bool(files)
        for f, info in files.items():
            full = os.path.join(path, f)
            if "/" in f or f in (".", "..") or os.path.islink(full):
                ok = False
                break
            st = os.stat(full)
            if st.st_size != int(info["size"]):
                ok = False
                break
            size += st.st_size
            disk += st.st_blocks * 512
            largest = max(largest, st.st_size)
        if ok and int(manifest["step"]) == int(name[5:]):
            found.append({"step": int(name[5:]), "manifest": hashlib.sha256(raw).hexdigest(),
                          "size": size, "disk": disk, "largest": largest})
    except Exception:
        pass
found.sort(key=lambda c: -c["step"])
print(json.dumps(found[:1000]))
"""


def checkpoint_dir(run_id: str) -> str:
    """The run's checkpoint directory on a node, relative to the node user's home."""
    return f"{layout.rundir(run_id)}/{CHECKPOINTS}"


@dataclass(frozen=True)
class Claim:
    """One complete checkpoint a node says it holds: untrusted until ``choose`` believes it."""

    step: int
    manifest: str
    """sha256 of its ``MANIFEST.json`` bytes (compared with what rank 0 recorded)."""
    size: int = 0
    """Bytes the manifest lists (apparent size: a sparse file counts whole)."""
    disk: int = 0
    """Bytes it takes on the node's disk (``du``)."""
    largest: int = 0


def _count(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 10**18:
        return None
    return value


def parse_claims(text: str) -> list[Claim]:
    """A node's listing (untrusted): JSON objects with step, manifest sha256 and sizes; anything
    malformed is dropped, and a bare list of steps (an older agent) gives claims without a digest."""
    lines = text.strip().splitlines()
    try:
        # the wire's decoder: byte and nesting bounds before parsing (a bracket bomb raised
        # RecursionError out of json.loads, past every caller)
        data = decode(lines[-1], MAX_CLAIMS_BYTES, "the checkpoint listing") if lines else []
    except ProtocolError:
        return []
    if not isinstance(data, list):
        return []
    claims = []
    for item in data[:MAX_STEPS]:
        if isinstance(item, dict):
            step, digest = _count(item.get("step")), item.get("manifest")
            sizes = [_count(item.get(k)) for k in ("size", "disk", "largest")]
            if step is None or not isinstance(digest, str) or len(digest) != 64 or None in sizes:
                continue
            if any(c not in "0123456789abcdef" for c in digest):
                continue
            size, disk, largest = (s or 0 for s in sizes)
            claims.append(Claim(step, digest, size, disk, largest))
        elif (step := _count(item)) is not None:
            claims.append(Claim(step, ""))
    return claims


def parse_steps(text: str) -> list[int]:
    """A node's answer (untrusted): its step numbers, newest first; anything else: []."""
    return [c.step for c in parse_claims(text)]


def complete_claims(fleet: Fleet, hosts: list[Host], run_id: str) -> dict[str, list[Claim]]:
    """Complete checkpoints per node as each claims them (a node that does not answer holds none)."""
    script = f"-c {shlex.quote(LIST_SCRIPT)} {shlex.quote('~/' + checkpoint_dir(run_id))}"

    def ask(conn: NodeConnection) -> list[Claim]:
        # the inventory's interpreter, as the doctor and the claim use (the node agent still runs python3)
        result = conn.run(f"{shlex.quote(conn.host.python)} {script}", timeout=60)
        return parse_claims(result.stdout[-MAX_CLAIMS_BYTES:]) if result.ok else []

    answers = fleet.map(ask, hosts=hosts, deadline=90)
    return {name: r if isinstance(r, list) else [] for name, r in answers.items()}


def complete_steps(fleet: Fleet, hosts: list[Host], run_id: str) -> dict[str, list[int]]:
    """Complete checkpoint steps per node, newest first (a node that does not answer holds none)."""
    return {n: [c.step for c in claims] for n, claims in complete_claims(fleet, hosts, run_id).items()}


def newest(steps: dict[str, list[int]]) -> tuple[int, str] | None:
    """(step, a node holding it) of the newest complete checkpoint anywhere."""
    best: tuple[int, str] | None = None
    for node, found in sorted(steps.items()):
        if found and (best is None or max(found) > best[0]):
            best = (max(found), node)
    return best


@dataclass(frozen=True)
class Bounds:
    """What one checkpoint may weigh to be copied: the pull's caps (``launch.run.artifacts``)."""

    total_bytes: int = PULL_MAX_TOTAL_BYTES
    file_bytes: int = PULL_MAX_FILE_BYTES


@dataclass(frozen=True)
class Choice:
    """The newest believed checkpoint (``step`` None: none), who holds it, and every claim refused."""

    step: int | None = None
    holders: tuple[str, ...] = ()
    refused: tuple[str, ...] = ()


def refusal(node: str, run_id: str, claim: Claim, recorded: Mapping[int, str], bounds: Bounds) -> str:
    """Why ``node``'s claim is not believed ('' when it is): naming the node and the file."""
    where = f"{node}: ~/{checkpoint_dir(run_id)}/step-{claim.step}/MANIFEST.json"
    if claim.step not in recorded:
        return f"{where}: step {claim.step} was never recorded as saved by rank 0"
    if claim.manifest != recorded[claim.step]:
        return f"{where}: differs from the manifest rank 0 recorded for step {claim.step}"
    if claim.size > bounds.total_bytes or claim.disk > bounds.total_bytes:
        big = max(claim.size, claim.disk)
        return (
            f"{where}: {big / 1024**3:.1f} GiB, over the copy cap of {bounds.total_bytes / 1024**3:.0f} GiB"
        )
    if claim.largest > bounds.file_bytes:
        return (
            f"{where}: a file of {claim.largest / 1024**3:.1f} GiB, over the per-file cap of "
            f"{bounds.file_bytes / 1024**3:.0f} GiB"
        )
    return ""


def choose(
    claims: Mapping[str, Sequence[Claim]],
    recorded: Mapping[int, str],
    run_id: str,
    bounds: Bounds = Bounds(),  # noqa: B008 - frozen
) -> Choice:
    """Pure: the newest step some node holds that rank 0 recorded as saved, with the manifest it
    recorded and within the size caps; the nodes holding it; and a line for each claim refused."""
    believed: dict[int, list[str]] = {}
    refused: list[str] = []
    for node, found in sorted(claims.items()):
        for claim in found:
            why = refusal(node, run_id, claim, recorded, bounds)
            if why:
                refused.append(why)
            else:
                believed.setdefault(claim.step, []).append(node)
    if not believed:
        return Choice(refused=tuple(refused))
    step = max(believed)
    return Choice(step, tuple(believed[step]), tuple(refused))


def newest_durable(
    on_nodes: int | None, uploaded: Mapping[int, str], recorded: Mapping[int, str]
) -> tuple[int, str] | None:
    """Pure: the step a later attempt resumes from and where it is, ``(step, "nodes")`` or
    ``(step, "bucket")``; None when neither has one.

    A step is durable once a second copy of it exists, whichever came first: a verified copy on
    a node of the next attempt (``on_nodes``: ``choose``'s step, a peer copy or a survivor's own
    save, its manifest checked against rank 0's record) or its completed upload (``uploaded``:
    ``checkpoint_uploaded``, believed only with the manifest rank 0 recorded for that step). The
    newest wins; a tie goes to the nodes (no download)."""
    in_bucket = [s for s, digest in uploaded.items() if recorded.get(s) == digest]
    best_bucket = max(in_bucket, default=None)
    if best_bucket is not None and (on_nodes is None or best_bucket > on_nodes):
        return best_bucket, "bucket"
    return None if on_nodes is None else (on_nodes, "nodes")


# -- copying one checkpoint between nodes, through this machine ------------------------------------

RunOn = Callable[[Host, str, float], tuple[bool, str]]
"""Runs a shell command on a node: (ok, its stdout, bounded) or (False, the stderr tail). The
fleet's connection (``fleet_run``), or the OpenSSH client (``ssh_run``)."""
MAX_OUTPUT = 262144


def ssh_argv(host: Host, known_hosts: Path, multiplex: Path | None = None) -> list[str]:
    """The hardened OpenSSH client for ``host`` (``openssh_command``); with ``multiplex`` (a short
    directory of this machine's, 0700), one master connection per node is kept there for 60 s
    and reused by the next commands and rsyncs: a copy of a checkpoint then costs one SSH
    handshake per node, not one per step of it."""
    argv = openssh_command(host, known_hosts)
    if multiplex is not None:
        argv += ["-o", "ControlMaster=auto", "-o", f"ControlPath={multiplex}/%C", "-o", "ControlPersist=60"]
    return argv


def ssh_run(known_hosts: Path, multiplex: Path | None = None) -> RunOn:
    """A ``RunOn`` through the OpenSSH client (pinned host keys, as rsync uses): for a thread
    that must not share the watcher's connections."""

    def run(host: Host, command: str, timeout: float) -> tuple[bool, str]:
        argv = [*ssh_argv(host, known_hosts, multiplex), host.rsync_target("").rstrip(":"), command]
        try:
            with jump_slot(host):
                proc = subprocess.run(
                    argv, capture_output=True, text=True, errors="replace", timeout=timeout, check=False
                )
        except subprocess.TimeoutExpired:
            return False, f"timed out after {timeout:.0f} s"
        ok = proc.returncode == 0
        return ok, proc.stdout[-MAX_OUTPUT:] if ok else proc.stderr[-300:]

    return run


def fleet_run(fleet: Fleet) -> RunOn:
    def run(host: Host, command: str, timeout: float) -> tuple[bool, str]:
        result = fleet.connections[host.name].run(command, timeout=timeout)
        return result.ok, result.stdout[-MAX_OUTPUT:] if result.ok else result.stderr[-300:]

    return run


def _rsync(argv: list[str], host: Host, what: str, timeout: float) -> None:
    try:
        with jump_slot(host):
            done = subprocess.run(
                argv, capture_output=True, text=True, errors="replace", timeout=timeout, check=False
            )
    except subprocess.TimeoutExpired:
        raise HostError(host.name, f"{what}: timed out") from None
    if done.returncode != 0:
        raise HostError(host.name, f"{what}: {clean(rsync_error(done.stderr, done.returncode), 300)}")


def copy_step(
    holder: Host,
    targets: Sequence[Host],
    run_id: str,
    step: int,
    known_hosts: Path,
    staging: Path,
    run_on: RunOn,
    bounds: Bounds = Bounds(),  # noqa: B008 - frozen
    timeout: float = 3600.0,
    manifest: str = "",
    multiplex: Path | None = None,
) -> dict[str, HostError]:
    """Copy ``step-<step>/`` from ``holder`` to each of ``targets``: its ``MANIFEST.json`` first
    (checked against ``manifest`` when given: the one rank 0 recorded; its sizes against
    ``bounds``), then exactly the files it lists, pulled here with the pull's hardening (no links
    followed, no devices, ``--max-size``) plus ``--sparse``, so a sparse file stays sparse here and
    there, each checked for its listed size, then sent to a temporary name and renamed into place.
    The pull raises ``HostError`` (the holder); a target that fails is returned by name.
    ``multiplex``: reuse one SSH connection per node (``ssh_argv``)."""
    remote = f"{checkpoint_dir(run_id)}/step-{step}"
    local = staging / f"step-{step}"
    shutil.rmtree(local, ignore_errors=True)
    local.mkdir(parents=True)
    failed: dict[str, HostError] = {}
    try:
        rsh = shlex.join(ssh_argv(holder, known_hosts, multiplex))
        listed = _pull_manifest(holder, remote, local, rsh, step, manifest, bounds, timeout)
        names = staging / f"step-{step}.files"
        # exactly the files the manifest lists, anything else in the folder stays there; pulled in
        # groups of like size (within a power of two), each group's files no bigger than its
        # largest claim: a claim of 1 KiB cannot bring 300 MiB, whatever lies beside it
        groups: dict[int, list[str]] = {}
        for name, size in listed.items():
            groups.setdefault(size.bit_length(), []).append(name)
        for group in groups.values():
            names.write_text("".join(f"{name}\n" for name in sorted(group)))
            cap = max(1, *(listed[name] for name in group))
            argv = pull_argv(holder.rsync_target(f"{remote}/"), local, rsh, cap)
            argv[1:1] = ["--sparse", f"--files-from={names}"]
            _rsync(argv, holder, f"could not copy checkpoint step {step}", timeout)
        _check_pulled(holder, remote, local, listed)
        for host in targets:
            incoming = f"{checkpoint_dir(run_id)}/.incoming-step-{step}"
            ok, err = run_on(
                host, f'mkdir -p "$HOME/{incoming}" && chmod 700 "$HOME/{layout.rundir(run_id)}"', 60
            )
            if not ok:
                failed[host.name] = HostError(host.name, f"cannot prepare {incoming}: {clean(err[-200:])}")
                continue
            push = [
                "rsync",
                "-a",
                "--sparse",
                "--no-devices",
                "--no-specials",
                "--chmod=Du=rwx,go=,Fu=rw,go=",
                f"--max-size={bounds.file_bytes}",
                "-e",
                shlex.join(ssh_argv(host, known_hosts, multiplex)),
                f"{local}/",
                host.rsync_target(f"{incoming}/"),
            ]
            try:
                _rsync(push, host, f"could not send checkpoint step {step}", timeout)
            except HostError as exc:
                failed[host.name] = exc
                continue
            ok, err = run_on(host, f'rm -rf "$HOME/{remote}" && mv "$HOME/{incoming}" "$HOME/{remote}"', 60)
            if not ok:
                failed[host.name] = HostError(
                    host.name, f"cannot move checkpoint step {step} into place: {clean(err[-200:])}"
                )
    finally:
        shutil.rmtree(local, ignore_errors=True)
        (staging / f"step-{step}.files").unlink(missing_ok=True)
    return failed


def _pull_manifest(
    holder: Host,
    remote: str,
    local: Path,
    rsh: str,
    step: int,
    manifest: str,
    bounds: Bounds,
    timeout: float,
) -> dict[str, int]:
    """Pull ``MANIFEST.json`` alone, check it is the one rank 0 recorded (when ``manifest``), parse
    it (untrusted: a typed, bounded model) and check its sizes against ``bounds`` before any
    other byte moves; the listed files and their sizes, or ``HostError`` naming the file."""
    where = f"~/{remote}/{MANIFEST_NAME}"
    argv = pull_argv(holder.rsync_target(f"{remote}/{MANIFEST_NAME}"), local, rsh, MAX_MANIFEST_BYTES)
    _rsync(argv, holder, f"could not copy checkpoint step {step}'s manifest", timeout)
    path = local / MANIFEST_NAME
    try:
        if path.is_symlink() or not path.is_file():
            raise OSError("not a regular file")
        data = path.read_bytes()[: MAX_MANIFEST_BYTES + 1]
    except OSError:
        raise HostError(holder.name, f"{where}: missing or not a regular file") from None
    if manifest and hashlib.sha256(data).hexdigest() != manifest:
        raise HostError(holder.name, f"{where} differs from the manifest rank 0 recorded for step {step}")
    try:
        files = Manifest.from_json(data).files
    except ProtocolError as exc:
        raise HostError(holder.name, f"{where}: {clean(exc, 300)}") from None
    listed = {name: size for name, (size, _sha) in files.items() if name != MANIFEST_NAME}
    for name, size in listed.items():
        if size > bounds.file_bytes:
            raise HostError(
                holder.name,
                f"{where}: files.{clean(name, 200)} claims {size} bytes, over the per-file cap of {bounds.file_bytes}",
            )
    if sum(listed.values()) > bounds.total_bytes:
        raise HostError(
            holder.name,
            f"{where}: lists {sum(listed.values())} bytes, over the copy cap of {bounds.total_bytes}",
        )
    return listed


def _check_pulled(holder: Host, remote: str, local: Path, listed: Mapping[str, int]) -> None:
    """After the pull: every listed file here, a regular file of exactly its listed size, and
    nothing else (a file the size cap skipped, or one that grew or shrank, is refused by name)."""
    found: dict[str, int] = {}
    for path in local.rglob("*"):
        info = path.lstat()
        name = path.relative_to(local).as_posix()
        if stat.S_ISDIR(info.st_mode):
            continue
        if not stat.S_ISREG(info.st_mode):
            raise HostError(holder.name, f"~/{remote}/{clean(name, 200)}: not a regular file")
        found[name] = info.st_size
    for name, size in listed.items():
        got = found.get(name)
        if got != size:
            what = "missing (or over the size cap)" if got is None else f"{got} bytes"
            raise HostError(
                holder.name,
                f"~/{remote}/{clean(name, 200)}: {what}, but its manifest lists {size} bytes",
            )
    extra = sorted(set(found) - set(listed) - {MANIFEST_NAME})
    if extra:
        raise HostError(
            holder.name, f"~/{remote}: files the manifest does not list: {clean(', '.join(extra), 200)}"
        )


# -- before a later attempt --------------------------------------------------------------------------


@dataclass(frozen=True)
class Spread:
    """What ``spread_latest`` did: the path every node resumes from (None: none chosen), a
    sentence for the operator, and the same for the run record (``resumed_from``)."""

    resume_from: str | None
    said: str
    record: str
    refused: tuple[str, ...] = field(default_factory=tuple)


def spread_latest(
    fleet: Fleet,
    hosts: list[Host],
    run_id: str,
    known_hosts: Path,
    staging: Path,
    recorded: Mapping[int, str] | None = None,
    bucket: bool = False,
    peers: Mapping[int, str] | None = None,
    uploaded: Mapping[int, str] | None = None,
    bucket_url: str | None = None,
) -> Spread:
    """Copy the newest trusted checkpoint (``choose``) to every node of ``hosts`` that lacks it,
    unless the bucket holds a newer one (``newest_durable``): then every node resumes from that.

    ``recorded``: step -> manifest sha256 of every save rank 0 reported (the watcher's metrics);
    ``bucket``: the run has one (the nodes look there themselves when no node holds a step);
    ``peers``: step -> node of the peer copies made during the run (to say where a step came
    from); ``uploaded``: step -> manifest sha256 of the uploads rank 0 reported complete, with
    ``bucket_url`` the run's bucket prefix. A node the copy fails on raises ``HostError``."""
    claims = complete_claims(fleet, hosts, run_id)
    choice = choose(claims, recorded or {}, run_id)
    refused = "".join(f"; refused {r}" for r in choice.refused[:5])
    durable = newest_durable(choice.step, uploaded or {}, recorded or {}) if bucket_url else None
    if durable is not None and durable[1] == "bucket":
        step = durable[0]
        newer = (
            f"newer than any node holds (step {choice.step})"
            if choice.step is not None
            else "no node holds one"
        )
        return Spread(
            f"{bucket_url}/checkpoints/step-{step}",
            f"checkpoint step {step} is in the bucket, {newer}: every node resumes from it{refused}",
            f"step {step} from the bucket (its upload completed; {newer}){refused}",
            choice.refused,
        )
    if choice.step is None:
        if bucket:
            why = "no node holds a checkpoint rank 0 recorded as saved"
            return Spread(
                None,
                f"{why}: the nodes resume from the bucket's newest complete step, if any{refused}",
                f"the bucket's newest step, if any ({why}){refused}",
                choice.refused,
            )
        why = (
            "no node holds a checkpoint rank 0 recorded as saved"
            if recorded
            else "rank 0 recorded no checkpoint saved"
        )
        return Spread(
            None,
            f"{why}: the next attempt starts from the beginning{refused}",
            f"the beginning: {why}{refused}",
            choice.refused,
        )
    step = choice.step
    remote = f"{checkpoint_dir(run_id)}/step-{step}"
    by_name = {h.name: h for h in hosts}
    holder = choice.holders[0]
    kind = "a peer copy" if (peers or {}).get(step) == holder else "its own save"
    origin = f"step {step} from {holder} ({kind}){refused}"
    lacking = [h for h in hosts if h.name not in choice.holders]
    if not lacking:
        return Spread(remote, f"every node holds checkpoint step {step}{refused}", origin, choice.refused)
    failed = copy_step(
        by_name[holder],
        lacking,
        run_id,
        step,
        known_hosts,
        staging,
        fleet_run(fleet),
        manifest=(recorded or {}).get(step, ""),
    )
    if failed:
        raise next(iter(failed.values()))
    names = ", ".join(h.name for h in lacking)
    return Spread(
        remote,
        f"checkpoint step {step} copied from {holder} ({kind}) to {names}{refused}",
        origin,
        choice.refused,
    )


def drained_from_bucket(spread: Spread, drained: Sequence[Drained], bucket_url: str | None) -> Spread:
    """The step a drain saw reach the bucket when no node holds one as new: resume from there.

    A preempted node's drain ends once its post-notice checkpoint is in the bucket (``durable``);
    the node then goes with its disk. ``spread_latest`` only sees the nodes' disks, where the
    newest step may be older (a step copied to a node for an earlier attempt): resuming from it
    would recompute the steps the notice's checkpoint saved. ``bucket_url``: the run's bucket
    prefix (``<url>`` of ``<url>/checkpoints/step-<N>``), None without a bucket."""
    steps = [d.step for d in drained if d.ended == "durable" and d.step is not None]
    if bucket_url is None or not steps:
        return spread
    step = max(steps)
    found = STEP_DIR.search(spread.resume_from or "")
    if found is not None and int(found.group(1)) >= step:
        return spread
    nodes = ", ".join(d.node for d in drained if d.step == step)
    return Spread(
        f"{bucket_url}/checkpoints/step-{step}",
        f"checkpoint step {step} is in the bucket (the drain of {nodes} saw it there): every node resumes from it",
        f"step {step} from the bucket (drained from {nodes})",
        spread.refused,
    )


def resume_story(chosen: str | None, summary: MetricsSummary | None) -> str | None:
    """The record's ``resumed_from`` for an attempt: what the laptop chose before it started
    (``Spread.record``), what rank 0 says it resumed from (``checkpoint_resumed``), and every
    checkpoint the helper refused on the way, so ``fab show`` names a restart from scratch and
    its cause."""
    parts = [chosen] if chosen else []
    if summary is not None:
        resumed = summary.resumed_checkpoint
        if resumed is not None and resumed[0] is not None:
            parts.append(f"rank 0 resumed from step {resumed[0]} ({resumed[1]})")
        elif resumed is not None:
            parts.append("rank 0 found no checkpoint that loads: it started from the beginning")
        parts += [f"refused {line}" for line in summary.refused_checkpoints[:5]]
    return clean("; ".join(parts), 1500) if parts else None
