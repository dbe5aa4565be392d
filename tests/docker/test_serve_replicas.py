"""The inference router end to end on a real engine: two replica sessions of the model image
(``bai-kernel/sklearn-serve:1``) on a real Docker agent, called through the apps proxy's
``/serve/<endpoint>/`` over the agent's tunnels, as callers will.

serving_app's side (which routes are HEALTHY, the tokens) is still the double of
tests/serving_double.py, served by ``tests.serving_double_asgi`` in the apps-proxy process; the
sessions, kernels, agent, tunnels and containers are real. With core's selectors merged, this
test makes an Endpoint with its Routes and tokens instead, and the proxy is the real one.

Personas: ``alice`` launches the replica sessions; callers are whoever holds a token.
"""

from __future__ import annotations

import http.client
import json
from collections import Counter

import pytest

from sessions_app import kernel_images
from sessions_app.models import Agent, AgentStatus, Image, Kernel, Status
from tests.conftest import skip_or_fail
from tests.docker.test_cluster_system import _wait_status, engine  # noqa: F401
from tests.live import wait_for
from tests.serving_double import ENV, ServingDouble, route

pytestmark = [pytest.mark.docker, pytest.mark.django_db(transaction=True)]

IRIS = [[5.1, 3.5, 1.4, 0.2], [5.9, 3.0, 4.2, 1.5], [6.7, 3.0, 5.2, 2.3]]


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
    Image.objects.update_or_create(reference=kernel_images.SKLEARN_SERVE_IMAGE)
    return kernel_images.SKLEARN_SERVE_IMAGE


class Caller:
    """A caller of the router on one kept-alive connection."""

    def __init__(self, port: int, origin_host: str) -> None:
        self.port, self.host = port, origin_host
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)

    def __call__(self, method, path, *, token=None, body=None):
        headers = {"Host": self.host}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        if body is not None:
            headers["Content-Type"] = "application/json"
            body = json.dumps(body)
        self.conn.request(method, path, body=body, headers=headers)
        response = self.conn.getresponse()
        data = response.read()
        return response.status, json.loads(data) if data else None


def test_two_model_replicas_answer_through_the_router_and_one_killed_fails_no_get(
    engine,  # noqa: F811
    model_image,
    live_system,
    make_agent,
    make_token,
    alice,
    tmp_path,
):
    double_file = tmp_path / "serving.json"
    ServingDouble().save(double_file)
    live_system.start_apps("tests.serving_double_asgi:application", **{ENV: str(double_file)})
    agent = make_agent("node-a", cpu="4", mem=8 * 2**30)
    live_system.start_agent(agent, "--cpu", "4", "--mem", "8g")
    wait_for(lambda: Agent.objects.filter(status=AgentStatus.ALIVE).exists(), what="the agent")
    token = make_token(alice)

    sessions = []
    for _ in range(2):
        conn = http.client.HTTPConnection("127.0.0.1", live_system.port, timeout=60)
        spec = {
            "image": model_image,
            "resources": {"cpu": 1, "mem": "1g"},
            # A kernel without a declared port has no network at all: the agent could not
            # reach the server (replica sessions must declare the endpoint's port).
            "ports": [kernel_images.SKLEARN_SERVE_PORT],
            "startup_command": kernel_images.SKLEARN_SERVE_COMMAND,
        }
        conn.request(
            "POST",
            "/api/v1/sessions/",
            body=json.dumps(spec),
            headers={"Authorization": f"Token {token}", "Content-Type": "application/json"},
        )
        response = conn.getresponse()
        created = json.loads(response.read())
        assert response.status == 201, created
        sessions.append(created["id"])
    for session_id in sessions:
        _wait_status(session_id, Status.RUNNING, timeout=120)

    double = ServingDouble()
    routes = []
    for i, session_id in enumerate(sessions, start=1):
        main = Kernel.objects.get(session_id=session_id, cluster_role="main")
        routes.append(
            route(
                i,
                kernel_images.SKLEARN_SERVE_PORT,
                kernel_id=str(main.pk),
                agent_id=main.agent_id,
            )
        )
    iris = double.endpoint("iris", *routes, public=False)
    other = double.endpoint("other", routes[0], public=False)
    double.tokens = {iris.endpoint_id: ["iris-token"], other.endpoint_id: ["other-token"]}
    double.save(double_file)

    call = Caller(live_system.apps_port, f"apps.localhost:{live_system.apps_port}")

    last = []

    def both_up():  # RUNNING before uvicorn listens: wait for each replica's /health
        seen = set()
        for _ in range(4):
            status, body = call("GET", "/serve/iris/health", token="iris-token")
            last[:] = [status, body]
            if status != 200:
                return None
            seen.add(body["replica"])
        return seen if len(seen) == 2 else None

    try:
        assert wait_for(both_up, timeout=60, what="both replicas healthy") == set(sessions)
    except AssertionError:
        apps_log = (tmp_path / "apps.log").read_text(errors="replace")[-3000:]
        raise AssertionError(f"last answer {last}; apps proxy log:\n{apps_log}") from None

    # Callers: a token of this endpoint only.
    assert call("POST", "/serve/iris/predict", body={"instances": IRIS})[0] == 401
    status, body = call(
        "POST", "/serve/iris/predict", token="other-token", body={"instances": IRIS}
    )
    assert status == 403, body

    spread = Counter()
    for _ in range(40):
        status, body = call(
            "POST", "/serve/iris/predict", token="iris-token", body={"instances": IRIS}
        )
        assert status == 200, body
        assert body["predictions"] == ["setosa", "versicolor", "virginica"]
        spread[body["replica"]] += 1
    assert set(spread) == set(sessions)
    assert all(16 <= n <= 24 for n in spread.values()), spread  # 40-60 % each

    # Kill one replica's container: the double still calls it HEALTHY (core's health checks
    # would take it out within seconds), and not one idempotent request fails meanwhile.
    dead = Kernel.objects.get(session_id=sessions[0], cluster_role="main")
    engine.containers.get(dead.container_id).kill()
    answered = Counter()
    for _ in range(30):
        status, body = call("GET", "/serve/iris/health", token="iris-token")
        assert status == 200, body
        answered[body["replica"]] += 1
    assert answered == {sessions[1]: 30}
