"""Launch validation as a plan: a launch spec in, a checked ``LaunchPlan`` out.

``plan_launch`` first checks the spec's shape once, against the schema that
template import uses too (``specs.LAUNCH_SCHEMA``: types and bounds of every
field). Then small named checks judge its meaning: image, resource group,
session type, cluster, resources, mounts, environment, name, command, time,
dependencies, pinned agents, quota and capacity. Each check reports to one
``_Errors`` collector, so one response names every bad field; nothing is
written until the plan is whole (``services.session_create`` inserts it).

Quota and capacity words come from ``sessions_app.policy``, which the
scheduler shares: a launch is refused at once with the same reason the
scheduler would give it for ever.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from functools import partial
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from bai_common.units import format_amount

from . import policy as rules
from . import selectors, service_ports
from . import slots as slotlib
from .errors import (
    Conflict,
    Forbidden,
    InvalidInput,
    PendingLimitReached,
    QuotaExceeded,
    field_error,
)
from .models import (
    TERMINAL,
    AgentStatus,
    ClusterMode,
    DataFolder,
    FolderPermission,
    FolderShare,
    Image,
    ResourceGroup,
    ResourcePolicy,
    Session,
    SessionTemplate,
    SessionType,
    Status,
)
from .specs import merge_spec, spec_errors

ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
SESSION_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
FOLDER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
# A user name as Django's validator allows it: the ``owner/`` of a shared folder's mount.
FOLDER_OWNER = re.compile(r"[\w.@+-]{1,150}")
RESERVED_ENV_PREFIX = "BACKENDAI_"
DEFAULT_SLOTS = {"cpu": Decimal(1), "mem": Decimal(2**30)}
# A start time is accepted this far ahead at most, and dates stay well inside
# what every database and Python's datetime can hold.
MAX_START_AHEAD = timedelta(days=366)


@dataclass(frozen=True)
class RolePlan:
    """What each kernel of one role gets."""

    image: Image
    slots: dict[str, Decimal]


@dataclass(frozen=True)
class LaunchPlan:
    name: str
    session_type: str
    image: Image
    group: ResourceGroup
    cluster_mode: str
    cluster_size: int
    main: RolePlan
    sub: RolePlan
    env: dict[str, str]
    folders: tuple[DataFolder, ...]
    startup_command: str
    depends_on: tuple[Session, ...]
    starts_at: datetime | None
    batch_timeout: timedelta | None
    template: SessionTemplate | None
    agents: tuple[str, ...]
    ports: tuple[int, ...] = ()
    # A subset of ``folders``: read-only shares, mounted read-only.
    readonly_folders: tuple[DataFolder, ...] = ()

    @property
    def kernel_slots(self) -> list[dict[str, Decimal]]:
        """Per kernel, main1 first."""
        return [self.main.slots] + [self.sub.slots] * (self.cluster_size - 1)


class _Errors:
    """Field -> messages, in the order they were found."""

    def __init__(self) -> None:
        self.fields: dict[str, list[str]] = {}

    def __call__(self, field: str, message: str) -> None:
        self.fields.setdefault(field, []).append(message)

    def raise_if_any(self, error: type[InvalidInput] | type[QuotaExceeded] = InvalidInput) -> None:
        if self.fields:
            first, messages = next(iter(self.fields.items()))
            message = messages[0] if first == "non_field_errors" else f"{first}: {messages[0]}"
            if issubclass(error, QuotaExceeded):
                raise error(messages[0], {"fields": self.fields})
            raise InvalidInput(message, self.fields)


def plan_launch(*, owner: AbstractBaseUser, spec: Any) -> LaunchPlan:
    """Check a launch spec (optionally based on a template) for ``owner``.

    Raises InvalidInput (400), Forbidden or QuotaExceeded (403) naming the
    field; returns the plan otherwise.
    """
    plan, policy = _plan(owner=owner, spec=spec)
    _check_quota(owner, policy, plan)
    _check_capacity(plan)
    return plan


def plan_preview(*, owner: AbstractBaseUser, spec: Any) -> tuple[LaunchPlan, str | None]:
    """``plan_launch`` for a preview: (the plan, why it can never fit or None).

    A bad spec, a name in use and the pending limit raise the same errors as a
    launch; what a launch refuses because it can never fit (the quota's bounds on one session,
    more than the group's largest agent) is returned as the reason instead.
    """
    plan, policy = _plan(owner=owner, spec=spec)
    conflict = name_conflict(owner=owner, name=plan.name)
    if conflict is not None:
        raise conflict
    never = _Errors()
    _check_quota_bounds(policy, plan, never)
    if never.fields:
        return plan, next(iter(never.fields.values()))[0]
    try:
        _check_capacity(plan)
    except InvalidInput as exc:
        return plan, exc.message
    pending = _Errors()
    _check_pending_limit(owner, policy, plan, pending)
    pending.raise_if_any(PendingLimitReached)
    return plan, None


# --- warnings: valid, but not what a user may expect --------------------------------------------


def ssh_warning(*, main: Image | None, sub: Image | None) -> str | None:
    """Why ``ssh sub1`` from main1 will not work in a cluster of these images, or None:
    the sub kernels' image has no SSH server, or main1's no SSH client (``supports_ssh``)."""
    if sub is not None and not sub.supports_ssh:
        return (
            f"`ssh sub1` will not work: the sub kernels' image {sub.reference} has no SSH "
            "server; choose an image with SSH for them if main1 must reach them"
        )
    if sub is not None and main is not None and not main.supports_ssh:
        return (
            f"`ssh sub1` will not work: main1's image {main.reference} has no SSH client; "
            "choose an image with SSH for main1 if it must reach the sub kernels"
        )
    return None


def plan_warnings(plan: LaunchPlan) -> list[str]:
    """What a valid launch will not do that its user may count on (shown, never refused)."""
    if plan.cluster_size < 2:
        return []
    warning = ssh_warning(main=plan.main.image, sub=plan.sub.image)
    return [warning] if warning else []


def image_catalogue() -> dict[str, Image]:
    """Every image by reference, in one query (for ``template_warnings`` over a list)."""
    return {i.reference: i for i in Image.objects.only("reference", "supports_ssh")}


def template_warnings(spec: Any, images: dict[str, Image] | None = None) -> list[str]:
    """``plan_warnings`` for a template's spec alone (any field of it may still be given at
    launch): its sub kernels' image is the sub role's, else the spec's when it makes a cluster.
    ``images``: the ``image_catalogue()`` when judging many (else a query each)."""
    if not isinstance(spec, dict):
        return []
    roles = spec.get("roles") if isinstance(spec.get("roles"), dict) else {}
    main_role = roles.get("main") if isinstance(roles.get("main"), dict) else {}
    sub_role = roles.get("sub") if isinstance(roles.get("sub"), dict) else {}
    size = spec.get("cluster_size")
    clustered = bool(sub_role) or (isinstance(size, int) and size > 1)
    main_ref = main_role.get("image") or spec.get("image")
    sub_ref = (sub_role.get("image") or spec.get("image")) if clustered else None
    if images is None:
        refs = {ref for ref in (main_ref, sub_ref) if isinstance(ref, str)}
        images = {i.reference: i for i in Image.objects.filter(reference__in=refs)}
    warning = ssh_warning(main=images.get(main_ref), sub=images.get(sub_ref))
    return [warning] if warning else []


def name_conflict(*, owner: AbstractBaseUser, name: str) -> Conflict | None:
    """The error for a name one of the owner's active sessions already has, or None.

    A launch checks it after its insert fails (so two concurrent launches cannot
    both pass); a preview checks it before, to answer as the launch would.
    """
    if not Session.objects.filter(owner=owner, name=name).exclude(status__in=TERMINAL).exists():
        return None
    return Conflict(
        f"You already have an active session named {name!r}.",
        {"fields": {"name": ["already used by one of your active sessions"]}},
    )


def _plan(*, owner: AbstractBaseUser, spec: Any) -> tuple[LaunchPlan, ResourcePolicy | None]:
    """The spec's shape and meaning, checked; quota and capacity are the callers'."""
    if not isinstance(spec, dict):
        raise InvalidInput("The body must be a JSON object.")
    shape = spec_errors(spec)
    if shape:
        raise InvalidInput(f"{next(iter(shape))}: {next(iter(shape.values()))[0]}", shape)
    spec, template = _with_template(owner=owner, spec=spec)
    bad = _Errors()
    policy = selectors.policy_for_user(user=owner)
    session_type = spec.get("type") or SessionType.INTERACTIVE
    image = _check_image(spec.get("image"), "image", bad)
    group = _check_resource_group(spec, policy, session_type, bad)
    _check_image_allowed(image, group, "image", bad)
    cluster_mode = spec.get("cluster_mode") or ClusterMode.SINGLE_NODE
    main, sub, cluster_size = _check_cluster(spec, image, group, bad)
    mounts = _check_mounts(owner, spec.get("mounts") or [], bad)
    plan = LaunchPlan(
        name=_check_name(spec.get("name"), bad),
        session_type=session_type,
        image=image,  # type: ignore[arg-type]  (None only with an error recorded)
        group=group,  # type: ignore[arg-type]  (None only with an error recorded)
        cluster_mode=cluster_mode,
        cluster_size=cluster_size,
        main=main,
        sub=sub,
        env=_check_env(spec.get("env") or {}, bad),
        folders=mounts[0],
        readonly_folders=mounts[1],
        startup_command=_check_command(spec.get("startup_command") or "", session_type, bad),
        depends_on=_check_dependencies(owner, spec.get("depends_on") or [], bad),
        starts_at=_check_starts_at(spec.get("starts_at"), session_type, bad),
        batch_timeout=_check_batch_timeout(spec.get("batch_timeout"), session_type, bad),
        template=template,
        agents=_check_agents(owner, group, spec.get("agents") or [], bad),
        ports=_check_ports(spec.get("ports") or [], main.image, bad),
    )
    bad.raise_if_any()
    return plan, policy


def _with_template(
    *, owner: AbstractBaseUser, spec: dict[str, Any]
) -> tuple[dict[str, Any], SessionTemplate | None]:
    spec = dict(spec)
    template_id = spec.pop("template", None)
    if template_id in (None, ""):
        return spec, None
    try:
        template = selectors.templates_for_user(user=owner).get(pk=int(str(template_id)))
    except (ValueError, SessionTemplate.DoesNotExist):
        raise field_error("template", f"no template with id {template_id!r}") from None
    merged = merge_spec(template.spec, spec)
    shape = spec_errors(merged)
    if shape:
        raise InvalidInput(f"{next(iter(shape))}: {next(iter(shape.values()))[0]}", shape)
    return merged, template


# --- image, group, type --------------------------------------------------------------


def _check_image(reference: str | None, field: str, bad: _Errors) -> Image | None:
    if not reference:
        bad(field, "is required")
        return None
    image = Image.objects.filter(reference=reference, is_active=True).first()
    if image is None:
        bad(field, f"unknown image {reference!r}")
    return image


def _check_image_allowed(
    image: Image | None, group: ResourceGroup | None, field: str, bad: _Errors
) -> None:
    if image is None or group is None:
        return
    allowed = list(image.allowed_groups.values_list("name", flat=True))
    if allowed and group.name not in allowed:
        bad(field, f"image {image.reference!r} is not allowed in resource group {group.name!r}")


def _check_resource_group(
    spec: dict[str, Any], policy: ResourcePolicy | None, session_type: str, bad: _Errors
) -> ResourceGroup | None:
    name = spec.get("resource_group") or "default"
    group = ResourceGroup.objects.filter(name=name, is_active=True).first()
    if group is None:
        bad("resource_group", f"unknown resource group {name!r}")
        return None
    if policy is not None:
        allowed = list(policy.allowed_resource_groups.values_list("name", flat=True))
        if allowed and group.name not in allowed:
            bad("resource_group", f"your resource policy does not allow group {group.name!r}")
    if session_type not in group.allowed_session_types:
        bad("type", f"resource group {group.name!r} does not allow {session_type} sessions")
    return group


# --- cluster and resources ------------------------------------------------------------


def _check_cluster(
    spec: dict[str, Any], image: Image | None, group: ResourceGroup | None, bad: _Errors
) -> tuple[RolePlan, RolePlan, int]:
    """The roles' images and resources, and the cluster size (``roles.sub.replicas``
    + 1 unless given). A role's resources override the common ones key by key."""
    roles = spec.get("roles") or {}
    main_role, sub_role = roles.get("main") or {}, roles.get("sub") or {}
    if main_role.get("replicas", 1) != 1:
        bad("roles.main.replicas", "a session has exactly one main kernel (main1)")
    size = spec.get("cluster_size")
    if size is None:
        size = 1 + int(sub_role.get("replicas") or 0)
    size = int(size)
    main_image = _role_image(main_role, image, group, "roles.main.image", bad)
    sub_image = _role_image(sub_role, image, group, "roles.sub.image", bad)
    main_field = "roles.main.resources" if main_role.get("resources") is not None else "resources"
    main_slots = _check_resources(spec, main_role, main_image, main_field, bad)
    sub_slots = main_slots
    if sub_role.get("resources") is not None or main_role.get("resources") is not None:
        sub_field = "roles.sub.resources" if sub_role.get("resources") is not None else "resources"
        sub_slots = _check_resources(spec, sub_role, sub_image, sub_field, bad)
    elif sub_image is not main_image and size > 1:
        _check_minimums(sub_slots, sub_image, "roles.sub.image", bad)
    return (
        RolePlan(main_image, main_slots),  # type: ignore[arg-type]
        RolePlan(sub_image, sub_slots),  # type: ignore[arg-type]
        size,
    )


