"""Bounds on JSON that arrives from outside, checked before it costs anything.

Python's ``json`` decoder recurses once per nested array or object: a text of
100,000 ``[`` raises ``RecursionError`` (not ``ValueError``) after a deep
descent. ``nesting_beyond`` finds the depth on the text itself, in one linear
pass, before the decoder runs. ``lone_surrogate`` finds what ``json`` accepts
and UTF-8 cannot encode (``"\\ud800"``): such a string breaks every database,
channel layer and socket it is passed on to.

Standard library only.
"""

from __future__ import annotations

import re
from typing import Any

# A whole string (its brackets do not count), or one bracket.
_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]')


def nesting_beyond(text: str, limit: int) -> int | None:
    """The offset in ``text`` of the first ``[`` or ``{`` that opens a level
    deeper than ``limit``, or None when the text nests no deeper than that."""
    depth = 0
    for match in _TOKENS.finditer(text):
        token = match.group()
        if token in ("[", "{"):
            depth += 1
            if depth > limit:
                return match.start()
        elif token in ("]", "}"):
            depth -= 1
    return None


def lone_surrogate(value: Any) -> bool:
    """Whether any string in decoded JSON (keys too) holds a lone surrogate."""
    return lone_surrogate_at(value) is not None


def lone_surrogate_at(value: Any) -> tuple[str | int, ...] | None:
    """The path to the first string in decoded JSON that holds a lone surrogate
    (for a key, the path ends with that key), or None when there is none."""
    stack: list[tuple[tuple[str | int, ...], Any]] = [((), value)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return path
        elif isinstance(item, dict):
            for key, child in reversed(item.items()):
                stack.append(((*path, key), child))
                stack.append(((*path, key), key))
        elif isinstance(item, list):
            stack.extend(((*path, i), child) for i, child in reversed(list(enumerate(item))))
    return None
