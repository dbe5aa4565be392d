"""Reads. Every query a user can trigger is scoped to what that user may see."""

from __future__ import annotations

import functools
import json
import logging
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.db import connection
from django.db.models import Count, Prefetch, Q, QuerySet, Sum, TextField, prefetch_related_objects
from django.db.models.functions import Cast
from knox.models import AuthToken

from bai_common import units

from . import folder_files, service_ports, tokens
from .errors import Forbidden, NotFound
from .folder_files import Usage
from .models import (
    ACTIVE,
    OCCUPYING,
    Agent,
    AgentStatus,
    DataFolder,
    ExecutionRun,
    FolderPermission,
    Image,
    Kernel,
    ResourceGroup,
    ResourcePolicy,
    ResourcePreset,
    Session,
    SessionEvent,
    SessionTemplate,
    SessionType,
    Status,
    UserResourcePolicy,
)
from .policy import slot_value_refusal

logger = logging.getLogger(__name__)


_KERNELS = Prefetch(
    "kernels", queryset=Kernel.objects.select_related("agent").order_by("local_rank")
)


def sessions_for_user(*, user: AbstractBaseUser, include_all: bool = False) -> QuerySet[Session]:
    """A user's own sessions; admins see everyone's when ``include_all``."""
    qs = Session.objects.select_related("image", "resource_group", "owner").prefetch_related(
        _KERNELS
    )
    if include_all and user.is_staff:
        return qs
    return qs.filter(owner=user)


def as_uuid(value: object) -> uuid.UUID | None:
    try:
        return uuid.UUID(str(value))
    except (ValueError, TypeError, AttributeError):
        return None


def _visible(qs: QuerySet[Any], user: AbstractBaseUser, owner: str = "owner") -> QuerySet[Any]:
    """The one ownership rule: admins see every session, anyone else their own."""
    return qs if user.is_staff else qs.filter(**{owner: user})


def get_session_for_user(*, user: AbstractBaseUser, session_id: object) -> Session:
    """The one ownership check: another user's session is simply not found."""
    pk = as_uuid(session_id)
    qs = _visible(Session.objects.select_related("image", "resource_group", "owner"), user)
    session = qs.filter(pk=pk).first() if pk else None
    if session is None:
        raise NotFound("No such session.")
    return session


def get_session_detail_for_user(*, user: AbstractBaseUser, session_id: object) -> Session:
    """``get_session_for_user`` with what its detail shows fetched along: its
    kernels, mounts and dependencies, a query each (read per field, they were a
    query each time: kernels four times over)."""
    session = get_session_for_user(user=user, session_id=session_id)
    prefetch_related_objects([session], _KERNELS, "mounts", "depends_on")
    return session


def get_kernel_for_user(*, user: AbstractBaseUser, session_id: object, kernel_ref: str) -> Kernel:
    """A kernel by id or by hostname (``main1``, ``sub2``) within a visible session."""
    session = get_session_for_user(user=user, session_id=session_id)
    if "\x00" in kernel_ref or len(kernel_ref) > 64:  # never a hostname, and NUL breaks the query
        raise NotFound("No such kernel in this session.")
    lookup = Q(cluster_hostname=kernel_ref)
    pk = as_uuid(kernel_ref)
    if pk is not None:
        lookup |= Q(pk=pk)
    kernel = Kernel.objects.filter(lookup, session=session).select_related("agent").first()
    if kernel is None:
        raise NotFound("No such kernel in this session.")
    return kernel


def get_session_main_for_user(
    *, user: AbstractBaseUser, session_id: object
) -> tuple[Session, Kernel]:
    """A visible session and its main1, where everything that talks to a session lands."""
    session = get_session_for_user(user=user, session_id=session_id)
    main = Kernel.objects.filter(session=session, cluster_role="main").first()
    if main is None:
        raise NotFound("This session has no main kernel.")
    return session, main


def session_main_facts_for_user(*, user: AbstractBaseUser, session_id: object) -> dict[str, Any]:
    """What a code run checks of a visible session and its main1, in one query
    (it is on every run's path): ``session_id``, ``kernel_id``, ``agent_id``,
    ``status``, ``status_reason``, ``session_type``, ``owner_id``.

    The query is written as SQL (``_main_facts_sql``): building and compiling it
    with the ORM took three times what the database took to answer it."""
    pk = as_uuid(session_id)
    row = None
    if pk is not None:
        with connection.cursor() as cursor:
            sql = _main_facts_sql(connection.vendor)
            cursor.execute(sql.select, sql.params(pk))
            row = cursor.fetchone()
    return visible_main_facts(user=user, facts=main_facts(row))


