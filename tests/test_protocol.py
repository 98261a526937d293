"""The node protocol against hostile input: every parser raises ``ProtocolError`` and nothing else.

Each message type gets the same corpus (nesting bombs, a 50 MB line, invalid UTF-8, non-objects,
NaN, huge integers, brackets hidden in strings), then its own field-level cases: wrong types,
out-of-range numbers, missing keys (refused) and extra keys (ignored).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable

import pytest

from launch.nodelib import fleetrun_protocol as protocol
from launch.nodelib.fleetrun_protocol import (
    MAX_DEPTH,
    FileBundle,
    GuardConfig,
    GuardOutcome,
    PollAnswer,
    PollRequest,
    ProtocolError,
    RelayConfig,
    RelayResult,
    StartAnswer,
    StatusRecord,
    StopAnswer,
    UploadAnswer,
    UploadRequest,
    parse_metrics_line,
)

GUARD = GuardConfig(
    run_id="job-20250101-000000-abc123",
    node="fr-node0",
    started_at=1_700_000_000.0,
    peers=("198.18.0.11", "fe80::1"),
    peer_port=2222,
    starts_processes=True,
    expects_metrics=True,
    watcher_lost_after_s=5.0,
    stall_timeout_s=60.0,
    startup_timeout_s=None,
    max_wall_time_s=3600.0,
    unreachable_timeout_s=30.0,
    upload_argv=("aws", "s3", "sync", "{src}", "s3://b/runs/r/n0"),
)
ANSWER = PollAnswer(
    state="exited",
    rc=3,
    offset=10,
    metrics=b'{"step": 1}\n\xff',
    status=StatusRecord(status="failed", time=1.7e9, step=4, message="boom", fields={"loss": 0.5}),
    exited_at=1.7e9,
    log_tail="[bold]not markup[/]",
    gpu_util=99.5,
    malformed=("rc: 'x' is not an exit code",),
)
RELAY = {
    "key": ".fleetrun/relay/t/key",
    "known_hosts": ".fleetrun/relay/t/known_hosts",
    "parallel": 4,
    "timeout": 1800,
    "transfers": [{"source": ".fleetrun/work/j", "dest": ".fleetrun/work/j", "filters": ["--exclude=.git"]}],
    "targets": [{"name": "n1", "user": "u", "address": "10.0.0.2", "port": 22, "ship_lib": False}],
}

PARSERS: dict[str, Callable[[bytes], object]] = {
    "guard.json": GuardConfig.from_json,
    "poll request": PollRequest.from_json,
    "poll answer": PollAnswer.from_json,
    "status.json": StatusRecord.from_json,
    "start answer": StartAnswer.from_json,
    "stop answer": StopAnswer.from_json,
    "upload request": UploadRequest.from_json,
    "upload answer": UploadAnswer.from_json,
    "guard outcome": GuardOutcome.from_json,
    "file bundle": FileBundle.from_json,
    "relay config": RelayConfig.from_json,
    "relay result": RelayResult.from_json,
    "metrics line": parse_metrics_line,
}

HOSTILE: dict[str, bytes] = {
    "200 KB of [": b"[" * 200_000,
    "200 KB of {": b'{"a":' * 40_000,
    "deep inside a valid prefix": b'{"state": "running", "status": ' + b"[" * 5000 + b"]" * 5000 + b"}",
    "50 MB line": b'{"a": "' + b"x" * 50_000_000 + b'"}',
    "invalid UTF-8": b'{"state": "running", "log_tail": "\xff\xfe"}',
    "lone surrogate escape only": b'"\\ud800"',
    "a list": b'["state", "running"]',
    "a number": b"42",
    "null": b"null",
    "a string": b'"running"',
    "NaN": b"NaN",
    "empty": b"",
    "whitespace": b"  \n",
    "truncated": b'{"state": "run',
    "huge integer": b'{"offset": ' + b"9" * 100_000 + b"}",
    "unterminated escaped quotes": b'"' + b'\\"' * 100_000,
}


@pytest.mark.parametrize("kind", sorted(PARSERS))
@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_every_parser_refuses_hostile_input_with_protocol_error_only(kind: str, case: str) -> None:
    with pytest.raises(ProtocolError):
        PARSERS[kind](HOSTILE[case])


def test_round_trips() -> None:
    assert GuardConfig.from_json(GUARD.to_json()) == GUARD
    assert PollAnswer.from_json(ANSWER.to_json()) == ANSWER
    assert PollRequest.from_json(PollRequest(7, heartbeat=False).to_json()) == PollRequest(7, False)
    assert StartAnswer.from_json(StartAnswer(12, None, "bad").to_json()) == StartAnswer(12, None, "bad")
    assert StopAnswer.from_json(StopAnswer(1, 2, 3, 0).to_json()) == StopAnswer(1, 2, 3, 0)
    assert UploadRequest.from_json(UploadRequest(("cp", "{src}", "d")).to_json()).argv == ("cp", "{src}", "d")
    assert UploadAnswer.from_json(UploadAnswer("uploaded to x", True).to_json()) == UploadAnswer(
        "uploaded to x", True
    )
    outcome = GuardOutcome("nan_loss", "loss nan", 1.7e9, StopAnswer(3, 1, 0, 0), "no bucket", 2)
    assert GuardOutcome.from_json(outcome.to_json()) == outcome
    bundle = FileBundle({"launch.sh": "export TOKEN=s3cret\n", "guard.json": "{}"})
    assert FileBundle.from_json(bundle.to_json()) == bundle
    relay = RelayConfig.from_json(json.dumps(RELAY))
    assert relay.targets[0].address == "10.0.0.2" and not relay.targets[0].ship_lib
    assert relay.transfers[0].filters == ("--exclude=.git",)
    result = RelayResult("n1", True, files=3, sent_bytes=10)
    assert RelayResult.from_json(result.to_json()) == result


def test_depth_limit_is_exact_and_ignores_brackets_inside_strings() -> None:
    inner = "[" * (MAX_DEPTH - 1) + "1" + "]" * (MAX_DEPTH - 1)
    assert parse_metrics_line(f'{{"a": {inner}}}')["a"] is not None, "exactly MAX_DEPTH levels parse"
    with pytest.raises(ProtocolError, match="nested deeper"):
        parse_metrics_line(f'{{"a": [{inner}]}}')
    # a job's log tail full of brackets (in a string) is data, not nesting
    tail = '\\"[' * 10_000
    answer = PollAnswer.from_json(
        json.dumps({"state": "running", "offset": 0, "log_tail": json.loads(f'"{tail}"')})
    )
    assert answer.log_tail.endswith('"[')


def _answer(**fields: object) -> bytes:
    base: dict[str, object] = {"state": "running", "rc": None, "offset": 0, "metrics_b64": ""}
    base.update(fields)
    return json.dumps(base).encode()


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"rc": "x"}, "rc"),
        ({"rc": 1.5}, "rc"),
        ({"rc": True}, "rc"),
        ({"rc": 2**40}, "rc"),
        ({"gpu_util": "99"}, "gpu_util"),
        ({"gpu_util": 250.0}, "gpu_util"),
        ({"offset": "zz"}, "offset"),
        ({"offset": -1}, "offset"),
        ({"offset": 2**60}, "offset"),
        ({"state": ["running"]}, "state"),
        ({"state": "dancing"}, "state"),
        ({"metrics_b64": "not base64!"}, "metrics_b64"),
        ({"metrics_b64": 12}, "metrics_b64"),
        ({"exited_at": float("nan")}, "exited_at"),
        ({"exited_at": float("inf")}, "exited_at"),
        ({"exited_at": -5}, "exited_at"),
        ({"log_tail": {"a": 1}}, "log_tail"),
        ({"malformed": "rc"}, "malformed"),
        ({"malformed": ["x"] * 100}, "malformed"),
        ({"status": [1, 2]}, "status.json"),
        ({"status": {"status": "failed", "time": "now"}}, "time"),
    ],
)
def test_poll_answer_wrong_types_and_ranges_are_refused_naming_the_field(fields: dict, field: str) -> None:
    with pytest.raises(ProtocolError, match=field):
        PollAnswer.from_json(_answer(**fields))


def test_poll_answer_missing_keys_refused_extra_keys_ignored_free_text_truncated() -> None:
    with pytest.raises(ProtocolError, match="'offset' is missing"):
        PollAnswer.from_json(b'{"state": "running"}')
    answer = PollAnswer.from_json(_answer(surprise={"deep": [1]}, log_tail="x" * 100_000))
    assert answer.state == "running" and len(answer.log_tail) == protocol.MAX_LOG_TAIL
    assert PollAnswer.from_json(b'{"error": "unknown request"}').error == "unknown request"


def test_guard_config_bounds() -> None:
    good = GUARD.to_dict()
    bad_cases = {
        "watcher_lost_after_s": [0, -1, "5", float("nan"), 1e400, True],
        "started_at": [None, -1.0, "yesterday", 1e300],
        "run_id": ["", "a b", "$(reboot)", "x" * 300, 5],
        "peers": ["198.18.0.1", [["nested"]], ["a;b"], ["x" * 300]],
        "peer_port": [0, 70000, "22"],
        "upload_argv": [["aws", "s3", "sync"], "aws s3 sync {src}", [1, "{src}"], ["{src}"] * 100],
        "expects_metrics": ["yes", 1],
    }
    for key, values in bad_cases.items():
        for value in values:
            data = {**good, key: value}
            with pytest.raises(ProtocolError, match=key):
                GuardConfig.from_json(json.dumps(data))
    missing = {k: v for k, v in good.items() if k != "run_id"}
    with pytest.raises(ProtocolError, match="'run_id' is missing"):
        GuardConfig.from_json(json.dumps(missing))
    lean = GuardConfig.from_json(json.dumps({"run_id": "r", "node": "n", "started_at": 1.0, "x": [1]}))
    assert lean.expects_metrics and lean.upload_argv == () and lean.stall_timeout_s is None


def test_status_record_keeps_scalars_drops_the_rest_and_truncates_the_message() -> None:
    record = StatusRecord.from_json(
        json.dumps(
            {
                "status": "failed",
                "message": "could not open [/data/shard-7] " + "y" * 10_000,
                "loss": float("nan"),
                "nested": {"a": [1, 2]},
                "big": 10**30,
                "note": "n" * 5000,
            }
        )
    )
    assert record.status == "failed" and len(record.message) == protocol.MAX_TEXT
    assert record.message.startswith("could not open [/data/shard-7]")
    assert math.isnan(record.fields["loss"]) and "nested" not in record.fields and "big" not in record.fields
    assert len(record.fields["note"]) == protocol.MAX_ERROR
    for status in ("", "a b", "x" * 100, 3, None):
        with pytest.raises(ProtocolError, match="status"):
            StatusRecord.from_json(json.dumps({"status": status}))
    with pytest.raises(ProtocolError, match="step"):
        StatusRecord.from_json(json.dumps({"status": "failed", "step": 2**70}))


def test_file_bundle_accepts_only_plain_names_and_bounded_text() -> None:
    for name in ("../x", "/etc/passwd", ".bashrc", "a/b", "", "x" * 100, "run dir"):
        with pytest.raises(ProtocolError, match="files"):
            FileBundle.from_json(json.dumps({"files": {name: "x"}}))
    with pytest.raises(ProtocolError, match="files"):
        FileBundle.from_json(json.dumps({"files": {f"f{i}": "" for i in range(20)}}))
    with pytest.raises(ProtocolError, match="files.launch.sh"):
        FileBundle.from_json(json.dumps({"files": {"launch.sh": 5}}))
    with pytest.raises(ProtocolError, match="files"):
        FileBundle.from_json(json.dumps({"files": ["launch.sh"]}))


def test_small_answers_refuse_wrong_types() -> None:
    for text in (
        '{"terminated": "3", "remaining": 0}',
        '{"terminated": 1, "remaining": -1}',
        '{"terminated": 1}',
    ):
        with pytest.raises(ProtocolError):
            StopAnswer.from_json(text)
    for text in ('{"upload": ["x"]}', '{"ok": true}', '{"upload": "x", "ok": "yes"}'):
        with pytest.raises(ProtocolError):
            UploadAnswer.from_json(text)
    for text in ('{"pid": 0}', '{"pid": "12"}', '{"guard": -3}'):
        with pytest.raises(ProtocolError):
            StartAnswer.from_json(text)
    for text in ('{"op": "poll", "offset": "5"}', '{"op": "stop", "offset": 5}', '{"offset": 5}'):
        with pytest.raises(ProtocolError):
            PollRequest.from_json(text)
    for text in (
        '{"name": "n1", "ok": "true"}',
        '{"name": "../n", "ok": true}',
        '{"name": "n1", "files": -1}',
    ):
        with pytest.raises(ProtocolError):
            RelayResult.from_json(text)


def test_relay_config_refuses_odd_targets_and_transfers() -> None:
    for key, value in {
        "targets": [{"name": "n1", "user": "u;rm", "address": "10.0.0.2"}],
        "transfers": [{"source": "a\0b", "dest": "d"}],
        "parallel": 0,
        "timeout": float("inf"),
    }.items():
        with pytest.raises(ProtocolError):
            RelayConfig.from_json(json.dumps({**RELAY, key: value}))
    with pytest.raises(ProtocolError, match="'address'"):
        RelayConfig.from_json(
            json.dumps({**RELAY, "targets": [{"name": "n1", "user": "u", "address": "$(x)"}]})
        )


def test_metrics_line_keeps_nan_and_refuses_bombs() -> None:
    record = parse_metrics_line(b'{"step": 3, "loss": NaN, "lr": Infinity}')
    assert math.isnan(record["loss"]) and math.isinf(record["lr"])
    with pytest.raises(ProtocolError, match="keys"):
        parse_metrics_line(json.dumps({f"k{i}": i for i in range(protocol.MAX_METRICS_KEYS + 1)}))
    with pytest.raises(ProtocolError, match="integer"):
        parse_metrics_line(b'{"step": ' + b"1" * 41 + b"}")
    with pytest.raises(ProtocolError, match="over the limit"):
        parse_metrics_line(b'{"a": "' + b"x" * protocol.MAX_METRICS_LINE_BYTES + b'"}')


@pytest.mark.parametrize(
    ("text", "rc", "pid"),
    [
        ("0\n", 0, None),
        (" 7 \n", 7, 7),
        ("-1", -1, None),
        ("garbage", None, None),
        ("", None, None),
        ("0x10", None, None),
        ("9" * 100, None, None),
        ("1.5", None, None),
        ("\x00\x01", None, None),
        ("2147483648", None, None),
    ],
)
def test_rc_and_pid_files(text: str, rc: int | None, pid: int | None) -> None:
    assert protocol.parse_exit_code(text) == rc
    assert protocol.parse_pid(text) == pid
    assert protocol.parse_exit_code(text.encode()) == rc
