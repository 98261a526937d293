"""What pyproject.toml cannot say: ``images/`` ships in the wheel as the package ``fleetrun_images``,
and the built-in playbooks with their example code as data files under ``share/fleetrun/``.

The runtime files stay where the image recipes are (see ``images/__init__.py``) and are mapped
into the wheel here, so a checkout and an installed package read the same files through
``importlib.resources``. Everything else about the package is in pyproject.toml.
"""

from pathlib import Path

from setuptools import find_packages, setup


def shipped(top: str) -> list[tuple[str, list[str]]]:
    """``top``'s files as data files under ``share/fleetrun/``, keeping the layout: a playbook's
    ``workdir: ../examples/digits`` must still find its code (``launch/job/builtin.py``)."""
    by_dir: dict[str, list[str]] = {}
    for path in sorted(Path(top).rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
            by_dir.setdefault(str(Path("share/fleetrun") / path.parent), []).append(str(path))
    return sorted(by_dir.items())


setup(
    packages=[
        *find_packages(include=["launch", "launch.*", "infra", "infra.*", "fleetrun_contract"]),
        "fleetrun_images",
    ],
    package_dir={"fleetrun_images": "images"},
    package_data={
        "launch": ["nodelib/*.py", "py.typed", "job/schemas/*.json"],
        "fleetrun_images": ["cloud-init/*", "horovod/*", "local/*"],
    },
    data_files=[*shipped("playbooks"), *shipped("examples")],
)
