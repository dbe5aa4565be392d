"""The bounds of every agent -> manager field (agent/protocol.py): pure, no Django."""

from __future__ import annotations

import json

import pytest

from agent import protocol


def _report(**changes):
    report = {
        "kernel_id": "0b5c2c1e-8d7f-4a44-9a0e-2f6f3a5a9c10",
        "session_id": "0b5c2c1e-8d7f-4a44-9a0e-2f6f3a5a9c10",
        "status": protocol.KR_RUNNING,
        "exit_code": None,
        "container_id": "f" * 64,
        "reason": None,
    }
    report.update(changes)
    return report


def _register(**changes):
    message = {
        "type": protocol.REGISTER,
        "protocol": protocol.PROTOCOL_VERSION,
        "hostname": "node-a",
        "backend": "docker",
        "resource_group": None,
        "slots": {"cpu": "8", "mem": str(16 * 2**30), "cuda.shares": "0.5"},
        "labels": {"zone": "a"},
        "version": "0.1.0",
        "kernels": [_report()],
    }
    message.update(changes)
    return message


VALID = [
    _register(),
    _register(slots={"cpu": 4, "mem": "1024", "cuda.device": "1.000"}, kernels=[]),
    {"type": protocol.HEARTBEAT, "kernels": [_report(), _report(status="exited", exit_code=-9)]},
    {"type": protocol.HEARTBEAT, "kernels": [], "slots": None},
    {"type": protocol.KERNEL_STATUS, **_report(session_id="", status="gone")},
    {"type": protocol.LOG_CHUNK, "kernel_id": "k1", "stream_id": "ab12", "data": "a\x00b"},
    {"type": protocol.LOG_TAIL, "kernel_id": "k1", "data": "é" * 1000},
    {"type": protocol.TERM_OUTPUT, "term_id": "aa-bb", "data": "$ "},
    {"type": protocol.TERM_CLOSED, "term_id": "aa-bb", "reason": "shell exited"},
    {"type": protocol.ERROR, "message": "logs_follow s1: no such kernel", "stream_id": "s1"},
]


