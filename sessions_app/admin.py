"""Django admin for every model. Statuses are never edited here: ending a
session is an action that goes through the same service as the API."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.forms.utils import pretty_name
from django.http import HttpRequest
from django.utils.html import format_html
from knox.models import AuthToken

from . import agent_selectors, services
from . import slots as slotlib
from .errors import ApplicationError, InvalidInput
from .models import (
    Agent,
    DataFolder,
    Image,
    Kernel,
    ResourceGroup,
    ResourcePolicy,
    Session,
    SessionEvent,
    SessionTemplate,
    SessionType,
    UserResourcePolicy,
)
from .templates import validate_template_spec
from .tokens import token_is_expired, token_prefix


class ReadOnlyInline(admin.TabularInline):
    extra = 0
    can_delete = False
    show_change_link = True

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


def _clean_slots(value: Any) -> dict[str, str]:
    """Slots typed by an admin, stored as exact decimal strings ("4g" becomes
    bytes): a typo here would otherwise break every launch that reads them."""
    try:
        parsed = slotlib.parse_slots(value if value is not None else {}, settings.BAI_SLOT_TYPES)
    except slotlib.SlotError as exc:
        raise forms.ValidationError(str(exc)) from None
    return {slot: format(amount, "f") for slot, amount in parsed.items()}


class AgentSelectorField(forms.ChoiceField):
    """A select of the installed agent selectors; a name that is not installed is refused with
    the list of those that are."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(choices=agent_selectors.agent_selector_choices, **kwargs)

    def validate(self, value: Any) -> None:
        forms.Field.validate(self, value)
        installed = agent_selectors.agent_selector_names()
        if value not in installed:
            raise forms.ValidationError(
                f"Agent selector {value!r} is not installed. Installed: {', '.join(installed)}."
            )


