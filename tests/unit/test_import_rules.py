"""The dependency arrows drawn in docs/architecture.md, read from the source.

Each package imports only what is below it.
"""

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


def test_the_scheduler_reaches_sessions_app_but_sessions_app_never_reaches_the_scheduler() -> None:
    upward = {
        path: sorted(m for m in names if _top(m) == "scheduler_app")
        for path, names in _imports("sessions_app").items()
    }
    assert {path: names for path, names in upward.items() if names} == {}


def test_the_two_apps_consumers_share_helpers_only_through_backendai_web() -> None:
    gateway = _imports("scheduler_app")["scheduler_app/consumers.py"]
    assert not [m for m in gateway if m.startswith("sessions_app.consumers")]
    assert "backendai_web.websockets.LoopDispatch" in gateway


def test_models_record_transitions_and_push_nothing() -> None:
    models = _imports("sessions_app")["sessions_app/models.py"]
    tree = ast.parse((ROOT / "sessions_app/models.py").read_text())
    relative = {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.level > 0
        for alias in node.names
    }
    assert "live" not in relative
    assert not [m for m in models if "live" in m.split(".") or _top(m) == "channels"]


def test_the_policies_import_nothing_of_django() -> None:
    for package, path in (
        ("scheduler_app", "scheduler_app/policy.py"),
        ("sessions_app", "sessions_app/policy.py"),
    ):
        names = _imports(package)[path]
        assert not [m for m in names if _top(m) in {"django", "rest_framework", "channels"}], path


def test_serving_app_reaches_sessions_app_only_and_nothing_below_reaches_it() -> None:
    # docs/architecture.md, "Where things live": proxy_app → serving_app → sessions_app.
    upward = {
        path: sorted(m for m in names if _top(m) in {"proxy_app", "scheduler_app"})
        for path, names in _imports("serving_app").items()
    }
    assert {path: names for path, names in upward.items() if names} == {}
    for package in ("sessions_app", "scheduler_app", "agent", "bai_client"):
        reaching = {
            path: sorted(m for m in names if _top(m) == "serving_app")
            for path, names in _imports(package).items()
        }
        assert {path: names for path, names in reaching.items() if names} == {}, package
