"""The one rule for names in data folders (bai_common/names.py), and the safe form of a
name a kernel wrote anyway, as a zip member."""

from __future__ import annotations

import pytest

from bai_common.names import name_problem, safe_member_name


@pytest.mark.parametrize(
    "name, words",
    [
        ("", "not a name"),
        (".", "not a name"),
        ("..", "not a name"),
        ("a/b", "'/'"),
        ("..\\..\\evil.txt", "backslash"),
        ("a\x00b", "NUL"),
        ("a\nb", "control"),
        ("a\x7fb", "control"),
        ("C:evil", "drive"),
        ("z:", "drive"),
    ],
)
def test_a_name_with_a_path_trick_is_refused_saying_why(name, words):
    assert words in (name_problem(name) or "")


@pytest.mark.parametrize("name", ["a", "12:30.log", "résumé.pdf", ".hidden", "a b", "..a", "CON"])
def test_ordinary_linux_names_are_allowed(name):
    assert name_problem(name) is None


@pytest.mark.parametrize(
    "name, safe",
    [
        ("..\\..\\evil.txt", ".._.._evil.txt"),
        ("C:x", "C_x"),
        ("a\tb", "a_b"),
        ("..", "_"),
        ("bad\udcffbyte", "bad?byte"),
        ("fine.txt", "fine.txt"),
    ],
)
def test_a_zip_member_name_is_always_safe(name, safe):
    assert safe_member_name(name) == safe
    assert name_problem(safe_member_name(name)) is None
