"""Every model of the platform.

Status fields are changed only by the ``mark_*`` transition methods, which
check the transition table, set every dependent field together, persist with a
compare-and-swap (exactly one row updated) and append a SessionEvent. Models
push nothing: the services that move a status queue the live push after commit
(``live.status_changed``).
"""

from __future__ import annotations

import hashlib
import logging
import secrets
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models, transaction
from django.db.models import Q
from django.utils import timezone

from bai_common.units import format_decimal

from .service_ports import declaration_errors

logger = logging.getLogger(__name__)


# --- statuses ----------------------------------------------------------------


class Status(models.TextChoices):
    """Shared by sessions and kernels."""

    PENDING = "PENDING"
    SCHEDULED = "SCHEDULED"
    PREPARING = "PREPARING"
    PULLING = "PULLING"
    RUNNING = "RUNNING"
    TERMINATING = "TERMINATING"
    TERMINATED = "TERMINATED"
    ERROR = "ERROR"
    CANCELLED = "CANCELLED"


S = Status
TERMINAL = frozenset({S.TERMINATED, S.ERROR, S.CANCELLED})
ACTIVE = frozenset(set(S) - TERMINAL)
# Statuses in which a kernel holds resources on its agent.
OCCUPYING = frozenset({S.SCHEDULED, S.PREPARING, S.PULLING, S.RUNNING, S.TERMINATING})

# One table for both: a session's status is derived from its kernels' and so
# must be able to follow any move a kernel makes.
TRANSITIONS: dict[str, frozenset[str]] = {
    S.PENDING: frozenset({S.SCHEDULED, S.CANCELLED, S.ERROR}),
    S.SCHEDULED: frozenset({S.PREPARING, S.PULLING, S.RUNNING, S.TERMINATING, S.ERROR}),
    S.PREPARING: frozenset({S.PULLING, S.RUNNING, S.TERMINATING, S.ERROR}),
    S.PULLING: frozenset({S.PREPARING, S.RUNNING, S.TERMINATING, S.ERROR}),
    S.RUNNING: frozenset({S.TERMINATING, S.TERMINATED, S.ERROR}),
    S.TERMINATING: frozenset({S.TERMINATED, S.ERROR}),
    S.TERMINATED: frozenset(),
    S.ERROR: frozenset(),
    S.CANCELLED: frozenset(),
}

# Order of progress while starting; used to derive a session's status.
_START_ORDER = [S.PENDING, S.SCHEDULED, S.PREPARING, S.PULLING, S.RUNNING]


def can_transition(src: str, dst: str) -> bool:
    return dst in TRANSITIONS.get(src, frozenset())


def derive_session_status(main: str, kernels: list[str]) -> str:
    """A session's status from its kernels' (CONCEPTS.md, Lifecycle).

    It follows ``main1``; it is RUNNING only when every kernel runs; when any
    kernel ended or is ending while others live, the session is TERMINATING.
    """
    if all(k in TERMINAL for k in kernels):
        if all(k == S.CANCELLED for k in kernels):
            return S.CANCELLED
        return S.ERROR if main == S.ERROR else S.TERMINATED
    if any(k in TERMINAL or k == S.TERMINATING for k in kernels):
        return S.TERMINATING
    return min(kernels, key=_START_ORDER.index)


class SessionType(models.TextChoices):
    INTERACTIVE = "interactive"
    BATCH = "batch"
    INFERENCE = "inference"
    SYSTEM = "system"


class ClusterMode(models.TextChoices):
    SINGLE_NODE = "single-node", "Single Node"
    MULTI_NODE = "multi-node", "Multi Node"


class Result(models.TextChoices):
    UNDEFINED = "UNDEFINED"
    SUCCESS = "SUCCESS"
    FAILED = "FAILED"


# --- resource groups, agents, images ----------------------------------------


class SessionSelection(models.TextChoices):
    FIFO = "fifo", "FIFO (oldest first)"
    LIFO = "lifo", "LIFO (newest first)"
    DRF = "drf", "DRF (dominant resource fairness)"


def _all_session_types() -> list[str]:
    return [t.value for t in SessionType]


