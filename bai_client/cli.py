"""The ``bai`` command: ``login``, ``sessions list|show|create|terminate``,
``logs``, ``exec``, ``run``, ``app``, ``folders list|create|upload|download``.
``logs``, ``exec``, ``run``, ``app``, ``serve create|list|show|scale|delete``.

Sessions are named by id or by name. Errors are the manager's words, exit
status 1; usage errors exit 2. ``exec`` and ``run`` exit with the run's status.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Callable, Coroutine
from functools import partial
from typing import Any

import click

from . import config, output
from .api import ApiError, Client
from .launch import (
    KEY_VALUE,
    failure,
    launch_options,
    launch_spec,
    wait_until_running,
    with_options,
)
from .streams import STREAM_FAILURES, Outcome, execute, read_log, stream_error

INTERRUPTED = 130  # a shell's status for a command stopped by Ctrl-C


def _client() -> Client:
    data = config.load()
    if not data.get("manager") or not data.get("token"):
        raise click.ClickException("not logged in: run `bai login --manager URL --username NAME`")
    return Client(data["manager"], data["token"])


def _api(action: Callable[[], Any]) -> Any:
    """``action()``, with the manager's refusal as the command's error."""
    try:
        return action()
    except ApiError as exc:
        raise click.ClickException(str(exc)) from None


def _stream(coroutine: Coroutine[Any, Any, Any]) -> Any:
    try:
        return asyncio.run(coroutine)
    except STREAM_FAILURES as exc:
        raise click.ClickException(str(stream_error(exc))) from None


def _say(message: str) -> None:
    click.echo(message, err=True)


json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON, for scripts.")


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
    credentials = {"username": username, "password": password}
    answer = _api(lambda: Client(manager).call("POST", "auth/token/", credentials))
    path = config.save({"manager": manager.rstrip("/"), "token": answer["token"]})
    click.echo(f"Logged in as {username}; token kept in {path} (expires {answer['expires_at']}).")


# --- sessions ------------------------------------------------------------------------------


list_options = with_options(
    [
        click.option("--status", help="Only sessions in this status, e.g. RUNNING."),
        click.option(
            "--all",
            "everyone",
            is_flag=True,
            help="Admins: every user's sessions, with their owners (others: their own).",
        ),
        json_option,
    ]
)


@main.group(invoke_without_command=True)
@list_options
@click.pass_context
def sessions(ctx: click.Context, status: str | None, everyone: bool, as_json: bool) -> None:
    """Your sessions (with no command: list them, as ``sessions list`` does)."""
    if ctx.invoked_subcommand is None:
        ctx.invoke(sessions_list, status=status, everyone=everyone, as_json=as_json)


@sessions.command("list")
@list_options
def sessions_list(status: str | None, everyone: bool, as_json: bool) -> None:
    """List your sessions, newest first."""
    query = {"status": status} if status else {}
    if everyone:
        query["all"] = "true"
    rows = _api(lambda: _client().sessions(**query))
    output.echo_json(rows) if as_json else output.sessions_table(rows, owners=everyone)


@sessions.command("show")
@click.argument("session")
@json_option
def sessions_show(session: str, as_json: bool) -> None:
    """Show SESSION (an id or a name): its status and why, and its kernels."""
    client = _client()
    detail = _api(lambda: client.call("GET", f"sessions/{client.session_id(session)}/"))
    output.echo_json(detail) if as_json else output.session_details(detail)


@sessions.command("runs")
@click.argument("session")
@json_option
def sessions_runs(session: str, as_json: bool) -> None:
    """SESSION's code runs, newest first: who ran what mode when, and how it ended."""
    client = _client()
    runs = _api(lambda: client.call("GET", f"sessions/{client.session_id(session)}/runs/"))
    output.echo_json(runs) if as_json else output.runs_table(runs)


def _create(client: Client, image: str | None, options: dict[str, Any], wait: bool) -> Any:
    spec = _api(lambda: launch_spec(client, image, **options))
    created = _api(lambda: client.call("POST", "sessions/", spec))
    reason = f" ({created['status_reason']})" if created["status_reason"] else ""
    _say(f"Session {created['name']} ({created['id']}) created: {created['status']}{reason}")
    if not wait:
        return created
    session = _api(lambda: wait_until_running(client, created, _say))
    if (why := failure(session)) is not None:
        raise click.ClickException(why)
    return session


