"""``bai serve`` against a live manager: an endpoint's autoscaling rules are added, listed and
deleted after it was created, an empty start command is refused for an image with no
serving command of its own, with the API's words, and ``bai serve quota`` says what the policy
allows.

Personas: ``alice`` owns the endpoint; ``bob`` may not reach it.
"""

from __future__ import annotations

import json

import pytest

from tests.docker.test_bai_cli import bai, login, with_passwords  # noqa: F401 - a fixture

pytestmark = pytest.mark.django_db(transaction=True)


def test_bai_serve_adds_lists_and_deletes_rules_of_an_existing_endpoint(
    live_system,
    image,
    alice,
    bob,
    with_passwords,  # noqa: F811
    tmp_path,
):
    from serving_app.models import AutoScalingRule

    config = tmp_path / "alice.json"
    login(config, live_system.url, "alice")
    refused = bai(config, "serve", "create", "iris", "-i", image.reference, check=False)
    assert refused.returncode == 1
    assert "has no default serving command" in refused.stderr
    bai(config, "serve", "create", "iris", "-i", image.reference, "-c", "sleep 600")
    quota = bai(config, "serve", "quota").stdout
    assert "endpoints: 1 of unlimited" in quota, quota
    assert "your sessions: at most 10 running, 20 pending" in quota, quota

    added = bai(
        config, "serve", "rule", "add", "iris", "--metric", "rps_per_replica", "--when", "gt",
        "--threshold", "20", "--step", "1", "--cooldown", "30", "--json",
    )  # fmt: skip
    rule = json.loads(added.stdout)
    assert (rule["metric"], rule["comparator"], rule["threshold"], rule["step"]) == (
        "rps_per_replica",
        "gt",
        20.0,
        1,
    )
    assert AutoScalingRule.objects.get().cooldown == 30
    listed = bai(config, "serve", "rule", "list", "iris").stdout
    assert f"{rule['id']}" in listed and "gt 20" in listed and "+1" in listed, listed
    bad = bai(
        config, "serve", "rule", "add", "iris", "--metric", "inflight", "--when", "lt",
        "--threshold", "1", "--step", "0", check=False,
    )  # fmt: skip
    assert bad.returncode == 1 and "step" in bad.stderr

    other = tmp_path / "bob.json"
    login(other, live_system.url, "bob")
    denied = bai(other, "serve", "rule", "delete", "iris", str(rule["id"]), check=False)
    assert denied.returncode == 1 and "no endpoint named 'iris'" in denied.stderr
    assert AutoScalingRule.objects.count() == 1

    bai(config, "serve", "rule", "delete", "iris", str(rule["id"]))
    assert not AutoScalingRule.objects.exists()
    gone = bai(config, "serve", "rule", "delete", "iris", str(rule["id"]), check=False)
    assert gone.returncode == 1 and "No such rule" in gone.stderr