REFUSED = {
    "cpu far beyond any node": (_register(slots={"cpu": "1e100"}), "slots: cpu"),
    "a negative device count": (_register(slots={"cuda.device": "-1"}), "negative"),
    "NaN cpu": (_register(slots={"cpu": "NaN"}), "not a finite decimal"),
    "infinite cpu": (_register(slots={"cpu": "Infinity"}), "not a finite decimal"),
    "a fraction of a byte": (_register(slots={"mem": "1.5"}), "whole number"),
    "a ten-thousandth of a cpu": (_register(slots={"cpu": "0.0001"}), "3 decimal places"),
    "a float amount": (_register(slots={"cpu": 1.5}), "decimal string"),
    "a boolean amount": (_register(slots={"cpu": True}), "decimal string"),
    "too many slots": (
        _register(slots={f"s{i}": "1" for i in range(protocol.SLOTS_MAX + 1)}),
        "slots",
    ),
    "a slot name with spaces": (_register(slots={"c p u": "1"}), "slot name"),
    "an unknown backend": (_register(backend="vm"), "backend"),
    "a long hostname": (_register(hostname="h" * 256), "hostname"),
    "a long version": (_register(version="v" * 65), "version"),
    "too many labels": (
        _register(labels={str(i): "x" for i in range(protocol.LABELS_MAX + 1)}),
        "labels",
    ),
    "a long label value": (_register(labels={"k": "v" * 257}), "label k"),
    "a label that is not text": (_register(labels={"k": 1}), "label k"),
    "a group name that is not text": (_register(resource_group=["gpu"]), "resource_group"),
    "no kernel list": (
        {k: v for k, v in _register().items() if k != "kernels"},
        "kernels: missing",
    ),
    "an exit code beyond int32": (
        {"type": protocol.KERNEL_STATUS, **_report(exit_code=2**40)},
        "exit_code",
    ),
    "a boolean exit code": ({"type": protocol.KERNEL_STATUS, **_report(exit_code=True)}, "exit"),
    "a 10 KB container id": (
        {"type": protocol.KERNEL_STATUS, **_report(container_id="c" * 10_000)},
        "container_id",
    ),
    "a long reason": ({"type": protocol.KERNEL_STATUS, **_report(reason="r" * 501)}, "reason"),
    "a reason with NUL": ({"type": protocol.KERNEL_STATUS, **_report(reason="a\x00")}, "NUL"),
    "an unknown status": ({"type": protocol.KERNEL_STATUS, **_report(status="happy")}, "status"),
    "a kernel id with a slash": (
        {"type": protocol.KERNEL_STATUS, **_report(kernel_id="../x")},
        "kernel_id",
    ),
    "an empty kernel id": ({"type": protocol.KERNEL_STATUS, **_report(kernel_id="")}, "empty"),
    "a lone surrogate": ({"type": protocol.KERNEL_STATUS, **_report(reason="\ud800")}, "surrog"),
    "an unknown field": ({"type": protocol.KERNEL_STATUS, **_report(), "extra": 1}, "unknown"),
    "too many reports": (
        {"type": protocol.HEARTBEAT, "kernels": [_report()] * (protocol.REPORTS_MAX + 1)},
        "kernels: 4097 items",
    ),
    "a report that is not an object": ({"type": protocol.HEARTBEAT, "kernels": [1]}, "[0]"),
    "a nested report in a report": (
        {"type": protocol.HEARTBEAT, "kernels": [_report(reason={"deep": [1]})]},
        "reason",
    ),
    "a huge log chunk": (
        {
            "type": protocol.LOG_CHUNK,
            "kernel_id": "k",
            "stream_id": "s",
            "data": "x" * (protocol.LOG_CHUNK_DATA_MAX + 1),
        },
        "data",
    ),
    "a log tail without data": ({"type": protocol.LOG_TAIL, "kernel_id": "k"}, "data: missing"),
    "terminal output that is not text": (
        {"type": protocol.TERM_OUTPUT, "term_id": "t", "data": 5},
        "data",
    ),
    "an unknown type": ({"type": "steal_kernels"}, "unknown message type"),
    "no type": ({"kernels": []}, "unknown message type"),
    "not an object": ([1, 2], "JSON object"),
}


def test_a_refusal_never_quotes_a_huge_value():
    refusal = protocol.validate({"type": protocol.KERNEL_STATUS, **_report(reason="r" * 10**6)})
    assert refusal is not None and len(refusal) < 200


BAD_FRAMES = {
    "oversize": ('{"type": "heartbeat", "pad": "' + "x" * 100 + '"}', "at most 64"),
    "not JSON": ("{type: heartbeat}", "not JSON"),
    "an array": ("[1, 2]", "JSON object"),
    "a number": ("42", "JSON object"),
    "deep nesting": ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    "NaN": ('{"type": "heartbeat", "x": NaN}', "NaN"),
    "a huge integer": ('{"exit_code": ' + "9" * 5000 + "}", "digits"),
    "an infinite float": ('{"x": 1e999}', "out of range"),
}


@pytest.mark.parametrize("frame, expected", BAD_FRAMES.values(), ids=list(BAD_FRAMES))
def test_a_bad_frame_is_refused_with_a_reason(frame, expected):
    with pytest.raises(protocol.FrameError, match=expected):
        protocol.decode_frame(frame, max_chars=64 if expected == "at most 64" else 10**6)


def test_a_good_frame_decodes_to_its_object():
    frame = json.dumps({"type": protocol.HEARTBEAT, "kernels": [_report()]})
    assert protocol.decode_frame(frame)["kernels"][0]["status"] == protocol.KR_RUNNING


def test_the_frame_limit_holds_the_configured_log_tail_fully_escaped():
    tail = "\x01" * 256 * 1024
    frame = json.dumps({"type": protocol.LOG_TAIL, "kernel_id": "k", "data": tail})
    assert len(frame) <= protocol.max_frame_chars(256 * 1024)
    assert protocol.max_frame_chars(1024) == protocol.FRAME_CHARS_MIN


