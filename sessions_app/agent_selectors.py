"""The agent selectors a resource group may use: the built-ins and every installed plugin.

An agent selector is a class (``scheduler_app.policy.AgentSelector``) registered by name in the
entry point group ``backendai_web.agent_selectors``. A plugin package declares it in its
pyproject.toml, and the name appears in the resource group admin once the package is installed
and the processes restarted::

    [project.entry-points."backendai_web.agent_selectors"]
    by-label = "my_package.selectors:ByLabel"

The project runs from its checkout rather than as an installed package, so its own three are
declared here in the same form. Everything is loaded by reference, as entry points are: the
admin (sessions_app) validates options with the very class the scheduler will use, without
importing scheduler_app.
"""

from __future__ import annotations

import logging
from functools import cache
from importlib.metadata import EntryPoint, entry_points
from typing import Any

logger = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "backendai_web.agent_selectors"
_INTERFACE = EntryPoint("AgentSelector", "scheduler_app.policy:AgentSelector", ENTRY_POINT_GROUP)
BUILTIN = {
    name: EntryPoint(name, f"scheduler_app.policy:{attr}", ENTRY_POINT_GROUP)
    for name, attr in (
        ("concentrated", "ConcentratedSelector"),
        ("dispersed", "DispersedSelector"),
        ("roundrobin", "RoundRobinSelector"),
    )
}
_BUILTIN_LABELS = {
    "concentrated": "concentrated (pack: the fitting agent with the least free)",
    "dispersed": "dispersed (spread: the fitting agent with the most free)",
    "roundrobin": "roundrobin (the next fitting agent in turn)",
}


class AgentSelectorError(Exception):
    """A selector cannot be used; ``message`` says why, for an admin or a waiting user."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class AgentSelectorNotInstalled(AgentSelectorError):
    pass


class AgentSelectorBadOptions(AgentSelectorError):
    pass


@cache
def _registered() -> dict[str, EntryPoint]:
    plugins: dict[str, EntryPoint] = {}
    for entry in entry_points(group=ENTRY_POINT_GROUP):
        if entry.name in BUILTIN:
            logger.warning(
                "agent selector %s from %s ignored: the name is a built-in's",
                entry.name,
                entry.value,
            )
        elif entry.name in plugins:
            # The first on sys.path wins, as for imports.
            logger.warning(
                "agent selector %s from %s ignored: %s comes first",
                entry.name,
                entry.value,
                plugins[entry.name].value,
            )
        else:
            plugins[entry.name] = entry
    return {**BUILTIN, **dict(sorted(plugins.items()))}


def agent_selectors_reload() -> None:
    """Look for installed plugins again (the lookup is kept for the life of the process)."""
    _registered.cache_clear()


def agent_selector_names() -> list[str]:
    """The built-ins first, then the installed plugins by name."""
    return list(_registered())


def agent_selector_choices() -> list[tuple[str, str]]:
    """(name, label) for a select: a plugin's label names the package it comes from."""
    choices = []
    for name, entry in _registered().items():
        label = _BUILTIN_LABELS.get(name)
        if label is None:
            dist = entry.dist
            label = f"{name} (plugin {dist.name} {dist.version})" if dist else f"{name} (plugin)"
        choices.append((name, label))
    return choices


def agent_selector_build(*, name: str, options: Any) -> Any:
    """The selector ``name`` built with ``options`` (a JSON object): an AgentSelector.

    Raises AgentSelectorError saying why not: not installed, cannot be loaded, not a selector,
    or it refused its options (the selector's message names the option).
    """
    entry = _registered().get(name)
    if entry is None:
        raise AgentSelectorNotInstalled(f"agent selector {name!r} is not installed")
    try:
        selector_class = entry.load()
    except Exception as exc:  # noqa: BLE001 - any import error of a plugin is reported
        raise AgentSelectorError(
            f"agent selector {name!r} cannot be loaded from {entry.value}: "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    interface = _INTERFACE.load()
    if not (isinstance(selector_class, type) and issubclass(selector_class, interface)):
        raise AgentSelectorError(
            f"agent selector {name!r} ({entry.value}) is not an AgentSelector class"
        )
    if not isinstance(options, dict):
        raise AgentSelectorBadOptions("the options must be a JSON object, such as {}")
    try:
        return selector_class(options)
    except ValueError as exc:
        raise AgentSelectorBadOptions(
            f"agent selector {name!r} refused its options: {exc}"
        ) from exc
    except Exception as exc:  # noqa: BLE001 - a plugin's bug is reported, not raised
        raise AgentSelectorBadOptions(
            f"agent selector {name!r} failed with these options: {type(exc).__name__}: {exc}"
        ) from exc