@sessions.command("create")
@click.argument("image", required=False)
@click.option(
    "-t",
    "--type",
    type=click.Choice(["interactive", "batch", "inference", "system"]),
    help="The session type (default: interactive).",
)
@launch_options
@click.option(
    "--wait",
    is_flag=True,
    help="Wait until it runs (a batch session: until it ends), showing each change of status.",
)
@json_option
def sessions_create(image: str | None, wait: bool, as_json: bool, **options: Any) -> None:
    """Start a session from IMAGE (or from --template)."""
    if image is None and options["template"] is None:
        raise click.UsageError("give an IMAGE, or a --template that names one")
    session = _create(_client(), image, options, wait)
    output.echo_json(session) if as_json else output.session_details(session)


@sessions.command("terminate")
@click.argument("session", nargs=-1, required=True)
@click.option("--reason", help="Why (kept in the session's history).")
@json_option
def sessions_terminate(session: tuple[str, ...], reason: str | None, as_json: bool) -> None:
    """End SESSION (ids or names; several at once)."""
    client = _client()
    body = {"reason": reason} if reason else {}
    ended = []
    for ref in session:
        path = f"sessions/{_api(lambda ref=ref: client.session_id(ref))}/terminate/"
        ended.append(_api(lambda path=path: client.call("POST", path, body)))
        if not as_json:
            click.echo(f"{ended[-1]['name']} ({ended[-1]['id']}): {ended[-1]['status']}")
    if as_json:
        output.echo_json(ended)


# --- logs and code -------------------------------------------------------------------------


@main.command()
@click.argument("session")
@click.option("-k", "--kernel", default="main1", show_default=True, help="main1, sub1, …")
@click.option("-f", "--follow", is_flag=True, help="Keep writing what the kernel writes.")
def logs(session: str, kernel: str, follow: bool) -> None:
    """Write a kernel's log: live, or the kept tail once it ended."""
    client = _client()
    session_id = _api(lambda: client.session_id(session))
    url = client.websocket_url(f"sessions/{session_id}/kernels/{kernel}/logs/")

    try:
        _stream(read_log(url, client.token, follow=follow, write=output.write, say=_say))
    except KeyboardInterrupt:
        _say("Stopped.")


def _code(code: str | None, file: Any) -> str:
    if (code is None) == (file is None):
        raise click.UsageError("give the CODE to run, or --file with it (one of the two)")
    return code if code is not None else file.read()


def _run_code(client: Client, session_id: str, code: str, timeout: float | None) -> int:
    """Run ``code`` in the session, show its output as it comes; its exit status."""
    url = client.websocket_url(f"sessions/{session_id}/execute/")
    options = {"timeout": timeout} if timeout is not None else {}
    try:
        outcome: Outcome = _stream(execute(url, client.token, code=code, options=options, say=_say))
    except asyncio.CancelledError:
        _say("Stopped waiting for the run.")
        return INTERRUPTED
    if outcome.status == "exec-timeout":
        _say(f"The run went past its time limit ({timeout} s) and was interrupted.")
    return outcome.exit_status


code_options = with_options(
    [
        click.argument("code", required=False),
        click.option("--file", type=click.File(encoding="utf-8"), help="Run this file's code."),
        click.option(
            "--timeout", type=click.FloatRange(0, 86400), help="Seconds the run may take."
        ),
    ]
)


@main.command("exec")
@click.argument("session")
@code_options
@click.pass_context
def exec_(
    ctx: click.Context, session: str, code: str | None, file: Any, timeout: float | None
) -> None:
    """Run Python CODE (or --file) in SESSION's main1; exit with its status.

    Output streams as it comes; input() reads from your terminal; Ctrl-C
    interrupts the code."""
    source = _code(code, file)
    client = _client()
    session_id = _api(lambda: client.session_id(session))
    ctx.exit(_run_code(client, session_id, source, timeout))


@main.command()
@click.argument("image")
@code_options
@launch_options
@click.pass_context
def run(
    ctx: click.Context,
    image: str,
    code: str | None,
    file: Any,
    timeout: float | None,
    **options: Any,
) -> None:
    """Start an interactive session of IMAGE, run CODE (or --file) in it, end it.

    Exits with the run's status. The session ends in every case: when the
    code finishes, fails, or you press Ctrl-C."""
    source = _code(code, file)
    client = _client()
    session = _create(client, image, {**options, "type": "interactive"}, wait=False)
    status = INTERRUPTED
    try:
        running = _api(lambda: wait_until_running(client, session, _say))
        if (why := failure(running)) is not None:
            raise click.ClickException(why)
        status = _run_code(client, session["id"], source, timeout)
    except KeyboardInterrupt:
        _say("Stopped.")
    finally:
        _end(client, session)
    ctx.exit(status)