def test_the_agent_cuts_long_free_text_to_fit_the_bounds():
    frame = {
        "type": protocol.HEARTBEAT,
        "kernels": [_report(status="error", reason="docker said: " + "x" * 5000)],
    }
    fitted = protocol.fit(frame)
    assert protocol.validate(frame) is not None
    assert protocol.validate(fitted) is None
    assert fitted["kernels"][0]["reason"].startswith("docker said: ")
    assert len(frame["kernels"][0]["reason"]) > protocol.REASON_MAX  # the original is left alone


def test_a_frame_within_the_bounds_is_sent_as_it_is():
    frame = {"type": protocol.TERM_OUTPUT, "term_id": "t", "data": "x" * 10_000}
    assert protocol.fit(frame) is frame


# --- code execution (issue 13) ---------------------------------------------------

REQ = "0123456789abcdef" * 2


def _exec(**changes):
    command = {
        "type": protocol.EXEC,
        "req_id": REQ,
        "kernel_id": "0b5c2c1e-8d7f-4a44-9a0e-2f6f3a5a9c10",
        "mode": "query",
        "run_id": None,
        "code": "print('hi')",
        "options": {"timeout": 30},
        "stream": False,
        "flush": 1.5,
    }
    command.update(changes)
    return command


def _result(**changes):
    message = {
        "type": protocol.EXEC_RESULT,
        "req_id": REQ,
        "run_id": "r1",
        "status": protocol.EXEC_FINISHED,
        "exit_code": 0,
        "records": [{"kind": "stdout", "data": "hi\n", "mime": None}],
        "completions": None,
        "reason": None,
    }
    message.update(changes)
    return message


