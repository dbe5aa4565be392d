"""The nesting depth of a JSON body, measured without parsing it."""

from __future__ import annotations

import json

import pytest

from sessions_app.middleware import json_nesting_depth


@pytest.mark.parametrize(
    ("body", "depth"),
    [
        (b"", 0),
        (b"42", 0),
        (b"[]", 1),
        (b'{"a": {"b": [1, 2, {"c": []}]}}', 5),
        (b"[[], [], []]", 2),
        (b'{"text": "[[[[{{{{"}', 1),  # brackets inside strings do not count
        (b'{"text": "a \\" [[[ \\\\", "b": [[]]}', 3),  # nor after escaped quotes
        (b"[" * 100_000 + b"]" * 100_000, 100_000),
    ],
)
def test_it_measures_how_deep_arrays_and_objects_nest(body, depth):
    assert json_nesting_depth(body) == depth


@pytest.mark.parametrize(
    "value", [{"a": [1, {"b": "x]}"}]}, [[["[", "]]]"]]], {"k": [{"k": [{"k": '\\"['}]}]}]
)
def test_it_agrees_with_the_depth_of_what_json_builds(value):
    def depth(v) -> int:
        if isinstance(v, dict):
            return 1 + max((depth(x) for x in v.values()), default=0)
        if isinstance(v, list):
            return 1 + max((depth(x) for x in v), default=0)
        return 0

    assert json_nesting_depth(json.dumps(value).encode()) == depth(value)
