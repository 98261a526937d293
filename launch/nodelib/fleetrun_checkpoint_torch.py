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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
if TYPE_CHECKING:
    from launch.nodelib.fleetrun_checkpoint import Checkpoint, Checkpointer, attempt, default
else:
    from fleetrun_checkpoint import Checkpoint, Checkpointer, attempt, default  # noqa: E402


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


def load_training_state(ckpt: Checkpoint, model: Any, optimizer: Any = None) -> dict[str, Any]:
    """Restore model, optimizer and RNG from ``ckpt``; returns step, epoch, sampler and extra.

    The file's hash was checked against the manifest by ``latest()``; it is fleetrun's own
    pickle (RNG states are not plain tensors), hence ``weights_only=False``.
    """
    import torch

    state = torch.load(ckpt.file(STATE_FILE), map_location="cpu", weights_only=False)
    model.load_state_dict(state["model"])
    if optimizer is not None and state.get("optimizer") is not None:
        optimizer.load_state_dict(state["optimizer"])
    _restore_rng(state.get("rng") or {})
    return {k: state.get(k) for k in ("step", "epoch", "sampler", "extra", "attempt")}
