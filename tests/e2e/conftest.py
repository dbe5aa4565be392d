"""End-to-end set-up: daphne on loopback over the pytest database, a real agent
with the Docker backend, the project's own kernel images, and Debian's Chromium
driven by Playwright (never a downloaded browser).

Outside CI a missing part (Chromium, Docker, the kernel images) skips with the
reason; under ``CI=true`` it fails.

Pages send a Content-Security-Policy without 'unsafe-eval': give
``wait_for_function`` a function (``"() => window.wsReady === true"``), never
a bare expression, which Playwright would evaluate with ``eval`` in the page.

Two checks apply to every test here (``checks.py``): a page that requests
anything outside the live server's origin fails the test, and every screenshot
(``shot``) runs axe-core on the page and fails on a serious or critical
accessibility violation (``shot(page, step, axe_exclude=[...])`` leaves out a
third-party region; ``assert_accessible(page)`` checks a state without a shot).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import skip_or_fail
from tests.e2e.checks import GuardedBrowser, OwnOriginGuard, assert_accessible
from tests.live import free_port, server_environment, stop_process, wait_http

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts" / "e2e"
CHROMIUM = os.environ.get("BAI_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]
IMAGES = {
    "bai-kernel/python:2": ("Python 3", True),
    "bai-kernel/minimal:1": ("Minimal (busybox)", False),
}
PASSWORDS = {"alice": "alice-pass-123", "bob": "bob-pass-123"}
ADMIN_PASSWORD = "root-pass-123"

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="session")
def chromium_path() -> str:
    if not Path(CHROMIUM).exists():
        skip_or_fail(f"no Chromium at {CHROMIUM} (apt-get install chromium)")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        skip_or_fail("the playwright Python package is not installed")
    return CHROMIUM


@pytest.fixture(scope="session")
def docker_client():
    try:
        import docker

        client = docker.from_env(timeout=60)
        client.ping()
    except Exception as exc:  # noqa: BLE001 - any failure means no usable engine
        skip_or_fail(f"no Docker engine answers ({exc})")
    return client


@pytest.fixture(scope="session")
def kernel_images(docker_client) -> list[str]:
    """The project's own kernel images (built locally and cached; nothing is pulled)."""
    from docker.errors import ImageNotFound

    missing = []
    for ref in IMAGES:
        try:
            docker_client.images.get(ref)
        except ImageNotFound:
            missing.append(ref)
    if missing:
        result = subprocess.run(
            [sys.executable, "manage.py", "build_kernel_images"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=600,
        )
        if result.returncode != 0:
            skip_or_fail(f"building the kernel images failed: {result.stderr[-500:]}")
    return list(IMAGES)


@pytest.fixture
def apps_port() -> int:
    """The apps proxy's port (the proxy itself runs only for tests asking ``apps_proxy``)."""
    return free_port()


@pytest.fixture
def live_port() -> int:
    return free_port()


@pytest.fixture
def live_env(settings, channel_prefix, tmp_path, apps_port, live_port) -> dict[str, str]:
    """The environment of the live server and of the apps proxy."""
    return server_environment(
        settings,
        BAI_MANAGER_ORIGIN=f"http://127.0.0.1:{live_port}",
        BAI_CHANNEL_PREFIX=channel_prefix,
        BAI_VAR_DIR=str(tmp_path / "var"),
        BAI_AGENT_HEARTBEAT_INTERVAL="1",
        BAI_APPS_PORT=str(apps_port),
        BAI_APPS_ORIGIN=f"http://apps.localhost:{apps_port}",
        BAI_APPS_TUNNEL_URL=f"ws://127.0.0.1:{apps_port}",
    )


@pytest.fixture
def live_server_url(transactional_db, live_env, live_port, tmp_path) -> str:
    """daphne in a subprocess on 127.0.0.1, over this test's database.

    Celery runs eagerly there as here, so a session created through a page is
    scheduled inline.
    """
    from django.db import connection

    db = connection.settings_dict
    port = live_port
    env = live_env
    if "postgresql" not in db["ENGINE"]:
        pytest.skip("the live server shares the test database: run on PostgreSQL")
    log = open(tmp_path / "daphne.log", "w")  # noqa: SIM115 - closed at teardown
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "backendai_web.serve",
            "-b",
            "127.0.0.1",
            "-p",
            str(port),
            "backendai_web.asgi:application",
        ],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{url}/login/", proc)
        yield url
    finally:
        stop_process(proc)
        log.close()
        tail = (tmp_path / "daphne.log").read_text()[-4000:]
        if re.search(r"Traceback|ERROR", tail):
            print("--- daphne log (tail) ---\n" + tail)