def token_candidates_with_main_facts(
    token_key: str, session_id: object
) -> list[tuple[AuthToken, dict[str, Any] | None]]:
    """``tokens.token_candidates`` and, read in the same query, the main1 facts of
    session ``session_id`` (None when there is none) whoever owns it: the caller
    applies the ownership rule (``visible_main_facts``) once it knows the user.
    A code run over REST asks for both at once, one round trip fewer."""
    pk = as_uuid(session_id)
    if pk is None:
        return [(token, None) for token in tokens.token_candidates(token_key)]
    query = tokens.candidates_query(connection.vendor)
    with connection.cursor() as cursor:
        cursor.execute(_token_and_facts_sql(connection.vendor), [*_FactsSQL.params(pk), token_key])
        rows = cursor.fetchall()
    return [(query.read(row), main_facts(row[query.width :])) for row in rows]


@functools.cache
def _token_and_facts_sql(vendor: str) -> str:
    """The token candidates' query with main1's facts of a session LEFT JOINed: the
    session's two parameters, then the token key's."""
    query, facts = tokens.candidates_query(vendor), _main_facts_sql(vendor)
    return (
        f"SELECT {query.columns}, {facts.columns} FROM {query.source} "
        f"LEFT JOIN ({facts.source}) ON {facts.where} WHERE {query.where}"
    )


def visible_main_facts(*, user: AbstractBaseUser, facts: dict[str, Any] | None) -> dict[str, Any]:
    """``facts`` when ``user`` may see their session (``_visible``'s rule: an
    admin every session, anyone else their own), else NotFound."""
    if facts is None or not (user.is_staff or facts["owner_id"] == user.pk):
        raise NotFound("No such session.")
    return facts


MAIN_FACTS = (
    "status",
    "status_reason",
    "session_type",
    "owner_id",
    "session_id",
    "kernel_id",
    "agent_id",
)


def main_facts(row: tuple[Any, ...] | None) -> dict[str, Any] | None:
    """``MAIN_FACTS`` of a row of ``_main_facts_sql``'s columns (None for no row, or
    the NULLs of a LEFT JOIN that found no session)."""
    if row is None or row[MAIN_FACTS.index("kernel_id")] is None:
        return None
    facts = dict(zip(MAIN_FACTS, row, strict=True))
    facts["session_id"] = Session._meta.pk.to_python(facts["session_id"])
    facts["kernel_id"] = Kernel._meta.pk.to_python(facts["kernel_id"])
    return facts


@dataclass(frozen=True)
class _FactsSQL:
    columns: str  # MAIN_FACTS, in order
    source: str  # the session ``s`` and its kernels ``k``
    where: str  # two parameters: the session's pk, and main1's role

    @functools.cached_property
    def select(self) -> str:
        return f"SELECT {self.columns} FROM {self.source} WHERE {self.where}"

    @staticmethod
    def params(pk: uuid.UUID) -> list[Any]:
        return [Session._meta.pk.get_db_prep_value(pk, connection), "main"]


@functools.cache
def _main_facts_sql(vendor: str) -> _FactsSQL:
    """``MAIN_FACTS`` of a session and its kernel of a role, whoever owns it;
    names from the models' own metadata."""
    q = connection.ops.quote_name
    session, kernel = Session._meta, Kernel._meta

    def col(meta: Any, alias: str, name: str) -> str:
        return f"{alias}.{q(meta.get_field(name).column)}"

    return _FactsSQL(
        columns=(
            f"{col(session, 's', 'status')}, {col(session, 's', 'status_reason')}, "
            f"{col(session, 's', 'session_type')}, {col(session, 's', 'owner')}, "
            f"{col(session, 's', 'id')}, {col(kernel, 'k', 'id')}, {col(kernel, 'k', 'agent')}"
        ),
        source=(
            f"{q(session.db_table)} s INNER JOIN {q(kernel.db_table)} k "
            f"ON {col(kernel, 'k', 'session')} = {col(session, 's', 'id')}"
        ),
        where=f"{col(session, 's', 'id')} = %s AND {col(kernel, 'k', 'cluster_role')} = %s",
    )


