"""The endpoints' REST API: shapes, validation (a bad input is a 400 that changes
nothing), tokens and rules, and isolation: bob gets 404 on every path of alice's
endpoint, an admin gets through."""

from __future__ import annotations

import pytest

from serving_app import selectors, services
from serving_app.models import AutoScalingRule, Endpoint, EndpointEvent, EndpointToken

pytestmark = pytest.mark.django_db


def test_alice_creates_an_endpoint_and_reads_it_back(api, alice, endpoint_data):
    response = api(alice).post("/api/v1/endpoints/", endpoint_data, format="json")
    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["name"] == "iris"
    assert body["owner"] == "alice"
    assert body["model_folder"] == "iris-model"
    assert body["status"] == "PROVISIONING"
    assert body["url"].endswith("/serve/iris/")
    assert (body["replicas"], body["min_replicas"], body["max_replicas"]) == (2, 1, 4)
    assert set(body) >= {
        "id", "image", "start_command", "port", "health_path", "health_interval", "resources",
        "cluster_size", "resource_group", "open_to_public", "status_reason", "routes", "rules",
        "created_at",
    }  # fmt: skip
    assert body["port"] == 8000 and body["health_path"] == "/health"
    listed = api(alice).get("/api/v1/endpoints/").json()
    assert [e["name"] for e in listed] == ["iris"]
    history = api(alice).get(f"/api/v1/endpoints/{body['id']}/history/").json()
    assert history[0]["kind"] == "created"


@pytest.mark.parametrize(
    "changes, field",
    [
        ({"name": "Bad Name"}, "name"),
        ({"name": "-x"}, "name"),
        ({"port": 80}, "port"),
        ({"port": 70000}, "port"),
        ({"port": 2200}, "port"),
        ({"replicas": 5}, "replicas"),
        ({"replicas": 17, "max_replicas": 17}, "replicas"),
        ({"min_replicas": 3, "max_replicas": 2, "replicas": 2}, "min_replicas"),
        ({"replicas": -1}, "replicas"),
        ({"health_interval": 0}, "health_interval"),
        ({"health_interval": 301}, "health_interval"),
        ({"health_path": "health"}, "health_path"),
        ({"image": "nope:1"}, "image"),
        ({"model_folder": "nope"}, "model_folder"),
        ({"resource_group": "nope"}, "resource_group"),
        ({"resources": {"cpu": "-1"}}, "resources"),
        ({"resources": {"cpu": "lots"}}, "resources"),
        ({"cluster_size": 0}, "cluster_size"),
        ({"cluster_size": 99}, "cluster_size"),
        ({"open_to_public": "yes"}, "open_to_public"),
        ({"colour": "blue"}, "colour"),
        (
            {
                "rules": [
                    {"metric": "rps_per_replica", "comparator": "gt", "threshold": 1, "step": 0}
                ]
            },
            "rules.0.step",
        ),
        (
            {"rules": [{"metric": "rps", "comparator": "gt", "threshold": 1, "step": 1}]},
            "rules.0.metric",
        ),
        (
            {"rules": [{"metric": "inflight", "comparator": "gt", "threshold": 1e300, "step": 1}]},
            "rules.0.threshold",
        ),
        (
            {
                "rules": [
                    {
                        "metric": "inflight",
                        "comparator": "gt",
                        "threshold": 1,
                        "step": 1,
                        "cooldown": 0,
                    }
                ]
            },
            "rules.0.cooldown",
        ),
    ],
)
def test_a_bad_endpoint_is_refused_with_a_400_naming_the_field_and_nothing_is_written(
    api, alice, endpoint_data, changes, field
):
    response = api(alice).post("/api/v1/endpoints/", {**endpoint_data, **changes}, format="json")
    assert response.status_code == 400, response.json()
    body = response.json()
    assert field in body["extra"]["fields"], body
    assert body["message"]
    if field == "name":  # the rule in words, not "does not match the required pattern"
        assert "lower-case letters, digits and '-'" in body["extra"]["fields"]["name"][0]
    assert not Endpoint.objects.exists()
    assert not EndpointEvent.objects.exists()


def test_a_name_is_unique_over_all_users(api, bob, make_endpoint, endpoint_data):
    make_endpoint()
    data = {**endpoint_data, "model_folder": None}
    response = api(bob).post("/api/v1/endpoints/", data, format="json")
    assert response.status_code == 409
    assert response.json()["extra"]["fields"] == {"name": ["already taken"]}


