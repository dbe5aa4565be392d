"""Inference endpoints end to end on a real engine, as a user deploys and calls one.

Everything is the real part: the model image ``bai-kernel/sklearn-serve:1`` (uvicorn serving
the iris classifier trained at build time), daphne with the API, the apps proxy
(``proxy_app.asgi:application``) with the router at ``/serve/<name>/``, a Docker agent, the
replica sessions, serving_app's reconciler (run every 0.3 s by a thread of this process, as
beat runs it; its health checks go through the apps proxy's tunnels), the metrics in Redis,
and endpoint tokens. One endpoint of 2 replicas is deployed once and taken through every
check in turn, so that the whole story costs one deployment:

1. both replicas turn HEALTHY and ``/predict`` through the router answers the right species;
2. 40 requests spread 40–60 % over the two (equal ratios);
3. a token of another endpoint is refused (403); bob neither sees the endpoint in the API
   nor calls it with what he holds;
4. a killed replica's container: the route turns UNHEALTHY and is replaced, while a caller
   sending GETs all along sees not one fail;
5. a bounded load generator drives ``rps_per_replica`` over its threshold: a third replica
   serves; after the load stops the scale-down rule's cooldown brings it back to 2;
6. min 0 and idle: it scales to zero, and the first request after it is held until a replica
   is healthy, and answered.

Personas: ``alice`` owns the endpoints; ``bob`` is another user (404 in the API, refused at
the router).
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections import Counter

import pytest

from serving_app import metrics, reconcile
from serving_app.models import Endpoint, EndpointEvent, Route
from sessions_app import kernel_images
from sessions_app import services as session_services
from sessions_app.management.commands.build_kernel_images import IMAGE_INFO
from sessions_app.models import Agent, AgentStatus, Image, Session
from tests.conftest import skip_or_fail
from tests.docker.test_apps_proxy import _api
from tests.docker.test_cluster_system import engine  # noqa: F401
from tests.live import wait_for

pytestmark = [pytest.mark.docker, pytest.mark.django_db(transaction=True)]

IRIS = [[5.1, 3.5, 1.4, 0.2], [5.9, 3.0, 4.2, 1.5], [6.7, 3.0, 5.2, 2.3]]
SPECIES = ["setosa", "versicolor", "virginica"]


@pytest.fixture
def model_image(engine):  # noqa: F811
    try:
        engine.images.get(kernel_images.SKLEARN_SERVE_IMAGE)
    except Exception:  # noqa: BLE001
        if not kernel_images.python_tarball_path(spec=kernel_images.SKLEARN_SERVE_ROOT).is_file():
            skip_or_fail(
                f"{kernel_images.SKLEARN_SERVE_IMAGE} is missing "
                "(python manage.py build_kernel_images --only sklearn-serve)"
            )
        kernel_images.build_sklearn_serve(client=engine)
    # Registered as build_kernel_images registers it (with its default serving command).
    Image.objects.update_or_create(
        reference=kernel_images.SKLEARN_SERVE_IMAGE,
        defaults=IMAGE_INFO[kernel_images.SKLEARN_SERVE_IMAGE],
    )
    return kernel_images.SKLEARN_SERVE_IMAGE


class Reconciler:
    """serving_app's reconciler every ``interval`` seconds in a thread, as beat runs it."""

    def __init__(self, interval: float = 0.3) -> None:
        self.interval = interval
        self.stop = threading.Event()
        self.errors: list[BaseException] = []
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        from django.db import connection

        try:
            while not self.stop.wait(self.interval):
                for endpoint_id in reconcile.endpoint_ids():
                    reconcile.reconcile_endpoint(endpoint_id)
        except BaseException as exc:  # noqa: BLE001 - the test reports it
            self.errors.append(exc)
        finally:
            connection.close()

    def __enter__(self) -> Reconciler:
        self.thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop.set()
        self.thread.join(30)