def session_runs(*, session: Session) -> QuerySet[ExecutionRun]:
    """A session's code runs, newest first, with who ran each."""
    return ExecutionRun.objects.filter(session=session).select_related("user")


def session_apps(*, session: Session) -> list[service_ports.App]:
    """The apps of a session's main1: its image's declared apps, then the user's
    own ports. Reads the prefetched kernels; asks for main1's image only when a
    per-role template gave main1 an image other than the session's."""
    main = next((k for k in session.kernels.all() if k.cluster_role == "main"), None)
    image = session.image
    if main is not None and main.image != image.reference:
        image = Image.objects.filter(reference=main.image).first() or image
    return service_ports.session_apps(image.service_ports, list(session.preopen_ports or []))


def session_app(*, session: Session, name: str) -> service_ports.App | None:
    return next((a for a in session_apps(session=session) if a.name == name), None)


def session_events(*, session: Session) -> QuerySet[SessionEvent]:
    return (
        SessionEvent.objects.filter(session=session)
        .select_related("kernel")
        .order_by("created_at", "id")
    )


def folders_for_user(*, user: AbstractBaseUser) -> QuerySet[DataFolder]:
    """The user's own folders and those shared with them, each once."""
    return (
        DataFolder.objects.filter(Q(owner=user) | Q(shares__user=user))
        .distinct()
        .select_related("owner")
        .order_by("name", "owner__username")
    )


@dataclass(frozen=True)
class FolderAccess:
    """What one user may do with one folder: ``permission`` is "owner" (also an
    admin's, on any folder), "rw" or "ro" (a share's)."""

    folder: DataFolder
    permission: str
    is_admin: bool = False

    @property
    def can_write(self) -> bool:
        return self.permission != FolderPermission.READ_ONLY or self.is_admin

    @property
    def can_manage(self) -> bool:
        """Delete the folder, change its shares: the owner and admins."""
        return self.permission == "owner" or self.is_admin

    def require_write(self) -> None:
        if not self.can_write:
            raise Forbidden(f"Folder {self.folder.name!r} is shared with you read-only.")

    def require_manage(self) -> None:
        if not self.can_manage:
            raise Forbidden(f"Only the owner of folder {self.folder.name!r} may do that.")


def get_folder_for_user(*, user: AbstractBaseUser, folder_id: object) -> FolderAccess:
    """A folder the user owns, is shared with, or any folder for an admin; else
    NotFound, the same for a folder that does not exist."""
    folder = (
        DataFolder.objects.select_related("owner").filter(pk=folder_id).first()
        if isinstance(folder_id, int)
        else None
    )
    if folder is None:
        raise NotFound("No such folder.")
    if folder.owner_id == user.pk:
        return FolderAccess(folder, "owner", bool(user.is_staff))
    share = folder.shares.filter(user=user).first()
    if share is not None:
        return FolderAccess(folder, share.permission, bool(user.is_staff))
    if user.is_staff:
        return FolderAccess(folder, "owner", True)
    raise NotFound("No such folder.")


def folder_sessions_mounting(*, folder: DataFolder) -> QuerySet[Session]:
    """The live (not ended) sessions that mount a folder, oldest first."""
    return folder.sessions.filter(status__in=ACTIVE).order_by("created_at")


# A listing walks each folder for its size for at most this long; the quota check
# walks all of a user's folders for at most this long.
FOLDER_WALK_SECONDS = 2.0


def folder_usage(*, folder: DataFolder, seconds: float = FOLDER_WALK_SECONDS) -> Usage:
    """Bytes and files in a folder (a bounded walk: links never followed)."""
    return folder_files.usage(folder.host_path, deadline=time.monotonic() + seconds)


def storage_used(*, owner: AbstractBaseUser, seconds: float = FOLDER_WALK_SECONDS) -> int:
    """Bytes held by all of a user's own folders (shared ones count for their owner)."""
    deadline = time.monotonic() + seconds
    return sum(
        folder_files.usage(folder.host_path, deadline=deadline).bytes
        for folder in DataFolder.objects.filter(owner=owner)
    )


