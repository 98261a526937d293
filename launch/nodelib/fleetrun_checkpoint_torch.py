"""The checkpoint helper's torch conveniences: a whole training state in one checkpoint.

Model, optimizer, epoch and step, the sampler's state, the caller's ``extra`` and every random
generator (Python, torch, CUDA, numpy when present), so a resumed attempt continues the same
sequence of batches and dropout masks instead of starting a different run. Kept apart from
``fleetrun_checkpoint`` (which re-exports these) so that module stays torch-free; torch is
imported only when called. Standard library only otherwise.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import TYPE_CHECKING, Any

if not __package__:  # on a node, beside the other files in ~/.fleetrun/lib (not as launch.nodelib)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
if TYPE_CHECKING or __package__:  # one module per file: launch.nodelib.X here, X on a node
    from launch.nodelib.fleetrun_ranks import horovod
else:
    from fleetrun_ranks import horovod  # noqa: E402


STATE_FILE = "training_state.pt"


def _rng_state() -> dict[str, Any]:
    import random

    import torch

    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    with contextlib.suppress(ImportError):
        import numpy

        state["numpy"] = numpy.random.get_state()
    return state


def _restore_rng(state: dict[str, Any]) -> None:
    import random

    import torch

    if "python" in state:
        random.setstate(state["python"])
    if "torch" in state:
        torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if "numpy" in state:
        with contextlib.suppress(ImportError):
            import numpy

            numpy.random.set_state(state["numpy"])


def save_training_state(
    step: int,
    model: Any,
    optimizer: Any = None,
    epoch: int | None = None,
    sampler_state: Any = None,
    extra: Any = None,
    checkpointer: Checkpointer | None = None,
) -> Checkpoint | None:
    """Save model, optimizer, epoch/step, sampler state, ``extra`` and every RNG (rank 0)."""
    import torch

    cp = checkpointer or default()
    if not cp.writes:
        return None
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
    return cp.save(step, lambda path: torch.save(state, os.path.join(path, STATE_FILE)))


def _apply(state: dict[str, Any], model: Any, optimizer: Any) -> dict[str, Any]:
    model.load_state_dict(state["model"])
    if optimizer is not None and state.get("optimizer") is not None:
        optimizer.load_state_dict(state["optimizer"])
    _restore_rng(state.get("rng") or {})
    return {k: state.get(k) for k in ("step", "epoch", "sampler", "extra", "attempt")}


def load_training_state(ckpt: Checkpoint, model: Any, optimizer: Any = None) -> dict[str, Any]:
    """Restore model, optimizer and RNG from ``ckpt``; returns step, epoch, sampler and extra.

    The file's hash was checked against the manifest by ``latest()``; it is fleetrun's own
    pickle (RNG states are not plain tensors), hence ``weights_only=False``.
    """
    import torch

    state = torch.load(ckpt.file(STATE_FILE), map_location="cpu", weights_only=False)
    return _apply(state, model, optimizer)


def resume_training_state(
    model: Any, optimizer: Any = None, checkpointer: Checkpointer | None = None
) -> dict[str, Any] | None:
    """Every rank resumes from the same checkpoint, or none does (returns None: a fresh start).

    Rank 0 finds it (``latest()``: resume_from, its disk, the bucket) and, under
    torch.distributed, sends its bytes to the other ranks: their disks need not hold it (rank 0
    wrote it on another node), and two ranks must never start from different steps. Every rank
    gets rank 0's RNG state. Sharded checkpoints: each rank loads its own shard, of the newest
    step complete on every rank (``agreed_latest``).
    The answer adds ``source`` and ``path`` to ``load_training_state``'s.
    """
    import io

    import torch

    cp = checkpointer or default()
    dist = _distributed()
    hvd = horovod() if dist is None else None
    if hvd is not None and not cp.sharded:
        return _resume_under_horovod(hvd, cp, model, optimizer)
    if cp.sharded or dist is None:
        found = cp.agreed_latest() if cp.sharded else cp.latest()  # agreed: one step on every rank
        if found is None:
            return None
        return {**load_training_state(found, model, optimizer), "source": found.source, "path": found.path}
    payload: list[Any] = [None]
    if dist.get_rank() == 0:
        found = cp.latest()
        if found is not None:
            with open(found.file(STATE_FILE), "rb") as fh:
                payload = [(fh.read(), found.source, found.path)]
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else None
    dist.broadcast_object_list(payload, src=0, device=device)
    if payload[0] is None:
        return None
    data, source, path = payload[0]
    state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=False)
    return {**_apply(state, model, optimizer), "source": source, "path": path}


def _resume_under_horovod(hvd: Any, cp: Checkpointer, model: Any, optimizer: Any) -> dict[str, Any] | None:
    """``resume_training_state`` under horovodrun: rank 0's bytes go to every rank with
    ``hvd.broadcast_object`` (the same guarantee as the torch.distributed path)."""
    import io

    import torch

    payload = None
    if hvd.rank() == 0:
        found = cp.latest()
        if found is not None:
            with open(found.file(STATE_FILE), "rb") as fh:
                payload = (fh.read(), found.source, found.path)
    payload = hvd.broadcast_object(payload, root_rank=0, name="fleetrun.resume")
    if payload is None:
        return None
    data, source, path = payload
    state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=False)
    return {**_apply(state, model, optimizer), "source": source, "path": path}


def _distributed() -> Any:
    """``torch.distributed`` when a process group is up, else None."""
    import torch.distributed as dist

    return dist if dist.is_available() and dist.is_initialized() else None


# -- the checkpoint helper's names, imported last: fleetrun_checkpoint imports this module at its
# end, so whichever of the two is imported first, the other finds every name it needs defined
if TYPE_CHECKING or __package__:  # one module per file: launch.nodelib.X here, X on a node
    from launch.nodelib.fleetrun_checkpoint import Checkpoint, Checkpointer, attempt, default
else:
    from fleetrun_checkpoint import Checkpoint, Checkpointer, attempt, default  # noqa: E402
