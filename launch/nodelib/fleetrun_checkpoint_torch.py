"""The checkpoint helper's torch conveniences: a whole training state in one checkpoint.

Model, optimizer, epoch and step, the sampler's state, the caller's ``extra`` and every random
generator (Python, torch, CUDA, numpy when present), so a resumed attempt continues the same
sequence of batches and dropout masks instead of starting a different run. Kept apart from
``fleetrun_checkpoint`` (which re-exports these) so that module stays torch-free; torch is
imported only when called. Standard library only otherwise.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if not __package__:  # on a node, beside the other files in ~/.fleetrun/lib (not as launch.nodelib)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
if TYPE_CHECKING or __package__:  # one module per file: launch.nodelib.X here, X on a node
    from launch.nodelib.fleetrun_ranks import horovod
else:
    from fleetrun_ranks import horovod  # noqa: E402


STATE_FILE = "training_state.pt"


class Refused(ValueError):
    """A checkpoint file that is not plain data (a pickle naming a callable, a foreign format) or
    not a training state: never resumed from."""


class UnsafeTorch(Refused):
    """This node's torch has a known ``weights_only`` bypass: no checkpoint is loaded with it."""


SAFE_TORCH = (2, 6)
"""The oldest torch whose ``torch.load(weights_only=True)`` has no known bypass: before 2.6 a
crafted file runs code even so (CVE-2025-32434). Loading is the only barrier between a checkpoint
another node wrote and this node's code, so older torch loads none."""


def torch_bypass(version: str) -> str:
    """Why checkpoints are not loaded with torch ``version`` (one line naming the fix), or ''."""
    parts = []
    for piece in version.split("+")[0].split(".")[:2]:
        digits = "".join(c for c in piece if c.isdigit()) if piece[:1].isdigit() else ""
        parts.append(int(digits[:6]) if digits else -1)
    if len(parts) == 2 and tuple(parts) >= SAFE_TORCH:
        return ""
    need = ".".join(map(str, SAFE_TORCH))
    return (
        f"torch {version[:40]} has a known weights_only bypass (CVE-2025-32434): checkpoints are not "
        f"loaded with it; install torch>={need} on the nodes"
    )


