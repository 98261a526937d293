"""``images/``: machine-image recipes, and the runtime files fleetrun reads at run time.

In the wheel this folder is the package ``fleetrun_images`` (``setup.py`` maps it and ships only
the files in ``RUNTIME_FILES``), so an installed fleetrun reads the same files as a checkout,
found through ``importlib.resources`` instead of a path relative to the source tree. The files
stay here, where the image recipes that share them (``docker/``, ``packer/``) live:

* ``cloud-init/``             each cloud node's first boot (read by ``infra.bootstrap``)
* ``horovod/install.sh``      the Horovod build on nodes and in the local image
  (``launch.planning.launchers.horovod``, ``make horovod``)
* ``local/requirements.txt``  the local fleet's Python image (``launch.fleets.local``)
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

RUNTIME_FILES = (
    "cloud-init/fleetrun-bootstrap.sh",
    "cloud-init/sshd-fleetrun.conf",
    "horovod/install.sh",
    "local/requirements.txt",
)


def runtime_file(name: str) -> Path:
    """The installed copy of ``images/<name>`` (a plain file: wheels are installed unpacked)."""
    return Path(str(files(__name__).joinpath(name)))