# Admin forms: the ModelAdmin supplies the model and the fields.
class ResourceGroupForm(forms.ModelForm):
    """Also the changelist's form (``agent_selection`` is list-editable there), so every check
    works with or without the options field."""

    agent_selection = AgentSelectorField(
        initial="concentrated",
        help_text="The agent selector: a built-in, or a plugin installed in the entry point "
        f"group {agent_selectors.ENTRY_POINT_GROUP}.",
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        current = self.instance.agent_selection if self.instance.pk else None
        field = self.fields["agent_selection"]
        assert isinstance(field, forms.ChoiceField)
        if current and current not in agent_selectors.agent_selector_names():
            # Shown as it is, so that saving without choosing another says what is wrong.
            field.choices = [*field.choices, (current, f"{current} (not installed)")]

    def clean_allowed_session_types(self) -> Any:
        value = self.cleaned_data["allowed_session_types"]
        known = SessionType.values
        if not isinstance(value, list) or any(v not in known for v in value):
            raise forms.ValidationError(f"A list of session types, from: {', '.join(known)}.")
        return value

    def clean_agent_selector_options(self) -> Any:
        value = self.cleaned_data["agent_selector_options"]
        if value is None or value == "":
            return {}
        if not isinstance(value, dict):
            raise forms.ValidationError('A JSON object, such as {} or {"prefix": "gpu-"}.')
        return value

    def clean_pending_timeout(self) -> Any:
        value = self.cleaned_data["pending_timeout"]
        if value is not None and value < timedelta(0):
            raise forms.ValidationError(
                "A pending timeout cannot be negative. Leave it empty, or 0, for no timeout."
            )
        return value

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean()
        if "agent_selection" not in cleaned:
            return cleaned
        has_options = "agent_selector_options" in self.fields
        if has_options and "agent_selector_options" not in cleaned:
            return cleaned
        options = (
            cleaned["agent_selector_options"]
            if has_options
            else self.instance.agent_selector_options
        )
        try:
            agent_selectors.agent_selector_build(name=cleaned["agent_selection"], options=options)
        except agent_selectors.AgentSelectorBadOptions as exc:
            self.add_error("agent_selector_options" if has_options else None, exc.message)
        except agent_selectors.AgentSelectorError as exc:
            self.add_error("agent_selection", exc.message)
        return cleaned


class ImageForm(forms.ModelForm):
    def clean_min_slots(self) -> Any:
        return _clean_slots(self.cleaned_data["min_slots"])


class ResourcePolicyForm(forms.ModelForm):
    def clean_total_resource_slots(self) -> Any:
        return _clean_slots(self.cleaned_data["total_resource_slots"])


def _cells_named(form_class: Any) -> Any:
    """A changelist form whose editable cells say what they are.

    Django renders ``list_editable`` fields in table cells without a <label>:
    a screen reader hears only "combo box". Each field is named after itself
    and its row, e.g. "Session selection of default".
    """

    class Named(form_class):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            for name, field in self.fields.items():
                label = field.label or pretty_name(name)
                field.widget.attrs["aria-label"] = f"{label} of {self.instance}"

    return Named


@admin.register(ResourceGroup)
class ResourceGroupAdmin(admin.ModelAdmin):
    form = ResourceGroupForm
    list_display = [
        "name",
        "is_active",
        "session_selection",
        "num_retries_to_skip",
        "agent_selection",
        "agent_selector_options",
        "pending_timeout",
    ]
    list_editable = ["session_selection", "agent_selection"]
    search_fields = ["name"]
    fieldsets = [
        (None, {"fields": ["name", "description", "is_active"]}),
        (
            "Scheduling (takes effect at the next pass)",
            {
                "fields": [
                    "session_selection",
                    "num_retries_to_skip",
                    "agent_selection",
                    "agent_selector_options",
                ]
            },
        ),
        ("Limits", {"fields": ["allowed_session_types", "pending_timeout"]}),
    ]

    def get_changelist_form(self, request: HttpRequest, **kwargs: Any) -> Any:
        # The installed selectors' select, and the options check, in the list too.
        kwargs.setdefault("form", ResourceGroupForm)
        return _cells_named(super().get_changelist_form(request, **kwargs))


@admin.register(Agent)
class AgentAdmin(admin.ModelAdmin):
    list_display = [
        "id",
        "resource_group",
        "status",
        "schedulable",
        "backend",
        "hostname",
        "capacity_slots",
        "occupied_slots",
        "last_heartbeat_at",
    ]
    list_filter = ["status", "resource_group", "backend"]
    search_fields = ["id", "hostname"]
    readonly_fields = [
        "status",
        "status_reason",
        "backend",
        "hostname",
        "version",
        "capacity_slots",
        "occupied_slots",
        "token_prefix",
        "first_contact_at",
        "last_heartbeat_at",
        "lost_at",
        "created_at",
    ]
    actions = ["regenerate_token"]

    def save_model(self, request: HttpRequest, obj: Agent, form: Any, change: bool) -> None:
        token = None if change else obj.set_new_token()
        super().save_model(request, obj, form, change)
        if token:
            self._show_token(request, obj, token)

    def _show_token(self, request: HttpRequest, agent: Agent, token: str) -> None:
        messages.warning(
            request,
            format_html(
                "Token for agent <b>{}</b> (shown only now, stored hashed): <code>{}</code><br>"
                "Start it with: <code>BACKENDAI_AGENT_TOKEN={} python -m agent --manager ws://HOST:PORT</code>",
                agent.id,
                token,
                token,
            ),
        )

    @admin.action(description="Regenerate the token of the selected agents")
    def regenerate_token(self, request: HttpRequest, queryset: QuerySet[Agent]) -> None:
        for agent in queryset:
            token = agent.set_new_token()
            agent.save(update_fields=["token_hash", "token_prefix"])
            self._show_token(request, agent, token)


@admin.register(Image)
class ImageAdmin(admin.ModelAdmin):
    form = ImageForm
    list_display = ["reference", "display_name", "is_active", "supports_ssh", "min_slots"]
    list_filter = ["is_active", "supports_ssh"]
    search_fields = ["reference", "display_name"]
    filter_horizontal = ["allowed_groups"]


class UserResourcePolicyInline(admin.TabularInline):
    model = UserResourcePolicy
    extra = 0
    autocomplete_fields = ["user"]


@admin.register(ResourcePolicy)
class ResourcePolicyAdmin(admin.ModelAdmin):
    form = ResourcePolicyForm
    list_display = [
        "name",
        "is_default",
        "total_resource_slots",
        "max_concurrent_sessions",
        "max_pending_sessions",
        "max_containers_per_session",
        "idle_timeout",
        "max_session_lifetime",
    ]
    filter_horizontal = ["allowed_resource_groups"]
    inlines = [UserResourcePolicyInline]


@admin.register(UserResourcePolicy)
class UserResourcePolicyAdmin(admin.ModelAdmin):
    list_display = ["user", "policy"]
    autocomplete_fields = ["user"]


class KernelInline(ReadOnlyInline):
    model = Kernel
    fields = [
        "cluster_hostname",
        "cluster_role",
        "agent",
        "status",
        "status_reason",
        "exit_code",
        "container_id",
    ]
    readonly_fields = fields


class EventInline(ReadOnlyInline):
    model = SessionEvent
    fields = ["created_at", "kernel", "from_status", "to_status", "reason"]
    readonly_fields = fields
    show_change_link = False


@admin.register(Session)
class SessionAdmin(admin.ModelAdmin):
    list_display = [
        "name",
        "short_id",
        "owner",
        "session_type",
        "status",
        "status_reason",
        "cluster_mode",
        "cluster_size",
        "resource_group",
        "scheduling_attempts",
        "created_at",
    ]
    list_filter = ["status", "session_type", "cluster_mode", "resource_group"]
    search_fields = ["name", "id", "owner__username"]
    list_select_related = ["owner", "resource_group"]
    inlines = [KernelInline, EventInline]
    actions = ["terminate_sessions"]
    readonly_fields = [
        "id",
        "owner",
        "name",
        "session_type",
        "status",
        "status_reason",
        "status_changed_at",
        "cluster_mode",
        "cluster_size",
        "requested_slots",
        "image",
        "resource_group",
        "template",
        "environ",
        "startup_command",
        "starts_at",
        "batch_timeout",
        "result",
        "exit_code",
        "scheduling_attempts",
        "designated_agents",
        "created_at",
        "scheduled_at",
        "started_at",
        "terminated_at",
        "last_activity_at",
    ]
    exclude = ["mounts", "depends_on"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # sessions are launched through the API or the launch dialog

    @admin.action(description="Terminate the selected sessions")
    def terminate_sessions(self, request: HttpRequest, queryset: QuerySet[Session]) -> None:
        done = 0
        for session in queryset:
            try:
                services.session_terminate(
                    session=session, reason=f"terminated by admin {request.user}"
                )
                done += 1
            except ApplicationError as exc:
                self.message_user(request, f"{session}: {exc.message}", messages.WARNING)
        if done:
            self.message_user(request, f"Terminating {done} session(s).", messages.SUCCESS)


@admin.register(Kernel)
class KernelAdmin(admin.ModelAdmin):
    list_display = ["cluster_hostname", "session", "agent", "status", "status_reason", "exit_code"]
    list_filter = ["status", "cluster_role"]
    search_fields = ["id", "session__name", "container_id"]
    list_select_related = ["session", "agent"]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return [f.name for f in Kernel._meta.fields]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False


@admin.register(SessionEvent)
class SessionEventAdmin(admin.ModelAdmin):
    """Append-only: viewable, never edited."""

    list_display = ["created_at", "session", "kernel", "from_status", "to_status", "reason"]
    list_filter = ["to_status"]
    search_fields = ["session__name", "reason"]
    list_select_related = ["session", "kernel"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class SessionTemplateForm(forms.ModelForm):
    class Meta:
        model = SessionTemplate
        fields = ["owner", "name", "description", "is_shared", "spec"]

    def clean_spec(self) -> Any:
        try:
            return validate_template_spec(self.cleaned_data["spec"])
        except InvalidInput as exc:
            raise forms.ValidationError(exc.message) from None


@admin.register(SessionTemplate)
class SessionTemplateAdmin(admin.ModelAdmin):
    form = SessionTemplateForm
    list_display = ["name", "owner", "is_shared", "updated_at"]
    list_filter = ["is_shared"]
    search_fields = ["name"]


@admin.register(DataFolder)
class DataFolderAdmin(admin.ModelAdmin):
    list_display = ["name", "owner", "created_at"]
    search_fields = ["name", "owner__username"]


# knox's own admin lists tokens by digest and offers to make one: ours lists
# them by prefix and expiry and only revokes (a token is made by its owner).
if admin.site.is_registered(AuthToken):
    admin.site.unregister(AuthToken)


@admin.register(AuthToken)
class AuthTokenAdmin(admin.ModelAdmin):
    list_display = ["prefix", "user", "created", "expiry", "expired"]
    list_select_related = ["user"]
    search_fields = ["user__username", "token_key"]
    ordering = ["-created"]
    fields = ["prefix", "user", "created", "expiry"]
    readonly_fields = fields
    actions = ["revoke_tokens"]

    @admin.display(description="token")
    def prefix(self, obj: AuthToken) -> str:
        return f"{token_prefix(obj)}…"

    @admin.display(boolean=True)
    def expired(self, obj: AuthToken) -> bool:
        return token_is_expired(obj)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.action(description="Revoke the selected tokens", permissions=["delete"])
    def revoke_tokens(self, request: HttpRequest, queryset: QuerySet[AuthToken]) -> None:
        count, _ = queryset.delete()
        self.message_user(request, f"Revoked {count} token(s).", messages.SUCCESS)
