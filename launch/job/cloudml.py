"""A playbook's Cloud ML Engine / Vertex AI fields: ``tf_config:`` and ``job_dir:``.

``tf_config`` picks the cluster layout of ``TF_CONFIG`` that a trainer written for one of the
services expects (``launch.planning.launchers.cloudml`` builds it per node): ``workers`` (every
node a worker), ``chief`` (node 0 the chief, as Vertex AI and TF's MultiWorkerMirroredStrategy
expect) or ``master`` (node 0 the master, as Cloud ML Engine gives it).

``job_dir`` is the seeds' ``--job-dir`` convention: a folder inside the node's run directory (so
it is pulled back with the run, like ``outputs``), passed to the entrypoint as ``--job-dir`` and
exported as ``FLEETRUN_JOB_DIR``. Pure: validation only.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, Field

TfConfigLayout = Literal["workers", "chief", "master"]
JOB_DIR_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*(/[A-Za-z0-9_][A-Za-z0-9._-]*)*")
SCRATCH = "tmp"
"""The job's ``TMPDIR`` in the run directory (``remote_layout.RUN_TMP``): removed when the job ends
and never pulled, so a job dir there would never come back."""
JOB_DIR_ARGS = ' --job-dir "$FLEETRUN_JOB_DIR"'
"""What the entrypoint gets: the node's (or pod's) shell expands the variable to the real path."""


def _inside_run_dir(value: str | None) -> str | None:
    if value is not None and (not JOB_DIR_RE.fullmatch(value) or ".." in value.split("/")):
        raise ValueError(
            "expected a relative path inside the run directory: letters, digits, '.', '_', '-' and '/' "
            "(no '..', not absolute; a gs:// URL is the service's, here the folder comes back with the run)"
        )
    if value is not None and value.split("/")[0] == SCRATCH:
        raise ValueError(f"'{SCRATCH}/' is the job's scratch folder (removed at the end, never pulled back)")
    return value


JobDir = Annotated[str | None, Field(default=None, max_length=255), AfterValidator(_inside_run_dir)]
