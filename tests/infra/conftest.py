"""pytest hooks for tests/infra; shared helpers live in ``infra_cases``."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "typecheck: runs mypy over infra/ (~2 min cold, seconds with a warm cache)"
    )
    # The providers warn about their own deprecated classes when their modules are imported.
    config.addinivalue_line("filterwarnings", "ignore::DeprecationWarning:pulumi_aws")
    config.addinivalue_line("filterwarnings", "ignore::DeprecationWarning:pulumi_gcp")


@pytest.fixture(params=["aws", "gcp"])
def cloud(request: pytest.FixtureRequest) -> str:
    return str(request.param)