class ResourceGroup(models.Model):
    name = models.SlugField(max_length=64, unique=True)
    description = models.CharField(max_length=255, blank=True)
    is_active = models.BooleanField(default=True)
    session_selection = models.CharField(
        max_length=16, choices=SessionSelection.choices, default=SessionSelection.FIFO
    )
    num_retries_to_skip = models.PositiveIntegerField(
        default=0,
        help_text="FIFO head-of-line blocking avoidance: a session that failed to fit more "
        "than this many times is pushed behind the others. 0 turns it off.",
    )
    # Any registered agent selector (sessions_app.agent_selectors): the built-ins or a plugin.
    agent_selection = models.CharField(
        max_length=64,
        default="concentrated",
        help_text="The agent selector: a built-in or an installed plugin.",
    )
    agent_selector_options = models.JSONField(
        default=dict,
        blank=True,
        help_text='Options for the agent selector, as a JSON object (e.g. {"prefix": "gpu-"}); '
        "the selector checks them. The built-ins take none.",
    )
    allowed_session_types = models.JSONField(default=_all_session_types)
    pending_timeout = models.DurationField(
        null=True,
        blank=True,
        help_text="Cancel sessions pending longer than this. Empty or 0: never.",
    )
    roundrobin_cursor = models.PositiveIntegerField(default=0, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(
                condition=Q(pending_timeout__isnull=True) | Q(pending_timeout__gte=timedelta(0)),
                name="resource_group_pending_timeout_not_negative",
                violation_error_message="A pending timeout cannot be negative "
                "(empty or 0: no timeout).",
            ),
        ]

    def __str__(self) -> str:
        return self.name


class AgentStatus(models.TextChoices):
    ALIVE = "ALIVE"
    LOST = "LOST"
    TERMINATED = "TERMINATED"


class Backend(models.TextChoices):
    DOCKER = "docker"
    PROCESS = "process"


def hash_token(token: str) -> str:
    # Tokens are 32 random bytes, so a plain SHA-256 is enough: no dictionary
    # to attack, and the lookup stays an indexed equality.
    return hashlib.sha256(token.encode()).hexdigest()