def _role_image(
    role: dict[str, Any], image: Image | None, group: ResourceGroup | None, field: str, bad: _Errors
) -> Image | None:
    if not role.get("image"):
        return image
    found = _check_image(role["image"], field, bad)
    _check_image_allowed(found, group, field, bad)
    return found


def _check_resources(
    spec: dict[str, Any], role: dict[str, Any], image: Image | None, field: str, bad: _Errors
) -> dict[str, Decimal]:
    raw = {**(spec.get("resources") or {}), **(role.get("resources") or {})}
    try:
        parsed = slotlib.parse_slots(raw, settings.BAI_SLOT_TYPES)
    except slotlib.SlotError as exc:
        bad(field, exc.message if exc.slot == "resources" else f"{exc.slot}: {exc.message}")
        return dict(DEFAULT_SLOTS)
    slots = {**DEFAULT_SLOTS, **parsed}
    for slot, value in slots.items():
        refusal = rules.slot_value_refusal(slot, value)
        if refusal is not None:
            bad(field, refusal)
    for slot in ("cpu", "mem"):
        if slots[slot] <= 0:
            bad(field, f"{slot}: must be more than 0")
    _check_minimums(slots, image, field, bad)
    return slots


def _check_minimums(
    slots: dict[str, Decimal], image: Image | None, field: str, bad: _Errors
) -> None:
    """The admin's floor for every kernel (settings) and the image's own minimums."""
    floors = [(slotlib.from_strings(settings.BAI_KERNEL_MIN_SLOTS), "the smallest kernel")]
    if image is not None:
        floors.append((slotlib.from_strings(image.min_slots or {}), f"image {image.reference}"))
    for minimums, who in floors:
        for slot, minimum in minimums.items():
            if slots.get(slot, Decimal(0)) < minimum:
                bad(
                    field,
                    f"{slot}: {who} needs at least {slotlib.fmt(slot, minimum)} per container",
                )


