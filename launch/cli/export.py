"""``fab export``: a playbook as another system's job definition (the manifest is built in
``launch.planning.export_pytorchjob``; this module reads the playbook and writes the file)."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path

import yaml

from launch.errors import FleetrunError, SpecError
from launch.job.overrides import parse_overrides
from launch.job.spec import JobSpec, load_job_spec
from launch.reports.safe_text import clean

TARGETS = ("pytorchjob",)


def _relative_workdir(workdir: Path, context: Path) -> str | None:
    try:
        return str(workdir.resolve().relative_to(context.resolve())) or "."
    except ValueError:
        return None


def pod_image(spec: JobSpec, image: str) -> tuple[str, bool]:
    """The image the pods run and whether it is the playbook's own ``container.image`` (the one
    its fleet runs, so no other is built): ``--image`` when given, else ``container.image``."""
    if image:
        return image, spec.container is not None and spec.container.image == image
    if spec.container is not None:
        return spec.container.image, True
    raise SpecError(
        "--image: the container image the pods run is required when the playbook has no "
        "container.image (see images/docker/Dockerfile)"
    )


def export(
    playbook: str,
    *,
    to: str,
    image: str = "",
    nodes: int | str | None = None,
    gpus: int | str | None = None,
    namespace: str = "default",
    output: str | None = None,
    overrides: Sequence[str] = (),
    allow_paths: tuple[Path, ...] = (),
) -> Path | None:
    """Export ``playbook``; the manifest goes to ``output`` (or stdout), the notes to stderr."""
    if to not in TARGETS:
        raise SpecError(f"--to: expected one of {', '.join(TARGETS)}, got {to[:40]!r}")
    try:
        from launch.planning.export_pytorchjob import build_command, count_option, export_pytorchjob
    except ImportError as exc:
        raise FleetrunError(
            f"exporting a PyTorchJob needs the Training Operator SDK ({exc}): pip install 'fleetrun[kubeflow]'"
        ) from None
    node_count = count_option("--nodes", nodes, 1, 4096)
    gpu_count = count_option("--gpus", gpus, 0, 1024)
    spec = load_job_spec(playbook, parse_overrides(overrides), allowed=allow_paths)
    image, fleet_image = pod_image(spec, image)
    result = export_pytorchjob(spec, image, nodes=node_count, gpus_per_node=gpu_count, namespace=namespace)
    text = (
        f"# PyTorchJob exported by fleetrun from {clean(playbook, 300)} (kubectl apply -f this file)\n"
        + yaml.safe_dump(result.manifest, sort_keys=False, width=1000)
    )
    target = None
    if output:
        target = Path(output)
        try:
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # env may hold secrets
            with os.fdopen(fd, "w") as handle:
                handle.write(text)
        except OSError as exc:
            raise FleetrunError(f"--output: cannot write {clean(output, 300)}: {clean(exc)}") from None
        print(f"wrote {clean(target, 300)}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    context = Path.cwd()
    workdir = _relative_workdir(spec.workdir, context)
    if fleet_image:
        print(
            f"image: {clean(image, 300)}, the playbook's container.image (what its fleet runs); the pods "
            "need the job's code in /workspace and fleetrun's entry wrapper in it, as "
            "images/docker/Dockerfile builds them"
            + (f": {build_command(spec, image, '.', workdir)}" if workdir is not None else ""),
            file=sys.stderr,
        )
    elif workdir is None:
        print(
            f"note: the workdir {clean(spec.workdir, 300)} is outside {clean(context, 300)}; build the image "
            "from a directory holding both it and launch/nodelib",
            file=sys.stderr,
        )
    else:
        print(f"image: {build_command(spec, image, '.', workdir)}", file=sys.stderr)
    for note in result.notes:
        print(f"note: {clean(note, 800)}", file=sys.stderr)
    return target
