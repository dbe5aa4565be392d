"""``bai serve``: what each command sends, and endpoints named by name or id."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from bai_client import cli
from bai_client.api import ApiError, Client
from bai_client.cli import main

ENDPOINT_ID = "44444444-4444-4444-4444-444444444444"
ENDPOINT = {
    "id": ENDPOINT_ID,
    "name": "iris",
    "owner": "alice",
    "image": "bai-kernel/sklearn-serve:1",
    "model_folder": "models",
    "start_command": "",
    "port": 8000,
    "health_path": "/health",
    "health_interval": 5,
    "resources": {"cpu": "1"},
    "cluster_size": 1,
    "resource_group": "default",
    "replicas": 2,
    "min_replicas": 1,
    "max_replicas": 4,
    "open_to_public": False,
    "status": "READY",
    "status_reason": "",
    "url": "http://apps.localhost:8001/serve/iris/",
    "routes": [{"id": 1, "session_id": "s1", "status": "HEALTHY", "traffic_ratio": 1.0}],
    "rules": [
        {
            "id": 3,
            "metric": "rps_per_replica",
            "comparator": "gt",
            "threshold": 20.0,
            "step": 1,
            "cooldown": 60,
            "min_replicas": 1,
            "max_replicas": 4,
        }
    ],  # fmt: skip
    "created_at": "2026-01-01T00:00:00Z",
}


@pytest.fixture
def manager(monkeypatch):
    requests = []

    def call(client, method, path, body=None, **query):
        requests.append((method, path, body, query))
        if path == "endpoints/" and method == "GET":
            return [ENDPOINT]
        if path == "endpoints/" and method == "POST":
            if body["name"] == "taken":
                raise ApiError(409, "An endpoint named 'taken' exists already.")
            return {**ENDPOINT, **body}
        if path.endswith("/history/"):
            return [{"created_at": "t", "kind": "scale", "message": "scaled 1 → 2: rps"}]
        if path.endswith("/scale/"):
            return {**ENDPOINT, "replicas": body["replicas"]}
        if path.endswith("/tokens/") and method == "POST":
            return {"id": 1, "prefix": "0123abcd", "token": "bai_0123abcdplain"}
        if method == "DELETE":
            return None
        return ENDPOINT

    monkeypatch.setattr(Client, "call", call)
    monkeypatch.setattr(cli, "_client", lambda: Client("http://manager", "token"))
    return requests


def test_create_sends_only_what_was_given(manager):
    result = CliRunner().invoke(
        main,
        ["serve", "create", "iris", "-i", "img:1", "-m", "models", "--replicas", "2",
         "--min-replicas", "0", "-r", "cpu=1", "--json"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    (request,) = manager
    assert request[:2] == ("POST", "endpoints/")
    assert request[2] == {
        "name": "iris", "open_to_public": False, "image": "img:1", "model_folder": "models",
        "replicas": 2, "min_replicas": 0, "resources": {"cpu": "1"},
    }  # fmt: skip
    assert json.loads(result.output)["name"] == "iris"


def test_a_refusal_is_the_managers_words_and_exit_1(manager):
    result = CliRunner().invoke(main, ["serve", "create", "taken", "-i", "img:1"])
    assert result.exit_code == 1
    assert "exists already" in result.output


def test_list_show_scale_and_delete_name_an_endpoint_by_name(manager):
    runner = CliRunner()
    listed = runner.invoke(main, ["serve", "list"])
    assert "iris" in listed.output and "READY" in listed.output
    shown = runner.invoke(main, ["serve", "show", "iris"])
    assert shown.exit_code == 0, shown.output
    assert "rps_per_replica" in shown.output and "scaled 1 → 2" in shown.output
    scaled = runner.invoke(main, ["serve", "scale", "iris", "3"])
    assert scaled.output.strip() == "iris: 3 replica(s) wanted; READY"
    assert ("POST", f"endpoints/{ENDPOINT_ID}/scale/", {"replicas": 3}, {}) in manager
    deleted = runner.invoke(main, ["serve", "delete", ENDPOINT_ID])
    assert deleted.exit_code == 0
    assert ("DELETE", f"endpoints/{ENDPOINT_ID}/", None, {}) in manager
    missing = runner.invoke(main, ["serve", "show", "nope"])
    assert missing.exit_code == 1 and "no endpoint named 'nope'" in missing.output


def test_token_prints_a_new_caller_token_once(manager):
    made = CliRunner().invoke(main, ["serve", "token", "iris"])
    assert made.exit_code == 0, made.output
    assert made.output == "bai_0123abcdplain\n"
    assert ("POST", f"endpoints/{ENDPOINT_ID}/tokens/", {}, {}) in manager
