"""Where ``Runner`` lived: the run life cycle is now ``launch.run.lifecycle`` (the path every
command takes), ``launch.run.stages`` (each stage a function of context and state) and
``launch.run.state`` (the frozen ``RunState`` and the ``RunContext``).

The names other modules and tests import from here stay importable.
"""

from __future__ import annotations

from launch.run.stages import StepFailed, progress_bar
from launch.run.state import AskKeepRunning, RunOptions

__all__ = ["AskKeepRunning", "RunOptions", "StepFailed", "progress_bar"]