def owner_over_quota(*, owner: AbstractBaseUser) -> bool:
    """Whether the bytes last measured in ``owner``'s folders (``DataFolder.measured_bytes``)
    are past their policy's byte quota."""
    policy = policy_for_user(user=owner)
    if policy is None or policy.max_folder_bytes is None:
        return False
    measured = DataFolder.objects.filter(owner=owner).aggregate(total=Sum("measured_bytes"))
    return int(measured["total"] or 0) > policy.max_folder_bytes


@dataclass(frozen=True)
class FolderQuota:
    folder_count: int
    max_folders: int | None
    used_bytes: int
    max_bytes: int | None


def folder_quota(*, user: AbstractBaseUser) -> FolderQuota:
    policy = policy_for_user(user=user)
    return FolderQuota(
        folder_count=DataFolder.objects.filter(owner=user).count(),
        max_folders=policy.max_folders if policy else None,
        used_bytes=storage_used(owner=user),
        max_bytes=policy.max_folder_bytes if policy else None,
    )


def templates_for_user(
    *, user: AbstractBaseUser, include_all: bool = False
) -> QuerySet[SessionTemplate]:
    """Own templates plus shared ones (admins' or marked shared); admins see
    everyone's when ``include_all``."""
    if include_all and user.is_staff:
        return SessionTemplate.objects.all()
    return SessionTemplate.objects.filter(Q(owner=user) | Q(is_shared=True) | Q(owner__isnull=True))


def get_template_for_user(*, user: AbstractBaseUser, template_id: object) -> SessionTemplate:
    """A template the user may read (own and shared ones; admins any), else NotFound."""
    try:
        pk = int(str(template_id))
    except ValueError:
        pk = None
    qs = templates_for_user(user=user, include_all=True).select_related("owner")
    template = qs.filter(pk=pk).first() if pk is not None else None
    if template is None:
        raise NotFound("No such template.")
    return template


def template_can_change(*, user: AbstractBaseUser, template: SessionTemplate) -> bool:
    """Own templates; admins also every other, shared ones included."""
    return template.owner_id == user.pk or bool(user.is_staff)


def images_for_user(*, user: AbstractBaseUser) -> QuerySet[Image]:
    return Image.objects.filter(is_active=True).prefetch_related("allowed_groups")


def resource_groups_for_user(*, user: AbstractBaseUser) -> QuerySet[ResourceGroup]:
    qs = ResourceGroup.objects.filter(is_active=True)
    policy = policy_for_user(user=user)
    if policy is not None:
        allowed = list(policy.allowed_resource_groups.values_list("pk", flat=True))
        if allowed:
            qs = qs.filter(pk__in=allowed)
    return qs


def policy_for_user(*, user: AbstractBaseUser) -> ResourcePolicy | None:
    assignment = UserResourcePolicy.objects.filter(user=user).select_related("policy").first()
    if assignment is not None:
        return assignment.policy
    return ResourcePolicy.objects.filter(is_default=True).first()


def agents_in_group(*, group: ResourceGroup) -> QuerySet[Agent]:
    """Agents that could ever take a kernel of this group (alive or expected back)."""
    return Agent.objects.filter(resource_group=group, schedulable=True).exclude(
        status=AgentStatus.TERMINATED
    )


def presets_for_user(
    *, user: AbstractBaseUser, group: ResourceGroup | None = None
) -> QuerySet[ResourcePreset]:
    """The presets offered to a user: those for every group and those of the groups
    they may use (only ``group``'s, when given)."""
    groups = resource_groups_for_user(user=user)
    if group is not None:
        groups = groups.filter(pk=group.pk)
    return ResourcePreset.objects.filter(
        Q(resource_group__isnull=True) | Q(resource_group__in=groups)
    ).select_related("resource_group")


# --- slots held: what agents and owners occupy now ------------------------------------


def slots_as_text(field_name: str) -> Cast:
    """A stored slot mapping as JSON text: no per-row decoding, and the text is a cache key."""
    return Cast(field_name, output_field=TextField())


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 64 else f"{text[:61]}..."


