"""The dependency arrows of DESIGN.md, read from the source: each package imports only what is below it."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _imports(package: str) -> dict[str, set[str]]:
    """Every absolute module a package's files import, by file (relative imports stay inside)."""
    found: dict[str, set[str]] = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.update(f"{node.module}.{alias.name}" for alias in node.names)
        found[str(path.relative_to(ROOT))] = names
    return found


def _top(module: str) -> str:
    return module.split(".")[0]


def test_bai_common_imports_only_the_standard_library() -> None:
    outside = {
        path: sorted(m for m in names if _top(m) not in sys.stdlib_module_names | {"bai_common"})
        for path, names in _imports("bai_common").items()
    }
    assert {path: names for path, names in outside.items() if names} == {}


def test_sessions_app_reaches_the_agent_only_through_its_protocol() -> None:
    sideways = {
        path: sorted(
            m for m in names if _top(m) == "agent" and m.split(".")[:2] != ["agent", "protocol"]
        )
        for path, names in _imports("sessions_app").items()
    }
    assert {path: names for path, names in sideways.items() if names} == {}


def test_the_agent_imports_nothing_of_the_manager() -> None:
    manager = {"django", "backendai_web", "sessions_app", "scheduler_app"}
    upward = {
        path: sorted(m for m in names if _top(m) in manager)
        for path, names in _imports("agent").items()
    }
    assert {path: names for path, names in upward.items() if names} == {}
