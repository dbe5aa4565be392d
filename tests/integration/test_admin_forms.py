"""Admin forms speak as people do: a group's session types are checkboxes, its selector's
options are ``key = value`` lines, an image's apps are one line each, a policy's folder quota
takes a size with its unit, memory shows its unit once, and the admin has an icon.

Each form stores what it stored before (JSON lists and objects, bytes) and refuses a bad
value with a message that says where it is, changing nothing.

Personas (tests/conftest.py): ``admin`` edits everything here.
"""

from __future__ import annotations

import html
import re

import pytest
from django.contrib.staticfiles import finders
from django.urls import reverse

from sessions_app.models import Image, ResourceGroup, ResourcePolicy

pytestmark = pytest.mark.django_db

GIB, MIB = 2**30, 2**20


@pytest.fixture(autouse=True)
def _as_admin(client, admin, settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    client.force_login(admin)


def _url(model, page: str, *args) -> str:
    return reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_{page}", args=args)


def _errors(response) -> dict[str, list[str]]:
    assert response.status_code == 200, "the form was accepted"
    return {k: list(v) for k, v in response.context["adminform"].form.errors.items()}


def _textarea(page: str, name: str) -> str:
    match = re.search(rf'<textarea[^>]*name="{re.escape(name)}"[^>]*>(.*?)</textarea>', page, re.S)
    assert match, f"no textarea {name}"
    return html.unescape(match.group(1)).strip()


def _input_value(page: str, name: str) -> str:
    tag = re.search(rf'<input[^>]*name="{re.escape(name)}"[^>]*>', page)
    assert tag, f"no input {name}"
    value = re.search(r'value="([^"]*)"', tag.group(0))
    return html.unescape(value.group(1)) if value else ""


# --- resource groups: session types as checkboxes ----------------------------------------------


def _group_form(**changes: object) -> dict[str, object]:
    form = {
        "name": "g2",
        "is_active": "on",
        "session_selection": "fifo",
        "num_retries_to_skip": "0",
        "agent_selection": "concentrated",
        "agent_selector_options": "",
        "allowed_session_types": ["interactive", "batch"],
        "pending_timeout": "",
    }
    form.update(changes)
    return form


def test_a_groups_session_types_are_one_checkbox_each_ticked_as_stored(client, group):
    ResourceGroup.objects.filter(pk=group.pk).update(allowed_session_types=["batch"])

    page = client.get(_url(ResourceGroup, "change", group.pk)).content.decode()

    boxes = re.findall(r'<input type="checkbox" name="allowed_session_types"[^>]*>', page)
    assert [re.search(r'value="([^"]+)"', b).group(1) for b in boxes] == [
        "interactive",
        "batch",
        "inference",
        "system",
    ]
    assert ["checked" in b for b in boxes] == [False, True, False, False]
    assert "[&quot;batch&quot;]" not in page  # no raw JSON anywhere


def test_ticking_session_types_stores_them_as_the_list_and_none_ticked_as_empty(client):
    response = client.post(
        _url(ResourceGroup, "add"), _group_form(allowed_session_types=["interactive", "system"])
    )
    assert response.status_code == 302, _errors(response)
    assert ResourceGroup.objects.get(name="g2").allowed_session_types == ["interactive", "system"]

    response = client.post(
        _url(ResourceGroup, "add"), _group_form(name="g3", allowed_session_types=[])
    )
    assert response.status_code == 302, _errors(response)
    assert ResourceGroup.objects.get(name="g3").allowed_session_types == []


def test_the_group_list_shows_types_and_options_as_words(client, group):
    ResourceGroup.objects.filter(pk=group.pk).update(allowed_session_types=["interactive"])

    page = client.get(_url(ResourceGroup, "changelist")).content.decode()

    assert '<td class="field-session_types">interactive</td>' in page
    assert '<td class="field-selector_options">none</td>' in page


# --- resource groups: selector options as key = value lines --------------------------------------


@pytest.mark.parametrize(
    ("typed", "error"),
    [
        ("prefix gpu-", "line 1: write key = value"),
        ("spread = true\n= 3", "line 2: a key is up to 64 letters"),
        ("a = 1\na = 2", "line 2: 'a' is given twice"),
        ('["gpu-"]', 'A JSON object, such as {} or {"prefix": "gpu-"}.'),
        ("x" * 40_000, "at most 32000 characters"),
    ],
)
def test_options_that_are_not_key_value_lines_are_refused_saying_which_line(client, typed, error):
    response = client.post(_url(ResourceGroup, "add"), _group_form(agent_selector_options=typed))

    [message] = _errors(response)["agent_selector_options"]
    assert message.startswith(error), message
    assert not ResourceGroup.objects.filter(name="g2").exists()


def test_options_lines_reach_the_selector_as_a_json_object_with_typed_values(client):
    # The built-ins take no option: the selector's own refusal names the option it read.
    response = client.post(
        _url(ResourceGroup, "add"), _group_form(agent_selector_options="spread = true")
    )

    assert _errors(response) == {
        "agent_selector_options": [
            "agent selector 'concentrated' refused its options: option 'spread': "
            "unknown option; this selector takes none"
        ]
    }


def test_stored_options_are_shown_as_lines_that_read_back_the_same(client, group):
    from sessions_app.forms import KeyValueOptionsField

    options = {"prefix": "gpu-", "limit": 4, "spread": True, "tags": ["a", "b"], "code": "42"}
    field = KeyValueOptionsField()
    text = field.prepare_value(options)

    assert text.splitlines() == [
        "prefix = gpu-",
        "limit = 4",
        "spread = true",
        'tags = ["a", "b"]',
        'code = "42"',  # text that would read as a number is quoted
    ]
    assert field.clean(text) == options


# --- images: apps one per line --------------------------------------------------------------------


def _image_form(**changes: object) -> dict[str, object]:
    form = {"reference": "x/apps:1", "is_active": "on", "service_ports": ""}
    form.update(changes)
    return form


def test_an_images_apps_typed_one_per_line_are_stored_as_the_declaration(client):
    typed = (
        "jupyter http 8888 exec jupyter notebook --port=$BAI_APP_PORT\n\n  ssh-tunnel tcp 2222  \n"
    )

    response = client.post(_url(Image, "add"), _image_form(service_ports=typed))

    assert response.status_code == 302, _errors(response)
    image = Image.objects.get(reference="x/apps:1")
    assert image.service_ports == [
        {
            "name": "jupyter",
            "protocol": "http",
            "port": 8888,
            "start_command": "exec jupyter notebook --port=$BAI_APP_PORT",
        },
        {"name": "ssh-tunnel", "protocol": "tcp", "port": 2222},
    ]
    page = client.get(_url(Image, "change", image.pk)).content.decode()
    assert _textarea(page, "service_ports").splitlines() == [
        "jupyter http 8888 exec jupyter notebook --port=$BAI_APP_PORT",
        "ssh-tunnel tcp 2222",
    ]
    assert "&quot;protocol&quot;" not in page


@pytest.mark.parametrize(
    ("typed", "error"),
    [
        ("jupyter http", "line 1: write name protocol port [start command]"),
        ("web http 80", "line 1: port must be a whole number from 1024 to 65535"),
        ("web http eighty", "line 1: port must be a whole number from 1024 to 65535"),
        ("web ftp 8080", "line 1: protocol must be one of http, tcp"),
        ("web http 8080\nweb tcp 9000", "line 2: name 'web' is taken"),
        ("Web http 8080", "line 1: name must be 1-32 lower-case letters"),
        ("ssh tcp 2200", "line 1: port 2200 is reserved for the runner (sshd)"),
    ],
)
def test_a_bad_app_line_is_refused_saying_which_line(client, typed, error):
    response = client.post(_url(Image, "add"), _image_form(service_ports=typed))

    messages = _errors(response)["service_ports"]
    assert any(m.startswith(error) for m in messages), messages
    assert not Image.objects.filter(reference="x/apps:1").exists()


# --- policies: the folder quota as a size, memory's unit once ------------------------------------


def _policy_form(**changes: object) -> dict[str, object]:
    form = {
        "name": "quota",
        "max_containers_per_session": "8",
        "max_concurrent_sftp_sessions": "1",
        "assignments-TOTAL_FORMS": "0",
        "assignments-INITIAL_FORMS": "0",
    }
    form.update(changes)
    return form


@pytest.mark.parametrize(
    ("typed", "stored", "shown"),
    [
        ("64 MiB", 64 * MIB, "64 MiB"),
        ("2 GiB", 2 * GIB, "2 GiB"),
        ("1.5g", 3 * GIB // 2, "1.5 GiB"),
        ("1000", 1000, "1000 B"),  # a bare number is bytes, as the help says
        ("", None, ""),  # empty: unlimited
    ],
)
def test_the_folder_quota_is_typed_with_a_unit_and_shown_with_it(client, typed, stored, shown):
    response = client.post(_url(ResourcePolicy, "add"), _policy_form(max_folder_bytes=typed))

    assert response.status_code == 302, _errors(response)
    policy = ResourcePolicy.objects.get(name="quota")
    assert policy.max_folder_bytes == stored
    page = client.get(_url(ResourcePolicy, "change", policy.pk)).content.decode()
    assert _input_value(page, "max_folder_bytes") == shown


@pytest.mark.parametrize(
    ("typed", "error"),
    [
        ("lots", "'lots' is not a size"),
        ("-1 GiB", "must not be negative"),
        ("2048 PiB", "is too large"),
    ],
)
def test_a_bad_folder_quota_is_refused_with_the_reason(client, typed, error):
    response = client.post(_url(ResourcePolicy, "add"), _policy_form(max_folder_bytes=typed))

    [message] = _errors(response)["max_folder_bytes"]
    assert error in message, message
    assert not ResourcePolicy.objects.filter(name="quota").exists()


def test_memory_shows_its_unit_once_in_its_box(client):
    policy = ResourcePolicy.objects.create(
        name="teams", total_resource_slots={"cpu": "16", "mem": str(64 * MIB)}
    )

    page = client.get(_url(ResourcePolicy, "change", policy.pk)).content.decode()

    assert _input_value(page, "total_resource_slots_mem") == "64 MiB"
    slot = re.search(
        r'<span class="bai-slot">\s*<label for="id_total_resource_slots_1">Memory</label>(.*?)</span>\s*(?=<span class="bai-slot">|</div>)',
        page,
        re.S,
    )
    assert slot and "bai-unit" not in slot.group(1), slot and slot.group(1)
    assert '<span class="bai-unit">cores</span>' in page  # cpu keeps its unit word


# --- the icon --------------------------------------------------------------------------------------


def test_the_admin_links_an_icon_that_exists_and_favicon_ico_leads_to_it(client):
    page = client.get(reverse("admin:index")).content.decode()

    [href] = re.findall(r'<link rel="icon" href="([^"]+)"', page)
    assert href == "/static/favicon.svg"
    assert finders.find("favicon.svg")
    response = client.get("/favicon.ico")
    assert response.status_code == 301 and response["Location"] == href
