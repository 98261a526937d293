"""pytest hooks for tests/infra; shared helpers live in ``infra_cases``."""

from __future__ import annotations

import importlib.util
import warnings

import pytest

# The Pulumi program needs the cloud extras (pip install -e '.[aws,gcp]'); without them these
# tests cannot even import, so they are left out of the run with a warning rather than erroring.
MISSING = [
    m for m in ("pulumi", "pulumi_aws", "pulumi_gcp", "pulumi_tls") if importlib.util.find_spec(m) is None
]
if MISSING:
    collect_ignore_glob = ["test_*.py"]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "typecheck: runs mypy over infra/ (~2 min cold, seconds with a warm cache)"
    )
    # The providers warn about their own deprecated classes when their modules are imported.
    config.addinivalue_line("filterwarnings", "ignore::DeprecationWarning:pulumi_aws")
    config.addinivalue_line("filterwarnings", "ignore::DeprecationWarning:pulumi_gcp")
    if MISSING:
        warnings.warn(
            f"tests/infra skipped: {', '.join(MISSING)} not installed (the aws/gcp extras)", stacklevel=1
        )


@pytest.fixture(params=["aws", "gcp"])
def cloud(request: pytest.FixtureRequest) -> str:
    return str(request.param)