def _end(client: Client, session: dict[str, Any]) -> None:
    try:
        client.call("POST", f"sessions/{session['id']}/terminate/", {})
        _say(f"Session {session['name']} terminated.")
    except ApiError as exc:
        _say(f"Could not terminate session {session['name']} ({session['id']}): {exc}")


# --- apps ----------------------------------------------------------------------------------


@main.command()
@click.argument("session")
@click.argument("app")
@click.option(
    "--bind", default="127.0.0.1:0", show_default=True, help="Local address to listen on."
)
def app(session: str, app: str, bind: str) -> None:
    """Forward a local TCP port to APP (a service port) of SESSION's main kernel."""
    client = _client()
    detail = _api(lambda: client.call("GET", f"sessions/{client.session_id(session)}/"))
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
        if found.get("protocol") == "http":
            # An app the session starts (Jupyter) asks for its token: this link logs you in.
            where = f"[{host}]" if ":" in host else host
            token = found.get("forward_token")
            click.echo(f"Open http://{where}:{bound}/" + (f"?token={token}" if token else ""))
        click.echo("Press Ctrl-C to stop.", err=True)

    def log(message: str) -> None:
        click.echo(message, err=True)

    try:
        asyncio.run(serve(host, int(port), found["forward_url"], client.token, log, ready))
    except KeyboardInterrupt:
        click.echo("Stopped.", err=True)
    except OSError as exc:
        raise click.ClickException(f"cannot listen on {bind}: {exc.strerror}") from None


# --- folders -------------------------------------------------------------------------------
# --- data folders ---------------------------------------------------------------------------


@main.group(invoke_without_command=True)
@click.pass_context
def folders(ctx: click.Context) -> None:
    """Your data folders and those shared with you (with no command: list them)."""
    if ctx.invoked_subcommand is None:
        ctx.invoke(folders_list)


@folders.command("list")
@json_option
def folders_list(as_json: bool) -> None:
    """List folders: size, files, who may write, live sessions mounting each."""
    rows = _api(lambda: _client().call("GET", "folders/"))
    output.echo_json(rows) if as_json else output.folders_table(rows)


@folders.command("create")
@click.argument("name")
@json_option
def folders_create(name: str, as_json: bool) -> None:
    """Create the folder NAME."""
    folder = _api(lambda: _client().call("POST", "folders/", {"name": name}))
    output.echo_json(folder) if as_json else click.echo(
        f"Folder {folder['name']} ({folder['id']}) created."
    )


def _local_files(sources: tuple[str, ...]) -> list[tuple[str, str]]:
    """(local path, path in the folder) of every regular file the sources name:
    a file by its name, a directory with its tree under its own name."""
    found = []
    for source in sources:
        source = source.rstrip("/") or "/"
        base = os.path.basename(source)
        if os.path.isfile(source):
            found.append((source, base))
        elif os.path.isdir(source):
            for top, dirs, files in os.walk(source):
                dirs.sort()
                rel = os.path.relpath(top, source)
                for name in sorted(files):
                    inside = "/".join(p for p in (base, rel, name) if p and p != ".")
                    if os.path.isfile(os.path.join(top, name)):
                        found.append((os.path.join(top, name), inside))
        else:
            raise click.ClickException(f"{source}: no such file or directory")
    return found


@folders.command("upload")
@click.argument("folder")
@click.argument("sources", nargs=-1, required=True, type=click.Path(exists=True))
@click.option("--to", "target", default="", help="A directory in the folder (default: its top).")
def folders_upload(folder: str, sources: tuple[str, ...], target: str) -> None:
    """Upload files and directory trees SOURCES into FOLDER (name, owner/name or id)."""
    client = _client()
    found = _api(lambda: client.folder(folder))
    prefix = target.strip("/")
    for local, inside in _local_files(sources):
        path = f"{prefix}/{inside}" if prefix else inside
        size = os.path.getsize(local)
        with open(local, "rb") as body:
            endpoint = f"folders/{found['id']}/files/content/"
            _api(partial(client.upload, endpoint, {"path": path}, body, size))
        _say(f"{path} ({output.size(size)})")