def test_another_users_folder_is_not_a_model_folder(api, bob, endpoint_data):
    response = api(bob).post("/api/v1/endpoints/", {**endpoint_data, "name": "b"}, format="json")
    assert response.status_code == 400
    assert "model_folder" in response.json()["extra"]["fields"]


def _paths(endpoint_id, token_id, rule_id):
    base = f"/api/v1/endpoints/{endpoint_id}"
    return [
        ("get", f"{base}/", None),
        ("patch", f"{base}/", {"replicas": 1}),
        ("delete", f"{base}/", None),
        ("post", f"{base}/scale/", {"replicas": 1}),
        ("get", f"{base}/routes/", None),
        ("get", f"{base}/history/", None),
        ("get", f"{base}/metrics/", None),
        ("get", f"{base}/tokens/", None),
        ("post", f"{base}/tokens/", {}),
        ("delete", f"{base}/tokens/{token_id}/", None),
        ("get", f"{base}/rules/", None),
        (
            "post",
            f"{base}/rules/",
            {"metric": "inflight", "comparator": "gt", "threshold": 1, "step": 1},
        ),
        ("delete", f"{base}/rules/{rule_id}/", None),
    ]


def test_bob_gets_404_on_every_path_of_alices_endpoint_and_changes_nothing(
    api, alice, bob, make_endpoint
):
    endpoint = make_endpoint()
    token, _ = services.token_create(endpoint=endpoint, user=alice)
    rule = services.rule_create(
        endpoint=endpoint,
        data={"metric": "inflight", "comparator": "gt", "threshold": 5, "step": 1},
    )
    events = EndpointEvent.objects.count()
    for method, path, body in _paths(endpoint.pk, token.pk, rule.pk):
        response = getattr(api(bob), method)(path, body, format="json")
        assert response.status_code == 404, (method, path, response.content)
        assert response.json()["message"] == "No such endpoint."
    assert api(bob).get("/api/v1/endpoints/").json() == []
    assert api(bob).get("/api/v1/endpoints/?all=true").json() == []
    endpoint.refresh_from_db()
    assert endpoint.replicas == 2
    assert EndpointToken.objects.count() == 1 and AutoScalingRule.objects.count() == 1
    assert EndpointEvent.objects.count() == events


def test_anonymous_callers_are_refused_everywhere(api, make_endpoint):
    endpoint = make_endpoint()
    for method, path, body in _paths(endpoint.pk, 1, 1):
        response = getattr(api(), method)(path, body, format="json")
        assert response.status_code in (401, 403), (method, path)
    assert api().get("/api/v1/endpoints/quota/").status_code in (401, 403)


def test_an_admin_sees_and_manages_alices_endpoint(api, admin, make_endpoint):
    endpoint = make_endpoint()
    assert api(admin).get("/api/v1/endpoints/").json() == []
    assert [e["name"] for e in api(admin).get("/api/v1/endpoints/?all=true").json()] == ["iris"]
    response = api(admin).post(
        f"/api/v1/endpoints/{endpoint.pk}/scale/", {"replicas": 3}, format="json"
    )
    assert response.status_code == 200
    assert response.json()["replicas"] == 3


def test_scaling_is_recorded_and_kept_within_min_and_max(api, alice, make_endpoint):
    endpoint = make_endpoint()
    client = api(alice)
    response = client.post(
        f"/api/v1/endpoints/{endpoint.pk}/scale/", {"replicas": 3}, format="json"
    )
    assert response.status_code == 200
    last = client.get(f"/api/v1/endpoints/{endpoint.pk}/history/").json()[-1]
    assert last["kind"] == "scale"
    assert last["data"] == {"from": 2, "to": 3}
    assert "scaled 2 → 3" in last["message"]
    for replicas in (0, 5):
        response = client.post(
            f"/api/v1/endpoints/{endpoint.pk}/scale/", {"replicas": replicas}, format="json"
        )
        assert response.status_code == 400
        assert "replicas" in response.json()["extra"]["fields"]
    endpoint.refresh_from_db()
    assert endpoint.replicas == 3


