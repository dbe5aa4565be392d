"""Every page of one thing (a session, its terminal, a folder, an endpoint, a template)
answers 404 for a thing that does not exist and for another user's, exactly as the API
does: never a 200 page with live controls for nothing.

Personas (tests/conftest.py): ``alice`` owns every thing here; ``bob`` is another plain
user, for whom none of it exists; ``admin`` reaches all of it.
"""

from __future__ import annotations

import uuid

import pytest

from serving_app.models import Endpoint
from sessions_app import services
from sessions_app.models import Session, SessionTemplate

pytestmark = pytest.mark.django_db


@pytest.fixture
def things(alice, image, group) -> dict[str, str]:
    """Each detail page of one of alice's things, by name."""
    session = Session.objects.create(owner=alice, name="job", image=image, resource_group=group)
    folder = services.folder_create(owner=alice, name="data")
    endpoint = Endpoint.objects.create(owner=alice, name="iris", image=image, resource_group=group)
    template = SessionTemplate.objects.create(
        owner=alice, name="tpl", spec={"image": image.reference}
    )
    return {
        "session": f"/sessions/{session.pk}/",
        "terminal": f"/sessions/{session.pk}/terminal/",
        "folder": f"/folders/{folder.pk}/",
        "endpoint": f"/serving/{endpoint.pk}/",
        "template": f"/templates/{template.pk}/edit/",
        "template copy": f"/templates/new/?from={template.pk}",
    }


UNKNOWN = {
    "session": f"/sessions/{uuid.uuid4()}/",
    "terminal": f"/sessions/{uuid.uuid4()}/terminal/",
    "folder": "/folders/999/",
    "endpoint": f"/serving/{uuid.uuid4()}/",
    "template": "/templates/999/edit/",
    "template copy": "/templates/new/?from=999",
}


@pytest.mark.parametrize("kind", sorted(UNKNOWN))
def test_a_page_for_a_thing_that_does_not_exist_is_not_found(client, alice, things, kind):
    client.force_login(alice)
    response = client.get(UNKNOWN[kind])
    assert response.status_code == 404, (kind, response.status_code)
    assert b"Page not found" in response.content or b"404" in response.content


@pytest.mark.parametrize("kind", sorted(UNKNOWN))
def test_a_page_for_another_users_thing_is_not_found(client, bob, things, kind):
    client.force_login(bob)
    assert client.get(things[kind]).status_code == 404, kind


@pytest.mark.parametrize("kind", sorted(UNKNOWN))
def test_the_owner_and_an_admin_get_the_page(client, alice, admin, things, kind):
    for user in (alice, admin):
        client.force_login(user)
        assert client.get(things[kind]).status_code == 200, (kind, user.username)