# --- environment, mounts, name, command --------------------------------------------------


def _check_env(env: dict[str, str], bad: _Errors) -> dict[str, str]:
    for name in env:
        if not ENV_NAME.fullmatch(name):
            bad(
                "env",
                f"{name!r} is not a valid variable name (letters, digits, _; not starting with a digit)",
            )
        elif name.startswith(RESERVED_ENV_PREFIX):
            bad("env", f"{name!r}: names starting with {RESERVED_ENV_PREFIX} are set by the system")
    return env


def _check_mounts(
    owner: AbstractBaseUser, names: list[str], bad: _Errors
) -> tuple[tuple[DataFolder, ...], tuple[DataFolder, ...]]:
    """(every folder, the read-only ones): own folders by name, and folders shared
    with the owner, by name or as ``owner/name`` (own wins for a bare name). Each
    is mounted at ``/home/work/<name>``, so two with one name are refused."""
    folders: list[DataFolder] = []
    readonly: list[DataFolder] = []
    targets: dict[str, str] = {}
    for entry in names:
        user, _, name = entry.rpartition("/") if "/" in entry else ("", "", entry)
        bad_owner = user and (not FOLDER_OWNER.fullmatch(user) or user in (".", ".."))
        if not FOLDER_NAME.fullmatch(name) or bad_owner:
            bad(
                "mounts",
                f"{entry!r} is not a folder name (a path outside your folders is never mounted)",
            )
            continue
        qs = DataFolder.objects.filter(name=name).select_related("owner")
        folder, permission = None, None
        if not user or user == owner.get_username():
            folder = qs.filter(owner=owner).first()
        if folder is None:
            shares = (
                FolderShare.objects.filter(user=owner, folder__name=name)
                .select_related("folder", "folder__owner")
                .order_by("folder__owner__username")
            )
            if user:
                shares = shares.filter(folder__owner__username=user)
            found = list(shares[:2])
            if len(found) > 1 and not user:
                bad(
                    "mounts",
                    f"{name!r} is shared with you by {found[0].folder.owner.username!r} and "
                    f"{found[1].folder.owner.username!r}: say which, as 'owner/{name}'",
                )
                continue
            if found:
                folder, permission = found[0].folder, found[0].permission
        if folder is None:
            where = (
                f"{user!r} shares no" if user and user != owner.get_username() else "you have no"
            )
            bad("mounts", f"{where} data folder named {name!r}")
        elif folder in folders:
            bad("mounts", f"{entry!r} is listed twice")
        elif name in targets:
            bad(
                "mounts",
                f"{targets[name]!r} and {entry!r} would both be mounted at /home/work/{name}",
            )
        else:
            folders.append(folder)
            targets[name] = entry
            if permission == FolderPermission.READ_ONLY:
                readonly.append(folder)
    return tuple(folders), tuple(readonly)


