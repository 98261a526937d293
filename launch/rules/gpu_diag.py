"""DCGM's active diagnostic (``fab doctor --gpu-diag N``), judged per node and per GPU: pure.

``dcgmi diag -r N`` exercises the GPUs (level 1: deployment checks in seconds; 2: PCIe and memory
in about two minutes; 3: stress, power and bandwidth tests in about fifteen, NVIDIA's figures).
The node's reader (``launch/nodelib/fleetrun_gpu.py``, ``read_diag``) runs it and flattens its
JSON into the tests that did not pass; here that answer is parsed as untrusted input and judged:
a failed test is bad on its GPU's line (``gpu3 ERROR dcgm diag: Memory test failed: ...``), and a
diagnostic that could not run (no ``dcgmi``, no host engine, past its bound) is unknown, never a
pass. A malformed answer is unknown too, naming the field, never a crash.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from launch.nodelib.fleetrun_wire import ProtocolError, _Fields
from launch.rules.gpu_health import (
    BAD,
    MAX_DCGM_TEXT,
    OK,
    UNKNOWN,
    WARN,
    GpuVerdict,
    _items,
    _opt_text,
    printable,
)

__all__ = ["DiagFailure", "DiagReport", "judge_diag", "parse_diag"]

DIAG_STATES = ("ok", "not_installed", "no_engine", "timeout", "error")
MAX_DIAG_RESULTS = 128


@dataclass(frozen=True)
class DiagFailure:
    """One test that did not pass on one GPU (``gpu`` None: on the node, or another entity)."""

    test: str
    gpu: int | None
    status: str
    """``fail`` or ``warn``."""
    warnings: tuple[str, ...]

    @property
    def test_name(self) -> str:
        """``memory`` as ``Memory``, ``pcie`` as ``PCIe`` (DCGM's plugin names, for people)."""
        name = {"pcie": "PCIe", "eud": "EUD", "memtest": "Memtest"}.get(self.test)
        return name or self.test.replace("_", " ").capitalize()


@dataclass(frozen=True)
class DiagReport:
    """One node's ``dcgmi diag -r LEVEL`` (``fleetrun_gpu.read_diag``)."""

    level: int
    state: str
    detail: str | None = None
    seconds: float | None = None
    tests: tuple[str, ...] = ()
    passed: int = 0
    skipped: int = 0
    failed: tuple[DiagFailure, ...] = ()


def parse_diag(data: object, what: str = "gpu diag") -> DiagReport:
    """The reader's diagnostic answer; a malformed one is a report in state ``error`` naming the
    field (unknown, never a pass and never a crash)."""
    level = 0
    try:
        fields = _Fields(data, what)
        level = fields.integer("level", 1, 4)
        state = fields.text("state", 20)
        if state not in DIAG_STATES:
            raise ProtocolError(f"{what}: field 'state': expected one of {', '.join(DIAG_STATES)}")
        detail = _opt_text(fields, "detail", MAX_DCGM_TEXT)
        seconds = fields.number("seconds", 0.0, 86400.0)
        if state != "ok":
            return DiagReport(level, state, None if detail is None else printable(detail), seconds)
        counts = _Fields(fields.data.get("counts"), f"{what} counts")
        failed = tuple(
            DiagFailure(
                printable(f.text("test", 60)),
                f.optional_integer("gpu", 0, 4095),
                "warn" if f.text("status", 10) == "warn" else "fail",
                tuple(printable(w) for w in f.strings("warnings", 8, _warning)),
            )
            for f in _items(fields, "failed", MAX_DIAG_RESULTS) or []
        )
        return DiagReport(
            level,
            state,
            None,
            seconds,
            tests=tuple(printable(t) for t in fields.strings("tests", 64, _test_name)),
            passed=counts.integer("pass", 0, 1 << 20),
            skipped=counts.integer("skip", 0, 1 << 20),
            failed=failed,
        )
    except ProtocolError as exc:
        return DiagReport(level, "error", printable(f"answer not understood: {exc}")[:MAX_DCGM_TEXT])


def _warning(value: object, key: str) -> str:
    if not isinstance(value, str):
        raise ProtocolError(f"field {key!r}: expected text")
    return value[:MAX_DCGM_TEXT]


def _test_name(value: object, key: str) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= 60:
        raise ProtocolError(f"field {key!r}: expected a test name")
    return value


def judge_diag(report: DiagReport) -> list[GpuVerdict]:
    """One node's diagnostic: a node line (``gpu`` None) and one line per GPU with a test that
    did not pass, every such test in it: ``dcgm diag: Memory test failed: ...``. Without
    dcgmi, or with a host engine that does not answer, the node line is unknown, never ok."""
    what = f"dcgm diag level {report.level}"
    if report.state == "not_installed":
        return [GpuVerdict(None, UNKNOWN, "unknown: dcgmi not installed (DCGM's diagnostic cannot run here)")]
    if report.state == "no_engine":
        return [
            GpuVerdict(
                None, UNKNOWN, f"unknown: {what}: the host engine does not answer (is nv-hostengine running?)"
            )
        ]
    if report.state == "timeout":
        return [GpuVerdict(None, UNKNOWN, f"unknown: {what} {report.detail or 'did not finish'}")]
    if report.state != "ok":
        return [GpuVerdict(None, UNKNOWN, f"unknown: {what}: {report.detail or 'failed to run'}")]
    per_gpu: dict[int | None, list[DiagFailure]] = {}
    for failure in report.failed:
        per_gpu.setdefault(failure.gpu, []).append(failure)

    def line(failures: Sequence[DiagFailure]) -> tuple[str, str]:
        level = BAD if any(f.status == "fail" for f in failures) else WARN
        parts = []
        for f in failures:
            verb = "failed" if f.status == "fail" else "warned"
            said = "; ".join(f.warnings)
            parts.append(f"dcgm diag: {f.test_name} test {verb}" + (f": {said}" if said else ""))
        return level, "; ".join(parts)

    took = f" in {report.seconds:.0f} s" if report.seconds is not None else ""
    tests = f" ({', '.join(report.tests)})" if report.tests else ""
    summary = f"{what}{tests}: {report.passed} result(s) passed, {report.skipped} skipped{took}"
    out: list[GpuVerdict] = []
    node = per_gpu.pop(None, [])
    if node:
        level, message = line(node)
        out.append(GpuVerdict(None, level, f"{message}; {summary}"))
    else:
        # the GPUs' own lines carry their failures (and the exit status): said once, there
        failing = len(report.failed)
        out.append(
            GpuVerdict(None, OK, f"{summary}, {failing} failed on the GPUs below" if failing else summary)
        )
    for gpu in sorted(g for g in per_gpu if g is not None):
        level, message = line(per_gpu[gpu])
        out.append(GpuVerdict(gpu, level, message))
    return out
