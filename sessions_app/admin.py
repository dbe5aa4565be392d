"""Django admin for every model. Statuses are never edited here: ending a
session is an action that goes through the same service as the API. Sessions,
kernels and events are never deleted here: they are the audit history.

Slots and durations are typed and shown with units (``sessions_app.forms``).
"""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.auth import get_user_model
from django.contrib.auth.admin import UserAdmin
from django.db import models
from django.db.models import QuerySet
from django.forms.utils import pretty_name
from django.http import HttpRequest
from django.utils import timezone
from django.utils.formats import date_format
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from knox.models import AuthToken

from bai_common import units

from . import agent_selectors, services
from .errors import ApplicationError, InvalidInput
from .forms import (
    ADMIN_CSS,
    DurationInput,
    KeyValueOptionsField,
    ServicePortsField,
    SessionTypesField,
    SizeInput,
    SlotsField,
    slot_unit,
    slots_text,
)
from .models import (
    Agent,
    DataFolder,
    ExecutionRun,
    FolderShare,
    Image,
    Kernel,
    ResourceGroup,
    ResourcePolicy,
    ResourcePreset,
    Session,
    SessionEvent,
    SessionTemplate,
    SessionType,
    SSHKey,
    UserResourcePolicy,
)
from .templates import validate_template_spec
from .tokens import token_is_expired, token_prefix

# Durations are typed and shown as 30m, 8h, 1d (every DurationField of a model admin).
DURATIONS = {models.DurationField: {"form_class": DurationInput}}


class ReadOnlyInline(admin.TabularInline):
    extra = 0
    can_delete = False
    show_change_link = True

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class AuditHistory:
    """Sessions, kernels and events are the audit history: viewable, never deleted here
    (a deleted session would take its kernels and events with it). The pages say so."""

    change_form_template = "admin/sessions_app/audit_change_form.html"
    change_list_template = "admin/sessions_app/audit_change_list.html"

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    class Media:
        css = ADMIN_CSS


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
class ResourceGroupListForm(forms.ModelForm):
    """The changelist's form (``agent_selection`` is list-editable there) and the base of the
    page's: every check works with or without the options field."""

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


class ResourceGroupForm(ResourceGroupListForm):
    """A group's page: session types as checkboxes, the selector's options as lines."""

    allowed_session_types = SessionTypesField(
        label="Allowed session types", choices=SessionType.choices
    )
    agent_selector_options = KeyValueOptionsField(
        label="Agent selector options",
        help_text="The selector checks them; the built-ins take none.",
    )


# Slots typed by an admin are checked and stored as exact decimal strings ("2g"
# becomes bytes): a typo here would otherwise break every launch that reads them.
class ImageForm(forms.ModelForm):
    min_slots = SlotsField(label="Minimum per container", empty_means="Empty: no minimum.")
    service_ports = ServicePortsField(label="Apps (service ports)")


class ResourcePolicyForm(forms.ModelForm):
    total_resource_slots = SlotsField(
        label="Total resource slots",
        empty_means="The most a user may hold at once, over all their sessions. Empty: unlimited.",
    )
    max_folder_bytes = SizeInput(
        label="Max size of all folders",
        required=False,
        help_text="Over all the user's own folders. Empty: unlimited.",
    )