def _check_name(name: str | None, bad: _Errors) -> str:
    if not name:
        return f"session-{uuid.uuid4().hex[:6]}"
    if not SESSION_NAME.fullmatch(name):
        bad(
            "name", "use up to 64 letters, digits, '.', '_' or '-', starting with a letter or digit"
        )
    return name


def _check_ports(ports: list[int], image: Image | None, bad: _Errors) -> tuple[int, ...]:
    """The user's own ports of main1: not reserved, not the image's, no twins, a few."""
    declared = image.service_ports if image is not None else []
    for message in service_ports.preopen_errors(ports, declared):
        bad("ports", message)
    return tuple(ports)


def _check_command(command: str, session_type: str, bad: _Errors) -> str:
    if session_type == SessionType.BATCH and not command.strip():
        bad("startup_command", "a batch session needs a start command")
    return command


# --- dependencies, time, agents -----------------------------------------------------------


def _check_dependencies(
    owner: AbstractBaseUser, ids: list[str], bad: _Errors
) -> tuple[Session, ...]:
    """The owner's own sessions only."""
    found: list[Session] = []
    for dep_id in ids:
        pk = selectors.as_uuid(dep_id)
        dep = Session.objects.filter(owner=owner, pk=pk).first() if pk else None
        if dep is None:
            bad("depends_on", f"no session of yours with id {dep_id!r}")
        elif dep in found:
            bad("depends_on", f"{dep_id} is listed twice")
        else:
            found.append(dep)
    return tuple(found)