class Agent(models.Model):
    """A node that runs kernels. Created by an admin with a token; the agent
    process dials in with that token and reports its capacity."""

    id = models.SlugField(max_length=64, primary_key=True)
    resource_group = models.ForeignKey(
        ResourceGroup, on_delete=models.PROTECT, related_name="agents"
    )
    status = models.CharField(max_length=16, choices=AgentStatus.choices, default=AgentStatus.LOST)
    status_reason = models.CharField(max_length=255, blank=True)
    schedulable = models.BooleanField(default=True, help_text="Untick to drain the agent.")
    backend = models.CharField(max_length=16, choices=Backend.choices, blank=True)
    hostname = models.CharField(max_length=255, blank=True)
    version = models.CharField(max_length=64, blank=True)
    capacity_slots = models.JSONField(default=dict, blank=True)
    occupied_slots = models.JSONField(default=dict, blank=True, editable=False)
    labels = models.JSONField(default=dict, blank=True)
    token_hash = models.CharField(max_length=64, unique=True, editable=False)
    token_prefix = models.CharField(max_length=8, editable=False)
    first_contact_at = models.DateTimeField(null=True, blank=True)
    last_heartbeat_at = models.DateTimeField(null=True, blank=True)
    lost_at = models.DateTimeField(null=True, blank=True)
    # Counts the agent's registrations: each connection keeps the number it got, and the
    # gateway closes any connection whose number is no longer the newest (two registering
    # at once with the same token keep one; scheduler_app.consumers).
    connection_generation = models.PositiveBigIntegerField(default=0, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return self.id

    def set_new_token(self) -> str:
        """Give the agent a fresh token; returns it (shown once, stored hashed)."""
        # Hex: never starts with "-", so it is safe as a command-line value.
        token = secrets.token_hex(32)
        self.token_hash = hash_token(token)
        self.token_prefix = token[:8]
        return token


def validate_service_ports(value: Any) -> None:
    errors = declaration_errors(value)
    if errors:
        raise ValidationError(errors)


class Image(models.Model):
    reference = models.CharField(max_length=255, unique=True)
    display_name = models.CharField(max_length=128, blank=True)
    description = models.CharField(max_length=255, blank=True)
    is_active = models.BooleanField(default=True)
    allowed_groups = models.ManyToManyField(
        ResourceGroup, blank=True, help_text="Empty: allowed in every resource group."
    )
    min_slots = models.JSONField(
        default=dict, blank=True, help_text='e.g. {"cpu": "1", "mem": "268435456"}'
    )
    supports_ssh = models.BooleanField(default=False)
    service_ports = models.JSONField(
        default=list,
        blank=True,
        validators=[validate_service_ports],
        help_text=(
            'The apps of main1, e.g. [{"name": "jupyter", "protocol": "http", "port": 8888, '
            '"start_command": "..."}]; protocol http or tcp; a start command starts the app '
            "on demand (with $BAI_APP_BIND, $BAI_APP_PORT and $BAI_APP_TOKEN set)."
        ),
    )
    serve_command = models.TextField(
        blank=True,
        max_length=2048,
        help_text=(
            "The model server an inference endpoint's replicas run when the endpoint gives no "
            "start command (it listens on $BAI_SERVE_PORT). Empty: endpoints must give one."
        ),
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["reference"]

    def __str__(self) -> str:
        return self.reference


# --- quotas -----------------------------------------------------------------


class ResourcePolicy(models.Model):
    """A user's quota. One policy is the default; users may be given another."""

    name = models.CharField(max_length=64, unique=True)
    is_default = models.BooleanField(default=False)
    total_resource_slots = models.JSONField(
        default=dict, blank=True, help_text="Per slot; a slot not listed is unlimited."
    )
    max_concurrent_sessions = models.PositiveIntegerField(null=True, blank=True)
    max_pending_sessions = models.PositiveIntegerField(null=True, blank=True)
    max_containers_per_session = models.PositiveIntegerField(default=8)
    idle_timeout = models.DurationField(null=True, blank=True, help_text="Empty: never.")
    max_session_lifetime = models.DurationField(
        null=True, blank=True, help_text="Empty: unlimited."
    )
    allowed_resource_groups = models.ManyToManyField(
        ResourceGroup, blank=True, help_text="Empty: every resource group."
    )
    max_concurrent_sftp_sessions = models.PositiveIntegerField(default=1)
    # Storage quota over all the user's own folders (shared folders count for their owner).
    max_folders = models.PositiveIntegerField(null=True, blank=True, help_text="Empty: unlimited.")
    max_folder_bytes = models.PositiveBigIntegerField(
        null=True, blank=True, help_text="Bytes over all the user's folders. Empty: unlimited."
    )
    # Inference endpoints the user may own at once. Their replicas are sessions of the user
    # and count against the session limits above like any other.
    max_endpoints = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="Inference endpoints a user may own at once (their replicas count as the "
        "user's sessions). Empty: unlimited.",
    )

    class Meta:
        ordering = ["name"]
        verbose_name_plural = "resource policies"
        constraints = [
            models.UniqueConstraint(
                fields=["is_default"], condition=Q(is_default=True), name="one_default_policy"
            ),
            models.CheckConstraint(
                condition=Q(max_containers_per_session__gte=1),
                name="policy_containers_at_least_one",
            ),
        ]

    def __str__(self) -> str:
        return self.name


class UserResourcePolicy(models.Model):
    """A per-user override of the default resource policy."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL,
        on_delete=models.CASCADE,
        primary_key=True,
        related_name="resource_policy",
    )
    policy = models.ForeignKey(ResourcePolicy, on_delete=models.PROTECT, related_name="assignments")

    class Meta:
        verbose_name = "user resource policy"
        verbose_name_plural = "user resource policies"

    def __str__(self) -> str:
        return f"{self.user} → {self.policy}"


class ResourcePreset(models.Model):
    """A named size that admins define ("small: 1 CPU, 2 GiB"), offered in the launch dialog.

    ``resource_slots`` are per container, like a launch's ``resources``; an empty
    ``resource_group`` offers the preset in every group.
    """

    name = models.CharField(max_length=64, unique=True)
    description = models.CharField(max_length=255, blank=True)
    resource_slots = models.JSONField(default=dict, help_text="Per container.")
    resource_group = models.ForeignKey(
        ResourceGroup,
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        related_name="presets",
        help_text="Empty: offered in every resource group.",
    )
    order = models.PositiveIntegerField(
        default=0, help_text="Presets are listed by this, then name."
    )

    class Meta:
        ordering = ["order", "name"]

    def __str__(self) -> str:
        return self.name


# --- data folders and templates --------------------------------------------


class DataFolder(models.Model):
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="folders"
    )
    name = models.SlugField(max_length=64)
    created_at = models.DateTimeField(auto_now_add=True)
    # The bytes last measured on disk (``services.folder_measure``: after each upload, and by
    # the beat sweep while sessions mount it), so kernels' writes, which no filesystem quota
    # stops here, are seen after the fact. Null: never measured.
    measured_bytes = models.BigIntegerField(null=True, blank=True, editable=False)
    measured_at = models.DateTimeField(null=True, blank=True, editable=False)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(fields=["owner", "name"], name="unique_folder_per_owner")
        ]

    def __str__(self) -> str:
        return f"{self.owner}/{self.name}"

    @property
    def host_path(self) -> Path:
        return Path(settings.BAI_STORAGE_ROOT) / f"u{self.owner_id}" / self.name


class FolderPermission(models.TextChoices):
    READ_ONLY = "ro", "read-only"
    READ_WRITE = "rw", "read-write"


class FolderShare(models.Model):
    """The owner lets another user see and mount a folder. Revoking affects
    sessions created afterwards: a running session keeps the mount it got."""

    folder = models.ForeignKey(DataFolder, on_delete=models.CASCADE, related_name="shares")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="folder_shares"
    )
    permission = models.CharField(
        max_length=2, choices=FolderPermission.choices, default=FolderPermission.READ_ONLY
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["folder", "user"]
        constraints = [
            models.UniqueConstraint(fields=["folder", "user"], name="unique_share_per_user")
        ]

    def __str__(self) -> str:
        return f"{self.folder} → {self.user} ({self.permission})"


class SSHKey(models.Model):
    """A public key a user registers in their profile; it may log in to their SFTP sessions."""

    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="ssh_keys"
    )
    name = models.CharField(max_length=64)
    public_key = models.TextField()
    fingerprint = models.CharField(max_length=128, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["owner", "name"]
        verbose_name = "SSH key"
        constraints = [
            models.UniqueConstraint(fields=["owner", "name"], name="unique_ssh_key_name"),
            models.UniqueConstraint(fields=["owner", "fingerprint"], name="unique_ssh_key"),
        ]

    def __str__(self) -> str:
        return f"{self.owner}: {self.name}"


class SessionTemplate(models.Model):
    """A named, stored set of launch parameters. ``spec`` is validated by
    sessions_app.templates before it is saved."""

    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.CASCADE,
        related_name="templates",
        null=True,
        blank=True,
        help_text="Empty: a shared template owned by the admins.",
    )
    name = models.CharField(max_length=64)
    description = models.CharField(max_length=255, blank=True)
    is_shared = models.BooleanField(default=False, help_text="Visible to every user.")
    spec = models.JSONField(default=dict)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(fields=["owner", "name"], name="unique_template_per_owner")
        ]

    def __str__(self) -> str:
        return self.name


# --- sessions, kernels, events ----------------------------------------------


def _transition_values(dst: str, reason: str, now: Any, fields: dict[str, Any]) -> dict[str, Any]:
    """Every field a move to ``dst`` sets together."""
    values: dict[str, Any] = {"status": dst, "status_reason": reason, "status_changed_at": now}
    if dst == S.SCHEDULED:
        values["scheduled_at"] = now
    elif dst == S.RUNNING:
        values["started_at"] = now
    elif dst in TERMINAL:
        values["terminated_at"] = now
    values.update(fields)
    return values


def _alters_data(method: Any) -> Any:
    """Templates never call it (Django's ``alters_data``)."""
    method.alters_data = True
    return method


class _Transitions(models.Model):
    """Compare-and-swap status transitions shared by sessions and kernels."""

    status = models.CharField(
        max_length=16, choices=Status.choices, default=Status.PENDING, db_index=True
    )
    status_reason = models.CharField(max_length=500, blank=True)
    status_changed_at = models.DateTimeField(default=timezone.now)
    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    scheduled_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    terminated_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        abstract = True

    @_alters_data
    def transition(self, dst: str, reason: str, *, now: Any = None, **fields: Any) -> bool:
        """Move to ``dst`` if the table allows it and nobody moved first.

        Returns whether this call won. Refuses (ValueError) a move the table
        does not allow from the status this object was loaded with.
        """
        src = self.status
        if not can_transition(src, dst):
            raise ValueError(
                f"illegal transition {src} → {dst} for {self._meta.model_name} {self.pk}"
            )
        now = now or timezone.now()
        reason = reason[:500]  # the status and its event row hold the same text
        values = _transition_values(dst, reason, now, fields)
        # The status and its event row are written together or not at all.
        with transaction.atomic():
            won = type(self).objects.filter(pk=self.pk, status=src).update(**values) == 1
            if won:
                type(self)._record_events([self.event_key], src, dst, reason, now)
        if won:
            for key, value in values.items():
                setattr(self, key, value)
            logger.info("%s %s: %s → %s (%s)", self._meta.model_name, self.pk, src, dst, reason)
        return won

    @classmethod
    def _record_events(
        cls, keys: list[tuple[Any, Any]], src: str, dst: str, reason: str, now: Any
    ) -> None:
        """The one writer of event rows, for sessions and kernels, one or many."""
        SessionEvent.objects.bulk_create(
            SessionEvent(
                session_id=session_id,
                kernel_id=kernel_id,
                from_status=src,
                to_status=dst,
                reason=reason,
                created_at=now,
            )
            for session_id, kernel_id in keys
        )

    @property
    def event_key(self) -> tuple[Any, Any]:
        """(session id, kernel id or None): whose history an event of this row joins."""
        raise NotImplementedError

    @classmethod
    def _event_keys(cls, ids: list[Any]) -> list[tuple[Any, Any]]:
        raise NotImplementedError

    @classmethod
    @_alters_data
    def bulk_transition(
        cls, ids: list[Any], src: str, dst: str, reason: str, *, now: Any = None, **fields: Any
    ) -> int:
        """The same move for many rows in one statement (the scheduler's hot path).

        Only rows still in ``src`` move. The caller must hold row locks on ``ids``
        (select_for_update) so that every row moves, since the events are
        written for all of them; returns the number of rows moved.
        """
        if not can_transition(src, dst):
            raise ValueError(f"illegal transition {src} → {dst} for {cls._meta.model_name}")
        now = now or timezone.now()
        reason = reason[:500]
        values = _transition_values(dst, reason, now, fields)
        with transaction.atomic():
            moved = cls.objects.filter(pk__in=ids, status=src).update(**values)
            if moved != len(ids):
                raise RuntimeError(
                    f"bulk {src} → {dst}: {moved} of {len(ids)} rows moved; rows were not locked"
                )
            cls._record_events(cls._event_keys(ids), src, dst, reason, now)
        logger.info("%d %s(s): %s → %s (%s)", moved, cls._meta.model_name, src, dst, reason)
        return moved

    # One method per target status, so call sites read as what they do (the
    # scheduler's hot path moves many rows at once with bulk_transition).
    @_alters_data
    def mark_scheduled(self, reason: str, **fields: Any) -> bool:
        return self.transition(S.SCHEDULED, reason, **fields)

    @_alters_data
    def mark_preparing(self, reason: str, **fields: Any) -> bool:
        return self.transition(S.PREPARING, reason, **fields)

    @_alters_data
    def mark_pulling(self, reason: str, **fields: Any) -> bool:
        return self.transition(S.PULLING, reason, **fields)

    @_alters_data
    def mark_running(self, reason: str, **fields: Any) -> bool:
        return self.transition(S.RUNNING, reason, **fields)

    @_alters_data
    def mark_terminating(self, reason: str, **fields: Any) -> bool:
        return self.transition(S.TERMINATING, reason, **fields)

    @_alters_data
    def mark_terminated(self, reason: str, **fields: Any) -> bool:
        return self.transition(S.TERMINATED, reason, **fields)

    @_alters_data
    def mark_error(self, reason: str, **fields: Any) -> bool:
        return self.transition(S.ERROR, reason, **fields)

    @_alters_data
    def mark_cancelled(self, reason: str, **fields: Any) -> bool:
        return self.transition(S.CANCELLED, reason, **fields)

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL


class Session(_Transitions):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="compute_sessions"
    )
    name = models.CharField(max_length=64)
    session_type = models.CharField(
        max_length=16, choices=SessionType.choices, default=SessionType.INTERACTIVE
    )
    cluster_mode = models.CharField(
        max_length=16, choices=ClusterMode.choices, default=ClusterMode.SINGLE_NODE
    )
    cluster_size = models.PositiveIntegerField(default=1)
    # Per container, as requested for main1; sub kernels may differ (templates).
    requested_slots = models.JSONField(default=dict)
    image = models.ForeignKey(Image, on_delete=models.PROTECT, related_name="sessions")
    resource_group = models.ForeignKey(
        ResourceGroup, on_delete=models.PROTECT, related_name="sessions"
    )
    template = models.ForeignKey(SessionTemplate, on_delete=models.SET_NULL, null=True, blank=True)
    environ = models.JSONField(default=dict, blank=True)
    mounts = models.ManyToManyField(DataFolder, blank=True, related_name="sessions")
    # The mounts given read-only (a read-only share at launch): a subset of ``mounts``.
    readonly_mounts = models.ManyToManyField(
        DataFolder, blank=True, related_name="readonly_sessions"
    )
    startup_command = models.TextField(blank=True)
    depends_on = models.ManyToManyField(
        "self", symmetrical=False, blank=True, related_name="dependents"
    )
    starts_at = models.DateTimeField(null=True, blank=True, help_text="Batch: do not start before.")
    batch_timeout = models.DurationField(null=True, blank=True)
    result = models.CharField(max_length=16, choices=Result.choices, default=Result.UNDEFINED)
    exit_code = models.IntegerField(null=True, blank=True)
    scheduling_attempts = models.PositiveIntegerField(default=0)
    # Manual agent designation: an admin pinned the session to these agent ids at launch
    # (empty: any agent of its resource group). The scheduler places it only there.
    designated_agents = models.JSONField(default=list, blank=True)
    last_activity_at = models.DateTimeField(default=timezone.now)
    # The user's own ports opened at launch ("preopen"), reachable like the image's apps.
    preopen_ports = models.JSONField(default=list, blank=True)
    ssh_private_key = models.TextField(blank=True, editable=False)
    ssh_public_key = models.TextField(blank=True, editable=False)

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["resource_group", "status", "created_at"])]
        constraints = [
            models.CheckConstraint(
                condition=Q(cluster_size__gte=1), name="session_cluster_size_positive"
            ),
            models.CheckConstraint(
                condition=Q(cluster_mode__in=[m.value for m in ClusterMode]),
                name="session_cluster_mode_valid",
            ),
            models.CheckConstraint(
                condition=Q(status__in=[s.value for s in Status]), name="session_status_valid"
            ),
            models.UniqueConstraint(
                fields=["owner", "name"],
                condition=~Q(status__in=sorted(s.value for s in TERMINAL)),
                name="unique_active_session_name_per_owner",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({str(self.id)[:8]})"

    @property
    def event_key(self) -> tuple[Any, Any]:
        return (self.pk, None)

    @classmethod
    def _event_keys(cls, ids: list[Any]) -> list[tuple[Any, Any]]:
        return [(pk, None) for pk in ids]

    def main_kernel(self) -> Kernel:
        return self.kernels.get(cluster_role="main")

    @property
    def short_id(self) -> str:
        return str(self.id)[:8]

    def total_slots(self) -> dict[str, str]:
        """All kernels' requested slots together (exact decimal strings): the
        truth of what the session holds, since main1 and the sub kernels may
        differ (per-role templates), so never ``requested_slots`` × size."""
        from decimal import Decimal

        total: dict[str, Decimal] = {}
        for kernel in self.kernels.all():
            for slot, value in kernel.requested_slots.items():
                total[slot] = total.get(slot, Decimal(0)) + Decimal(value)
        return {k: format_decimal(v) for k, v in total.items()}


class KernelRole(models.TextChoices):
    MAIN = "main"
    SUB = "sub"


class Kernel(_Transitions):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="kernels")
    cluster_role = models.CharField(max_length=8, choices=KernelRole.choices)
    cluster_idx = models.PositiveIntegerField()
    local_rank = models.PositiveIntegerField()
    cluster_hostname = models.CharField(max_length=16)
    image = models.CharField(max_length=255)
    requested_slots = models.JSONField(default=dict)
    agent = models.ForeignKey(
        Agent, on_delete=models.SET_NULL, null=True, blank=True, related_name="kernels"
    )
    container_id = models.CharField(max_length=128, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    log_tail = models.TextField(blank=True)
    # An SFTP kernel's server as its agent published it: where users connect, and the
    # fingerprint of the host key they should see (agent/publish.py).
    published_host = models.CharField(max_length=255, blank=True)
    published_port = models.PositiveIntegerField(null=True, blank=True)
    host_key_fingerprint = models.CharField(max_length=128, blank=True)

    class Meta:
        ordering = ["session", "local_rank"]
        indexes = [models.Index(fields=["agent", "status"])]
        constraints = [
            models.UniqueConstraint(
                fields=["session", "cluster_hostname"], name="unique_kernel_hostname"
            ),
            models.UniqueConstraint(fields=["session", "local_rank"], name="unique_kernel_rank"),
            models.UniqueConstraint(
                fields=["session"],
                condition=Q(cluster_role="main"),
                name="one_main_kernel_per_session",
            ),
            models.CheckConstraint(
                condition=Q(cluster_idx__gte=1), name="kernel_cluster_idx_positive"
            ),
            models.CheckConstraint(
                condition=Q(status__in=[s.value for s in Status]), name="kernel_status_valid"
            ),
            models.CheckConstraint(
                condition=Q(agent__isnull=False)
                | Q(status__in=[S.PENDING, S.CANCELLED, S.ERROR, S.TERMINATED]),
                name="placed_kernel_has_agent",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.cluster_hostname} of {self.session_id}"

    @property
    def event_key(self) -> tuple[Any, Any]:
        return (self.session_id, self.pk)

    @classmethod
    def _event_keys(cls, ids: list[Any]) -> list[tuple[Any, Any]]:
        return [
            (session_id, pk)
            for pk, session_id in cls.objects.filter(pk__in=ids).values_list("pk", "session_id")
        ]


class SessionEvent(models.Model):
    """Append-only audit log of every transition (and a few notable facts)."""

    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="events")
    kernel = models.ForeignKey(
        Kernel, on_delete=models.CASCADE, null=True, blank=True, related_name="events"
    )
    from_status = models.CharField(max_length=16, blank=True)
    to_status = models.CharField(max_length=16, blank=True)
    reason = models.CharField(max_length=500)
    created_at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        return f"{self.from_status}→{self.to_status}: {self.reason}"


# --- code execution ----------------------------------------------------------


class RunStatus(models.TextChoices):
    RUNNING = "running"
    FINISHED = "finished"
    EXEC_TIMEOUT = "exec-timeout"


class RunMode(models.TextChoices):
    QUERY = "query"
    BATCH = "batch"


class ExecutionRun(models.Model):
    """One code run (a query or batch) in a session's main1: who ran it, when, and
    how it ended. Neither the code nor its output is kept.

    Created when the run is sent to the agent (status ``running``); its status,
    exit code and end are set once an answer says it finished or timed out.
    """

    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="runs")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="execution_runs"
    )
    mode = models.CharField(max_length=8, choices=RunMode.choices)
    run_id = models.CharField(max_length=64)
    started_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)
    status = models.CharField(max_length=16, choices=RunStatus.choices, default=RunStatus.RUNNING)
    exit_code = models.IntegerField(null=True, blank=True)
    # The exception a query ended on (KeyboardInterrupt: interrupted), "" when none.
    error = models.CharField(max_length=100, blank=True, default="")

    class Meta:
        ordering = ["-started_at", "-id"]
        indexes = [models.Index(fields=["session", "-started_at"], name="run_session_newest")]
        constraints = [
            models.CheckConstraint(
                condition=Q(status__in=[s.value for s in RunStatus]), name="run_status_valid"
            ),
            models.CheckConstraint(
                condition=Q(mode__in=[m.value for m in RunMode]), name="run_mode_valid"
            ),
            models.CheckConstraint(
                condition=Q(status=RunStatus.RUNNING, finished_at__isnull=True)
                | (~Q(status=RunStatus.RUNNING) & Q(finished_at__isnull=False)),
                name="run_finished_when_it_ended",
            ),
        ]

    def __str__(self) -> str:
        return f"run {self.run_id} ({self.mode}, {self.status}) in {self.session_id}"

    @property
    def outcome(self) -> str:
        """How it ended, in words: "finished", "error: ZeroDivisionError",
        "interrupted", "exit status 3", "timed out" (or "running")."""
        if self.status == RunStatus.RUNNING:
            return "running"
        if self.status == RunStatus.EXEC_TIMEOUT:
            return "timed out"
        if self.error == "KeyboardInterrupt":
            return "interrupted"
        if self.error:
            return f"error: {self.error}"
        if self.exit_code:
            return f"exit status {self.exit_code}"
        return "finished"
