"""Bounds on outside JSON, found before a decoder runs: the nesting depth on
the text (brackets inside strings do not count) and lone surrogates in what
was decoded."""

from __future__ import annotations

import json
import time

import pytest

from bai_common.jsonlimits import lone_surrogate, nesting_beyond


@pytest.mark.parametrize(
    "text, limit, offset",
    [
        pytest.param('{"a": [1, 2]}', 2, None, id="two levels within two"),
        pytest.param('{"a": [[1]]}', 2, 7, id="the third level opens at its bracket"),
        pytest.param('{"a": "[[[[[[", "b": "{{{"}', 1, None, id="brackets in strings do not count"),
        pytest.param(
            '{"a": "\\"[[[", "b": 1}', 1, None, id="an escaped quote does not end a string"
        ),
        pytest.param('["\\\\", [[1]]]', 2, 8, id="an escaped backslash does end one"),
        pytest.param("[]" * 1000, 1, None, id="siblings are not depth"),
        pytest.param("not json at all", 1, None, id="text without brackets"),
    ],
)
def test_the_nesting_is_measured_on_the_text(text, limit, offset):
    assert nesting_beyond(text, limit) == offset


def test_a_100000_deep_text_is_measured_without_recursion_in_milliseconds():
    text = "[" * 100_000 + "]" * 100_000
    started = time.process_time()  # CPU time: a busy machine must not fail the bound
    assert nesting_beyond(text, 32) == 32
    assert time.process_time() - started < 0.5
    with pytest.raises(RecursionError):
        json.loads(text)  # what the bound saves us from


@pytest.mark.parametrize(
    "value, found",
    [
        pytest.param({"type": "input", "data": "ls\n"}, False, id="plain text"),
        pytest.param(
            {"data": "😀 and é"}, False, id="an emoji is a surrogate pair, not a lone one"
        ),
        pytest.param(json.loads('{"data": "\\ud83d\\ude00"}'), False, id="an escaped pair"),
        pytest.param(json.loads('{"data": "\\ud800"}'), True, id="a lone high surrogate"),
        pytest.param(json.loads('{"\\udfff": 1}'), True, id="in a key"),
        pytest.param(json.loads('{"a": [1, {"b": ["\\udc00"]}]}'), True, id="deep in a list"),
    ],
)
def test_lone_surrogates_are_found_anywhere_in_decoded_json(value, found):
    assert lone_surrogate(value) is found