def _check_starts_at(raw: str | None, session_type: str, bad: _Errors) -> datetime | None:
    """Batch sessions only; an ISO 8601 date-time within MAX_START_AHEAD of now."""
    if not raw:
        return None
    if session_type != SessionType.BATCH:
        bad("starts_at", f"a start time applies to batch sessions only, not {session_type}")
        return None
    try:
        parsed = parse_datetime(raw)
    except ValueError:  # well formed but not a date, e.g. month 13
        parsed = None
    if parsed is None:
        bad("starts_at", f"{raw!r} is not an ISO 8601 date-time")
        return None
    if timezone.is_naive(parsed):
        parsed = timezone.make_aware(parsed)
    try:
        # Far-off offsets overflow only when converted: here, not in the database.
        in_range = abs(parsed.astimezone(UTC) - timezone.now()) <= MAX_START_AHEAD
    except OverflowError:
        in_range = False
    if not in_range:
        bad("starts_at", f"must be within {MAX_START_AHEAD.days} days of now")
        return None
    return parsed


def _check_batch_timeout(raw: float | None, session_type: str, bad: _Errors) -> timedelta | None:
    if raw is None:
        return None
    if session_type != SessionType.BATCH:
        bad("batch_timeout", f"a batch timeout applies to batch sessions only, not {session_type}")
        return None
    return timedelta(seconds=raw)