def _rng_state() -> dict[str, Any]:
    """Every generator's state as tensors and plain types, so it loads with ``weights_only``."""
    import random

    import torch

    version, internal, gauss = random.getstate()
    state: dict[str, Any] = {
        "python": [int(version), torch.tensor(internal, dtype=torch.int64), gauss],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = list(torch.cuda.get_rng_state_all())
    with contextlib.suppress(ImportError):
        import numpy

        kind, keys, pos, has_gauss, cached = numpy.random.get_state(legacy=True)  # type: ignore[misc]
        state["numpy"] = [
            str(kind),
            torch.from_numpy(numpy.asarray(keys, dtype="int64")),
            int(pos),
            int(has_gauss),
            float(cached),
        ]
    return state


def _restore_rng(state: dict[str, Any]) -> None:
    import random

    import torch

    if "python" in state:
        version, internal, gauss = state["python"]
        internal = internal.tolist() if hasattr(internal, "tolist") else internal
        random.setstate((int(version), tuple(int(x) for x in internal), gauss))
    if "torch" in state:
        torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if "numpy" in state:
        with contextlib.suppress(ImportError):
            import numpy

            kind, keys, pos, has_gauss, cached = state["numpy"]
            numpy.random.set_state((kind, keys.numpy().astype("uint32"), pos, has_gauss, cached))


_PLAIN = (str, int, float, bool, type(None), bytes)


def _check_plain(value: Any, where: str, depth: int = 0) -> None:
    """``value`` must load back with ``torch.load(weights_only=True)``: tensors and plain types
    (dict, list, tuple, str, numbers, None). Checked at save time, where the caller can fix it,
    not at resume, where the checkpoint would be refused."""
    import torch

    if depth > 32:
        raise TypeError(f"{where} is nested too deeply for a checkpoint")
    if isinstance(value, (*_PLAIN, torch.Tensor)):
        return
    if isinstance(value, dict):
        for key, item in value.items():
            _check_plain(key, f"{where} key", depth + 1)
            _check_plain(item, f"{where}[{key!r}]", depth + 1)
        return
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _check_plain(item, f"{where}[{i}]", depth + 1)
        return
    raise TypeError(
        f"{where} is a {type(value).__name__}: a checkpoint holds only tensors and plain types "
        "(dict, list, tuple, str, int, float, bool, None), so it loads as data (weights_only)"
    )


def load_state_bytes(data: bytes) -> dict[str, Any]:
    """A training state from a checkpoint file's bytes, as data only (``weights_only=True``: a
    pickle that names any callable torch does not allow is refused, nothing runs). ``Refused``
    when it is not plain data or not a training state."""
    import io

    import torch

    why = torch_bypass(str(torch.__version__))
    if why:
        raise UnsafeTorch(why)
    try:
        state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - whatever a foreign file makes torch raise
        first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
        raise Refused(f"not plain data ({type(exc).__name__}: {first})") from None
    if not isinstance(state, dict) or not isinstance(state.get("model"), dict):
        raise Refused("not a training state (no model state dict)")
    return state


def save_training_state(
    step: int,
    model: Any,
    optimizer: Any = None,
    epoch: int | None = None,
    sampler_state: Any = None,
    extra: Any = None,
    checkpointer: Checkpointer | None = None,
    background: bool = True,
) -> Checkpoint | None:
    """Save model, optimizer, epoch/step, sampler state, ``extra`` and every RNG (rank 0).

    Returns once ``torch.save`` wrote the state; the fsync, the manifest's hashes and the rename
    follow in the background (``Checkpointer.save``'s ``background``), so a step waits for about
    what a plain ``torch.save`` costs. ``background=False``: return with the step complete."""
    import torch

    cp = checkpointer or default()
    if not cp.writes:
        return None
    _check_plain(sampler_state, "sampler_state")
    _check_plain(extra, "extra")
    state = {
        "step": int(step),
        "epoch": epoch,
        "model": model.state_dict(),
        "optimizer": None if optimizer is None else optimizer.state_dict(),
        "sampler": sampler_state,
        "extra": extra,
        "rng": _rng_state(),
        "attempt": attempt(),
    }
    return cp.save(
        step, lambda path: torch.save(state, os.path.join(path, STATE_FILE)), background=background
    )


def _apply(state: dict[str, Any], model: Any, optimizer: Any) -> dict[str, Any]:
    model.load_state_dict(state["model"])
    if optimizer is not None and state.get("optimizer") is not None:
        optimizer.load_state_dict(state["optimizer"])
    _restore_rng(state.get("rng") or {})
    return {k: state.get(k) for k in ("step", "epoch", "sampler", "extra", "attempt")}


def load_training_state(ckpt: Checkpoint, model: Any, optimizer: Any = None) -> dict[str, Any]:
    """Restore model, optimizer and RNG from ``ckpt``; returns step, epoch, sampler and extra.

    Data only: ``torch.load(weights_only=True)``, so a file that would run code when unpickled
    raises ``Refused`` instead (the same on a node and on the laptop, for a pulled checkpoint).
    """
    with open(ckpt.file(STATE_FILE), "rb") as fh:
        return _apply(load_state_bytes(fh.read()), model, optimizer)


def _first_loadable(cp: Checkpointer, candidates: Iterator[Checkpoint]) -> tuple[bytes, str, str] | None:
    """The bytes of the first candidate that loads as a training state, with its source and
    path; each one refused on the way is named (``Checkpointer.refuse``). What was chosen goes
    into the run's metrics (``checkpoint_resumed``; step None: none), for the run record."""
    got = _first_of(cp, candidates)
    if cp.rank == 0:
        step = None if got is None else got[3]
        record_event(cp.run_dir, "checkpoint_resumed", step=step, source="none" if got is None else got[1])
    return None if got is None else got[:3]


def _first_of(cp: Checkpointer, candidates: Iterator[Checkpoint]) -> tuple[bytes, str, str, int] | None:
    for found in candidates:
        try:
            with open(found.file(STATE_FILE), "rb") as fh:
                data = fh.read()
            load_state_bytes(data)
        except OSError as exc:
            cp.refuse(found, STATE_FILE, f"unreadable ({type(exc).__name__})")
            continue
        except UnsafeTorch as exc:
            # not this file's fault, and no other file would load: a fresh start would throw the
            # run's progress away, so the job ends here with the one line that says the fix
            raise SystemExit(f"fleetrun: cannot resume from {found.path}: {exc}") from None
        except Refused as exc:
            cp.refuse(found, STATE_FILE, str(exc))
            continue
        return data, found.source, found.path, found.step
    return None


def resume_training_state(
    model: Any, optimizer: Any = None, checkpointer: Checkpointer | None = None
) -> dict[str, Any] | None:
    """Every rank resumes from the same checkpoint, or none does (returns None: a fresh start).

    Rank 0 takes the first candidate (``Checkpointer.candidates``: resume_from, its disk, the
    bucket) that loads as data, naming every one it refuses, and, under torch.distributed, sends
    its bytes to the other ranks: their disks need not hold it (rank 0 wrote it on another node),
    and two ranks must never start from different steps. Every rank loads them with
    ``weights_only`` too and gets rank 0's RNG state. Sharded checkpoints: each rank loads its own
    shard, of the newest step complete on every rank (``agreed_latest``).
    The answer adds ``source`` and ``path`` to ``load_training_state``'s.
    """
    import torch

    cp = checkpointer or default()
    dist = _distributed()
    hvd = horovod() if dist is None else None
    if hvd is not None and not cp.sharded:
        return _resume_under_horovod(hvd, cp, model, optimizer)
    if cp.sharded:
        found = cp.agreed_latest()  # agreed: one step on every rank
        if found is None:
            return None
        return {**load_training_state(found, model, optimizer), "source": found.source, "path": found.path}
    if dist is None:
        got = _first_loadable(cp, cp.candidates())
        if got is None:
            return None
        data, source, path = got
        return {**_apply(load_state_bytes(data), model, optimizer), "source": source, "path": path}
    first = dist.get_rank() == 0
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else None

    def broadcast(tensor: Any, _name: str) -> Any:
        dist.broadcast(tensor, src=0)
        return tensor

    got = _share_resume(broadcast, _first_loadable(cp, cp.candidates()) if first else None, first, device)
    if got is None:
        return None
    data, source, path = got
    return {**_apply(load_state_bytes(data), model, optimizer), "source": source, "path": path}


RESUME_HEADER_LIMIT = 64 * 1024
"""The most bytes of the JSON that names rank 0's choice (source and path) in the resume broadcast."""


def _share_resume(
    broadcast: Any, got: tuple[bytes, str, str] | None, first: bool, device: Any
) -> tuple[bytes, str, str] | None:
    """Rank 0's choice (``got``) on every rank, as bytes in tensors, never a pickle.

    ``broadcast(tensor, name)`` sends rank 0's tensor to every rank and returns what arrived
    (``torch.distributed.broadcast`` or Horovod's). Two rounds: the sizes (int64), then one uint8
    tensor holding a small JSON header (source, path; ``null`` for a fresh start) and the
    checkpoint's bytes. The object collectives (``broadcast_object_list``, Horovod's
    ``broadcast_object``) unpickle what arrives; a checkpoint is data, never code, so the state
    travels as bytes and each rank loads it with ``weights_only`` like any other checkpoint.
    """
    import torch

    header, data = b"null", b""
    if first and got is not None:
        data = got[0]
        header = json.dumps({"source": got[1], "path": got[2]}).encode()
    sizes = torch.tensor([len(header), len(data)] if first else [0, 0], dtype=torch.int64, device=device)
    sizes = broadcast(sizes, "fleetrun.resume.sizes")
    head_n, data_n = int(sizes[0]), int(sizes[1])
    if not 0 < head_n <= RESUME_HEADER_LIMIT or data_n < 0:
        raise SystemExit(
            f"fleetrun: the resume broadcast from rank 0 is malformed (sizes {head_n}, {data_n})"
        )
    if first:
        buf = torch.frombuffer(bytearray(header + data), dtype=torch.uint8)
        buf = buf.to(device) if device is not None else buf
    else:
        buf = torch.empty(head_n + data_n, dtype=torch.uint8, device=device)
    raw = _tensor_bytes(broadcast(buf, "fleetrun.resume.bytes"))
    try:
        named = json.loads(raw[:head_n])
    except ValueError:
        named = {}
    if named is None:
        return None
    if not (
        isinstance(named, dict)
        and isinstance(named.get("source"), str)
        and isinstance(named.get("path"), str)
    ):
        raise SystemExit("fleetrun: the resume broadcast from rank 0 does not name its checkpoint")
    return raw[head_n:], named["source"][:200], named["path"][:4096]


def _tensor_bytes(tensor: Any) -> bytes:
    """A uint8 tensor's bytes, without numpy (not every node's torch has it)."""
    import ctypes

    host = tensor.detach().to("cpu").contiguous()
    return ctypes.string_at(host.data_ptr(), host.numel()) if host.numel() else b""


def _resume_under_horovod(hvd: Any, cp: Checkpointer, model: Any, optimizer: Any) -> dict[str, Any] | None:
    """``resume_training_state`` under horovodrun: rank 0's bytes go to every rank with
    ``hvd.broadcast`` of tensors (the same guarantee as the torch.distributed path)."""
    first = hvd.rank() == 0

    def broadcast(tensor: Any, name: str) -> Any:
        return hvd.broadcast(tensor, root_rank=0, name=name)

    got = _share_resume(broadcast, _first_loadable(cp, cp.candidates()) if first else None, first, None)
    if got is None:
        return None
    data, source, path = got
    return {**_apply(load_state_bytes(data), model, optimizer), "source": source, "path": path}


def exact_allreduce(ddp: Any) -> Any:
    """Make ``ddp`` (a ``DistributedDataParallel``) sum gradients in an order that a resume does
    not change, so a resumed run ends bit-identical to an uninterrupted one on any number of ranks.

    Why: DDP all-reduces gradients in buckets, and rebuilds its buckets after the first step (in
    the order gradients became ready). A resumed run's first step therefore uses the initial
    layout where the uninterrupted run used the rebuilt one; with 3 or more ranks the ring
    all-reduce sums an element in an order that depends on its offset in the bucket, so the last
    bits differ (with 2 ranks a+b == b+a and nothing shows). This registers a communication hook
    that all-reduces each parameter's gradient on its own (then divides by the world size):
    the order depends only on the tensor, never on the bucket. Cost: one all-reduce per
    parameter tensor instead of one per bucket (measure it on a large model before using it
    there). Returns ``ddp``.
    """
    import torch
    import torch.distributed as dist

    def each_on_its_own(state: Any, bucket: Any) -> Any:
        world = dist.get_world_size()
        for grad in bucket.gradients():
            dist.all_reduce(grad)
            grad.div_(world)
        done: Any = torch.futures.Future()
        done.set_result(bucket.buffer())
        return done

    each_on_its_own.__annotations__ = {}  # DDP checks annotations; these are strings (__future__)
    ddp.register_comm_hook(None, each_on_its_own)
    return ddp


def _distributed() -> Any:
    """``torch.distributed`` when a process group is up, else None."""
    import torch.distributed as dist

    return dist if dist.is_available() and dist.is_initialized() else None


# -- the checkpoint helper's names, imported last: fleetrun_checkpoint imports this module at its
# end, so whichever of the two is imported first, the other finds every name it needs defined
if TYPE_CHECKING or __package__:  # one module per file: launch.nodelib.X here, X on a node
    from launch.nodelib.fleetrun_checkpoint import Checkpoint, Checkpointer, attempt, default, record_event
else:
    from fleetrun_checkpoint import Checkpoint, Checkpointer, attempt, default, record_event  # noqa: E402
