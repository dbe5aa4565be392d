"""How ``bai`` shows things: aligned tables for people, JSON for scripts."""

from __future__ import annotations

import json
import os
from typing import IO, Any

import click

from bai_common import units


def color() -> bool | None:
    """Whether text keeps its colours (ANSI escapes, e.g. a kernel's traceback):
    never under ``NO_COLOR`` (https://no-color.org); else as click decides, only
    on a terminal (``None``)."""
    return False if os.environ.get("NO_COLOR") else None


def write(text: str, file: IO[str] | None = None, *, err: bool = False) -> None:
    """``text`` as it is (no newline added), its colours stripped where ``color()``
    says so."""
    click.echo(text, file=file, nl=False, err=err, color=color())


def echo_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2))


def table(headers: list[str], rows: list[list[Any]]) -> None:
    """Columns as wide as their widest cell; the last one is not padded."""
    cells = [headers] + [["" if c is None else str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    for row in cells:
        padded = [cell.ljust(width) for cell, width in zip(row[:-1], widths, strict=False)]
        click.echo("  ".join([*padded, row[-1]]).rstrip())


def labelled(fields: list[tuple[str, Any]]) -> None:
    """``label: value`` lines, aligned; empty values left out; then a blank line."""
    width = max(len(label) for label, _ in fields)
    for label, value in fields:
        if value not in (None, ""):
            click.echo(f"{label + ':':{width + 1}} {value}")
    click.echo()


def _resources(slots: dict[str, Any]) -> str:
    """``1 cpu, 64 MiB mem``: each amount as people read it (bai_common.units)."""
    shown = []
    for slot, amount in sorted(slots.items()):
        try:
            shown.append(units.format_slot(slot, units.parse_amount(amount)))
        except ValueError:  # not an amount the client knows how to show: as it came
            shown.append(f"{amount} {slot}")
    return ", ".join(shown)


def _cluster(session: dict[str, Any]) -> str:
    return f"{session['cluster_size']} ({session['cluster_mode']})"


def sessions_table(sessions: list[dict[str, Any]], *, owners: bool = False) -> None:
    """One row a session; ``owners``: with an OWNER column (``--all``)."""
    table(
        [
            "ID",
            *(["OWNER"] if owners else []),
            "NAME",
            "STATUS",
            "TYPE",
            "IMAGE",
            "CLUSTER",
            "APPS",
        ],
        [
            [
                s["id"],
                *([s.get("owner", "")] if owners else []),
                s["name"],
                s["status"],
                s["type"],
                s["image"],
                _cluster(s),
                ",".join(a["name"] for a in s.get("apps", [])),
            ]
            for s in sessions
        ],
    )


def session_details(session: dict[str, Any]) -> None:
    """The session, its status and why, then one line per kernel."""
    fields = [
        ("id", session["id"]),
        ("name", session["name"]),
        ("owner", session["owner"]),
        ("type", session["type"]),
        ("status", session["status"]),
        ("reason", session["status_reason"]),
        ("result", session["result"] if session["result"] != "UNDEFINED" else None),
        ("exit code", session["exit_code"]),
        ("image", session["image"]),
        ("resource group", session["resource_group"]),
        ("cluster", _cluster(session)),
        ("resources", f"{_resources(session['resources'])} per kernel"),
        ("mounts", ", ".join(session["mounts"])),
        ("apps", ", ".join(a["name"] for a in session.get("apps", []))),
        ("created", session["created_at"]),
        ("started", session["started_at"]),
        ("ended", session["terminated_at"]),
    ]
    labelled(fields)
    table(
        ["KERNEL", "ROLE", "STATUS", "AGENT", "EXIT", "REASON"],
        [
            [
                k["cluster_hostname"],
                k["cluster_role"],
                k["status"],
                k["agent"],
                k["exit_code"],
                k["status_reason"],
            ]
            for k in session["kernels"]
        ],
    )


def size(value: int) -> str:
    return units.format_size_shown(int(value))


def folders_table(folders: list[dict[str, Any]]) -> None:
    table(
        ["ID", "NAME", "OWNER", "ACCESS", "SIZE", "FILES", "MOUNTED BY"],
        [
            [
                f["id"],
                f["name"],
                f["owner"],
                f["permission"],
                size(f["size_bytes"]) + (" (over quota)" if f.get("over_quota") else ""),
                f["file_count"],
                ", ".join(m["name"] for m in f["mounted_by"]) or "-",
            ]
            for f in folders
        ],
    )


def endpoints_table(endpoints: list[dict[str, Any]]) -> None:
    table(
        ["ID", "NAME", "STATUS", "REPLICAS", "HEALTHY", "IMAGE", "URL"],
        [
            [
                e["id"],
                e["name"],
                e["status"],
                f"{e['replicas']} ({e['min_replicas']}–{e['max_replicas']})",
                sum(r["status"] == "HEALTHY" for r in e["routes"]),
                e["image"],
                e["url"],
            ]
            for e in endpoints
        ],
    )


def rules_table(rules: list[dict[str, Any]]) -> None:
    """Autoscaling rules, one a row."""
    table(
        ["RULE", "METRIC", "WHEN", "STEP", "COOLDOWN", "MIN–MAX"],
        [
            [
                r["id"],
                r["metric"],
                f"{r['comparator']} {r['threshold']:g}",
                f"{r['step']:+d}",
                f"{r['cooldown']} s",
                f"{r['min_replicas']}–{r['max_replicas']}",
            ]
            for r in rules
        ],
    )


def endpoint_details(endpoint: dict[str, Any], history: list[dict[str, Any]] | None = None) -> None:
    """The endpoint and why it is in its status, its routes, rules and history."""
    fields = [
        ("id", endpoint["id"]),
        ("name", endpoint["name"]),
        ("owner", endpoint["owner"]),
        ("url", endpoint["url"]),
        ("status", endpoint["status"]),
        ("reason", endpoint["status_reason"]),
        ("image", endpoint["image"]),
        ("model folder", endpoint["model_folder"]),
        (
            "start command",
            endpoint["start_command"]
            or (
                f"{endpoint['effective_start_command']} (the image's default)"
                if endpoint.get("effective_start_command")
                else None
            ),
        ),
        ("port", endpoint["port"]),
        ("health", f"GET {endpoint['health_path']} every {endpoint['health_interval']} s"),
        (
            "replicas",
            f"{endpoint['replicas']} ({endpoint['min_replicas']}–{endpoint['max_replicas']})",
        ),
        (
            "resources",
            f"{_resources(endpoint['resources'])} per replica" if endpoint["resources"] else None,
        ),
        ("access", "public" if endpoint["open_to_public"] else "token"),
        ("created", endpoint["created_at"]),
    ]
    labelled(fields)
    table(
        ["ROUTE", "SESSION", "STATUS", "RATIO", "WHY"],
        [
            [r["id"], r["session_id"], r["status"], r["traffic_ratio"], r.get("health_reason")]
            for r in endpoint["routes"]
        ],
    )
    if endpoint["rules"]:
        click.echo()
        rules_table(endpoint["rules"])
    if history:
        click.echo()
        table(
            ["TIME", "KIND", "WHAT"],
            [[e["created_at"], e["kind"], e["message"]] for e in history[-20:]],
        )


def runs_table(runs: list[dict[str, Any]]) -> None:
    table(
        ["STARTED", "BY", "MODE", "RUN", "ENDED", "EXIT"],
        [
            [r["started_at"], r["user"], r["mode"], r["run_id"], r["outcome"], r["exit_code"]]
            for r in runs
        ],
    )