class Caller:
    """A caller of the router on one kept-alive connection (a new one after an error)."""

    def __init__(self, port: int) -> None:
        self.port, self.host = port, f"apps.localhost:{port}"
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)

    def __call__(self, method, path, *, token=None, body=None, headers=()):
        sent = {"Host": self.host, **dict(headers)}
        if token:
            sent["Authorization"] = f"Bearer {token}"
        if body is not None:
            sent["Content-Type"] = "application/json"
            body = json.dumps(body)
        try:
            self.conn.request(method, path, body=body, headers=sent)
            response = self.conn.getresponse()
            data = response.read()
        except (OSError, http.client.HTTPException):
            self.conn.close()
            self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
            raise
        return response.status, json.loads(data) if data else None, dict(response.getheaders())


def _routes(endpoint_id, status=None):
    qs = Route.objects.filter(endpoint_id=endpoint_id).order_by("id")
    return list(qs.filter(status=status) if status else qs)


def _events(endpoint_id):
    return list(
        EndpointEvent.objects.filter(endpoint_id=endpoint_id)
        .order_by("id")
        .values_list("message", "data")
    )


def test_an_endpoint_serves_spreads_heals_scales_and_wakes_from_zero(
    engine,  # noqa: F811
    model_image,
    live_system,
    make_agent,
    make_token,
    alice,
    bob,
    settings,
):
    from backendai_web.env import persistent_secret

    # The reconciler runs in this process: it signs its health checks with the key the
    # servers share (as a Celery worker of the same deployment does) and reads short windows.
    settings.SECRET_KEY = persistent_secret(live_system.tmp_path / "var" / "secret_key")
    settings.BAI_APPS_TUNNEL_URL = f"ws://127.0.0.1:{live_system.apps_port}"
    settings.BAI_SERVE_UNHEALTHY_AFTER = 1
    settings.BAI_SERVE_METRICS_WINDOW = 2
    settings.BAI_SERVE_IDLE_TIMEOUT = 2
    live_system.start_apps()
    live_system.start_agent(
        make_agent("node-a", cpu="4", mem=8 * 2**30), "--cpu", "4", "--mem", "8g"
    )
    wait_for(lambda: Agent.objects.filter(status=AgentStatus.ALIVE).exists(), what="the agent")
    folder = session_services.folder_create(owner=alice, name="iris-model")
    alice_api, bob_api = make_token(alice), make_token(bob)

    def create(name, **fields):
        status, body = _api(
            live_system,
            alice_api,
            "POST",
            "/api/v1/endpoints/",
            {
                "name": name,
                "image": model_image,
                "model_folder": folder.name,
                "start_command": kernel_images.SKLEARN_SERVE_COMMAND,
                "port": kernel_images.SKLEARN_SERVE_PORT,
                "health_path": "/health",
                "health_interval": 1,
                "resources": {"cpu": "1", "mem": "512m"},
                **fields,
            },
        )
        assert status == 201, body
        code, token = _api(
            live_system, alice_api, "POST", f"/api/v1/endpoints/{body['id']}/tokens/", {}
        )
        assert code == 201, token
        return body["id"], token["token"]

    call = Caller(live_system.apps_port)
    created = []
    try:
        with Reconciler() as reconciler:
            iris, token = create("iris", replicas=2, min_replicas=1, max_replicas=3)
            created.append(iris)
            other, other_token = create("other", replicas=0, min_replicas=0, max_replicas=1)
            created.append(other)

            # 1. Two HEALTHY replicas, and /predict answers through the router.
            wait_for(lambda: len(_routes(iris, "HEALTHY")) == 2, timeout=90, what="2 healthy")
            # The status follows the routes at the end of the same reconciler pass.
            wait_for(
                lambda: Endpoint.objects.get(pk=iris).status == "READY", what="the status READY"
            )
            status, detail = _api(live_system, alice_api, "GET", f"/api/v1/endpoints/{iris}/")
            assert detail["status"] == "READY", detail
            assert detail["url"].endswith("/serve/iris/")
            first_two = _routes(iris, "HEALTHY")
            assert list(first_two[0].session.readonly_mounts.all()) == [folder]
            status, body, _ = call(
                "POST", "/serve/iris/predict", token=token, body={"instances": IRIS}
            )
            assert status == 200, body
            assert body["predictions"] == SPECIES

            # 2. Equal ratios: each replica gets 40-60 % of 40 requests.
            spread = Counter()
            for _ in range(40):
                status, body, _ = call(
                    "POST", "/serve/iris/predict", token=token, body={"instances": IRIS[:1]}
                )
                assert status == 200 and body["predictions"] == ["setosa"], body
                spread[body["replica"]] += 1
            assert len(spread) == 2 and all(16 <= n <= 24 for n in spread.values()), spread

            # 3. Callers: this endpoint's token only; bob sees nothing and calls nothing.
            assert call("POST", "/serve/iris/predict", body={"instances": IRIS})[0] == 401
            for wrong in (other_token, bob_api, alice_api):
                status, body, _ = call(
                    "POST", "/serve/iris/predict", token=wrong, body={"instances": IRIS}
                )
                assert status == 403, (wrong[:6], body)
            assert call("GET", "/serve/other/health", token=token)[0] == 403
            for method, path in (
                ("GET", ""),
                ("GET", "routes/"),
                ("GET", "history/"),
                ("GET", "tokens/"),
                ("POST", "tokens/"),
                ("POST", "scale/"),
            ):
                code, body = _api(
                    live_system,
                    bob_api,
                    method,
                    f"/api/v1/endpoints/{iris}/{path}",
                    {"replicas": 1},
                )
                assert code == 404, (method, path, body)
            assert _api(live_system, bob_api, "GET", "/api/v1/endpoints/")[1] == []

            # 4. Kill one replica's container while a caller sends GETs all along.
            failures, answered, stop = [], Counter(), threading.Event()

            def keep_calling():
                caller = Caller(live_system.apps_port)
                while not stop.is_set():
                    try:
                        status, body, _ = caller("GET", "/serve/iris/health", token=token)
                    except (OSError, http.client.HTTPException, ValueError) as exc:
                        failures.append(repr(exc))
                        continue
                    if status != 200:
                        failures.append((status, body))
                    else:
                        answered[body["replica"]] += 1

            victim = first_two[0]
            background = threading.Thread(target=keep_calling, daemon=True)
            background.start()
            try:
                time.sleep(0.5)
                for container in engine.containers.list(
                    filters={"label": f"ai.backend.session_id={victim.session_id}"}
                ):
                    container.kill()
                wait_for(
                    lambda: len([r for r in _routes(iris, "HEALTHY") if r.pk != victim.pk]) == 2,
                    timeout=90,
                    what="a replacement replica",
                )
                # The router reads its view again within a second; a busy machine may take
                # longer to give the new replica its first request through a fresh tunnel.
                wait_for(lambda: len(answered) == 3, timeout=45, what="the replacement answering")
            finally:
                stop.set()
                background.join(30)
            assert failures == [], failures[:5]
            assert sum(answered.values()) > 50 and len(answered) == 3, answered
            messages = [m for m, _ in _events(iris)]
            assert any(m.startswith(f"replica {victim.pk} unhealthy") for m in messages), messages
            assert any(m.startswith(f"replica {victim.pk} removed: unhealthy") for m in messages)

            # 5. Load drives rps_per_replica over 20: a third replica; then back to 2.
            wait_for(lambda: metrics.snapshot(iris, window_s=2)["rps"] == 0, what="quiet")
            status, body = _api(
                live_system,
                alice_api,
                "PATCH",
                f"/api/v1/endpoints/{iris}/",
                {
                    "rules": [
                        {
                            "metric": "rps_per_replica",
                            "comparator": "gt",
                            "threshold": 20,
                            "step": 1,
                            "cooldown": 30,
                            "max_replicas": 3,
                        },
                        {
                            "metric": "rps_per_replica",
                            "comparator": "lt",
                            "threshold": 1,
                            "step": -1,
                            "cooldown": 3,
                            "min_replicas": 2,
                        },
                    ]
                },
            )
            assert status == 200, body
            before = {r.pk for r in _routes(iris, "HEALTHY")}
            load_stop, load_failures, sent = threading.Event(), [], Counter()

            def load():  # bounded: 4 callers, one request at a time each, at most 5000 each
                caller = Caller(live_system.apps_port)
                for _ in range(5000):
                    if load_stop.is_set():
                        return
                    status, body, _ = caller(
                        "POST", "/serve/iris/predict", token=token, body={"instances": IRIS[:1]}
                    )
                    sent[status] += 1
                    if status != 200:
                        load_failures.append((status, body))

            callers = [threading.Thread(target=load, daemon=True) for _ in range(4)]
            for thread in callers:
                thread.start()
            try:
                wait_for(
                    lambda: [r for r in _routes(iris, "HEALTHY") if r.pk not in before],
                    timeout=60,
                    what="a third healthy replica under load",
                )
            finally:
                load_stop.set()
                for thread in callers:
                    thread.join(30)
            assert load_failures == [], load_failures[:5]
            up = next(
                d for m, d in _events(iris) if m.startswith("rps_per_replica") and d.get("to") == 3
            )
            assert up["metric"] == "rps_per_replica" and up["value"] > 20 and up["from"] == 2, up
            wait_for(
                lambda: (
                    Endpoint.objects.get(pk=iris).replicas == 2
                    and len(_routes(iris, "HEALTHY")) == 2
                ),
                timeout=30,
                what="the scale-down after the cooldown",
            )
            down = [d for _, d in _events(iris) if d.get("from") == 3 and d.get("to") == 2]
            assert down and down[-1]["metric"] == "rps_per_replica" and down[-1]["value"] < 1

            # 6. Idle with min 0: scaled to zero; the first request after it is answered.
            status, body = _api(
                live_system,
                alice_api,
                "PATCH",
                f"/api/v1/endpoints/{iris}/",
                {"min_replicas": 0, "rules": []},
            )
            assert status == 200, body
            wait_for(
                lambda: (
                    Endpoint.objects.get(pk=iris).status == "SCALED_TO_ZERO" and not _routes(iris)
                ),
                timeout=60,
                what="scale to zero",
            )
            t0 = time.monotonic()
            status, body, _ = call(
                "POST", "/serve/iris/predict", token=token, body={"instances": IRIS}
            )
            cold = time.monotonic() - t0
            assert status == 200, body
            assert body["predictions"] == SPECIES
            assert cold < settings.BAI_SERVE_COLD_START_TIMEOUT
            messages = [m for m, _ in _events(iris)]
            assert any(m.startswith("scaled 2 → 0: idle for") for m in messages), messages
            assert "scaled 0 → 1: a request arrived while scaled to zero" in messages
            print(f"cold start from zero through the router: {cold:.2f} s")
            assert reconciler.errors == []
    finally:
        replica_sessions = [str(pk) for pk in Route.objects.values_list("session_id", flat=True)]
        replica_sessions += [
            str(pk)
            for pk in Session.objects.filter(session_type="inference").values_list("pk", flat=True)
        ]
        for endpoint_id in created:
            _api(live_system, alice_api, "DELETE", f"/api/v1/endpoints/{endpoint_id}/")
        _gone(engine, set(replica_sessions))


