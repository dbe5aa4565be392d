"""Malformed input is answered with a 4xx that says why, never a 500: NUL
bytes and lone surrogates wherever text enters, query parameters checked like
bodies, hostile template documents at bounded cost, template names that would
break a download's header, and names with a trailing newline.

Personas (tests/conftest.py): ``alice`` sends all of it; a template name the
old rules let through is written straight to the database, as if stored
before them.
"""

from __future__ import annotations

import json
import time

import pytest

from sessions_app.models import Session, SessionTemplate

pytestmark = pytest.mark.django_db

SESSIONS = "/api/v1/sessions/"
TEMPLATES = "/api/v1/templates/"


@pytest.fixture
def as_alice(api, alice):
    return api(alice)


def post_json(client, url: str, body, method: str = "post"):
    """Send ``body`` as JSON text of our own making: ``json.dumps`` escapes a
    lone surrogate as ``\\ud800``, as a hostile client would send it."""
    return getattr(client, method)(url, json.dumps(body), content_type="application/json")


def refused(response, status: int = 400, field: str | None = None, words: str = "") -> dict:
    assert response.status_code == status, response.content
    body = response.json()  # an error is JSON, even when it echoes what was sent
    assert isinstance(body["message"], str) and body["message"]
    if field is not None:
        assert field in body["extra"]["fields"], body
        assert words in " ".join(body["extra"]["fields"][field]), body
    else:
        assert words in body["message"], body
    return body


# --- query parameters ---------------------------------------------------------------------------


@pytest.fixture
def template_id(alice):
    return SessionTemplate.objects.create(owner=alice, name="t", spec={"image": "x"}).pk


@pytest.mark.parametrize(
    "query",
    [
        "?status=RUN%00NING",
        "?all=%00",
        "?sta%00tus=RUNNING",
        "?unknown=x%00",
    ],
)
def test_a_nul_in_a_query_parameter_of_the_session_list_is_refused(as_alice, query):
    refused(as_alice.get(SESSIONS + query), words="must not contain a NUL character")


def test_a_nul_in_the_export_format_or_the_template_list_is_refused(as_alice, template_id):
    for url in (f"{TEMPLATES}{template_id}/export/?format=yaml%00", f"{TEMPLATES}?all=1%00"):
        refused(as_alice.get(url), words="NUL")


def test_a_nul_in_any_query_parameter_is_refused_at_the_edge(as_alice, group):
    body = refused(
        as_alice.get("/api/v1/presets/?resource_group=a%00b"), words="must not contain a NUL"
    )
    assert body["extra"]["fields"] == {"resource_group": ["must not contain a NUL character"]}
    refused(as_alice.get("/api/v1/folders/?x%00=1"), words="x\\x00")


def test_a_nul_in_a_page_query_is_refused_too(client, alice):
    client.force_login(alice)
    response = client.get("/sessions/?q=%00")
    assert response.status_code == 400
    assert b"must not contain a NUL character" in response.content


@pytest.mark.parametrize("path", [SESSIONS, f"{SESSIONS}{{session}}/execute/"])
@pytest.mark.parametrize(
    "body, content_type",
    [
        ("image=local/process", "application/x-www-form-urlencoded"),
        (
            "--b\r\nContent-Disposition: form-data; name=image\r\n\r\nx\r\n--b--\r\n",
            "multipart/form-data; boundary=b",
        ),
    ],
)
def test_the_api_takes_json_only_and_says_so(
    as_alice, alice, image, group, agent, path, body, content_type
):
    session = Session.objects.create(owner=alice, name="p", image=image, resource_group=group)
    response = as_alice.post(path.format(session=session.pk), body, content_type=content_type)
    refused(response, 415, words="The API takes JSON")
    assert Session.objects.count() == 1