def test_patch_changes_bounds_and_replaces_rules(api, alice, make_endpoint):
    endpoint = make_endpoint()
    rules = [
        {
            "metric": "rps_per_replica",
            "comparator": "gt",
            "threshold": 20,
            "step": 1,
            "cooldown": 30,
        },
        {"metric": "rps_per_replica", "comparator": "lt", "threshold": 2, "step": -1},
    ]
    response = api(alice).patch(
        f"/api/v1/endpoints/{endpoint.pk}/",
        {"min_replicas": 0, "max_replicas": 2, "open_to_public": True, "rules": rules},
        format="json",
    )
    assert response.status_code == 200, response.json()
    body = response.json()
    assert (body["min_replicas"], body["max_replicas"], body["open_to_public"]) == (0, 2, True)
    assert [(r["threshold"], r["step"], r["cooldown"]) for r in body["rules"]] == [
        (20.0, 1, 30),
        (2.0, -1, 60),
    ]
    response = api(alice).patch(
        f"/api/v1/endpoints/{endpoint.pk}/", {"max_replicas": 17}, format="json"
    )
    assert response.status_code == 400


def test_a_token_is_shown_once_and_opens_only_its_own_endpoint(api, alice, make_endpoint):
    iris = make_endpoint()
    other = make_endpoint(name="other", model_folder=None)
    client = api(alice)
    response = client.post(f"/api/v1/endpoints/{iris.pk}/tokens/", {}, format="json")
    assert response.status_code == 201
    plain = response.json()["token"]
    assert plain.startswith("bai_") and response.json()["prefix"] == plain[4:12]
    listed = client.get(f"/api/v1/endpoints/{iris.pk}/tokens/").json()
    assert "token" not in listed[0]
    assert plain not in str(EndpointToken.objects.values_list())
    assert selectors.token_ok(str(iris.pk), plain)
    assert not selectors.token_ok(str(other.pk), plain)
    assert not selectors.token_ok(str(iris.pk), plain + "x")
    assert not selectors.token_ok(str(iris.pk), "")
    assert not selectors.token_ok("not-a-uuid", plain)
    token_id = listed[0]["id"]
    assert client.delete(f"/api/v1/endpoints/{iris.pk}/tokens/{token_id}/").status_code == 204
    assert not selectors.token_ok(str(iris.pk), plain)


def test_an_expired_token_is_refused(alice, make_endpoint, time_machine=None):
    from datetime import timedelta

    from django.utils import timezone

    endpoint = make_endpoint()
    token, plain = services.token_create(
        endpoint=endpoint, user=alice, expires_at=timezone.now() + timedelta(seconds=60)
    )
    assert selectors.token_ok(str(endpoint.pk), plain)
    EndpointToken.objects.filter(pk=token.pk).update(
        expires_at=timezone.now() - timedelta(seconds=1)
    )
    assert not selectors.token_ok(str(endpoint.pk), plain)


def test_rules_are_added_and_deleted(api, alice, make_endpoint):
    endpoint = make_endpoint()
    client = api(alice)
    rule = {
        "metric": "p95_latency_ms",
        "comparator": "ge",
        "threshold": 250,
        "step": 2,
        "cooldown": 10,
    }
    response = client.post(f"/api/v1/endpoints/{endpoint.pk}/rules/", rule, format="json")
    assert response.status_code == 201
    rule_id = response.json()["id"]
    assert [r["id"] for r in client.get(f"/api/v1/endpoints/{endpoint.pk}/rules/").json()] == [
        rule_id
    ]
    assert client.delete(f"/api/v1/endpoints/{endpoint.pk}/rules/{rule_id}/").status_code == 204
    assert client.delete(f"/api/v1/endpoints/{endpoint.pk}/rules/{rule_id}/").status_code == 404


def test_the_router_view_lists_only_healthy_routes(make_endpoint, agent):
    from serving_app.models import Route, RouteStatus
    from sessions_app import services as session_services
    from sessions_app.models import Kernel, Status

    endpoint = make_endpoint(open_to_public=True)
    view = selectors.router_view("iris")
    assert view.endpoint_id == str(endpoint.pk) and view.open_to_public is True
    assert view.routes == [] and view.replicas == 2
    session = session_services.session_create(
        owner=endpoint.owner, spec={"image": endpoint.image.reference}
    )
    Kernel.objects.filter(session=session).update(agent=agent, status=Status.RUNNING)
    Route.objects.create(
        endpoint=endpoint, session=session, status=RouteStatus.HEALTHY, traffic_ratio=0.5
    )
    Route.objects.create(endpoint=endpoint, session=session, status=RouteStatus.UNHEALTHY)
    (route,) = selectors.router_view("iris").routes
    assert route.ratio == 0.5 and route.session_id == str(session.pk)
    assert route.target == {
        "session_id": str(session.pk),
        "kernel_id": str(session.pk),
        "agent_id": agent.pk,
        "port": 8000,
    }
    assert selectors.router_view("nope") is None