def read_slots(text: str | None, *, strict: bool) -> dict[str, Decimal] | str:
    """Stored slots (JSON text) as exact amounts, or why they cannot be used:
    "cpu '1e-19', which is out of range (...)". ``strict``: also the documented
    precision and ceiling of every slot (requests and capacities, which the
    API and the gateway bound); otherwise any finite, non-negative amount
    (what placed kernels hold, whatever they were given)."""
    try:
        raw = json.loads(text) if text else {}
    except ValueError:
        return f"slots {_shown(text)}, which are not JSON"
    if not isinstance(raw, dict):
        return f"slots {_shown(raw)}, which are not a mapping of slot to amount"
    amounts: dict[str, Decimal] = {}
    for slot, value in raw.items():
        name, shown = str(slot)[:64], _shown(value)
        try:
            amount = units.parse_amount(value)
        except ValueError as exc:
            detail = str(exc)
            if detail.startswith(f"{shown} "):
                return f"{name} {shown}, which {detail[len(shown) + 1 :]}"
            return f"{name} {shown}: {detail}"
        why = slot_value_refusal(name, amount) if strict else None
        if why is not None:
            return f"{name} {shown}: {why.removeprefix(f'{name}: ')}"
        amounts[name] = amount
    return amounts


def sum_slots(rows: Any, unreadable: dict[Any, str] | None = None) -> dict[Any, dict[str, Decimal]]:
    """(key, slots as JSON text) rows summed per key, exactly; each distinct text
    is decoded once (thousands of kernels share a few shapes). A row that
    cannot be read is left out of its key's sum, and the key is named in
    ``unreadable`` with the reason."""
    totals: dict[Any, dict[str, Decimal]] = defaultdict(dict)
    parsed: dict[str, list[tuple[str, Decimal]] | str] = {}
    for key, text in rows:
        items = parsed.get(text)
        if items is None:
            amounts = read_slots(text, strict=False)
            items = parsed[text] = amounts if isinstance(amounts, str) else list(amounts.items())
        if isinstance(items, str):
            logger.warning("slots of a kernel held by %s cannot be read: %s", key, items)
            if unreadable is not None:
                unreadable.setdefault(key, items)
            continue
        held = totals[key]
        for slot, value in items:
            held[slot] = held.get(slot, Decimal(0)) + value
    return totals


def agent_occupancy(
    *, agent_ids: list[str], unreadable: dict[str, str] | None = None
) -> dict[str, dict[str, Decimal]]:
    """Slots held on each agent by kernels that occupy resources (derived, never stored first).

    An agent running a kernel whose slots cannot be read is named in ``unreadable``.
    """
    return sum_slots(
        Kernel.objects.filter(agent_id__in=agent_ids, status__in=OCCUPYING).values_list(
            "agent_id", slots_as_text("requested_slots")
        ),
        unreadable,
    )


@dataclass
class OwnerUsage:
    """What one user holds now: slots of their occupying kernels and their session counts
    (``active``: started and not ended, system sessions apart)."""

    held: dict[str, Decimal] = field(default_factory=dict)
    active: int = 0
    pending: int = 0
    active_system: int = 0


def owner_usage(*, owner_ids: set[Any]) -> dict[Any, OwnerUsage]:
    """Per owner id, what quotas count against them now."""
    counts = {
        row["owner_id"]: row
        for row in Session.objects.filter(owner_id__in=owner_ids, status__in=ACTIVE)
        .values("owner_id")
        .annotate(
            pending=Count("pk", filter=Q(status=Status.PENDING)),
            active=Count(
                "pk",
                filter=~Q(status=Status.PENDING) & ~Q(session_type=SessionType.SYSTEM),
            ),
            system=Count(
                "pk", filter=~Q(status=Status.PENDING) & Q(session_type=SessionType.SYSTEM)
            ),
        )
    }
    held = sum_slots(
        Kernel.objects.filter(session__owner_id__in=owner_ids, status__in=OCCUPYING).values_list(
            "session__owner_id", slots_as_text("requested_slots")
        )
    )
    return {
        uid: OwnerUsage(
            held=held.get(uid, {}),
            active=counts.get(uid, {}).get("active", 0),
            pending=counts.get(uid, {}).get("pending", 0),
            active_system=counts.get(uid, {}).get("system", 0),
        )
        for uid in owner_ids
    }


def live_agents_in_group(*, group: ResourceGroup) -> list[tuple[str, dict[str, Decimal]]]:
    """(agent id, capacity) of the agents that can take a kernel now: alive and schedulable."""
    return [
        (pk, {k: Decimal(str(v)) for k, v in (capacity or {}).items()})
        for pk, capacity in Agent.objects.filter(
            resource_group=group, status=AgentStatus.ALIVE, schedulable=True
        ).values_list("pk", "capacity_slots")
    ]