def _check_agents(
    owner: AbstractBaseUser, group: ResourceGroup | None, ids: list[str], bad: _Errors
) -> tuple[str, ...]:
    """Manual agent designation: admins only, live agents of the session's group."""
    if not ids:
        return ()
    if not owner.is_staff:
        raise Forbidden(
            "Only admins may pin a session to agents.",
            {"fields": {"agents": ["only admins may pin a session to agents"]}},
        )
    if group is None:
        return ()
    known = set(group.agents.exclude(status=AgentStatus.TERMINATED).values_list("pk", flat=True))
    for agent_id in ids:
        if agent_id not in known:
            bad("agents", f"no agent {agent_id!r} in resource group {group.name!r}")
    if len(set(ids)) != len(ids):
        bad("agents", "an agent is listed twice")
    return tuple(ids)


# --- quota and capacity --------------------------------------------------------------------


def _check_quota(owner: AbstractBaseUser, policy: ResourcePolicy | None, plan: LaunchPlan) -> None:
    """What no amount of waiting can satisfy, and the pending limit (403)."""
    bad = _Errors()
    _check_quota_bounds(policy, plan, bad)
    bad.raise_if_any(QuotaExceeded)
    pending = _Errors()
    _check_pending_limit(owner, policy, plan, pending)
    pending.raise_if_any(PendingLimitReached)


def _check_quota_bounds(policy: ResourcePolicy | None, plan: LaunchPlan, bad: _Errors) -> None:
    """The quota's bounds on one session alone: more containers or slots than it ever allows."""
    if policy is None or plan.session_type == SessionType.SYSTEM:
        return
    refusal = rules.containers_refusal(plan.cluster_size, policy.max_containers_per_session)
    if refusal is not None:
        bad("cluster_size", refusal)
    total: dict[str, Decimal] = {}
    for one in plan.kernel_slots:
        total = slotlib.add(total, one)
    for slot, limit in slotlib.from_strings(policy.total_resource_slots or {}).items():
        refusal = rules.total_slots_refusal(
            slot=slot,
            held=Decimal(0),
            wanted=total.get(slot, Decimal(0)),
            allowed=limit,
            amount=partial(format_amount, slot),
        )
        if refusal is not None:
            bad("resources", refusal)