@pytest.fixture
def images(group):
    from sessions_app.models import Image

    return {
        ref: Image.objects.get_or_create(
            reference=ref, defaults={"display_name": name, "supports_ssh": ssh}
        )[0]
        for ref, (name, ssh) in IMAGES.items()
    }


@pytest.fixture
def users(alice, bob, settings):
    """alice and bob with passwords the live server can check (its hashers are the defaults)."""
    from django.conf import global_settings

    settings.PASSWORD_HASHERS = global_settings.PASSWORD_HASHERS
    for user in (alice, bob):
        user.set_password(PASSWORDS[user.username])
        user.save(update_fields=["password"])
    return {"alice": alice, "bob": bob}


@pytest.fixture
def real_agent(live_server_url, make_agent, kernel_images, docker_client, settings, tmp_path):
    """``python -m agent --backend docker`` registered with the live server.

    Its containers are removed at the end whatever happened.
    """
    from sessions_app.models import Agent

    # Two cores, as small CI machines have: a container may not ask for more than the host has.
    agent = make_agent("e2e-node", cpu="2", mem=8 * 2**30)
    Agent.objects.filter(pk=agent.pk).update(status="LOST", first_contact_at=None)
    manager = live_server_url.replace("http://", "ws://")
    log = open(tmp_path / "agent.log", "w")  # noqa: SIM115 - closed at teardown
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "agent",
            "--manager",
            manager,
            "--token",
            agent.plain_token,
            "--backend",
            "docker",
            "--cpu",
            "2",
            "--mem",
            "8g",
            "--work-dir",
            str(tmp_path / "agent"),
            "--data-root",
            str(settings.BAI_STORAGE_ROOT),
        ],
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    key = hashlib.sha256(agent.plain_token.encode()).hexdigest()[:16]
    try:
        deadline = time.monotonic() + 30
        while True:
            agent.refresh_from_db()
            if agent.status == "ALIVE" and agent.first_contact_at is not None:
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    "the agent did not register:\n" + (tmp_path / "agent.log").read_text()[-3000:]
                )
            time.sleep(0.1)
        yield agent
    finally:
        stop_process(proc)
        log.close()
        for container in docker_client.containers.list(
            all=True, filters={"label": f"ai.backend.agent-key={key}"}
        ):
            container.remove(force=True)
        for network in docker_client.networks.list(filters={"label": "ai.backend.managed=true"}):
            if not network.containers:
                try:
                    network.remove()
                except Exception:  # noqa: BLE001 - another test's network in use
                    pass


