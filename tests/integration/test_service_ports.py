"""Service ports: an image declares its apps (validated, admin-editable), a launch
may open a few ports of the user's own, and the session lists main1's apps.

Personas (tests/conftest.py): ``alice`` launches.
"""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError

from sessions_app import service_ports
from sessions_app.models import Session

pytestmark = pytest.mark.django_db
URL = "/api/v1/sessions/"
JUPYTER = {"name": "jupyter", "protocol": "http", "port": 8888, "start_command": "exec jupyter"}


@pytest.fixture
def app_image(image):
    image.service_ports = [JUPYTER, {"name": "echo", "protocol": "tcp", "port": 7000}]
    image.full_clean()
    image.save()
    return image


def _launch(api, user, **spec):
    return api(user).post(URL, {"image": "bai-kernel/minimal:1", **spec}, format="json")


def test_a_session_lists_the_images_apps_then_the_users_own_ports(api, alice, app_image, agent):
    response = _launch(api, alice, ports=[8080, 9000])
    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["ports"] == [8080, 9000]
    assert [(a["name"], a["protocol"], a["port"]) for a in body["apps"]] == [
        ("jupyter", "http", 8888),
        ("echo", "tcp", 7000),
        ("port-8080", "http", 8080),
        ("port-9000", "http", 9000),
    ]
    assert body["apps"][0]["on_demand"] is True
    assert Session.objects.get().preopen_ports == [8080, 9000]


def test_an_app_the_session_starts_gives_its_owner_the_token_it_asks_a_forward_for(
    api, alice, bob, app_image, agent
):
    """Jupyter runs with the token the proxy presents; through ``bai app`` (a raw
    forward) nobody presents it, so its owner reads it here; others see nothing."""
    from sessions_app import services

    session = _launch(api, alice, ports=[8080]).json()
    apps = {a["name"]: a for a in api(alice).get(f"{URL}{session['id']}/").json()["apps"]}
    expected = services.app_secret(session_id=session["id"], app="jupyter")
    assert apps["jupyter"]["forward_token"] == expected
    assert apps["echo"]["forward_token"] is None and apps["port-8080"]["forward_token"] is None
    assert api(bob).get(f"{URL}{session['id']}/").status_code == 404


@pytest.mark.parametrize(
    ("ports", "words"),
    [
        ([2200], "2200 is reserved for the runner (sshd)"),
        ([8888], "8888 is the image's own jupyter port"),
        ([8080, 8080], "8080 is given twice"),
        ([80], "80: a port must be from 1024 to 65535"),
        ([70000], "70000: a port must be from 1024 to 65535"),
        ([2000, 2001, 2002, 2003, 2004], "at most 4 ports"),
        (["8080"], "'8080' is not a port number"),
    ],
)
def test_a_launch_refuses_reserved_duplicate_and_out_of_range_ports(
    api, alice, app_image, agent, ports, words
):
    response = _launch(api, alice, ports=ports)
    assert response.status_code == 400
    assert words in response.json()["extra"]["fields"]["ports"]
    assert not Session.objects.exists()


@pytest.mark.parametrize(
    ("declared", "words"),
    [
        ([{"name": "x", "protocol": "udp", "port": 9000}], "protocol must be one of http, tcp"),
        ([{"name": "x", "protocol": "http", "port": 2200}], "reserved for the runner"),
        (
            [
                {"name": "a", "protocol": "http", "port": 9000},
                {"name": "b", "protocol": "tcp", "port": 9000},
            ],
            "port 9000 is declared twice",
        ),
        ([{"name": "Bad Name", "protocol": "http", "port": 9000}], "name must be"),
        ([{"name": "x", "protocol": "http", "port": 9000, "color": 1}], "unknown field 'color'"),
        ({"name": "x"}, "must be a list"),
    ],
)
def test_an_admin_cannot_save_a_broken_declaration(image, declared, words):
    image.service_ports = declared
    with pytest.raises(ValidationError) as caught:
        image.full_clean()
    assert words in str(caught.value)


def test_an_image_with_a_broken_declaration_offers_no_apps():
    assert service_ports.session_apps([{"name": "x"}], [8080])[0].name == "port-8080"
    assert len(service_ports.session_apps([{"name": "x"}], [])) == 0