@folders.command("download")
@click.argument("folder")
@click.argument("path", default="")
@click.option(
    "-o", "--output", "out", help="Where to write (default: the name, in this directory)."
)
def folders_download(folder: str, path: str, out: str | None) -> None:
    """Download PATH from FOLDER: a file as it is, a directory (or the whole folder,
    with no PATH) as a zip."""
    client = _client()
    found = _api(lambda: client.folder(folder))
    path = path.strip("/")
    parent, _, name = path.rpartition("/")
    is_file = False
    if path:
        listing = _api(
            lambda: client.call("GET", f"folders/{found['id']}/files/", query={"path": parent})
        )
        entry = next((e for e in listing["entries"] if e["name"] == name), None)
        if entry is None:
            raise click.ClickException(f"{path}: no such file or directory in {found['name']}")
        is_file = entry["type"] == "file"
    if is_file:
        endpoint, target = "files/content/", out or name
    else:
        endpoint, target = "archive/", out or f"{name or found['name']}.zip"
    with open(target, "wb") as sink:
        written = _api(
            lambda: client.download(f"folders/{found['id']}/{endpoint}", {"path": path}, sink)
        )
    _say(f"{target} ({output.size(written)})")


# --- inference endpoints -------------------------------------------------------------------


@main.group(invoke_without_command=True)
@click.pass_context
def serve(ctx: click.Context) -> None:
    """Your inference endpoints (with no command: list them)."""
    if ctx.invoked_subcommand is None:
        ctx.invoke(serve_list)


@serve.command("list")
@click.option("--all", "everyone", is_flag=True, help="Admins: every user's endpoints.")
@json_option
def serve_list(everyone: bool, as_json: bool) -> None:
    """List your endpoints."""
    query = {"all": "true"} if everyone else {}
    rows = _api(lambda: _client().call("GET", "endpoints/", query=query))
    output.echo_json(rows) if as_json else output.endpoints_table(rows)


@serve.command("create")
@click.argument("name")
@click.option("-i", "--image", required=True, help="The image of every replica.")
@click.option("-m", "--model-folder", help="A data folder with the model, mounted read-only.")
@click.option(
    "-c",
    "--start-command",
    help="The command that starts the model server (default: the image's own, if it has one).",
)
@click.option("--port", type=int, help="The port it listens on (default 8000).")
@click.option("--health-path", help="Its health check path (default /health).")
@click.option("--replicas", type=int, help="How many replicas (default 1).")
@click.option(
    "--min-replicas", type=int, help="The fewest replicas autoscaling keeps (0: may scale to zero)."
)
@click.option("--max-replicas", type=int, help="The most replicas autoscaling may start.")
@click.option(
    "-r", "--resources", type=KEY_VALUE, multiple=True, help="Per replica, e.g. -r cpu=1 -r mem=1g."
)
@click.option("-g", "--resource-group", help="The resource group (default: default).")
@click.option("--public", is_flag=True, help="Callable without a token.")
@json_option
def serve_create(name: str, as_json: bool, **options: Any) -> None:
    """Create the endpoint NAME (its URL: /serve/NAME/ on the apps origin)."""
    body: dict[str, Any] = {"name": name, "open_to_public": options.pop("public")}
    resources = options.pop("resources")
    if resources:
        body["resources"] = dict(resources)
    body.update({k: v for k, v in options.items() if v is not None})
    endpoint = _api(lambda: _client().call("POST", "endpoints/", body))
    output.echo_json(endpoint) if as_json else output.endpoint_details(endpoint)


def _endpoint_id(client: Client, ref: str) -> str:
    """An endpoint by id or by name (among those you see)."""
    for endpoint in client.call("GET", "endpoints/", query={"all": "true"}):
        if ref in (endpoint["id"], endpoint["name"]):
            return endpoint["id"]
    raise ApiError(404, f"You have no endpoint named {ref!r}.")


@serve.command("show")
@click.argument("endpoint")
@json_option
def serve_show(endpoint: str, as_json: bool) -> None:
    """Show ENDPOINT (a name or an id): its status and why, routes, rules and history."""
    client = _client()

    def fetch() -> tuple[Any, Any]:
        endpoint_id = _endpoint_id(client, endpoint)
        detail = client.call("GET", f"endpoints/{endpoint_id}/")
        return detail, client.call("GET", f"endpoints/{endpoint_id}/history/")

    detail, history = _api(fetch)
    if as_json:
        output.echo_json({**detail, "history": history})
    else:
        output.endpoint_details(detail, history)