EXEC_VALID = {
    "a query": _exec(),
    "a batch with build and exec": _exec(
        mode="batch", code="", options={"build": "make", "exec": "./a.out", "timeout": 0.5}
    ),
    "a continue of a named run": _exec(mode="continue", run_id="A-b_9" * 12, code=""),
    "a completion at the cursor": _exec(
        mode="complete", code="import o", options={"cursor_pos": 8}
    ),
    "a streamed input line": _exec(mode="input", run_id="r1", code="Ada", stream=True, flush=5),
    "only what is required": {
        "type": protocol.EXEC,
        "req_id": REQ,
        "kernel_id": "k",
        "mode": "query",
    },
    "a megabyte of code": _exec(code="é" * (protocol.EXEC_CODE_MAX // 2)),
}


@pytest.mark.parametrize("command", EXEC_VALID.values(), ids=list(EXEC_VALID))
def test_an_exec_command_within_its_bounds_passes(command):
    assert protocol.validate_command(command) is None


EXEC_REFUSED = {
    "a short req_id": (_exec(req_id="abc"), "req_id"),
    "a req_id that is not hex": (_exec(req_id="g" * 32), "req_id"),
    "no kernel id": ({k: v for k, v in _exec().items() if k != "kernel_id"}, "kernel_id: missing"),
    "an unknown mode": (_exec(mode="shell"), "mode"),
    "a run_id of 65 characters": (_exec(run_id="r" * 65), "run_id"),
    "a run_id with a slash": (_exec(run_id="../r1"), "run_id"),
    "an empty run_id": (_exec(run_id=""), "run_id"),
    "code over a megabyte of utf-8": (
        _exec(code="é" * (protocol.EXEC_CODE_MAX // 2 + 1)),
        "bytes of utf-8",
    ),
    "code that is not text": (_exec(code=["print(1)"]), "code"),
    "an unknown option": (_exec(options={"env": {"A": "1"}}), "options: unknown field"),
    "options that are not an object": (_exec(options="fast"), "options"),
    "a build command over 64 KiB": (_exec(options={"build": "x" * (64 * 1024 + 1)}), "build"),
    "an exec command that is not text": (_exec(options={"exec": 1}), "exec"),
    "a timeout over a day": (_exec(options={"timeout": 86401}), "timeout"),
    "a negative timeout": (_exec(options={"timeout": -1}), "timeout"),
    "a boolean timeout": (_exec(options={"timeout": True}), "timeout"),
    "a NaN timeout": (_exec(options={"timeout": float("nan")}), "timeout"),
    "a negative cursor": (_exec(options={"cursor_pos": -1}), "cursor_pos"),
    "a stream flag that is a string": (_exec(stream="yes"), "stream"),
    "a flush too short": (_exec(flush=0.01), "flush"),
    "a flush too long": (_exec(flush=6), "flush"),
    "an unknown field": (_exec(env={}), "unknown field"),
}


@pytest.mark.parametrize("command, expected", EXEC_REFUSED.values(), ids=list(EXEC_REFUSED))
def test_an_exec_command_out_of_bounds_is_refused_with_the_field_named(command, expected):
    refusal = protocol.validate_command(command)
    assert refusal is not None
    assert refusal.startswith("exec.")
    assert expected in refusal


def _record(kind="stdout", data="x", mime=None):
    return {"kind": kind, "data": data, "mime": mime}


ANSWERS_VALID = {
    "a finished run": _result(),
    "a refusal": _result(run_id="", status="finished", exit_code=None, records=[], reason="no"),
    "a png display": _result(records=[_record("display", "iVBORw0KGgo=", "image/png")]),
    "completions": _result(run_id="", completions=["os", "operator"], records=[]),
    "a timeout": _result(status=protocol.EXEC_TIMEOUT, exit_code=None),
    "records of a megabyte": {
        "type": protocol.EXEC_RECORDS,
        "req_id": REQ,
        "run_id": "r1",
        "records": [_record(data="x" * 1024)] * 1024 + [_record("notice", "[output cut]")],
    },
}


VALID += ANSWERS_VALID.values()


@pytest.mark.parametrize("message", VALID, ids=lambda m: m["type"])
def test_a_message_the_agent_sends_passes(message):
    assert protocol.validate(message) is None


ANSWERS_REFUSED = {
    "an unknown status": (_result(status="crashed"), "status"),
    "an exit code beyond int32": (_result(exit_code=2**31), "exit_code"),
    "a boolean exit code": (_result(exit_code=False), "exit_code"),
    "an unknown record kind": (_result(records=[_record("log")]), "records: [0].kind"),
    "a record without data": (_result(records=[{"kind": "stdout", "mime": None}]), "data"),
    "a record with an extra field": (_result(records=[{**_record(), "x": 1}]), "unknown"),
    "a long mime type": (_result(records=[_record(mime="m" * 101)]), "mime"),
    "too many records": (_result(records=[_record()] * 4097), "4097 items"),
    "too much data in all": (
        _result(records=[_record(data="x" * 1024 * 1024)] * 2),
        "characters of data in all",
    ),
    "one record too big": (_result(records=[_record(data="x" * (2 * 1024 * 1024))]), "data"),
    "too many completions": (_result(completions=["o"] * 1001), "completions"),
    "a completion too long": (_result(completions=["o" * 1001]), "completions: [0]"),
    "a completion that is not text": (_result(completions=[1]), "completions"),
    "a long reason": (_result(reason="r" * 501), "reason"),
    "a run_id with spaces": (_result(run_id="r 1"), "run_id"),
    "records without a req_id": (
        {"type": protocol.EXEC_RECORDS, "run_id": "r1", "records": []},
        "req_id: missing",
    ),
    "records with a status": (
        {"type": protocol.EXEC_RECORDS, "req_id": REQ, "run_id": "r", "records": [], "status": "x"},
        "unknown field",
    ),
}


REFUSED.update(ANSWERS_REFUSED)


@pytest.mark.parametrize("message, expected", REFUSED.values(), ids=list(REFUSED))
def test_a_message_out_of_bounds_is_refused_with_the_field_named(message, expected):
    refusal = protocol.validate(message)
    assert refusal is not None
    assert expected in refusal


def test_an_exec_frame_of_a_megabyte_fully_escaped_fits_the_frame_limit():
    records = [_record(data="\x01" * 1024)] * 1024
    frame = json.dumps({**_result(records=records), "type": protocol.EXEC_RECORDS})
    assert len(frame) <= protocol.max_frame_chars()
    assert len(frame) > 4 * 1024 * 1024  # the exec frames are what raised it
