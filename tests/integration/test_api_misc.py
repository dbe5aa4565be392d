"""The rest of the API surface: tokens, the schema and docs pages, the error
format, data folders, templates and ending a session.

Personas (tests/conftest.py): ``alice`` is a plain user working with her own
folders, templates and sessions.
"""

from __future__ import annotations

import json
import os
import re
import stat

import pytest
import yaml
from knox.models import AuthToken
from rest_framework.test import APIClient

from sessions_app.models import DataFolder, Session, SessionTemplate, Status

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _fast_password_hashing(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def as_alice(api, alice):
    return api(alice)


def assert_error(response, status: int, *words: str, field: str | None = None) -> dict:
    """Every error is JSON: a human ``message`` and an ``extra`` object."""
    assert response.status_code == status, response.content
    assert response["Content-Type"].startswith("application/json")
    body = response.json()
    assert isinstance(body["message"], str) and body["message"]
    assert isinstance(body["extra"], dict)
    text = (
        body["message"]
        + " "
        + " ".join(" ".join(v) for v in body["extra"].get("fields", {}).values())
    )
    for word in words:
        assert word in text, f"{word!r} not in {body}"
    if field is not None:
        assert body["extra"]["fields"][field], body
    return body


# --- tokens -------------------------------------------------------------------------------------


def test_the_right_password_gives_a_token_that_authenticates_api_calls(alice, image, group):
    Session.objects.create(owner=alice, name="mine", image=image, resource_group=group)
    client = APIClient()

    response = client.post(
        "/api/v1/auth/token/", {"username": "alice", "password": "alice-pass-123"}, format="json"
    )

    assert response.status_code == 200
    key = response.json()["token"]
    assert AuthToken.objects.get(user=alice).token_key == key[:15]
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    sessions = client.get("/api/v1/sessions/")
    assert sessions.status_code == 200
    assert [s["name"] for s in sessions.json()] == ["mine"]


def test_asking_twice_gives_two_tokens_that_both_work(alice):
    """Tokens are stored hashed, so an existing one cannot be shown again."""
    client = APIClient()
    body = {"username": "alice", "password": "alice-pass-123"}
    first = client.post("/api/v1/auth/token/", body, format="json").json()["token"]
    second = client.post("/api/v1/auth/token/", body, format="json").json()["token"]

    assert first != second
    for key in (first, second):
        client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
        assert client.get("/api/v1/sessions/").status_code == 200


@pytest.mark.parametrize(
    "credentials",
    [
        {"username": "alice", "password": "wrong"},
        {"username": "nobody", "password": "alice-pass-123"},
    ],
)
def test_a_wrong_password_gives_no_token(alice, credentials):
    response = APIClient().post("/api/v1/auth/token/", credentials, format="json")

    body = assert_error(response, 400, "Wrong username or password")
    assert "token" not in body
    assert not AuthToken.objects.exists()


def test_an_inactive_user_gets_no_token(alice):
    alice.is_active = False
    alice.save()
    response = APIClient().post(
        "/api/v1/auth/token/", {"username": "alice", "password": "alice-pass-123"}, format="json"
    )
    assert_error(response, 400)
    assert not AuthToken.objects.exists()


def test_a_token_request_without_a_password_names_the_field(alice):
    response = APIClient().post("/api/v1/auth/token/", {"username": "alice"}, format="json")
    assert_error(response, 400, "required", field="password")


def test_a_wrong_token_is_refused(alice):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Token not-a-real-key")
    assert_error(client.get("/api/v1/sessions/"), 401)


# --- schema and docs -----------------------------------------------------------------------------


def test_the_schema_is_an_openapi_document_covering_the_api(client):
    response = client.get("/api/schema/")
    assert response.status_code == 200
    document = yaml.safe_load(response.content)
    assert document["openapi"].startswith("3.")
    for path in (
        "/api/v1/sessions/",
        "/api/v1/sessions/{session_id}/terminate/",
        "/api/v1/templates/import/",
        "/api/v1/folders/",
        "/api/v1/auth/token/",
    ):
        assert path in document["paths"], path


def test_the_schema_is_available_as_json(client):
    response = client.get("/api/schema/?format=json")
    assert response.status_code == 200
    assert json.loads(response.content)["info"]["title"]


@pytest.fixture
def schema(client):
    return json.loads(client.get("/api/schema/?format=json").content)


ERROR_REF = {"$ref": "#/components/schemas/Error"}


def _error_codes(operation: dict) -> set[str]:
    codes = set()
    for code, response in operation["responses"].items():
        if code.startswith(("4", "5")):
            assert response["content"]["application/json"]["schema"] == ERROR_REF, code
            codes.add(code)
    return codes


@pytest.mark.parametrize(
    "path, method, codes",
    [
        ("/api/v1/sessions/", "get", {"400", "401", "403"}),
        ("/api/v1/sessions/", "post", {"400", "401", "403", "409", "413", "415"}),
        ("/api/v1/sessions/{session_id}/", "get", {"401", "403", "404"}),
        (
            "/api/v1/sessions/{session_id}/terminate/",
            "post",
            {"400", "401", "403", "404", "409", "413", "415"},
        ),
        ("/api/v1/templates/{template_id}/", "delete", {"401", "403", "404"}),
        ("/api/v1/templates/{template_id}/export/", "get", {"400", "401", "403", "404"}),
        ("/api/v1/folders/{folder_id}/", "delete", {"401", "403", "404", "409"}),
        ("/api/v1/auth/token/", "post", {"400", "413", "415"}),
    ],
)
def test_the_schema_lists_every_error_an_operation_can_answer_in_one_shape(
    schema, path, method, codes
):
    assert _error_codes(schema["paths"][path][method]) >= codes
    error = schema["components"]["schemas"]["Error"]
    assert set(error["required"]) == {"message", "extra"}


def test_the_schema_declares_both_export_formats(schema):
    content = schema["paths"]["/api/v1/templates/{template_id}/export/"]["get"]["responses"]["200"][
        "content"
    ]
    assert set(content) == {"application/yaml", "application/json"}
    for media in content.values():
        assert set(media["schema"]["required"]) == {"name", "spec"}


def test_request_bodies_are_json_and_strict_inputs_are_closed(schema):
    for path, operations in schema["paths"].items():
        for operation in operations.values():
            if "requestBody" in operation:
                # An upload's body is the file itself.
                expected = (
                    ["application/octet-stream"]
                    if path == "/api/v1/folders/{folder_id}/files/content/"
                    else ["application/json"]
                )
                assert list(operation["requestBody"]["content"]) == expected, path
    components = schema["components"]["schemas"]
    assert components["TemplateInputRequest"]["additionalProperties"] is False
    assert components["FolderCreateInputRequest"]["additionalProperties"] is False


def test_the_launch_schema_documents_its_bounds_as_enforced(schema):
    body = schema["paths"]["/api/v1/sessions/"]["post"]["requestBody"]["content"]
    launch = body["application/json"]["schema"]
    assert launch["properties"]["env"]["propertyNames"]["maxLength"] == 256
    assert "x-errors" not in json.dumps(launch)


def test_an_unknown_api_path_is_a_json_404(as_alice):
    assert_error(as_alice.get("/api/v1/nowhere/"), 404)
    assert_error(as_alice.get("/api/v1/templates/not-a-number/"), 404)


@pytest.mark.parametrize(
    "url, body, field",
    [
        ("/api/v1/folders/", {"name": 0}, "name"),
        ("/api/v1/templates/", {"name": "t", "spec": {}, "is_shared": 0}, "is_shared"),
        ("/api/v1/templates/", {"name": 7, "spec": {}}, "name"),
    ],
)
def test_json_types_are_taken_as_they_are_not_coerced(as_alice, url, body, field):
    assert_error(as_alice.post(url, body, format="json"), 400, field=field)


def test_the_docs_page_loads_swagger_ui_from_the_project_itself(client):
    response = client.get("/api/docs/")

    assert response.status_code == 200
    page = response.content.decode()
    scripts = re.findall(r'<script[^>]*src="([^"]+)"', page)
    assert "/static/drf_spectacular_sidecar/swagger-ui-dist/swagger-ui-bundle.js" in scripts
    assert all(src.startswith("/") for src in scripts), scripts
    assert "<script>" not in page  # the start-up script is a file too
    assert "cdn." not in page


def test_the_docs_start_up_script_is_served_as_javascript(client):
    response = client.get("/api/docs/?script=")

    assert response.status_code == 200
    assert response["Content-Type"].startswith("application/javascript")
    assert "/api/schema/" in response.content.decode()
    assert "swagger" in response.content.decode().lower()


# --- the error format -----------------------------------------------------------------------------


def test_a_validation_error_has_a_message_and_per_field_detail(as_alice):
    body = assert_error(as_alice.post("/api/v1/folders/", {}, format="json"), 400, field="name")
    assert body["message"].startswith("name:")


def test_not_found_and_method_not_allowed_are_json_too(as_alice):
    assert_error(as_alice.get("/api/v1/sessions/not-an-id/"), 404, "No such session")
    assert_error(as_alice.delete("/api/v1/sessions/"), 405)


def test_a_body_that_is_not_json_is_refused_with_a_message(as_alice):
    response = as_alice.post("/api/v1/folders/", "{nope", content_type="application/json")
    assert_error(response, 400)


# --- folders -------------------------------------------------------------------------------------


def test_a_folder_is_created_listed_and_deleted(as_alice, alice, settings):
    response = as_alice.post("/api/v1/folders/", {"name": "data_1"}, format="json")

    assert response.status_code == 201
    folder = DataFolder.objects.get(owner=alice, name="data_1")
    assert response.json()["id"] == folder.pk
    assert folder.host_path.is_dir()
    assert settings.BAI_STORAGE_ROOT in folder.host_path.resolve().parents
    assert [f["name"] for f in as_alice.get("/api/v1/folders/").json()] == ["data_1"]

    assert as_alice.delete(f"/api/v1/folders/{folder.pk}/").status_code == 204
    assert not DataFolder.objects.exists()
    assert not folder.host_path.exists()
    assert as_alice.get("/api/v1/folders/").json() == []


def test_a_new_folder_is_the_kernel_users_and_not_world_writable(as_alice, alice, settings):
    settings.BAI_STORAGE_ROOT.chmod(0o700)
    response = as_alice.post("/api/v1/folders/", {"name": "private"}, format="json")
    assert response.status_code == 201
    path = DataFolder.objects.get(owner=alice, name="private").host_path
    st = path.stat()
    assert stat.S_IMODE(st.st_mode) == 0o2770  # kernel user and group only; was 0777
    if os.geteuid() == 0:
        assert (st.st_uid, st.st_gid) == (1000, 1000)
    # The directories above it may be passed through (process kernels follow the path).
    for parent in (path.parent, settings.BAI_STORAGE_ROOT):
        assert parent.stat().st_mode & 0o011 == 0o011


@pytest.mark.parametrize("name", ["../etc", "a/b", "a b", "-x", ".hidden", "x" * 65, "ü"])
def test_a_folder_name_must_be_a_plain_name(as_alice, name, settings):
    response = as_alice.post("/api/v1/folders/", {"name": name}, format="json")
    assert_error(response, 400, field="name")
    assert not DataFolder.objects.exists()
    assert list(settings.BAI_STORAGE_ROOT.iterdir()) == []


def test_a_second_folder_with_the_same_name_is_a_conflict(as_alice, bob, api):
    assert as_alice.post("/api/v1/folders/", {"name": "data"}, format="json").status_code == 201
    assert_error(
        as_alice.post("/api/v1/folders/", {"name": "data"}, format="json"),
        409,
        "already",
        field="name",
    )
    assert DataFolder.objects.count() == 1
    # another user's folder of the same name is no conflict
    assert api(bob).post("/api/v1/folders/", {"name": "data"}, format="json").status_code == 201


def test_a_folder_mounted_by_an_active_session_cannot_be_deleted(as_alice, alice, image, group):
    folder = DataFolder.objects.get(
        pk=as_alice.post("/api/v1/folders/", {"name": "data"}, format="json").json()["id"]
    )
    session = Session.objects.create(owner=alice, name="uses-it", image=image, resource_group=group)
    session.mounts.set([folder])

    assert_error(as_alice.delete(f"/api/v1/folders/{folder.pk}/"), 409, "uses-it")
    assert DataFolder.objects.filter(pk=folder.pk).exists()
    assert folder.host_path.is_dir()

    session.mark_cancelled("done")
    assert as_alice.delete(f"/api/v1/folders/{folder.pk}/").status_code == 204


# --- templates -------------------------------------------------------------------------------------


SPEC = {"image": "bai-kernel/minimal:1", "resources": {"cpu": 2}, "cluster_size": 2}


def test_a_template_is_created_read_updated_and_deleted(as_alice, alice):
    created = as_alice.post("/api/v1/templates/", {"name": "train", "spec": SPEC}, format="json")
    assert created.status_code == 201, created.content
    pk = created.json()["id"]
    assert as_alice.get(f"/api/v1/templates/{pk}/").json()["spec"] == SPEC
    assert [t["name"] for t in as_alice.get("/api/v1/templates/").json()] == ["train"]

    updated = as_alice.put(
        f"/api/v1/templates/{pk}/",
        {"name": "train-2", "spec": {**SPEC, "cluster_size": 4}},
        format="json",
    )
    assert updated.status_code == 200, updated.content
    template = SessionTemplate.objects.get(pk=pk)
    assert (template.name, template.spec["cluster_size"], template.owner) == ("train-2", 4, alice)

    assert as_alice.delete(f"/api/v1/templates/{pk}/").status_code == 204
    assert not SessionTemplate.objects.exists()


def test_a_template_with_a_misspelt_spec_field_is_refused_naming_it(as_alice):
    response = as_alice.post(
        "/api/v1/templates/",
        {"name": "t", "spec": {"imgae": "bai-kernel/minimal:1"}},
        format="json",
    )
    assert_error(response, 400, "imgae", field="spec.imgae")
    assert not SessionTemplate.objects.exists()


def test_a_template_with_a_misspelt_top_level_field_is_refused_naming_it(as_alice):
    response = as_alice.post(
        "/api/v1/templates/",
        {"name": "t", "spec": SPEC, "descripton": "typo"},
        format="json",
    )
    assert_error(response, 400, "unknown field", field="descripton")
    assert not SessionTemplate.objects.exists()


def test_a_template_with_a_badly_typed_spec_field_is_refused_naming_it(as_alice):
    response = as_alice.post(
        "/api/v1/templates/", {"name": "t", "spec": {"cluster_size": "two"}}, format="json"
    )
    assert_error(response, 400, field="spec.cluster_size")


def test_a_second_template_with_the_same_name_is_a_conflict(as_alice):
    assert (
        as_alice.post("/api/v1/templates/", {"name": "t", "spec": SPEC}, format="json").status_code
        == 201
    )
    response = as_alice.post("/api/v1/templates/", {"name": "t", "spec": SPEC}, format="json")
    assert_error(response, 409, "already", field="name")
    assert SessionTemplate.objects.count() == 1


@pytest.mark.parametrize("fmt", ["yaml", "json"])
def test_an_exported_template_imports_back_unchanged(as_alice, fmt):
    pk = as_alice.post(
        "/api/v1/templates/",
        {"name": "orig", "description": "d", "spec": SPEC},
        format="json",
    ).json()["id"]

    exported = as_alice.get(f"/api/v1/templates/{pk}/export/?format={fmt}")
    assert exported.status_code == 200
    assert f'filename="orig.{fmt}"' in exported["Content-Disposition"]
    assert exported["Content-Type"].startswith(f"application/{fmt}")
    text = exported.content.decode()
    document = yaml.safe_load(text) if fmt == "yaml" else json.loads(text)
    assert document == {"name": "orig", "description": "d", "spec": SPEC}

    SessionTemplate.objects.all().delete()
    imported = as_alice.post(
        "/api/v1/templates/import/", {"format": fmt, "document": text}, format="json"
    )
    assert imported.status_code == 201, imported.content
    assert (imported.json()["name"], imported.json()["spec"]) == ("orig", SPEC)


def test_an_import_error_names_the_field_and_its_line(as_alice):
    document = "name: t\nspec:\n  image: x\n  clustr_size: 2\n"
    response = as_alice.post(
        "/api/v1/templates/import/", {"format": "yaml", "document": document}, format="json"
    )
    body = assert_error(response, 400, "clustr_size", "line 4")
    assert "spec.clustr_size" in body["extra"]["fields"]
    assert not SessionTemplate.objects.exists()


def test_an_import_of_broken_yaml_says_where(as_alice):
    response = as_alice.post(
        "/api/v1/templates/import/",
        {"format": "yaml", "document": "name: t\nspec: [\n"},
        format="json",
    )
    assert_error(response, 400, "invalid YAML", field="document")


def test_an_export_in_an_unknown_format_is_refused(as_alice):
    pk = as_alice.post("/api/v1/templates/", {"name": "t", "spec": SPEC}, format="json").json()[
        "id"
    ]
    assert_error(as_alice.get(f"/api/v1/templates/{pk}/export/?format=xml"), 400, field="format")


# --- terminate ---------------------------------------------------------------------------------------


def test_terminating_twice_is_a_conflict_the_second_time(as_alice, alice, image, group, agent):
    created = as_alice.post("/api/v1/sessions/", {"image": image.reference}, format="json")
    pk = created.json()["id"]

    first = as_alice.post(f"/api/v1/sessions/{pk}/terminate/", {}, format="json")
    assert first.status_code == 200
    assert first.json()["status"] == Status.CANCELLED
    assert first.json()["status_reason"] == "terminated by its owner"
    events = Session.objects.get(pk=pk).events.count()

    second = as_alice.post(f"/api/v1/sessions/{pk}/terminate/", {}, format="json")
    assert_error(second, 409, "already ended", "CANCELLED")
    assert Session.objects.get(pk=pk).events.count() == events


def test_terminate_records_the_users_reason(as_alice, image, agent):
    pk = as_alice.post("/api/v1/sessions/", {"image": image.reference}, format="json").json()["id"]
    response = as_alice.post(
        f"/api/v1/sessions/{pk}/terminate/", {"reason": "wrong image"}, format="json"
    )
    assert response.json()["status_reason"] == "wrong image"
    assert response.json()["events"][-1]["reason"] == "wrong image"


def test_terminate_refuses_an_overlong_reason(as_alice, image, agent):
    pk = as_alice.post("/api/v1/sessions/", {"image": image.reference}, format="json").json()["id"]
    response = as_alice.post(
        f"/api/v1/sessions/{pk}/terminate/", {"reason": "x" * 201}, format="json"
    )
    assert_error(response, 400, field="reason")
    assert Session.objects.get(pk=pk).status == Status.PENDING
