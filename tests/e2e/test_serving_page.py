"""The Serving page in a real browser, against a real agent and the real model image:
deploy the iris classifier from the dialog with no start command (the model image serves
with its own; a bad name refused first), watch its replica
turn HEALTHY on the endpoint's page, make a token, and call ``/predict`` through the
router from the "try it" box; bob cannot see the endpoint.

Personas: ``alice`` deploys; ``bob`` is another user. The reconciler is run by the test
(the live server has no beat); everything else is the real path: the router and the
health probes go through the apps proxy and the agent's tunnel.
Screenshots go to test-artifacts/e2e/<test>/.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.docker, pytest.mark.django_db(transaction=True)]


def _orm(call, *args, **kwargs):
    """Run an ORM call off this thread, where Playwright's sync API keeps an event loop."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(call, *args, **kwargs).result()


def _reconcile_until(endpoint_id: str, done, timeout: float = 120.0) -> None:
    from serving_app import reconcile
    from serving_app.models import Endpoint

    deadline = time.monotonic() + timeout
    while True:
        reconcile.reconcile_endpoint(endpoint_id)
        endpoint = Endpoint.objects.prefetch_related("routes").get(pk=endpoint_id)
        if done(endpoint):
            return
        assert time.monotonic() < deadline, (
            endpoint.status,
            endpoint.status_reason,
            [(r.status, r.health_reason) for r in endpoint.routes.all()],
        )
        time.sleep(1)


def test_a_model_is_deployed_watched_and_called_from_the_serving_pages(
    users,
    images,
    real_agent,
    apps_proxy,
    apps_port,
    docker_client,
    settings,
    live_server_url,
    login,
    shot,
    tmp_path,
):
    from sessions_app import kernel_images
    from sessions_app.models import Image
    from tests.conftest import skip_or_fail

    try:
        docker_client.images.get(kernel_images.SKLEARN_SERVE_IMAGE)
    except Exception:  # noqa: BLE001
        skip_or_fail("the model image is missing (manage.py build_kernel_images)")
    from sessions_app.management.commands.build_kernel_images import IMAGE_INFO

    _orm(
        Image.objects.update_or_create,
        reference=kernel_images.SKLEARN_SERVE_IMAGE,
        defaults=IMAGE_INFO[kernel_images.SKLEARN_SERVE_IMAGE],
    )
    # The reconciler runs here: it signs its health probes as the apps proxy expects.
    from backendai_web.env import persistent_secret

    settings.BAI_SERVE_PROBE_URL = f"http://127.0.0.1:{apps_port}"
    settings.SECRET_KEY = persistent_secret(tmp_path / "var" / "secret_key")

    page = login("alice")
    page.click("nav.topnav >> text=Serving")
    page.wait_for_function("() => window.servingReady === true")
    assert page.locator("#endpoints-empty").is_visible()
    page.click("#endpoint-new")
    page.fill('#endpoint-form [name="name"]', "Not a slug!")
    page.select_option("#ep-image", kernel_images.SKLEARN_SERVE_IMAGE)
    # No start command: the model image serves with its own (the dialog says so).
    assert "the image's own model server" in page.inner_text("#ep-command-hint")
    page.select_option("#ep-image", "bai-kernel/minimal:1")
    assert "has no model server of its own" in page.inner_text("#ep-command-hint")
    page.select_option("#ep-image", kernel_images.SKLEARN_SERVE_IMAGE)
    page.fill('#endpoint-form [name="cpu"]', "0.5")
    page.fill('#endpoint-form [name="mem"]', "512m")
    page.fill('#endpoint-form [name="max_replicas"]', "2")
    page.click("#endpoint-submit")
    refusal = page.wait_for_selector('#endpoint-errors li[data-field="name"]')
    assert "lower-case letters, digits and '-'" in refusal.inner_text()
    shot(page, "bad-name-refused")
    page.fill('#endpoint-form [name="name"]', "iris")
    page.click("#endpoint-submit")
    page.wait_for_url(f"{live_server_url}/serving/*/")
    endpoint_id = page.url.rstrip("/").rsplit("/", 1)[-1]

    _orm(
        _reconcile_until,
        endpoint_id,
        lambda e: any(r.status == "HEALTHY" for r in e.routes.all()),
    )
    page.wait_for_selector('#routes-body tr[data-status="HEALTHY"]', timeout=30_000)
    page.wait_for_function(
        "() => document.querySelector('#ep-badge').textContent.includes('READY')"
    )
    assert "/serve/iris/" in page.inner_text('[data-role="url"]')
    assert "(the image's default)" in page.inner_text("#ep-facts")
    assert page.locator("#history li").count() >= 1

    page.click("#token-create")
    page.wait_for_selector("#token-new:not([hidden])")
    assert page.input_value("#try-token").startswith("bai_")
    page.click("#try-send")
    page.wait_for_function("() => window.tryResult !== undefined")
    result = page.evaluate("window.tryResult")
    assert result["status"] == 200, result
    assert json.loads(result["text"])["predictions"] == ["setosa", "virginica"]
    assert "HTTP 200" in page.inner_text("#try-meta")
    page.evaluate("window.scrollTo(0, 0)")  # else the sticky bar lands mid-page in the picture
    shot(page, "endpoint-answered", full_page=True)

    other = login("bob", screenshot=False)
    # Not bob's: its page is not found, as for an endpoint that does not exist.
    assert other.goto(f"{live_server_url}/serving/{endpoint_id}/").status == 404
    assert "Nothing here" in other.inner_text("main")
    other.goto(f"{live_server_url}/serving/")
    other.wait_for_function("() => window.servingReady === true")
    assert other.locator("#endpoints-body tr").count() == 0
    assert page.js_errors == [] and other.js_errors == []
