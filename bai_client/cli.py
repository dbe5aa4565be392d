"""The ``bai`` command: ``bai login``, ``bai sessions``, ``bai app``."""

from __future__ import annotations

import asyncio
import sys

import click

from . import config
from .api import ApiError, Client


def _client() -> Client:
    data = config.load()
    if not data.get("manager") or not data.get("token"):
        raise click.ClickException("not logged in: run `bai login --manager URL --username NAME`")
    return Client(data["manager"], data["token"])


def _call(client: Client, method: str, path: str, body: object = None) -> object:
    try:
        return client.call(method, path, body)
    except ApiError as exc:
        raise click.ClickException(str(exc)) from None


@click.group()
def main() -> None:
    """Backend.AI Web from the command line."""


@main.command()
@click.option("--manager", required=True, help="The manager's URL, e.g. http://127.0.0.1:8000")
@click.option("--username", required=True)
@click.option("--password-stdin", is_flag=True, help="Read the password from standard input.")
def login(manager: str, username: str, password_stdin: bool) -> None:
    """Get an API token and keep it (with the manager's URL) in the config file."""
    if password_stdin:
        password = sys.stdin.readline().rstrip("\n")
    else:
        password = click.prompt("Password", hide_input=True)
    answer = _call(
        Client(manager), "POST", "auth/token/", {"username": username, "password": password}
    )
    path = config.save({"manager": manager.rstrip("/"), "token": answer["token"]})
    click.echo(f"Logged in as {username}; token kept in {path} (expires {answer['expires_at']}).")


@main.command()
def sessions() -> None:
    """List your sessions."""
    data = _call(_client(), "GET", "sessions/")
    rows = data["results"] if isinstance(data, dict) else data
    click.echo(f"{'ID':36}  {'NAME':20}  {'STATUS':12}  APPS")
    for s in rows:
        apps = ",".join(a["name"] for a in s.get("apps", []))
        click.echo(f"{s['id']:36}  {s['name'][:20]:20}  {s['status']:12}  {apps}")


@main.command()
@click.argument("session")
@click.argument("app")
@click.option(
    "--bind", default="127.0.0.1:0", show_default=True, help="Local address to listen on."
)
def app(session: str, app: str, bind: str) -> None:
    """Forward a local TCP port to APP (a service port) of SESSION's main kernel."""
    client = _client()
    detail = _call(client, "GET", f"sessions/{session}/")
    found = next((a for a in detail.get("apps", []) if a["name"] == app), None)
    if found is None:
        names = ", ".join(a["name"] for a in detail.get("apps", [])) or "none"
        raise click.ClickException(f"session {session} has no app {app!r} (apps: {names})")
    host, _, port = bind.rpartition(":")
    if not host or not port.isdigit():
        raise click.BadParameter("HOST:PORT, e.g. 127.0.0.1:8080", param_hint="--bind")

    from .forward import serve

    def ready(bound: int) -> None:
        click.echo(f"Forwarding {host}:{bound} -> {app} (port {found['port']}) of {detail['name']}")
        click.echo("Press Ctrl-C to stop.", err=True)

    def log(message: str) -> None:
        click.echo(message, err=True)

    try:
        asyncio.run(serve(host, int(port), found["forward_url"], client.token, log, ready))
    except KeyboardInterrupt:
        click.echo("Stopped.", err=True)
    except OSError as exc:
        raise click.ClickException(f"cannot listen on {bind}: {exc.strerror}") from None
