"""A playbook's ``profile:`` section: which ranks run ``torch.profiler`` for which steps.

Pure data, validated with pydantic; kept apart from the job spec so each stays small. The node
side (``launch/nodelib/fleetrun_profile.py``) reads only the environment ``node_env`` gives.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field, field_validator

MAX_PROFILE_STEPS = 100
"""Most steps one profile may span: a trace grows with every step recorded, and it is pulled whole."""
MAX_PROFILE_RANKS = 64
PROFILE_STEPS_RE = re.compile(r"\s*(\d{1,9})\s*(?:-\s*(\d{1,9})\s*)?")


class ProfileSpec(BaseModel):
    """``profile: {steps: "20-30", ranks: [0]}``: ``torch.profiler`` on those ranks for those steps.

    Steps are the ``step`` the training loop gives the metrics helper (``Metrics.log(step=...)``),
    both ends included; the node helper (``fleetrun_profile``) starts the profiler after the step
    before the range is logged and writes the trace when its last step is. Kept short and on few
    ranks, since every recorded operator lands in a trace that is pulled back with the run.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    steps: str = Field(max_length=40)
    """Steps to profile, both ends included: ``"20-30"`` or one step ``"25"`` (the ``step`` the loop gives ``Metrics.log``); at most 100."""
    ranks: list[int] = Field(default_factory=lambda: [0], min_length=1, max_length=MAX_PROFILE_RANKS)
    """Global ranks that profile (default rank 0); each must exist in the job's world size."""

    @field_validator("steps", mode="before")
    @classmethod
    def _steps_range(cls, value: object) -> object:
        if isinstance(value, int) and not isinstance(value, bool):
            value = str(value)
        if not isinstance(value, str):
            raise ValueError('expected a step range like "20-30" (or one step, "25")')
        match = PROFILE_STEPS_RE.fullmatch(value)
        if not match:
            raise ValueError('expected a step range like "20-30" (or one step, "25")')
        first = int(match.group(1))
        last = int(match.group(2) or first)
        if last < first:
            raise ValueError(f"the range {first}-{last} ends before it starts")
        if last - first + 1 > MAX_PROFILE_STEPS:
            raise ValueError(
                f"{last - first + 1} steps is more than {MAX_PROFILE_STEPS} (a trace grows with every step "
                "and is pulled whole): profile a shorter range"
            )
        return f"{first}-{last}"

    @field_validator("ranks")
    @classmethod
    def _ranks(cls, value: list[int]) -> list[int]:
        for rank in value:
            if not 0 <= rank <= 1_000_000:
                raise ValueError(f"expected global ranks from 0, got {rank}")
        if len(set(value)) != len(value):
            raise ValueError("a rank is listed twice")
        return sorted(value)

    @property
    def first_step(self) -> int:
        return int(self.steps.split("-")[0])

    @property
    def last_step(self) -> int:
        return int(self.steps.split("-")[1])

    def node_env(self) -> dict[str, str]:
        """What the launchers export for ``fleetrun_profile`` (the node side reads only these)."""
        return {
            "FLEETRUN_PROFILE_STEPS": self.steps,
            "FLEETRUN_PROFILE_RANKS": ",".join(str(r) for r in self.ranks),
        }
