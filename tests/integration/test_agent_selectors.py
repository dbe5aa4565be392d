"""Agent selectors on the database: a plugin installed with pip from tests/selector_plugin and
found through its entry point, chosen with options in Django admin and placing sessions; names
and options the admin refuses; a group whose selector cannot be used; a pending timeout of 0; and
sessions an admin pinned to agents.

Personas (tests/conftest.py): ``admin`` edits resource groups in Django admin; ``alice``
launches sessions and reads why they wait.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import IntegrityError, transaction
from django.urls import reverse
from session_steps import destroyed, launch, place, run
from test_scheduler_dispatch import admin_edit_group, kernel_agents

from sessions_app import agent_selectors, services
from sessions_app.models import Agent, AgentStatus, ResourceGroup, ResourcePolicy, Session, Status

pytestmark = pytest.mark.django_db

PLUGIN_SOURCE = Path(__file__).resolve().parent.parent / "selector_plugin"


@pytest.fixture(autouse=True)
def _roomy_default_policy(group):
    ResourcePolicy.objects.filter(is_default=True).update(
        max_concurrent_sessions=50, max_pending_sessions=50
    )


@pytest.fixture(scope="module")
def plugin_site(tmp_path_factory):
    """The plugin package installed by pip into a directory of its own: offline, no build
    isolation (setuptools and wheel come from the virtualenv)."""
    work = tmp_path_factory.mktemp("selector-plugin")
    source = work / "source"
    shutil.copytree(PLUGIN_SOURCE, source)  # the build writes next to its sources
    site = work / "site"
    result = subprocess.run(
        [
            *(sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"),
            *("--no-deps", "--no-build-isolation", "--no-index", "--target", str(site)),
            str(source),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert list(site.glob("bai_test_selector-0.1.dist-info/entry_points.txt"))
    return site


@pytest.fixture
def installed_plugin(plugin_site, monkeypatch):
    """The plugin on sys.path, as if installed in the environment (found by importlib.metadata)."""
    monkeypatch.syspath_prepend(str(plugin_site))
    agent_selectors.agent_selectors_reload()
    yield
    agent_selectors.agent_selectors_reload()
    sys.modules.pop("bai_test_selector", None)


def _add_url() -> str:
    return reverse("admin:sessions_app_resourcegroup_add")


def _group_form(name: str = "g2", **changes: object) -> dict[str, object]:
    form = {
        "name": name,
        "is_active": "on",
        "session_selection": "fifo",
        "num_retries_to_skip": "0",
        "agent_selection": "concentrated",
        "agent_selector_options": "{}",
        "allowed_session_types": ["interactive", "batch"],
        "pending_timeout": "",
    }
    form.update(changes)
    return form


def _errors(response) -> dict[str, list[str]]:
    assert response.status_code == 200, "the form was accepted"
    return dict(response.context["adminform"].form.errors)


# --- the plugin, from admin to placement -----------------------------------------------------


def test_the_admin_offers_the_built_ins_and_every_installed_plugin(client, admin, installed_plugin):
    client.force_login(admin)

    page = client.get(_add_url()).content.decode()

    for name in ("concentrated", "dispersed", "roundrobin", "by-prefix"):
        assert f'<option value="{name}"' in page
    assert "by-prefix (plugin bai-test-selector 0.1)" in page


def test_a_session_goes_to_the_agent_the_plugin_picks(
    client, admin, alice, image, group, make_agent, installed_plugin
):
    make_agent("big", cpu="16")
    make_agent("fast-a", cpu="4")
    make_agent("fast-b", cpu="8")

    admin_edit_group(
        client,
        admin,
        group,
        agent_selection="by-prefix",
        agent_selector_options='{"prefix": "fast-"}',
    )
    assert (group.agent_selection, group.agent_selector_options) == (
        "by-prefix",
        {"prefix": "fast-"},
    )

    # Concentrated would take fast-a (the least free that fits); the plugin takes the fast-*
    # agent with the most free cpu.
    session = place(launch(alice, name="s", resources={"cpu": "2", "mem": "1g"}))
    assert session.status == Status.SCHEDULED, session.status_reason
    assert kernel_agents(session) == ["fast-b"]

    # Only "big" holds 12 cpu, and the plugin will not use it: its reason is shown.
    huge = place(launch(alice, name="huge", resources={"cpu": "12", "mem": "1g"}))
    assert huge.status == Status.PENDING
    assert huge.status_reason == "no agent named fast-* can hold it"
    assert huge.scheduling_attempts == 1


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ("{}", "agent selector 'by-prefix' refused its options: option 'prefix': required"),
        (
            '{"prefix": 3}',
            "agent selector 'by-prefix' refused its options: option 'prefix': "
            "must be a non-empty string",
        ),
        (
            '{"prefix": "fast-", "speed": 1}',
            "agent selector 'by-prefix' refused its options: option 'speed': "
            "unknown option; this selector takes prefix",
        ),
        ('["fast-"]', 'A JSON object, such as {} or {"prefix": "gpu-"}.'),
    ],
)
def test_the_admin_refuses_options_the_plugin_refuses(
    client, admin, group, installed_plugin, options, error
):
    client.force_login(admin)

    response = client.post(
        _add_url(), _group_form(agent_selection="by-prefix", agent_selector_options=options)
    )

    assert _errors(response) == {"agent_selector_options": [error]}
    assert not ResourceGroup.objects.filter(name="g2").exists()


def test_a_built_in_refuses_any_option(client, admin, group):
    client.force_login(admin)

    response = client.post(_add_url(), _group_form(agent_selector_options='{"spread": true}'))

    assert _errors(response) == {
        "agent_selector_options": [
            "agent selector 'concentrated' refused its options: option 'spread': "
            "unknown option; this selector takes none"
        ]
    }


def test_a_selector_that_is_not_installed_is_refused_naming_those_that_are(client, admin, group):
    client.force_login(admin)

    response = client.post(_add_url(), _group_form(agent_selection="by-prefix"))

    assert _errors(response) == {
        "agent_selection": [
            "Agent selector 'by-prefix' is not installed. "
            "Installed: concentrated, dispersed, roundrobin."
        ]
    }


def test_switching_selector_in_the_group_list_checks_the_stored_options_too(
    client, admin, group, installed_plugin
):
    ResourceGroup.objects.filter(pk=group.pk).update(
        agent_selection="by-prefix", agent_selector_options={"prefix": "fast-"}
    )
    client.force_login(admin)
    form = {
        "form-TOTAL_FORMS": "1",
        "form-INITIAL_FORMS": "1",
        "form-MIN_NUM_FORMS": "0",
        "form-MAX_NUM_FORMS": "1000",
        "form-0-id": str(group.pk),
        "form-0-session_selection": "fifo",
        "form-0-agent_selection": "dispersed",
        "_save": "Save",
    }
    url = reverse("admin:sessions_app_resourcegroup_changelist")

    response = client.post(url, form)

    assert response.status_code == 200
    assert response.context["cl"].formset.errors == [
        {
            "__all__": [
                "agent selector 'dispersed' refused its options: option 'prefix': "
                "unknown option; this selector takes none"
            ]
        }
    ]
    group.refresh_from_db()
    assert group.agent_selection == "by-prefix"

    response = client.post(url, {**form, "form-0-agent_selection": "by-prefix"})
    assert response.status_code == 302


# --- a selector that cannot be used does not stop the pass ---------------------------------------


def test_a_group_whose_selector_was_uninstalled_keeps_its_sessions_waiting_with_the_reason(
    client, admin, alice, image, group, make_agent
):
    make_agent("agent-1")
    ResourceGroup.objects.filter(pk=group.pk).update(agent_selection="by-prefix")

    session = place(launch(alice, name="s"))

    assert session.status == Status.PENDING
    assert session.status_reason == "agent selector 'by-prefix' is not installed"
    assert session.scheduling_attempts == 0  # the group's fault, not the session's

    # Its admin page shows the name as it is, and saving it as it is says what is wrong.
    client.force_login(admin)
    url = reverse("admin:sessions_app_resourcegroup_change", args=[group.pk])
    assert "by-prefix (not installed)" in client.get(url).content.decode()
    response = client.post(url, _group_form("default", agent_selection="by-prefix"))
    assert "Agent selector 'by-prefix' is not installed." in _errors(response)["agent_selection"][0]


def test_options_stored_past_the_admin_keep_the_groups_sessions_waiting_with_the_reason(
    alice, image, group, make_agent
):
    make_agent("agent-1")
    ResourceGroup.objects.filter(pk=group.pk).update(agent_selector_options={"spread": True})
    other_group = ResourceGroup.objects.create(name="other")
    make_agent("agent-2", resource_group=other_group)

    session = place(launch(alice, name="s"))

    assert session.status == Status.PENDING
    assert session.status_reason == (
        "agent selector 'concentrated' refused its options: option 'spread': "
        "unknown option; this selector takes none"
    )


# --- pending timeout ---------------------------------------------------------------------------


def test_a_pending_timeout_of_zero_set_in_admin_cancels_nothing(client, admin, alice, image, group):
    admin_edit_group(client, admin, group, pending_timeout="0")
    assert group.pending_timeout is None  # 0 means none, and is kept as none
    waiting = launch(alice, name="waits")  # no agent: it cannot start
    Session.objects.filter(pk=waiting.pk).update(created_at=waiting.created_at - timedelta(days=2))

    place(waiting)

    assert waiting.status == Status.PENDING
    assert waiting.status_reason == "no agent alive and schedulable in resource group default"


def test_a_negative_pending_timeout_is_refused_saying_what_means_no_timeout(client, admin, group):
    client.force_login(admin)

    response = client.post(_add_url(), _group_form(pending_timeout="-1 00:00:00"))

    assert _errors(response) == {"pending_timeout": ["at least 1 s (leave it empty or 0 for none)"]}
    with pytest.raises(IntegrityError), transaction.atomic():
        ResourceGroup.objects.filter(pk=group.pk).update(pending_timeout=timedelta(minutes=-5))


# --- sessions an admin pinned to agents (manual agent designation) -------------------------------


def designate(session: Session, *agent_ids: str) -> Session:
    """What the launch does for an admin who names agents (sessions_app/launch.py)."""
    Session.objects.filter(pk=session.pk).update(designated_agents=list(agent_ids))
    session.refresh_from_db()
    return session


def test_a_pinned_session_goes_to_its_agent_though_the_selector_would_choose_another(
    alice, image, make_agent
):
    make_agent("agent-1", cpu="4")
    make_agent("agent-2", cpu="16")
    pinned = designate(launch(alice, name="pinned", resources={"cpu": "2", "mem": "1g"}), "agent-2")
    free = launch(alice, name="free", resources={"cpu": "2", "mem": "1g"})

    place(pinned)
    free.refresh_from_db()

    assert kernel_agents(pinned) == ["agent-2"]
    assert kernel_agents(free) == ["agent-1"]  # concentrated: the least free that fits


def test_a_pinned_session_waits_naming_its_agent_until_that_agent_has_room(
    alice, image, make_agent
):
    make_agent("agent-1", cpu="4")
    make_agent("agent-2", cpu="4")
    hog = run(launch(alice, name="hog", resources={"cpu": "4", "mem": "1g"}))
    assert kernel_agents(hog) == ["agent-1"]
    pinned = designate(launch(alice, name="pinned", resources={"cpu": "2", "mem": "1g"}), "agent-1")
    behind = launch(alice, name="behind", resources={"cpu": "2", "mem": "1g"})

    place(pinned)

    assert pinned.status == Status.PENDING
    assert pinned.status_reason == "pinned to agent agent-1: it does not have 2 cpu free"
    behind.refresh_from_db()
    assert kernel_agents(behind) == ["agent-2"], "a pinned session does not hold up the queue"

    services.session_terminate(session=hog, reason="done")
    destroyed(hog)
    place(pinned)
    assert pinned.status == Status.SCHEDULED
    assert kernel_agents(pinned) == ["agent-1"]


def test_a_session_pinned_to_agents_that_are_not_alive_says_so(alice, image, make_agent):
    make_agent("agent-1")
    lost = make_agent("agent-2")
    Agent.objects.filter(pk=lost.pk).update(status=AgentStatus.LOST)
    pinned = designate(launch(alice, name="pinned"), "agent-2", "agent-9")

    place(pinned)

    assert pinned.status == Status.PENDING
    assert pinned.status_reason == (
        "pinned to agents agent-2, agent-9: none of them is alive and schedulable "
        "in resource group default"
    )