def check_pending_limit(*, owner: AbstractBaseUser, plan: LaunchPlan) -> None:
    """The pending limit alone (403): the insert asks again under the owner's lock
    (``services.lock_owner``), so that launches at once cannot all pass one count."""
    bad = _Errors()
    _check_pending_limit(owner, selectors.policy_for_user(user=owner), plan, bad)
    bad.raise_if_any(PendingLimitReached)


def _check_pending_limit(
    owner: AbstractBaseUser, policy: ResourcePolicy | None, plan: LaunchPlan, bad: _Errors
) -> None:
    if policy is None or plan.session_type == SessionType.SYSTEM:
        return
    pending = Session.objects.filter(owner=owner, status=Status.PENDING).count()
    refusal = rules.pending_refusal(pending, policy.max_pending_sessions)
    if refusal is not None:
        bad("non_field_errors", refusal)


def _check_capacity(plan: LaunchPlan) -> None:
    """Refuse what no agent of the group could ever hold (only once the group has agents)."""
    capacities = []
    for raw in selectors.agents_in_group(group=plan.group).values_list("capacity_slots", flat=True):
        if not raw:
            continue  # not registered yet: its capacity is unknown
        try:
            capacities.append(slotlib.from_strings(raw))
        except (ArithmeticError, ValueError, TypeError, AttributeError):
            continue  # an agent whose capacity cannot be read is left out, as the pass does
    if not capacities:
        return  # no agent yet: the session waits, and says so
    size = plan.cluster_size
    field = "cluster_size" if size > 1 else "resources"
    for need in {tuple(sorted(k.items())) for k in plan.kernel_slots}:
        prefix = f"multi-node cluster of {size} needs " if size > 1 else "needs "
        short = _never_fits(dict(need), capacities, plan.group.name, prefix, " per container")
        if short:
            raise InvalidInput(short, {field: [short]})
    if size < 2:
        return
    total: dict[str, Decimal] = {}
    for one in plan.kernel_slots:
        total = slotlib.add(total, one)
    if plan.cluster_mode == ClusterMode.SINGLE_NODE:
        prefix = f"single-node cluster of {size} needs "
        short = _never_fits(total, capacities, plan.group.name, prefix, " on one agent")
        if short:
            message = f"{short}; use multi-node or a smaller cluster"
            raise InvalidInput(message, {field: [message]})
        return
    # Not a packing, only a bound that never refuses what could fit: the
    # agents together must have at least the whole cluster's resources.
    group_total: dict[str, Decimal] = {}
    for cap in capacities:
        group_total = slotlib.add(group_total, cap)
    missing = slotlib.shortfall(total, group_total)
    if missing:
        parts = ", ".join(
            f"needs {slotlib.fmt(slot, total[slot])}, all agents together have "
            f"{slotlib.fmt(slot, group_total.get(slot, Decimal(0)))}"
            for slot in sorted(missing)
        )
        message = (
            f"a cluster of {size} containers can never fit in resource group "
            f"{plan.group.name!r}: {parts}"
        )
        raise InvalidInput(message, {field: [message]})


def _never_fits(
    need: dict[str, Decimal],
    capacities: list[dict[str, Decimal]],
    group: str,
    prefix: str,
    where: str,
) -> str | None:
    """The shared words for a request larger than every agent, or None if one could hold it."""
    if any(not slotlib.shortfall(need, cap) for cap in capacities):
        return None
    for slot, value in sorted(need.items()):
        largest = max(cap.get(slot, Decimal(0)) for cap in capacities)
        if value > largest:
            return rules.capacity_refusal(
                need=f"{prefix}{slotlib.fmt(slot, value)}",
                where=where,
                group=group,
                largest=slotlib.fmt(slot, largest),
            )
    described = " and ".join(slotlib.fmt(slot, value) for slot, value in sorted(need.items()))
    return f"{prefix}{described}{where}; no agent in resource group {group} has all of it"
