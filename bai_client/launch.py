"""What ``bai sessions create`` and ``bai run`` share: the launch options (one
flag per field of the REST launch body, ``POST /api/v1/sessions/``), the body
they make, and waiting for the session to run."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import click

from .api import ENDED, Client

WAIT_INTERVAL = 0.5  # seconds between looks at a session that is starting


class KeyValue(click.ParamType):
    """``KEY=VALUE`` (``-r cpu=1``, ``-e DEBUG=1``), as a pair."""

    name = "KEY=VALUE"

    def convert(self, value: Any, param: Any, ctx: Any) -> tuple[str, str]:
        if isinstance(value, tuple):
            return value
        key, sep, rest = str(value).partition("=")
        if not sep or not key:
            self.fail(f"{value!r} is not KEY=VALUE (e.g. cpu=1)", param, ctx)
        return key, rest


KEY_VALUE = KeyValue()

_OPTIONS = [
    click.option("-n", "--name", help="The session's name (unique among your active sessions)."),
    click.option("-g", "--resource-group", help="The resource group to run in (default: default)."),
    click.option("--cluster-size", type=click.IntRange(1), help="How many kernels (main1, sub1…)."),
    click.option(
        "--cluster-mode",
        type=click.Choice(["single-node", "multi-node"]),
        help="single-node: all kernels on one agent; multi-node: spread over the group's agents.",
    ),
    click.option(
        "-r",
        "--resources",
        type=KEY_VALUE,
        multiple=True,
        help="Resources of each kernel, e.g. -r cpu=1 -r mem=1g (repeatable).",
    ),
    click.option("-e", "--env", type=KEY_VALUE, multiple=True, help="An environment variable."),
    click.option(
        "-m", "--mount", "mounts", multiple=True, help="One of your data folders, by name."
    ),
    click.option("--startup-command", help="A shell command the session starts with."),
    click.option(
        "-p",
        "--port",
        "ports",
        type=click.IntRange(1024, 65535),
        multiple=True,
        help="A port of main1 to offer as an app (port-PORT).",
    ),
    click.option("--starts-at", help="Batch sessions: start no earlier (ISO 8601 date-time)."),
    click.option("--batch-timeout", type=float, help="Batch sessions: seconds they may run."),
    click.option(
        "--depends-on", multiple=True, help="A session (id or name) to wait for; repeatable."
    ),
    click.option("--template", help="A session template (id or name) to start from."),
    click.option("--agent", "agents", multiple=True, help="Admins: pin to this agent."),
    click.option("--main-image", help="main1's image, when it differs from IMAGE."),
    click.option("--sub-image", help="The sub kernels' image, when it differs from IMAGE."),
    click.option(
        "--main-resources", type=KEY_VALUE, multiple=True, help="main1's own resources (KEY=VALUE)."
    ),
    click.option(
        "--sub-resources", type=KEY_VALUE, multiple=True, help="The sub kernels' own resources."
    ),
    click.option("--sub-replicas", type=click.IntRange(0), help="How many sub kernels."),
]


def with_options(options: list[Callable[[Any], Any]]) -> Callable[[Any], Any]:
    """A decorator that adds ``options`` to a click command, in their order."""

    def add(command: Any) -> Any:
        for option in reversed(options):
            command = option(command)
        return command

    return add


launch_options = with_options(_OPTIONS)


def _role(image: str | None, resources: tuple[tuple[str, str], ...], replicas: int | None):
    role: dict[str, Any] = {"image": image, "resources": dict(resources), "replicas": replicas}
    return {key: value for key, value in role.items() if value not in (None, {})}


def launch_spec(client: Client, image: str | None, **options: Any) -> dict[str, Any]:
    """The launch body: the fields given, and nothing else (a template fills the rest).
    Sessions and templates named by name become the ids the API takes."""
    spec: dict[str, Any] = {
        "image": image,
        "name": options.get("name"),
        "type": options.get("type"),
        "resource_group": options["resource_group"],
        "cluster_size": options["cluster_size"],
        "cluster_mode": options["cluster_mode"],
        "resources": dict(options["resources"]),
        "env": dict(options["env"]),
        "mounts": list(options["mounts"]),
        "startup_command": options["startup_command"],
        "ports": list(options["ports"]),
        "starts_at": options["starts_at"],
        "batch_timeout": options["batch_timeout"],
        "depends_on": [client.session_id(ref) for ref in options["depends_on"]],
        "agents": list(options["agents"]),
        "template": client.template_id(options["template"]) if options["template"] else None,
    }
    roles = {
        "main": _role(options["main_image"], options["main_resources"], None),
        "sub": _role(options["sub_image"], options["sub_resources"], options["sub_replicas"]),
    }
    spec["roles"] = {name: role for name, role in roles.items() if role}
    return {key: value for key, value in spec.items() if value not in (None, [], {})}


def wait_until_running(
    client: Client, session: dict[str, Any], say: Callable[[str], None]
) -> dict[str, Any]:
    """Look at ``session`` until it runs or ends, saying each change of status
    after the one it had (with the reason, e.g. why it waits). A batch session is
    waited for until it ends (as Slurm's ``sbatch --wait``): its result is what
    counts, and seeing it run for a moment says nothing of that. Returns the
    session as last seen."""
    shown = (session["status"], session["status_reason"])
    batch = session.get("type") == "batch"
    while True:
        status, reason = session["status"], session["status_reason"]
        if (status, reason) != shown:
            say(f"{session['name']}: {status}" + (f" ({reason})" if reason else ""))
            shown = (status, reason)
        if status in ENDED or (status == "RUNNING" and not batch):
            return session
        time.sleep(WAIT_INTERVAL)
        session = client.call("GET", f"sessions/{session['id']}/")


def failure(session: dict[str, Any]) -> str | None:
    """Why a waited-for session did not come up, or None when it runs (or a batch
    session already ended well)."""
    if session.get("result") == "SUCCESS":
        return None
    if session["status"] == "RUNNING" and session.get("type") != "batch":
        return None
    reason = session["status_reason"] or "no reason given"
    return f"session {session['name']} ended {session['status']}: {reason}"
