"""Service ports: the apps an image declares and the ports a user opens at launch.

Pure rules (no ORM): the admin form and the model validate an image's
declaration with :func:`declaration_errors`; ``launch.py`` checks a launch's
``ports`` with :func:`preopen_errors`; :func:`session_apps` lists what a
session offers (the image's apps, then the user's ports as ``port-<n>``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

PROTOCOLS = ("http", "tcp")
MIN_USER_PORT = 1024  # below: privileged, and the kernel user cannot bind them anyway
MAX_PORT = 65535
MAX_DECLARED = 16
MAX_PREOPEN = 4
MAX_START_COMMAND = 2048
# Ports the runner itself uses inside a kernel: sshd (``agent/backends/docker.py``).
RESERVED_PORTS = frozenset({2200})
APP_NAME = re.compile(r"[a-z][a-z0-9-]{0,31}")


@dataclass(frozen=True)
class App:
    name: str
    protocol: str
    port: int
    start_command: str = ""
    preopen: bool = False

    @property
    def title(self) -> str:
        return f"port {self.port}" if self.preopen else self.name.replace("-", " ").title()

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "title": self.title,
            "protocol": self.protocol,
            "port": self.port,
            "on_demand": bool(self.start_command),
        }


def _is_port(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def declaration_errors(declared: Any) -> list[str]:
    """Why an image's ``service_ports`` is not a valid declaration (empty: it is)."""
    if not isinstance(declared, list):
        return ['must be a list like [{"name": "jupyter", "protocol": "http", "port": 8888}]']
    if len(declared) > MAX_DECLARED:
        return [f"at most {MAX_DECLARED} service ports"]
    errors: list[str] = []
    names: set[str] = set()
    ports: set[int] = set()
    for i, item in enumerate(declared, 1):
        if not isinstance(item, dict):
            errors.append(f"item {i}: must be an object")
            continue
        unknown = sorted(set(item) - {"name", "protocol", "port", "start_command"})
        if unknown:
            errors.append(f"item {i}: unknown field {unknown[0]!r}")
        name, port = item.get("name"), item.get("port")
        if not isinstance(name, str) or not APP_NAME.fullmatch(name):
            errors.append(f"item {i}: name must be 1-32 lower-case letters, digits or '-'")
        elif name in names or name.startswith("port-"):
            errors.append(f"item {i}: name {name!r} is taken")
        else:
            names.add(name)
        if item.get("protocol") not in PROTOCOLS:
            errors.append(f"item {i}: protocol must be one of {', '.join(PROTOCOLS)}")
        if not _is_port(port) or not MIN_USER_PORT <= port <= MAX_PORT:
            errors.append(
                f"item {i}: port must be a whole number from {MIN_USER_PORT} to {MAX_PORT}"
            )
        elif port in RESERVED_PORTS:
            errors.append(f"item {i}: port {port} is reserved for the runner (sshd)")
        elif port in ports:
            errors.append(f"item {i}: port {port} is declared twice")
        else:
            ports.add(port)
        command = item.get("start_command", "")
        if not isinstance(command, str) or len(command) > MAX_START_COMMAND or "\x00" in command:
            errors.append(f"item {i}: start_command must be text of at most {MAX_START_COMMAND}")
    return errors


def declared_apps(declared: Any) -> list[App]:
    """An image's apps; a declaration that fails its check offers none."""
    if declaration_errors(declared):
        return []
    return [
        App(d["name"], d["protocol"], d["port"], d.get("start_command") or "") for d in declared
    ]


def preopen_errors(ports: list[Any], declared: Any) -> list[str]:
    """Why a launch's ``ports`` are refused (empty: accepted)."""
    if len(ports) > MAX_PREOPEN:
        return [f"at most {MAX_PREOPEN} ports"]
    image_ports = {app.port: app.name for app in declared_apps(declared)}
    errors: list[str] = []
    seen: set[int] = set()
    for port in ports:
        if not _is_port(port) or not MIN_USER_PORT <= port <= MAX_PORT:
            errors.append(f"{port!r}: a port must be from {MIN_USER_PORT} to {MAX_PORT}")
        elif port in RESERVED_PORTS:
            errors.append(f"{port} is reserved for the runner (sshd)")
        elif port in image_ports:
            errors.append(f"{port} is the image's own {image_ports[port]} port")
        elif port in seen:
            errors.append(f"{port} is given twice")
        seen.add(port)
    return errors


def session_apps(declared: Any, preopen: list[int]) -> list[App]:
    """What main1 of a session offers: the image's apps, then the user's ports."""
    apps = declared_apps(declared)
    return apps + [App(f"port-{p}", "http", p, preopen=True) for p in preopen]