def _gone(engine, session_ids, timeout=30):  # noqa: F811
    """Wait for the agent to remove this test's replica containers; remove what it left."""

    from docker.errors import NotFound

    def left():  # sparse: no inspection of containers the agent is removing meanwhile
        return [
            c
            for session_id in session_ids
            for c in engine.containers.list(
                all=True, sparse=True, filters={"label": f"ai.backend.session_id={session_id}"}
            )
        ]

    deadline = time.monotonic() + timeout
    while left() and time.monotonic() < deadline:
        time.sleep(0.5)
    for container in left():
        try:
            container.remove(force=True)
        except NotFound:
            pass  # the agent was quicker


def test_the_model_image_serves_with_no_start_command_and_a_silent_replica_says_so(
    engine,  # noqa: F811
    model_image,
    live_system,
    make_agent,
    make_token,
    alice,
    settings,
):
    """An endpoint of the model image with no start command runs the image's default server on
    the endpoint's port and turns READY; one whose command listens on nothing shows "nothing
    listens on port N" on its route (and in its status) at the first health check; an image
    with no default serving command is refused an empty command."""
    from backendai_web.env import persistent_secret

    settings.SECRET_KEY = persistent_secret(live_system.tmp_path / "var" / "secret_key")
    settings.BAI_APPS_TUNNEL_URL = f"ws://127.0.0.1:{live_system.apps_port}"
    live_system.start_apps()
    live_system.start_agent(
        make_agent("node-a", cpu="4", mem=8 * 2**30), "--cpu", "4", "--mem", "8g"
    )
    wait_for(lambda: Agent.objects.filter(status=AgentStatus.ALIVE).exists(), what="the agent")
    Image.objects.get_or_create(reference=kernel_images.MINIMAL_IMAGE)
    token = make_token(alice)
    base = {"health_interval": 1, "resources": {"cpu": "1", "mem": "512m"}, "replicas": 1}

    status, body = _api(
        live_system,
        token,
        "POST",
        "/api/v1/endpoints/",
        {**base, "name": "bare", "image": kernel_images.MINIMAL_IMAGE, "start_command": " "},
    )
    assert status == 400, body
    assert list(body["extra"]["fields"]) == ["start_command"]
    assert "has no default serving command" in body["message"]
    assert not Endpoint.objects.filter(name="bare").exists()

    created = []
    try:
        with Reconciler() as reconciler:
            status, default = _api(
                live_system,
                token,
                "POST",
                "/api/v1/endpoints/",
                {**base, "name": "default", "image": model_image, "port": 8123},
            )
            assert status == 201, default
            created.append(default["id"])
            assert default["start_command"] == ""
            assert default["effective_start_command"] == kernel_images.SKLEARN_SERVE_COMMAND
            status, silent = _api(
                live_system,
                token,
                "POST",
                "/api/v1/endpoints/",
                {**base, "name": "silent", "image": model_image, "start_command": "sleep 600"},
            )
            assert status == 201, silent
            created.append(silent["id"])

            def silent_reason():
                status, detail = _api(
                    live_system, token, "GET", f"/api/v1/endpoints/{silent['id']}/"
                )
                routes = detail["routes"]
                # The route's reason, then (at the end of the same pass) the endpoint's.
                said = routes and "nothing listens" in detail["status_reason"]
                return said and (detail, routes[0])

            detail, route = wait_for(silent_reason, timeout=90, what="the silent route's reason")
            assert route["status"] == "PROVISIONING"
            assert route["health_reason"].startswith("nothing listens on port 8000"), route
            assert "nothing listens on port 8000" in detail["status_reason"], detail
            wait_for(
                lambda: Endpoint.objects.get(pk=default["id"]).status == "READY",
                timeout=120,
                what="the default command serves (READY)",
            )
            assert len(_routes(default["id"], "HEALTHY")) == 1
            assert reconciler.errors == []
    finally:
        replica_sessions = [str(pk) for pk in Route.objects.values_list("session_id", flat=True)]
        for endpoint_id in created:
            _api(live_system, token, "DELETE", f"/api/v1/endpoints/{endpoint_id}/")
        _gone(engine, set(replica_sessions))