@pytest.mark.parametrize(
    "query, field",
    [
        ("?all=true&all=false", "all"),
        ("?all=yes", "all"),
        ("?all=null", "all"),
        ("?status=running", "status"),
        ("?status=ASLEEP", "status"),
    ],
)
def test_a_query_parameter_is_checked_like_a_field_of_a_body(as_alice, query, field):
    refused(as_alice.get(SESSIONS + query), field=field)


def test_well_formed_query_parameters_still_filter(as_alice, alice, image, group):
    Session.objects.create(owner=alice, name="p", image=image, resource_group=group)
    assert len(as_alice.get(SESSIONS + "?status=PENDING&all=false").json()) == 1
    assert as_alice.get(SESSIONS + "?status=RUNNING&all=0").json() == []


# --- launch fields ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "spec, field, words",
    [
        ({"env": {"A": "x\x00y"}}, "env", "NUL"),
        ({"env": {"A": "\ud800"}}, "env", "invalid Unicode"),
        ({"env": {"A\x00": "x"}}, "env", "NUL"),
        ({"env": {"A\n": "x"}}, "env", "not a valid variable name"),
        ({"startup_command": "ls\x00 -l"}, "startup_command", "NUL"),
        ({"startup_command": "ls \udc00"}, "startup_command", "invalid Unicode"),
        ({"name": "job\n"}, "name", "up to 64"),
        ({"name": "job\x00"}, "name", "up to 64"),
        ({"resources": {"cpu\x00": 1}}, "resources", "NUL"),
        ({"resources": {"cpu": "1\x00"}}, "resources", ""),
        ({"mounts": ["data\x00"]}, "mounts", ""),
        ({"starts_at": "2030-01-01T00:00:00\x00"}, "starts_at", ""),
        ({"image": "bai-kernel/minimal:1\ud800"}, "image", ""),
    ],
)
def test_a_launch_field_holding_nul_or_a_lone_surrogate_is_refused_naming_it(
    as_alice, image, agent, spec, field, words
):
    refused(
        post_json(as_alice, SESSIONS, {"image": image.reference, **spec}), field=field, words=words
    )
    assert not Session.objects.exists()


def test_an_unknown_field_with_a_lone_surrogate_is_echoed_safely(as_alice, image):
    body = refused(post_json(as_alice, SESSIONS, {"image": image.reference, "x\ud800": 1}))
    assert "x\ufffd" in body["extra"]["fields"]


def test_a_terminate_reason_with_a_lone_surrogate_is_refused(as_alice, alice, image, group):
    session = Session.objects.create(owner=alice, name="p", image=image, resource_group=group)
    response = post_json(as_alice, f"{SESSIONS}{session.pk}/terminate/", {"reason": "bye \ud800"})
    refused(response, field="reason", words="Surrogate")
    session.refresh_from_db()
    assert session.status == "PENDING"


def test_a_kernel_path_with_a_nul_is_not_found(as_alice, alice, image, group):
    session = Session.objects.create(owner=alice, name="p", image=image, resource_group=group)
    refused(as_alice.get(f"{SESSIONS}{session.pk}/kernels/main%001/logs/"), 404)


# --- template fields ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "changes, field, words",
    [
        ({"name": "evil\r\nSet-Cookie: a=b"}, "name", "line breaks"),
        ({"name": "tab\there"}, "name", "control characters"),
        ({"name": "trailing\n"}, "name", "line breaks"),
        ({"name": "nul\x00"}, "name", "Null characters are not allowed"),
        ({"name": "x" * 65}, "name", "64"),
        ({"name": "\udfff"}, "name", "Surrogate characters are not allowed"),
        ({"description": "a\x00b"}, "description", "Null characters"),
        ({"description": "a\ud800b"}, "description", "Surrogate"),
        ({"spec": {"env": {"A": "\x00"}}}, "spec.env.A", "NUL"),
        ({"spec": {"startup_command": "\x00"}}, "spec.startup_command", "NUL"),
    ],
)
def test_a_template_field_that_could_not_be_stored_or_exported_is_refused(
    as_alice, alice, changes, field, words
):
    body = {"name": "ok", "description": "", "spec": {"image": "x"}, **changes}
    refused(post_json(as_alice, TEMPLATES, body), field=field, words=words)
    kept = SessionTemplate.objects.create(owner=alice, name="kept", spec={"image": "x"})
    refused(post_json(as_alice, f"{TEMPLATES}{kept.pk}/", body, "put"), field=field, words=words)
    assert list(SessionTemplate.objects.values_list("name", flat=True)) == ["kept"]


