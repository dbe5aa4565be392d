"""Inference endpoints on a real engine: an endpoint of 2 replicas becomes HEALTHY
(health checks through the apps proxy's tunnel to the agent, the model folder
mounted read-only), killing one replica's container makes it UNHEALTHY and it is
replaced, and bob can neither see nor touch alice's endpoint.

The replicas run ``python3 -m http.server 8000`` in the Python kernel image, a
stand-in for the model image (``bai-kernel/sklearn-serve:1``) that the router's
branch builds; its health path is a file of the model folder, so a healthy
replica also proves the folder is mounted.

Personas: ``alice`` owns the endpoint; ``bob`` gets 404 on it.
"""

from __future__ import annotations

import time

import pytest

from serving_app import reconcile
from serving_app.models import Endpoint, EndpointEvent, Route
from sessions_app import services as session_services
from sessions_app.models import Agent, AgentStatus
from tests.docker.test_apps_proxy import _api
from tests.docker.test_cluster_system import PYTHON_IMAGE, engine  # noqa: F401
from tests.live import wait_for

pytestmark = [pytest.mark.docker, pytest.mark.django_db(transaction=True)]


def _healthy(endpoint_id, count, exclude=()):
    def check():
        reconcile.reconcile_endpoint(endpoint_id)
        routes = Route.objects.filter(endpoint_id=endpoint_id, status="HEALTHY").exclude(
            pk__in=exclude
        )
        return list(routes) if routes.count() >= count else None

    return check


def test_an_endpoint_of_two_replicas_turns_healthy_and_a_killed_replica_is_replaced(
    engine,  # noqa: F811
    images,  # noqa: F811
    live_system,
    make_agent,
    make_token,
    alice,
    bob,
    settings,
):
    from backendai_web.env import persistent_secret

    # The reconciler runs here, in the test process: it signs its health checks with
    # the key the servers share (as a Celery worker of the same deployment does).
    settings.SECRET_KEY = persistent_secret(live_system.tmp_path / "var" / "secret_key")
    settings.BAI_APPS_TUNNEL_URL = f"ws://127.0.0.1:{live_system.apps_port}"
    settings.BAI_SERVE_UNHEALTHY_AFTER = 1
    live_system.start_apps()
    live_system.start_agent(
        make_agent("node-a", cpu="4", mem=4 * 2**30), "--cpu", "4", "--mem", "4g"
    )
    wait_for(lambda: Agent.objects.filter(status=AgentStatus.ALIVE).exists(), what="the agent")
    folder = session_services.folder_create(owner=alice, name="iris-model")
    (folder.host_path / "health.txt").write_text("ok\n")
    alice_token, bob_token = make_token(alice), make_token(bob)

    status, endpoint = _api(
        live_system,
        alice_token,
        "POST",
        "/api/v1/endpoints/",
        {
            "name": "iris",
            "image": PYTHON_IMAGE,
            "model_folder": "iris-model",
            "start_command": "exec python3 -m http.server 8000",
            "health_path": "/iris-model/health.txt",
            "health_interval": 1,
            "resources": {"cpu": "1", "mem": "256m"},
            "replicas": 2,
            "max_replicas": 3,
        },
    )
    assert status == 201, endpoint
    endpoint_id = endpoint["id"]
    try:
        first = wait_for(_healthy(endpoint_id, 2), timeout=120, what="two healthy replicas")
        status, detail = _api(live_system, alice_token, "GET", f"/api/v1/endpoints/{endpoint_id}/")
        assert detail["status"] == "READY", detail
        assert sorted(r["status"] for r in detail["routes"]) == ["HEALTHY", "HEALTHY"]

        # The model folder is read-only in the replica (once the launch path sends it so).
        session = first[0].session
        assert list(session.readonly_mounts.all()) == [folder]

        # bob sees nothing of it.
        for path in ("", "routes/", "history/", "tokens/"):
            code, body = _api(
                live_system, bob_token, "GET", f"/api/v1/endpoints/{endpoint_id}/{path}"
            )
            assert code == 404, (path, body)
        assert _api(live_system, bob_token, "GET", "/api/v1/endpoints/")[1] == []

        # Kill one replica's container: it turns UNHEALTHY and is replaced.
        victim = first[0]
        for container in engine.containers.list(
            filters={"label": f"ai.backend.session_id={victim.session_id}"}
        ):
            container.kill()
        wait_for(_healthy(endpoint_id, 2, exclude=[victim.pk]), timeout=120, what="a replacement")
        messages = list(
            EndpointEvent.objects.filter(endpoint_id=endpoint_id).values_list("message", flat=True)
        )
        assert any(m.startswith(f"replica {victim.pk} unhealthy") for m in messages), messages
        assert any(m.startswith(f"replica {victim.pk} removed: unhealthy") for m in messages), (
            messages
        )
        assert Endpoint.objects.get(pk=endpoint_id).status == "READY"
    finally:
        _api(live_system, alice_token, "DELETE", f"/api/v1/endpoints/{endpoint_id}/")
        time.sleep(1)