def test_wake_sets_the_replicas_once_and_says_why(alice, make_endpoint):
    endpoint = make_endpoint(replicas=0, min_replicas=0)
    assert endpoint.status == "SCALED_TO_ZERO"
    services.wake(str(endpoint.pk), "scaled 0 → 1: a request arrived while scaled to zero")
    services.wake(str(endpoint.pk), "again")
    endpoint.refresh_from_db()
    assert endpoint.replicas == 1
    scales = EndpointEvent.objects.filter(endpoint=endpoint, kind="scale")
    assert [e.data for e in scales] == [{"from": 0, "to": 1}]


def test_delete_removes_the_endpoint_and_its_history(api, alice, make_endpoint):
    endpoint = make_endpoint()
    assert api(alice).delete(f"/api/v1/endpoints/{endpoint.pk}/").status_code == 204
    assert not Endpoint.objects.exists()
    assert not EndpointEvent.objects.exists()
    assert api(alice).get(f"/api/v1/endpoints/{endpoint.pk}/").status_code == 404


def test_the_schema_documents_every_endpoint_operation(client):
    import json

    document = json.loads(client.get("/api/schema/?format=json").content)
    for path in (
        "/api/v1/endpoints/",
        "/api/v1/endpoints/quota/",
        "/api/v1/endpoints/{endpoint_id}/",
        "/api/v1/endpoints/{endpoint_id}/scale/",
        "/api/v1/endpoints/{endpoint_id}/routes/",
        "/api/v1/endpoints/{endpoint_id}/history/",
        "/api/v1/endpoints/{endpoint_id}/metrics/",
        "/api/v1/endpoints/{endpoint_id}/tokens/",
        "/api/v1/endpoints/{endpoint_id}/tokens/{token_id}/",
        "/api/v1/endpoints/{endpoint_id}/rules/",
        "/api/v1/endpoints/{endpoint_id}/rules/{rule_id}/",
    ):
        assert path in document["paths"], path
        for operation in document["paths"][path].values():
            if "{" in path:
                assert "404" in operation["responses"], path


def test_an_empty_start_command_is_refused_where_the_image_has_no_serving_command(
    api, alice, endpoint_data
):
    for empty in ({"start_command": ""}, {"start_command": "   "}, {}):
        data = {k: v for k, v in endpoint_data.items() if k != "start_command"}
        response = api(alice).post("/api/v1/endpoints/", {**data, **empty}, format="json")
        assert response.status_code == 400, response.json()
        body = response.json()
        assert list(body["extra"]["fields"]) == ["start_command"]
        assert body["message"] == (
            "start_command: image bai-kernel/minimal:1 has no default serving command: give the "
            "command that starts your model server, listening on port 8000 ($BAI_SERVE_PORT)"
        )
    assert not Endpoint.objects.exists()


def test_with_no_start_command_replicas_run_the_images_serving_command(
    api, alice, image, endpoint_data
):
    from serving_app import reconcile
    from sessions_app.models import Session

    image.serve_command = 'exec serve --port "$BAI_SERVE_PORT"'
    image.save()
    data = {k: v for k, v in endpoint_data.items() if k != "start_command"}
    response = api(alice).post("/api/v1/endpoints/", {**data, "port": 8123}, format="json")
    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["start_command"] == ""
    assert body["effective_start_command"] == 'exec serve --port "$BAI_SERVE_PORT"'
    reconcile.reconcile_endpoint(body["id"])
    sessions = Session.objects.filter(session_type="inference")
    assert sessions.count() == 2
    for session in sessions:
        assert session.startup_command == 'exec serve --port "$BAI_SERVE_PORT"'
        assert session.environ["BAI_SERVE_PORT"] == "8123"
    # The image loses its command: no replica starts without one, and the route says why.
    image.serve_command = ""
    image.save()
    response = api(alice).patch(f"/api/v1/endpoints/{body['id']}/", {"replicas": 3}, format="json")
    assert response.status_code == 200
    reconcile.reconcile_endpoint(body["id"])
    failed = Endpoint.objects.get(pk=body["id"]).routes.filter(status="FAILED_TO_START").first()
    assert failed is not None and "has no default serving command" in failed.health_reason
    assert sessions.count() == 2
