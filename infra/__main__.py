"""Pulumi entry point (``main: infra/`` in Pulumi.yaml): settings in, cluster and outputs out.

Pulumi's Python host runs this directory as a script (``runpy.run_path``), so ``infra/`` itself
is ``sys.path[0]`` while it runs. Everything is imported by its full name (``infra.*``,
``fleetrun_contract.*``) from the interpreter's own environment, never by the bare module names
of this directory: in a checkout the ``virtualenv`` of ``Pulumi.yaml`` holds fleetrun installed
editable (``pip install -e .``, which ``make setup`` does); an installed package's materialised
project (``launch.fleets.pulumi_project``) names the environment fleetrun is installed in.
"""

from infra.config import load_settings
from infra.program import build_fleet

build_fleet(load_settings())