@serve.command("scale")
@click.argument("endpoint")
@click.argument("replicas", type=click.IntRange(0))
@json_option
def serve_scale(endpoint: str, replicas: int, as_json: bool) -> None:
    """Set how many replicas ENDPOINT runs."""
    client = _client()
    detail = _api(
        lambda: client.call(
            "POST", f"endpoints/{_endpoint_id(client, endpoint)}/scale/", {"replicas": replicas}
        )
    )
    if as_json:
        output.echo_json(detail)
    else:
        click.echo(f"{detail['name']}: {detail['replicas']} replica(s) wanted; {detail['status']}")


@serve.command("token")
@click.argument("endpoint")
@json_option
def serve_token(endpoint: str, as_json: bool) -> None:
    """A new caller token of ENDPOINT, printed this once (callers send it as
    ``Authorization: Bearer <token>``)."""
    client = _client()
    token = _api(
        lambda: client.call("POST", f"endpoints/{_endpoint_id(client, endpoint)}/tokens/", {})
    )
    if as_json:
        output.echo_json(token)
    else:
        click.echo(token["token"])


@serve.command("quota")
@json_option
def serve_quota(as_json: bool) -> None:
    """How many endpoints you have and may have, and the session limits replicas count against."""
    quota = _api(lambda: _client().call("GET", "endpoints/quota/"))
    if as_json:
        output.echo_json(quota)
        return

    def limit(n: int | None) -> str:
        return "unlimited" if n is None else str(n)

    output.labelled(
        [
            ("endpoints", f"{quota['endpoint_count']} of {limit(quota['max_endpoints'])}"),
            (
                "replicas",
                "your sessions: at most "
                f"{limit(quota['max_concurrent_sessions'])} running, "
                f"{limit(quota['max_pending_sessions'])} pending",
            ),
        ]
    )


@serve.group("rule")
def serve_rule() -> None:
    """The autoscaling rules of an existing endpoint: list, add, delete."""


@serve_rule.command("list")
@click.argument("endpoint")
@json_option
def serve_rule_list(endpoint: str, as_json: bool) -> None:
    """The rules of ENDPOINT."""
    client = _client()
    rules = _api(lambda: client.call("GET", f"endpoints/{_endpoint_id(client, endpoint)}/rules/"))
    output.echo_json(rules) if as_json else output.rules_table(rules)


@serve_rule.command("add")
@click.argument("endpoint")
@click.option(
    "--metric",
    required=True,
    type=click.Choice(["rps_per_replica", "p95_latency_ms", "inflight", "cpu_util"]),
    help="What the rule watches.",
)
@click.option(
    "--when",
    "comparator",
    required=True,
    type=click.Choice(["gt", "ge", "lt", "le"]),
    help="Above (gt), at or above (ge), below (lt), at or below (le) the threshold.",
)
@click.option("--threshold", required=True, type=float)
@click.option(
    "--step", required=True, type=int, help="Replicas to add (negative: to remove); not 0."
)
@click.option("--cooldown", type=int, help="Seconds before the rule may fire again (default 60).")
@click.option("--min-replicas", type=int, help="The fewest replicas it scales to.")
@click.option("--max-replicas", type=int, help="The most replicas it scales to.")
@json_option
def serve_rule_add(endpoint: str, as_json: bool, **options: Any) -> None:
    """Add an autoscaling rule to ENDPOINT, e.g. ``--metric rps_per_replica --when gt
    --threshold 20 --step 1``."""
    client = _client()
    body = {k: v for k, v in options.items() if v is not None}
    rule = _api(
        lambda: client.call("POST", f"endpoints/{_endpoint_id(client, endpoint)}/rules/", body)
    )
    output.echo_json(rule) if as_json else output.rules_table([rule])


@serve_rule.command("delete")
@click.argument("endpoint")
@click.argument("rule_id", type=click.IntRange(1))
def serve_rule_delete(endpoint: str, rule_id: int) -> None:
    """Delete rule RULE_ID (see ``bai serve rule list``) of ENDPOINT."""
    client = _client()
    _api(
        lambda: client.call(
            "DELETE", f"endpoints/{_endpoint_id(client, endpoint)}/rules/{rule_id}/"
        )
    )
    click.echo(f"rule {rule_id}: deleted")


@serve.command("delete")
@click.argument("endpoint", nargs=-1, required=True)
def serve_delete(endpoint: tuple[str, ...]) -> None:
    """Delete ENDPOINT(s): their replicas end, then the endpoint goes."""
    client = _client()
    for ref in endpoint:
        _api(lambda ref=ref: client.call("DELETE", f"endpoints/{_endpoint_id(client, ref)}/"))
        click.echo(f"{ref}: deleted")


if __name__ == "__main__":  # python -m bai_client.cli, as python -m bai_client
    main(prog_name="bai")