@pytest.fixture
def apps_proxy(live_server_url, live_env, apps_port, own_origin_guard, tmp_path) -> str:
    """The apps proxy (``proxy_app``) on its own port, as ``scripts/run`` starts it;
    pages may then also request its per-app origins (and still nothing else)."""
    log = open(tmp_path / "apps.log", "w")  # noqa: SIM115 - closed at teardown
    proc = subprocess.Popen(
        [sys.executable, "-m", "proxy_app.serve", "-b", "127.0.0.1", "-p", str(apps_port)],
        cwd=ROOT,
        env=live_env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    own_origin_guard.allow_apps(live_env["BAI_APPS_ORIGIN"])
    try:
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None:
                raise RuntimeError("the apps proxy exited:\n" + (tmp_path / "apps.log").read_text())
            try:
                socket.create_connection(("127.0.0.1", apps_port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        yield live_env["BAI_APPS_ORIGIN"]
    finally:
        stop_process(proc)
        log.close()


@pytest.fixture
def running_python(real_agent, users, images, apps_proxy):
    """alice's session of the Python image (which declares Jupyter), RUNNING."""
    from sessions_app import kernel_images, services
    from sessions_app.models import Session

    image = images["bai-kernel/python:2"]
    image.service_ports = [kernel_images.JUPYTER_APP]
    image.save(update_fields=["service_ports"])
    session = services.session_create(
        owner=users["alice"],
        spec={
            "image": image.reference,
            "name": "notebook",
            "resources": {"cpu": "1", "mem": "1g"},
            "ports": [8080],
        },
    )
    deadline = time.monotonic() + 120
    while (status := Session.objects.get(pk=session.pk).status) != "RUNNING":
        assert time.monotonic() < deadline, f"the session is still {status}"
        time.sleep(0.2)
    return session


@pytest.fixture
def own_origin_guard(live_server_url) -> OwnOriginGuard:
    """What the test's pages requested outside the live server's origin."""
    return OwnOriginGuard(live_server_url)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    """A test whose pages asked another host fails, even if its body passed."""
    result = yield
    guard = item.funcargs.get("own_origin_guard")
    if guard is not None:
        guard.assert_clean()
    return result


@pytest.fixture
def browser(chromium_path, own_origin_guard):
    """Chromium; every context made from it is watched by ``own_origin_guard``."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        instance = p.chromium.launch(executable_path=chromium_path, args=CHROMIUM_ARGS)
        yield GuardedBrowser(instance, own_origin_guard)
        instance.close()


class Shots:
    """Screenshots at named steps: test-artifacts/e2e/<test>/<step>.png.

    After each one, axe-core checks the page (see ``checks.assert_accessible``).
    """

    def __init__(self, test_name: str) -> None:
        self.dir = ARTIFACTS / re.sub(r"[^A-Za-z0-9_.-]", "_", test_name)
        shutil.rmtree(self.dir, ignore_errors=True)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.count = 0

    def __call__(
        self,
        page,
        step: str,
        full_page: bool = False,
        *,
        axe_exclude: tuple[str, ...] | list[str] = (),
        users_document: bool = False,
    ) -> Path:
        """``users_document``: the page is wholly a document a user's own app sent (a
        text file through the apps proxy), with no markup of ours to audit."""
        self.count += 1
        path = self.dir / f"{self.count:02d}-{step}.png"
        page.screenshot(path=str(path), full_page=full_page)
        if not users_document:
            assert_accessible(page, exclude=axe_exclude, where=f"step {step!r} ({path.name})")
        return path


@pytest.fixture
def shot(request) -> Shots:
    return Shots(request.node.name)


@pytest.fixture
def login(browser, live_server_url, shot):
    """``login("alice")`` → a page logged in as that user, on the sessions list.

    Keyword arguments go to ``browser.new_context`` (``device_scale_factor=1``…).
    """
    contexts = []

    def do(username: str, *, screenshot: bool = True, **context_options):
        context = browser.new_context(
            **{"viewport": {"width": 1440, "height": 900}, **context_options}
        )
        contexts.append(context)
        page = context.new_page()
        page.set_default_timeout(30_000)
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.js_errors = errors
        page.goto(f"{live_server_url}/login/")
        page.fill("#id_username", username)
        page.fill("#id_password", PASSWORDS[username])
        if screenshot:
            shot(page, f"login-{username}")
        page.click("button[type=submit]")
        page.wait_for_load_state()
        if "/login/" in page.url:
            raise AssertionError(f"login as {username} failed: {page.inner_text('main')[:500]}")
        page.wait_for_function("() => window.wsReady === true")
        return page

    yield do
    for context in contexts:
        context.close()


@pytest.fixture
def admin_with_password(admin, settings):
    """The superuser, with a password the live server can check (its hashers are the defaults)."""
    from django.conf import global_settings

    settings.PASSWORD_HASHERS = global_settings.PASSWORD_HASHERS
    admin.set_password(ADMIN_PASSWORD)
    admin.save(update_fields=["password"])
    return admin


@pytest.fixture
def admin_page(admin_with_password, live_server_url, browser):
    """A Chromium page logged in to the admin as a superuser."""
    admin = admin_with_password
    context = browser.new_context(viewport={"width": 1440, "height": 900})
    page = context.new_page()
    page.set_default_timeout(30_000)
    page.js_errors = []
    page.on("pageerror", lambda exc: page.js_errors.append(str(exc)))
    page.goto(f"{live_server_url}/admin/login/")
    page.fill("#id_username", admin.username)
    page.fill("#id_password", ADMIN_PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_selector("#site-name")
    yield page
    context.close()