class ResourcePresetForm(forms.ModelForm):
    resource_slots = SlotsField(label="Resources per container", required_slots=("cpu", "mem"))


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
    formfield_overrides = DURATIONS
    list_display = [
        "name",
        "is_active",
        "session_selection",
        "num_retries_to_skip",
        "agent_selection",
        "selector_options",
        "session_types",
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

    @admin.display(description="agent selector options")
    def selector_options(self, obj: ResourceGroup) -> str:
        options = obj.agent_selector_options
        if not isinstance(options, dict) or not options:
            return "none"
        return ", ".join(f"{key} = {value}" for key, value in options.items())

    @admin.display(description="session types")
    def session_types(self, obj: ResourceGroup) -> str:
        types = obj.allowed_session_types
        return ", ".join(map(str, types)) if isinstance(types, list) and types else "none"

    def get_changelist_form(self, request: HttpRequest, **kwargs: Any) -> Any:
        # The installed selectors' select, and the options check, in the list too.
        kwargs.setdefault("form", ResourceGroupListForm)
        return _cells_named(super().get_changelist_form(request, **kwargs))


# The slots the agents list shows as bars, in this order.
USAGE_SLOTS = ("cpu", "mem", "cuda.device")
USAGE_NAMES = {"cpu": "cpu", "mem": "mem", "cuda.device": "gpu"}


def _amount(slots: dict[str, Any], slot: str) -> Decimal:
    try:
        return Decimal(str(slots.get(slot) or 0))
    except ArithmeticError:
        return Decimal(0)


def _used_of(slot: str, used: Decimal, total: Decimal) -> str:
    """``2.5 / 8 cores``, ``1 / 23.5 GiB`` (the unit once when both share it), ``1 / 2``."""
    if slot == "mem":
        used_text, total_text = units.format_size_shown(used), units.format_size_shown(total)
        number, _, unit = used_text.partition(" ")
        if used == 0 or total_text.endswith(f" {unit}"):
            used_text = number
        return f"{used_text} / {total_text}"
    used_text, total_text = units.format_amount(slot, used), units.format_amount(slot, total)
    unit = slot_unit(slot)
    return f"{used_text} / {total_text} {unit}" if unit else f"{used_text} / {total_text}"


def usage_bars(capacity: dict[str, Any], occupied: dict[str, Any]) -> SafeString:
    """Used of capacity per slot, as ``<meter>`` bars with the figures beside them
    (attributes only, no inline style: the pages run under a strict CSP)."""
    rows = []
    for slot in USAGE_SLOTS:
        total, used = _amount(capacity, slot), _amount(occupied, slot)
        name = USAGE_NAMES[slot]
        if total <= 0:
            rows.append(
                format_html(
                    '<span class="bai-usage-name">{}</span><span></span>'
                    '<span class="bai-usage-text bai-none">none</span>',
                    name,
                )
            )
            continue
        text = _used_of(slot, used, total)
        rows.append(
            format_html(
                '<span class="bai-usage-name">{}</span>'
                '<meter min="0" max="{}" value="{}" low="{}" high="{}" optimum="0" title="{}">'
                "</meter>"
                '<span class="bai-usage-text">{}</span>',
                name,
                units.format_decimal(total),
                units.format_decimal(min(used, total)),
                units.format_decimal(total * Decimal("0.7")),
                units.format_decimal(total * Decimal("0.9")),
                f"{name} in use: {text}",
                text,
            )
        )
    return format_html(
        '<div class="bai-usage">{}</div>', format_html_join("", "{}", ((r,) for r in rows))
    )


@admin.register(Agent)
class AgentAdmin(admin.ModelAdmin):
    list_display = [
        "id",
        "resource_group",
        "state",
        "backend",
        "hostname",
        "usage",
        "heartbeat",
    ]
    list_filter = ["status", "schedulable", "resource_group", "backend"]
    search_fields = ["id", "hostname"]
    # The agent reports its capacity when it registers; what is occupied is the
    # manager's to count. Neither is typed here.
    exclude = ["capacity_slots"]
    readonly_fields = [
        "status",
        "status_reason",
        "backend",
        "hostname",
        "version",
        "capacity",
        "usage",
        "token_prefix",
        "first_contact_at",
        "last_heartbeat_at",
        "lost_at",
        "created_at",
    ]
    actions = ["regenerate_token"]

    class Media:
        css = ADMIN_CSS

    @admin.display(description="capacity")
    def capacity(self, obj: Agent) -> str:
        return slots_text(obj.capacity_slots, empty="not reported yet")

    @admin.display(description="used / capacity")
    def usage(self, obj: Agent) -> SafeString:
        return usage_bars(obj.capacity_slots or {}, obj.occupied_slots or {})

    @admin.display(description="status", ordering="status")
    def state(self, obj: Agent) -> str:
        """The status, and whether it is drained (one column: the list fits a laptop)."""
        if obj.schedulable:
            return obj.get_status_display()
        return format_html(
            '{}<span class="bai-sub">not schedulable</span>', obj.get_status_display()
        )

    @admin.display(description="last heartbeat", ordering="last_heartbeat_at")
    def heartbeat(self, obj: Agent) -> str:
        """How long ago (``12 s ago``), the time itself on hover: narrow enough for the list."""
        if obj.last_heartbeat_at is None:
            return "never"
        age = max(timezone.now() - obj.last_heartbeat_at, timedelta(0))
        return format_html(
            '<time datetime="{}" title="{}">{} ago</time>',
            obj.last_heartbeat_at.isoformat(),
            date_format(timezone.localtime(obj.last_heartbeat_at), "DATETIME_FORMAT"),
            units.format_duration(timedelta(seconds=int(age.total_seconds()))),
        )

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
    list_display = ["reference", "display_name", "is_active", "supports_ssh", "minimum"]
    list_filter = ["is_active", "supports_ssh"]
    search_fields = ["reference", "display_name"]
    filter_horizontal = ["allowed_groups"]

    @admin.display(description="minimum per container")
    def minimum(self, obj: Image) -> str:
        return slots_text(obj.min_slots)


class UserResourcePolicyForm(forms.ModelForm):
    """The user is the row's primary key: it is chosen when the row is added and
    shown read-only afterwards. (Changing it on an existing row would write a row
    for the new user and leave the old one as it was.)"""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if "user" in self.fields and not self.instance._state.adding:
            self.fields["user"].disabled = True
            self.fields[
                "user"
            ].help_text = "To move the policy to another user, delete this row and add one."


class UserResourcePolicyFormSet(forms.BaseInlineFormSet):
    def delete_existing(self, obj: UserResourcePolicy, commit: bool = True) -> None:
        user = obj.user
        super().delete_existing(obj, commit=commit)
        # delete() clears the primary key, which is the user; the change message
        # (the admin's history) still names whose assignment was removed.
        obj.user = user


class UserResourcePolicyInline(admin.TabularInline):
    model = UserResourcePolicy
    form = UserResourcePolicyForm
    formset = UserResourcePolicyFormSet
    extra = 0
    autocomplete_fields = ["user"]
    verbose_name = "user with this policy"
    verbose_name_plural = "users with this policy"


@admin.register(ResourcePolicy)
class ResourcePolicyAdmin(admin.ModelAdmin):
    form = ResourcePolicyForm
    formfield_overrides = DURATIONS
    list_display = [
        "name",
        "is_default",
        "total_slots",
        "max_concurrent_sessions",
        "max_pending_sessions",
        "max_containers_per_session",
        "max_endpoints",
        "idle",
        "lifetime",
    ]
    filter_horizontal = ["allowed_resource_groups"]
    inlines = [UserResourcePolicyInline]

    @admin.display(description="total resource slots")
    def total_slots(self, obj: ResourcePolicy) -> str:
        return slots_text(obj.total_resource_slots, empty="unlimited")

    @admin.display(description="idle timeout", ordering="idle_timeout")
    def idle(self, obj: ResourcePolicy) -> str:
        return units.format_duration(obj.idle_timeout) if obj.idle_timeout else "never"

    @admin.display(description="max session lifetime", ordering="max_session_lifetime")
    def lifetime(self, obj: ResourcePolicy) -> str:
        if obj.max_session_lifetime:
            return units.format_duration(obj.max_session_lifetime)
        return "unlimited"


@admin.register(UserResourcePolicy)
class UserResourcePolicyAdmin(admin.ModelAdmin):
    form = UserResourcePolicyForm
    list_display = ["user", "policy"]
    list_select_related = ["user", "policy"]
    autocomplete_fields = ["user"]
    search_fields = ["user__username"]


class UserPolicyInline(admin.StackedInline):
    """A user's resource policy, set on the user's own page."""

    model = UserResourcePolicy
    formset = UserResourcePolicyFormSet
    fields = ["policy"]
    max_num = 1
    can_delete = True
    verbose_name = "resource policy"
    verbose_name_plural = "resource policy"

    def get_formset(self, request: HttpRequest, obj: Any = None, **kwargs: Any) -> Any:
        formset = super().get_formset(request, obj, **kwargs)
        default = ResourcePolicy.objects.filter(is_default=True).first()
        fallback = f"the default policy ({default.name})" if default else "no policy (no limits)"
        formset.form.base_fields[
            "policy"
        ].help_text = f"Without one, {fallback} applies. Delete the row to go back to it."
        return formset


User = get_user_model()
if admin.site.is_registered(User):
    admin.site.unregister(User)


@admin.register(User)
class UserWithPolicyAdmin(UserAdmin):
    inlines = [*UserAdmin.inlines, UserPolicyInline]
    # Set by the system, not typed: shown as text (Django's split date/time
    # inputs for them carry no labels a screen reader can read).
    readonly_fields = ["last_login", "date_joined"]


@admin.register(ResourcePreset)
class ResourcePresetAdmin(admin.ModelAdmin):
    form = ResourcePresetForm
    list_display = ["name", "resources", "resource_group", "order", "description"]
    list_editable = ["order"]
    list_filter = ["resource_group"]
    list_select_related = ["resource_group"]
    search_fields = ["name", "description"]
    fields = ["name", "description", "resource_slots", "resource_group", "order"]

    class Media:
        css = ADMIN_CSS

    def get_changelist_form(self, request: HttpRequest, **kwargs: Any) -> Any:
        return _cells_named(super().get_changelist_form(request, **kwargs))

    @admin.display(description="per container")
    def resources(self, obj: ResourcePreset) -> str:
        return slots_text(obj.resource_slots)


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
class SessionAdmin(AuditHistory, admin.ModelAdmin):
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
        "resources",
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
    exclude = ["mounts", "depends_on", "requested_slots"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # sessions are launched through the API or the launch dialog

    @admin.display(description="resources per container")
    def resources(self, obj: Session) -> str:
        return slots_text(obj.requested_slots)

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
class KernelAdmin(AuditHistory, admin.ModelAdmin):
    list_display = ["cluster_hostname", "session", "agent", "status", "status_reason", "exit_code"]
    list_filter = ["status", "cluster_role"]
    search_fields = ["id", "session__name", "container_id"]
    list_select_related = ["session", "agent"]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return [f.name for f in Kernel._meta.fields]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False


@admin.register(SessionEvent)
class SessionEventAdmin(AuditHistory, admin.ModelAdmin):
    """Append-only: viewable, never edited."""

    list_display = ["created_at", "session", "kernel", "from_status", "to_status", "reason"]
    list_filter = ["to_status"]
    search_fields = ["session__name", "reason"]
    list_select_related = ["session", "kernel"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(ExecutionRun)
class ExecutionRunAdmin(AuditHistory, admin.ModelAdmin):
    """Who ran code where, when, and how it ended (never the code or its output)."""

    list_display = ["run_id", "session", "user", "mode", "outcome", "exit_code", "started_at"]
    list_filter = ["status", "mode"]
    search_fields = ["run_id", "session__name", "user__username"]
    list_select_related = ["session", "user"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
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


class FolderShareForm(forms.ModelForm):
    class Meta:
        model = FolderShare
        fields = ["folder", "user", "permission"]

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        folder, user = data.get("folder"), data.get("user")
        if folder is not None and user is not None and folder.owner_id == user.pk:
            raise forms.ValidationError("A folder is not shared with its own owner.")
        return data


@admin.register(FolderShare)
class FolderShareAdmin(admin.ModelAdmin):
    """Who may see and mount whose folder. Revoking affects sessions started from then on."""

    form = FolderShareForm
    list_display = ["folder", "user", "permission", "created_at"]
    list_filter = ["permission"]
    list_select_related = ["folder__owner", "user"]
    search_fields = ["folder__name", "folder__owner__username", "user__username"]


@admin.register(SSHKey)
class SSHKeyAdmin(admin.ModelAdmin):
    """Users' public keys for their SFTP sessions: added by their owners (the API checks
    each key), listed and deleted here."""

    list_display = ["name", "owner", "fingerprint", "created_at"]
    list_select_related = ["owner"]
    search_fields = ["name", "owner__username", "fingerprint"]
    fields = ["owner", "name", "fingerprint", "public_key", "created_at"]
    readonly_fields = fields

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False


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
