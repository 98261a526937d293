"""The docs site and the generated references stay true to the code.

* The reference pages and the JSON Schemas are generated (``docs/gen_reference.py``): a model
  field added without a description, or a generated file not regenerated, fails here.
* Every field a validation error names (the broken-input corpus's expectations) appears in the
  generated reference, so a user who gets ``field 'stop.stall_timeout_s'`` finds it documented.
* The site builds with MkDocs in strict mode: a broken link or a page missing from the nav fails.
* The schemas accept every built-in playbook and refuse an unknown field, as the validator does.
* The README stays a short entry point (at most 150 lines).
"""

from __future__ import annotations

import html
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
from tests.test_broken_inputs import CASES  # noqa: E402


def documented_paths(page: Path) -> set[str]:
    """The field paths in the first column of a generated reference page's tables."""
    return set(re.findall(r"^\| `([^`]+)` \|", page.read_text(encoding="utf-8"), flags=re.M))


def test_generated_files_are_current_and_every_field_is_described() -> None:
    """In a fresh interpreter: invoke's tasks give up their help texts once a program has parsed
    them (``Task.arg_opts`` pops them), so other tests in this process would change the page."""
    result = subprocess.run(
        [sys.executable, str(REPO / "docs" / "gen_reference.py"), "--check"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def _normalized(target: str, path: str) -> str:
    path = re.sub(r"\[\d+\]", "", path)
    if target.endswith("hosts.yaml"):
        if path in ("defaults", "hosts"):
            return path
        if path == "nodes":  # the playbook's field, named when the inventory is too small
            return path
        path = re.sub(r"^(hosts|defaults)\.", "", path)
        return f"hosts[].{path}"
    head, _, rest = path.partition(".")
    if head in ("env", "hyperparameters"):
        return head
    if head == "channels" and rest:
        name, _, field = rest.partition(".")
        return f"channels.<name>.{field}" if field else "channels"
    return path


def test_every_field_a_validation_error_names_is_in_the_reference() -> None:
    playbook = documented_paths(REPO / "docs/reference/playbook.md")
    inventory = documented_paths(REPO / "docs/reference/inventory.md")
    stack = documented_paths(REPO / "docs/reference/stack-config.md")
    named: list[tuple[str, str]] = []
    for case in CASES:
        if any("unknown field" in e for e in case.expect):
            continue  # the field named is the user's typo
        for expected in case.expect:
            match = re.match(r"field '([^']*)'", expected)
            if match:
                named.append((case.target, match.group(1)))
    assert len(named) > 40  # the corpus is still there
    undocumented = []
    for target, path in named:
        key = _normalized(target, path)
        if target.endswith("out.json"):
            ok = key in stack or f"nodes[].{key}" in stack
        elif target.endswith("hosts.yaml"):
            ok = key in inventory or key in playbook
        else:
            ok = key in playbook
        if not ok:
            undocumented.append(f"{target}: {path} (looked for {key})")
    assert undocumented == []


def _playbook_data(path: Path) -> dict[str, object]:
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    recovery = data.get("recovery")
    if isinstance(recovery, dict) and True in recovery:  # YAML 1.1's bare on: (editors read YAML 1.2)
        recovery["on"] = recovery.pop(True)
    return data


def test_schemas_accept_the_built_in_playbooks_and_refuse_unknown_fields() -> None:
    schema = json.loads((REPO / "launch/job/schemas/playbook.schema.json").read_text())
    validator = jsonschema.Draft202012Validator(schema)
    playbooks = sorted((REPO / "playbooks").glob("*.yaml"))
    assert playbooks
    for path in playbooks:
        errors = [e.message for e in validator.iter_errors(_playbook_data(path))]
        assert errors == [], f"{path.name}: {errors}"
        first = path.read_text(encoding="utf-8").splitlines()[0]
        assert "yaml-language-server: $schema=" in first, f"{path.name}: no schema comment on line 1"
    typo = {"name": "x", "workdir": ".", "entrypoint": "python t.py", "nodez": 3}
    assert any("nodez" in e.message for e in validator.iter_errors(typo))
    elastic = {"name": "x", "workdir": ".", "entrypoint": "python t.py", "nodes": "2:3"}
    assert list(validator.iter_errors(elastic)) == []

    inventory = json.loads((REPO / "launch/job/schemas/inventory.schema.json").read_text())
    hosts = {
        "defaults": {"user": "alice"},
        "hosts": [{"name": "gpu1", "address": "10.0.0.1", "host_key": "ssh-ed25519 AAAA"}],
    }
    ivalidator = jsonschema.Draft202012Validator(inventory)
    assert list(ivalidator.iter_errors(hosts)) == []
    assert list(ivalidator.iter_errors({**hosts, "teardown": "always"}))


def test_the_inventory_schema_accepts_the_slurm_tutorials_file_and_refuses_what_only_fleetrun_sets() -> None:
    """An editor checking a Slurm inventory against the schema agrees with the loader: the
    tutorial's file is clean, ``job_ids`` (fleetrun's own record) and a typo are flagged, and the
    patterns mean in an editor's regex what they mean in the model."""
    schema = json.loads((REPO / "launch/job/schemas/inventory.schema.json").read_text())
    validator = jsonschema.Draft202012Validator(schema)
    text = (REPO / "docs/tutorials/slurm.md").read_text(encoding="utf-8")
    block = text.split("# cluster.yaml\n", 1)[1].split("```", 1)[0]
    data = yaml.safe_load(block)
    assert data["slurm"]["partition"] == "gpu"
    assert [e.message for e in validator.iter_errors(data)] == []
    for bad in (
        {"job_ids": [7]},
        {"partitoin": "gpu"},
        {"partition": "gpu;rm -rf /"},
        {"exclude": ["gpu7\n"]},
    ):
        wrong = {**data, "slurm": {**data["slurm"], **bad}}
        assert list(validator.iter_errors(wrong)), bad


def test_docs_site_builds_strictly(tmp_path: Path) -> None:
    mkdocs = Path(sys.executable).parent / "mkdocs"
    if not mkdocs.exists():
        pytest.fail("mkdocs is not installed: it is a dev dependency (pip install -e '.[dev]')")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    result = subprocess.run(
        [str(mkdocs), "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert (tmp_path / "site" / "reference" / "playbook" / "index.html").exists()


def svg_text(path: Path) -> str:
    """The terminal text of a Rich SVG, spaces dropped (Rich writes them as separate spans)."""
    source = path.read_text(encoding="utf-8")
    assert source.startswith("<svg"), path
    spans = re.findall(r"<text[^>]*>(.*?)</text>", source)
    return "".join(html.unescape(s) for s in spans).replace("\xa0", "").replace(" ", "")


def test_pictures_from_real_runs_exist() -> None:
    """``make docs-pictures`` writes them from a real local fleet; the pages show them."""
    img = REPO / "docs/img"
    assert "noerrors" in svg_text(img / "doctor-healthy.svg")
    assert "ERROR" in svg_text(img / "doctor-fault.svg")
    assert "succeeded" in svg_text(img / "train.svg")
    assert (REPO / "docs/img/loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    pages = "".join(p.read_text(encoding="utf-8") for p in (REPO / "docs").rglob("*.md"))
    for name in ("doctor-fault.svg", "train.svg", "loss.png"):
        assert f"img/{name}" in pages, f"no page shows {name}"


def test_readme_is_a_short_entry_point() -> None:
    lines = (REPO / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 150
    text = "\n".join(lines[:15])
    assert "make demo" in text and "make test" in text
