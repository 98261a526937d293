"""``fab doctor``'s output: one verdict line per node and check, then a summary table.

Everything in a verdict may come from a node (versions, process names, user names), so it is
printed as literal text through ``safe_text``: never parsed as markup, control characters shown.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console
from rich.table import Table
from rich.text import Text

from launch.reports.safe_text import clean, safe_text
from launch.rules.preflight import CHECKS, ERROR, OK, WARN, Findings, Verdict, summary_rows

HEADER = {"python": "py", "hostname": "host", "rdzv-port": "rdzv", "interface": "iface", "gpu-health": "gpu"}
STYLE = {OK: "green", WARN: "yellow", ERROR: "bold red"}
LABEL = {OK: "ok", WARN: "WARN", ERROR: "ERROR"}


def verdict_line(verdict: Verdict, width: int = 12) -> Text:
    node = clean(verdict.node, 64)
    return (
        Text(f"{node:<{width}} {verdict.check:<10} ")
        + Text(f"{LABEL[verdict.level]:<6}", style=STYLE[verdict.level])
        + Text(" ")
        + safe_text(verdict.message, limit=600)
    )


def print_findings(
    console: Console,
    findings: Findings,
    nodes: Sequence[str],
    verbose: bool = False,
    site: Sequence[str] = (),
) -> None:
    """Verdict lines (only problems unless ``verbose``), a table, and the one-line outcome, which
    counts the fleet's own checks too (``site``: the level of each line a scheduler's health check
    printed above: a drained node is a warning of the whole answer, not only of its line)."""
    width = max([len(clean(n, 64)) for n in nodes] + [4])
    for verdict in findings.verdicts:
        if verbose or verdict.level != OK:
            console.print(verdict_line(verdict, width), soft_wrap=True)
    rows = summary_rows(findings, nodes)
    used = [c for c in CHECKS if any(c in cells for _, cells in rows)]
    table = Table(title="fab doctor", show_lines=False)
    table.add_column("node", no_wrap=True)
    for check in used:
        header = HEADER.get(check, check)
        table.add_column(header, no_wrap=True, min_width=len(header))
    readers = findings.gpu_readers
    if readers:
        table.add_column("gpu read by", no_wrap=True)
    for node, cells in rows:
        reader = [safe_text(readers.get(node, "-"), limit=40)] if readers else []
        table.add_row(
            safe_text(node, limit=64),
            *(Text(LABEL[cells[c]], style=STYLE[cells[c]]) if c in cells else Text("-") for c in used),
            *reader,
        )
    console.print(table)
    errors = len(findings.errors) + sum(1 for level in site if level == "error")
    warnings = sum(1 for v in findings.verdicts if v.level == WARN) + sum(
        1 for level in site if level == "warning"
    )
    if errors:
        console.print(
            Text(
                f"{errors} error(s), {warnings} warning(s): a job on these nodes would fail or hang",
                style="bold red",
            )
        )
    else:
        console.print(Text(f"no errors, {warnings} warning(s): the nodes are ready", style="bold green"))