def test_an_imported_name_with_a_line_break_is_refused_with_its_line(as_alice):
    document = 'description: x\nname: "evil\\r\\nX-Injected: 1"\nspec: {image: x}\n'
    response = post_json(as_alice, f"{TEMPLATES}import/", {"format": "yaml", "document": document})
    refused(response, field="name", words="line 2: must not contain line breaks")
    assert not SessionTemplate.objects.exists()


@pytest.mark.parametrize(
    "name, fallback, encoded",
    [
        (
            "evil\r\nSet-Cookie: a=b",
            "evil__Set-Cookie__a_b.yaml",
            "evil__Set-Cookie%3A%20a%3Db.yaml",
        ),
        ("Übung 1", "_bung_1.yaml", "%C3%9Cbung%201.yaml"),
        ('say "hi"', "say__hi_.yaml", "say%20%22hi%22.yaml"),
    ],
)
def test_the_export_of_any_stored_name_has_a_safe_file_name(
    as_alice, alice, name, fallback, encoded
):
    # Written past the service, as names stored before the rule were.
    template = SessionTemplate.objects.create(owner=alice, name=name, spec={"image": "x"})
    response = as_alice.get(f"{TEMPLATES}{template.pk}/export/?format=yaml")
    assert response.status_code == 200
    header = response["Content-Disposition"]
    assert not any(c in header for c in "\r\n\x00")
    assert header == f"attachment; filename=\"{fallback}\"; filename*=UTF-8''{encoded}"
    assert response["Content-Type"] == "application/yaml"


# --- template import ----------------------------------------------------------------------------

DEEP = 20_000


@pytest.mark.parametrize(
    "fmt, document, field, words",
    [
        ("yaml", 'name: t\nspec: !!python/object/apply:os.system ["id"]\n', "spec", "!!python"),
        (
            "yaml",
            "name: t\nspec:\n  cluster_size: " + "7" * 5000 + "\n",
            "spec.cluster_size",
            "5000 digits",
        ),
        (
            "json",
            '{"name": "t", "spec": {"cluster_size": ' + "7" * 5000 + "}}",
            "spec.cluster_size",
            "5000",
        ),
        ("yaml", "name: t\nspec:\n  batch_timeout: .inf\n", "spec.batch_timeout", "not a finite"),
        ("yaml", "name: t\nspec:\n  batch_timeout: .nan\n", "spec.batch_timeout", "not a finite"),
        ("json", '{"name": "t", "spec": {"batch_timeout": NaN}}', "spec.batch_timeout", "NaN"),
        (
            "json",
            '{"name": "t", "spec": {"batch_timeout": Infinity}}',
            "spec.batch_timeout",
            "Infinity",
        ),
        ("json", '{"name": "t", "spec": {"batch_timeout": 1e309}}', "spec.batch_timeout", "1e309"),
        ("yaml", "name: t\nspec: " + "[" * DEEP + "]" * DEEP + "\n", "document", "nested deeper"),
        (
            "json",
            '{"name": "t", "spec": ' + "[" * DEEP + "]" * DEEP + "}",
            "document",
            "nested deeper",
        ),
    ],
)
def test_a_hostile_import_is_refused_naming_the_field_quickly(
    as_alice, fmt, document, field, words
):
    started = time.perf_counter()
    response = post_json(as_alice, f"{TEMPLATES}import/", {"format": fmt, "document": document})
    refused(response, field=field, words=words)
    assert time.perf_counter() - started < 2
    assert not SessionTemplate.objects.exists()
