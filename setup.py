"""What pyproject.toml cannot say: ``images/`` ships in the wheel as the package ``fleetrun_images``.

The runtime files stay where the image recipes are (see ``images/__init__.py``) and are mapped
into the wheel here, so a checkout and an installed package read the same files through
``importlib.resources``. Everything else about the package is in pyproject.toml.
"""

from setuptools import find_packages, setup

setup(
    packages=[
        *find_packages(include=["launch", "launch.*", "infra", "infra.*", "fleetrun_contract"]),
        "fleetrun_images",
    ],
    package_dir={"fleetrun_images": "images"},
    package_data={
        "launch": ["nodelib/*.py", "py.typed"],
        "fleetrun_images": ["cloud-init/*", "horovod/*", "local/*"],
    },
)
