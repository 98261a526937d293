"""``fab doctor``'s verdicts from hand-written probe facts, and the probe answer's parser against
hostile input. Pure: no fleet, no root."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from launch.nodelib.fleetrun_wire import ProtocolError
from launch.rules.preflight import (
    GiB,
    Job,
    Observation,
    errors_by_node,
    judge,
    refusal,
    summary_rows,
)
from launch.rules.probe_facts import (
    MAX_PROBE_ANSWER_BYTES,
    Gpu,
    GpuProcess,
    PortFacts,
    PortHolder,
    ProbeFacts,
    parse_probe_answer,
)
from launch.run.doctor import torch_from_setup

NAMES = ("n0", "n1", "n2")


def facts(i: int, **changes: Any) -> ProbeFacts:
    base = ProbeFacts(
        python="3.11.2",
        hostname=NAMES[i],
        hostname_addrs=(f"10.0.0.{i + 1}",),
        rsync=True,
        home_free=50 * GiB,
        lib="",
        time=1_700_000_000.0,
        port=PortFacts(False, ()) if i == 0 else None,
        full=True,
        iface="eth0",
        mtu=9000,
        torch="2.6.0+cu124",
        torch_cuda="12.1",
        nccl="2.20.5",
        nvidia_smi=True,
        driver="550.54.15",
        gpus=(Gpu(0, "GPU-a"), Gpu(1, "GPU-b")),
        gpu_procs=(),
    )
    return dataclasses.replace(base, **changes)


def fleet(changes: dict[int, dict[str, Any]] | None = None, **obs: dict[int, Any]) -> list[Observation]:
    """Three healthy nodes (n0 the head), with ``changes`` to their facts and ``obs`` to what the
    laptop measured, each keyed by node index."""
    changes = changes or {}
    out = []
    for i, name in enumerate(NAMES):
        fields: dict[str, Any] = {"clock_offset_s": 0.0, "rdzv_reach": None if i == 0 else "ok"}
        fields.update({key: values[i] for key, values in obs.items() if i in values})
        f = None if fields.get("error") else facts(i, **changes.get(i, {}))
        out.append(Observation(name, f"u{i}", f"10.0.0.{i + 1}", facts=f, **fields))
    return out


JOB = Job(head="n0", port=29500)


def verdict(observations: list[Observation], node: str, check: str, job: Job = JOB) -> tuple[str, str]:
    found = [v for v in judge(observations, job).verdicts if v.node == node and v.check == check]
    assert found, f"no {check} verdict for {node}"
    worst = max(found, key=lambda v: {"ok": 0, "warn": 1, "error": 2}[v.level])
    return worst.level, worst.message


def test_healthy_fleet_has_no_errors_or_warnings() -> None:
    findings = judge(fleet(), JOB)
    assert not findings.failed
    assert {v.level for v in findings.verdicts} == {"ok"}
    checks = {v.check for v in findings.verdicts if v.node == "n0"}
    assert checks == {
        "ssh",
        "python",
        "torch",
        "rsync",
        "hostname",
        "rdzv-port",
        "interface",
        "clock",
        "disk",
        "gpus",
    }


def test_unreachable_node_names_the_ssh_cause_and_is_not_judged_further() -> None:
    obs = fleet(error={1: "host key at u1@10.0.0.2:22 does not match the pinned key"})
    findings = judge(obs, JOB)
    assert verdict(obs, "n1", "ssh") == ("error", "host key at u1@10.0.0.2:22 does not match the pinned key")
    assert {v.check for v in findings.verdicts if v.node == "n1"} == {"ssh"}
    assert errors_by_node(findings) == {"n1": "ssh: host key at u1@10.0.0.2:22 does not match the pinned key"}


def test_probe_that_did_not_run_is_a_python_error() -> None:
    obs = fleet(probe_error={2: "the probe did not run with python9 (exit 127: python9: not found)"})
    obs[2] = dataclasses.replace(obs[2], facts=None)
    assert verdict(obs, "n2", "python") == (
        "error",
        "the probe did not run with python9 (exit 127: python9: not found)",
    )


def test_python_minor_skew_is_an_error_patch_skew_a_warning() -> None:
    assert verdict(fleet({2: {"python": "3.10.12"}}), "n2", "python") == (
        "error",
        "Python 3.10.12, other nodes 3.11.2",
    )
    assert verdict(fleet({2: {"python": "3.11.4"}}), "n2", "python") == (
        "warn",
        "Python 3.11.4, other nodes 3.11.2",
    )
    assert verdict(fleet({2: {"python": "3.11.4"}}), "n0", "python")[0] == "ok"


def test_torch_missing_is_an_error_unless_setup_installs_it() -> None:
    obs = fleet({1: {"torch": None}})
    assert verdict(obs, "n1", "torch") == (
        "error",
        "torch not installed, and the job's requirements do not bring it",
    )
    brings = dataclasses.replace(JOB, torch_from_setup=True)
    assert verdict(obs, "n1", "torch", brings) == (
        "warn",
        "torch not installed (the job's setup installs it)",
    )


def test_torch_cuda_nccl_driver_skew() -> None:
    assert verdict(fleet({1: {"torch": "2.3.1"}}), "n1", "torch") == (
        "error",
        "torch 2.3.1, other nodes 2.6.0+cu124; torch 2.3.1 has a known weights_only bypass "
        "(CVE-2025-32434): checkpoints are not loaded with it; install torch>=2.6 on the nodes",
    )
    level, message = verdict(fleet({2: {"nccl": "2.18.1", "driver": "535.1"}}), "n2", "torch")
    assert level == "warn" and "NCCL 2.18.1, other nodes 2.20.5" in message and "CUDA driver 535.1" in message


def test_a_torch_with_a_known_weights_only_bypass_is_named_with_the_fix() -> None:
    """Every node on torch 2.5.1: the same everywhere, yet its checkpoint loader refuses to load
    (``weights_only`` is bypassable before 2.6), so preflight says so on each node, with the fix."""
    obs = fleet({i: {"torch": "2.5.1+cu121"} for i in range(3)})
    level, message = verdict(obs, "n1", "torch")
    assert level == "warn" and message == (
        "torch 2.5.1+cu121 has a known weights_only bypass (CVE-2025-32434): checkpoints are not "
        "loaded with it; install torch>=2.6 on the nodes"
    )
    assert verdict(fleet({}), "n1", "torch")[0] == "ok"


def test_rsync_missing() -> None:
    assert verdict(fleet({1: {"rsync": False}}), "n1", "rsync")[0] == "error"


@pytest.mark.parametrize("address", ["127.0.1.1", "127.0.0.1", "::1"])
def test_hostname_on_loopback_is_an_error(address: str) -> None:
    level, message = verdict(fleet({2: {"hostname_addrs": (address,)}}), "n2", "hostname")
    assert level == "error" and f"resolves to loopback {address}" in message


def test_hostname_that_does_not_resolve_is_a_warning() -> None:
    assert verdict(fleet({2: {"hostname_addrs": ()}}), "n2", "hostname") == (
        "warn",
        "hostname n2 does not resolve",
    )


def test_port_in_use_on_the_head_names_the_holder() -> None:
    held = PortFacts(True, (PortHolder("python3", 4242, "bob"),))
    obs = fleet({0: {"port": held}}, rdzv_reach={1: None, 2: None})
    assert verdict(obs, "n0", "rdzv-port") == (
        "error",
        "29500 on 10.0.0.1 already in use by python3 (pid 4242, user bob) "
        "(so the workers' connect test was skipped)",
    )
    hidden = fleet({0: {"port": PortFacts(True, ())}})
    assert "a process of another user (not visible)" in verdict(hidden, "n0", "rdzv-port")[1]


def test_port_not_reachable_from_a_worker() -> None:
    obs = fleet(rdzv_reach={1: "connection refused"})
    assert verdict(obs, "n1", "rdzv-port") == (
        "error",
        "29500 on 10.0.0.1 not reachable from n1 (connection refused)",
    )
    assert verdict(obs, "n2", "rdzv-port") == ("ok", "29500 on 10.0.0.1 reachable")
    assert (
        refusal(judge(obs, JOB))
        == "n1  rdzv-port  ERROR  29500 on 10.0.0.1 not reachable from n1 (connection refused)"
    )


def test_interface_missing_and_mtu_skew() -> None:
    assert verdict(fleet({1: {"mtu": 1500}}), "n1", "interface") == (
        "error",
        "eth0 MTU 1500, other nodes 9000",
    )
    level, message = verdict(fleet({2: {"iface": None, "mtu": None}}), "n2", "interface")
    assert level == "error" and "no interface holds the private address 10.0.0.3" in message


def test_clock_skew_against_the_head() -> None:
    obs = fleet(clock_offset_s={0: 0.3, 1: 2.0, 2: -0.5})
    assert verdict(obs, "n1", "clock") == ("warn", "clock 1.7 s ahead of the head's")
    assert verdict(obs, "n2", "clock")[0] == "ok"


def test_disk_thresholds() -> None:
    assert verdict(fleet({1: {"home_free": 1 * GiB}}), "n1", "disk")[0] == "error"
    assert verdict(fleet({1: {"home_free": 5 * GiB}}), "n1", "disk")[0] == "warn"


def test_gpus_busy_with_other_users_name_user_pid_memory_per_gpu() -> None:
    procs = (GpuProcess("GPU-b", 777, "alice", 12000), GpuProcess("GPU-a", 778, "u1", 100))
    level, message = verdict(fleet({1: {"gpu_procs": procs}}), "n1", "gpus")
    assert (
        level == "warn"
        and message == "1 GPU(s) busy with other users' processes: GPU 1: alice pid 777 12000 MiB"
    )
    no_smi = fleet({1: {"nvidia_smi": False, "gpus": ()}})
    assert verdict(no_smi, "n1", "gpus") == ("ok", "no GPU reader (NVML or nvidia-smi): no GPUs")


def test_cheap_mode_judges_only_the_cheap_checks() -> None:
    obs = fleet({1: {"torch": None, "mtu": 1}})
    cheap = dataclasses.replace(JOB, full=False)
    checks = {v.check for v in judge(obs, cheap).verdicts}
    assert checks == {"ssh", "python", "rsync", "hostname", "rdzv-port", "disk"}


def test_summary_rows_keep_the_worst_level() -> None:
    findings = judge(fleet({1: {"rsync": False}}), JOB)
    rows = dict(summary_rows(findings, list(NAMES)))
    assert rows["n1"]["rsync"] == "error" and rows["n0"]["rsync"] == "ok"


def test_torch_from_setup() -> None:
    assert torch_from_setup("torch==2.4.0\nnumpy\n", [])
    assert torch_from_setup("", ["pip install torch"])
    assert not torch_from_setup("numpy\n", ["echo hi"])


# -- the probe's answer: untrusted ----------------------------------------------------------------


def answer(**changes: Any) -> str:
    data: dict[str, Any] = {
        "v": 1,
        "mode": "full",
        "python": "3.11.2",
        "hostname": "n0",
        "hostname_addrs": ["10.0.0.1"],
        "rsync": True,
        "home_free": 123,
        "lib": "x",
        "time": 1.7e9,
        "port": {"in_use": True, "holders": [{"process": "python3", "pid": 9, "user": "bob"}]},
        "iface": "eth0",
        "mtu": 1500,
        "torch": "2.4.0",
        "torch_cuda": None,
        "nccl": None,
        "nvidia_smi": True,
        "driver": "550",
        "gpus": [{"index": 0, "uuid": "GPU-a"}],
        "gpu_procs": [{"gpu": "GPU-a", "pid": 5, "user": None, "mem_mib": 10}],
    }
    data.update(changes)
    return json.dumps(data)


def test_a_good_answer_parses_to_typed_facts() -> None:
    f = parse_probe_answer(answer())
    assert f.full and f.mtu == 1500 and f.port == PortFacts(True, (PortHolder("python3", 9, "bob"),))
    assert f.gpu_procs == (GpuProcess("GPU-a", 5, None, 10),) and f.torch_cuda is None


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        ("[" * 100 + "]" * 100, "nested deeper"),
        ("x" * (MAX_PROBE_ANSWER_BYTES + 1), "over the limit"),
        (answer(home_free=10**60), "integer of 61 digits"),
        (answer(home_free=2**63), "home_free"),
        (answer(mtu="1500"), "mtu"),
        (answer(time=float("nan")).replace("NaN", "1e400"), "time"),
        (answer(rsync="yes"), "rsync"),
        (answer(hostname_addrs=["a"] * 1000), "hostname_addrs"),
        (answer(hostname_addrs=[{"x": 1}]), "hostname_addrs"),
        (answer(gpu_procs=[{"gpu": "g", "pid": -1}]), "pid"),
        (answer(gpu_procs="all"), "gpu_procs"),
        (answer(port={"in_use": True, "holders": [[1]]}), "holders"),
        (answer(v=2), "'v'"),
        (answer(mode="root"), "mode"),
        ('{"v": 1, "mode": "cheap"}', "missing"),
        ("not json \x1b[31m", "not valid JSON"),
        (b"\xff\xfe", "not UTF-8"),
        ("[1, 2]", "expected a JSON object"),
    ],
)
def test_hostile_answers_are_refused_naming_the_field(raw: str | bytes, needle: str) -> None:
    with pytest.raises(ProtocolError) as info:
        parse_probe_answer(raw)
    assert needle in str(info.value)


def test_long_text_is_clipped_not_refused() -> None:
    f = parse_probe_answer(answer(python="3" * 10000, hostname="h" * 10000))
    assert len(f.python) <= 64 and len(f.hostname) <= 255


def test_on_a_tie_the_heads_value_is_the_reference() -> None:
    """Two nodes, two Pythons: the head's is the reference (as documented), so the worker is the
    node named, whichever version sorts first; the same for the MTU."""
    two = fleet({1: {"python": "3.10.12", "mtu": 1500}})[:2]
    assert verdict(two, "n1", "python") == ("error", "Python 3.10.12, other nodes 3.11.2")
    assert verdict(two, "n0", "python")[0] == "ok"
    assert verdict(two, "n1", "interface") == ("error", "eth0 MTU 1500, other nodes 9000")
    assert verdict(two, "n0", "interface")[0] == "ok"
