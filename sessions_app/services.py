"""Writes. Every change a user, an admin or an agent causes goes through here.

Validation raises an ApplicationError before anything is written; writes run
in one transaction; side effects (pushes, agent commands, scheduling
requests) happen after commit.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import stat
import uuid
from collections import deque
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

import jsonschema
from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import IntegrityError, transaction
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from agent import protocol

from . import live, selectors
from . import slots as slotlib
from .errors import ApplicationError, Conflict, InvalidInput, QuotaExceeded, field_error
from .models import (
    ACTIVE,
    OCCUPYING,
    TERMINAL,
    TRANSITIONS,
    Agent,
    ClusterMode,
    DataFolder,
    Image,
    Kernel,
    KernelRole,
    ResourceGroup,
    Result,
    Session,
    SessionTemplate,
    SessionType,
    Status,
    derive_session_status,
)
from .signals import scheduling_requested
from .specs import SPEC_PROPERTIES, merge_spec

logger = logging.getLogger(__name__)

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SESSION_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_FOLDER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
RESERVED_ENV_PREFIX = "BACKENDAI_"
MAX_ENV_VARS = 128
MAX_ENV_VALUE = 8192
DEFAULT_SLOTS = {"cpu": Decimal(1), "mem": Decimal(2**30)}


# --- session creation -------------------------------------------------------


def session_create(*, owner: AbstractBaseUser, spec: dict[str, Any]) -> Session:
    """Validate a launch spec (optionally based on a template) and enqueue the session.

    The spec fields are those of ``specs.SPEC_PROPERTIES`` plus ``template``
    (a template id). Raises InvalidInput / QuotaExceeded / Conflict naming the
    field; nothing is written then.
    """
    spec = dict(spec)
    template = None
    template_id = spec.pop("template", None)
    if template_id not in (None, ""):
        template = _get_template(owner=owner, template_id=template_id)
        spec = merge_spec(template.spec, spec)
    unknown = sorted(set(spec) - set(SPEC_PROPERTIES))
    if unknown:
        raise InvalidInput(
            f"unknown field: {', '.join(unknown)}", {name: ["unknown field"] for name in unknown}
        )
    plan = _validate_launch(owner=owner, spec=spec)
    try:
        with transaction.atomic():
            session = _session_insert(owner=owner, plan=plan, template=template)
    except IntegrityError:
        # Checked here rather than before the insert, so that two concurrent
        # launches cannot both pass; by existence, since SQLite's message
        # does not name the constraint.
        if (
            Session.objects.filter(owner=owner, name=plan["name"])
            .exclude(status__in=TERMINAL)
            .exists()
        ):
            raise Conflict(
                f"You already have an active session named {plan['name']!r}.",
                {"fields": {"name": ["already used by one of your active sessions"]}},
            ) from None
        raise
    logger.info(
        "session %s created by user %s in group %s", session.pk, owner.pk, plan["group"].name
    )
    return session


def _get_template(*, owner: AbstractBaseUser, template_id: object) -> SessionTemplate:
    try:
        return selectors.templates_for_user(user=owner).get(pk=int(str(template_id)))
    except (ValueError, SessionTemplate.DoesNotExist):
        raise field_error("template", f"no template with id {template_id!r}") from None


def _validate_launch(*, owner: AbstractBaseUser, spec: dict[str, Any]) -> dict[str, Any]:
    errors: dict[str, list[str]] = {}

    def bad(field: str, message: str) -> None:
        errors.setdefault(field, []).append(message)

    policy = selectors.policy_for_user(user=owner)

    # type
    session_type = spec.get("type") or SessionType.INTERACTIVE
    if session_type not in SessionType.values:
        bad(
            "type",
            f"unknown session type {session_type!r} (one of {', '.join(SessionType.values)})",
        )

    # image
    image = None
    image_ref = spec.get("image")
    if not image_ref or not isinstance(image_ref, str):
        bad("image", "is required")
    else:
        image = Image.objects.filter(reference=image_ref, is_active=True).first()
        if image is None:
            bad("image", f"unknown image {image_ref!r}")

    # resource group
    group = None
    group_name = spec.get("resource_group") or "default"
    if not isinstance(group_name, str):
        bad("resource_group", "must be a name")
    else:
        group = ResourceGroup.objects.filter(name=group_name, is_active=True).first()
        if group is None:
            bad("resource_group", f"unknown resource group {group_name!r}")
    if group is not None:
        if policy is not None:
            allowed = list(policy.allowed_resource_groups.values_list("name", flat=True))
            if allowed and group.name not in allowed:
                bad("resource_group", f"your resource policy does not allow group {group.name!r}")
        if session_type not in group.allowed_session_types:
            bad("type", f"resource group {group.name!r} does not allow {session_type} sessions")
        if image is not None:
            allowed_groups = list(image.allowed_groups.values_list("name", flat=True))
            if allowed_groups and group.name not in allowed_groups:
                bad(
                    "image",
                    f"image {image.reference!r} is not allowed in resource group {group.name!r}",
                )

    # cluster
    cluster_mode = spec.get("cluster_mode") or ClusterMode.SINGLE_NODE
    if cluster_mode not in ClusterMode.values:
        bad("cluster_mode", f"must be one of {', '.join(ClusterMode.values)}")
    roles = spec.get("roles") or {}
    role_errors = list(jsonschema.Draft202012Validator(SPEC_PROPERTIES["roles"]).iter_errors(roles))
    for error in role_errors:
        where = ".".join(["roles", *(str(p) for p in error.absolute_path)])
        bad(where, error.message)
    if role_errors:
        roles = {}
    main_role = roles.get("main") or {}
    sub_role = roles.get("sub") or {}
    if main_role.get("replicas", 1) != 1:
        bad("roles.main.replicas", "a session has exactly one main kernel (main1)")
    cluster_size = spec.get("cluster_size")
    if cluster_size is None:
        cluster_size = 1 + int(sub_role.get("replicas", 0) or 0)
    if isinstance(cluster_size, bool) or not isinstance(cluster_size, int):
        bad("cluster_size", f"{cluster_size!r} is not a whole number")
        cluster_size = 1
    elif cluster_size < 1:
        bad("cluster_size", f"must be at least 1 (got {cluster_size})")
    max_containers = policy.max_containers_per_session if policy else None
    quota_errors: dict[str, list[str]] = {}
    if (
        max_containers is not None
        and isinstance(cluster_size, int)
        and cluster_size > max_containers
    ):
        quota_errors["cluster_size"] = [
            f"quota: at most {max_containers} containers per session; {cluster_size} asked "
            f"({cluster_size - max_containers} over)"
        ]

    # per-role images and resources (a role's resources override the common ones key by key)
    def role_image(role: dict[str, Any], field: str) -> Image | None:
        if not role.get("image"):
            return image
        found = Image.objects.filter(reference=role["image"], is_active=True).first()
        if found is None:
            bad(field, f"unknown image {role['image']!r}")
        elif group is not None:
            allowed_groups = list(found.allowed_groups.values_list("name", flat=True))
            if allowed_groups and group.name not in allowed_groups:
                bad(
                    field,
                    f"image {found.reference!r} is not allowed in resource group {group.name!r}",
                )
        return found

    def role_slots(role: dict[str, Any], field: str, role_img: Image | None) -> dict[str, Decimal]:
        common = spec.get("resources")
        if role.get("resources") is None:
            return _parse_resources(common, "resources", bad, role_img)
        if common is not None and not isinstance(common, dict):
            common = {}  # reported once, as "resources", by the main role
        return _parse_resources({**(common or {}), **role["resources"]}, field, bad, role_img)

    main_image = role_image(main_role, "roles.main.image")
    sub_image = role_image(sub_role, "roles.sub.image")
    main_slots = role_slots(main_role, "roles.main.resources", main_image)
    sub_slots = main_slots
    if sub_role.get("resources") is not None or main_role.get("resources") is not None:
        sub_slots = role_slots(sub_role, "roles.sub.resources", sub_image)
    elif sub_image is not main_image:
        _check_min_slots(sub_slots, sub_image, "roles.sub.image", bad)

    # env
    env = spec.get("env") or {}
    if not isinstance(env, dict):
        bad("env", "must be an object of NAME: value")
        env = {}
    if len(env) > MAX_ENV_VARS:
        bad("env", f"at most {MAX_ENV_VARS} variables")
    for name, value in env.items():
        if not isinstance(name, str) or not _ENV_NAME.match(name):
            bad(
                "env",
                f"{name!r} is not a valid variable name (letters, digits, _; not starting with a digit)",
            )
        elif name.startswith(RESERVED_ENV_PREFIX):
            bad("env", f"{name!r}: names starting with {RESERVED_ENV_PREFIX} are set by the system")
        elif not isinstance(value, str):
            bad("env", f"{name}: the value must be a string")
        elif len(value) > MAX_ENV_VALUE:
            bad("env", f"{name}: the value is longer than {MAX_ENV_VALUE} characters")

    # mounts: names of the owner's folders, nothing else
    mounts = spec.get("mounts") or []
    folders: list[DataFolder] = []
    if not isinstance(mounts, list):
        bad("mounts", "must be a list of folder names")
        mounts = []
    for name in mounts:
        if not isinstance(name, str) or not _FOLDER_NAME.match(name):
            bad(
                "mounts",
                f"{name!r} is not a folder name (a path outside your folders is never mounted)",
            )
            continue
        folder = DataFolder.objects.filter(owner=owner, name=name).first()
        if folder is None:
            bad("mounts", f"you have no data folder named {name!r}")
        elif folder in folders:
            bad("mounts", f"{name!r} is listed twice")
        else:
            folders.append(folder)

    # command
    startup_command = spec.get("startup_command") or ""
    if not isinstance(startup_command, str):
        bad("startup_command", "must be a string")
        startup_command = ""
    if session_type == SessionType.BATCH and not startup_command.strip():
        bad("startup_command", "a batch session needs a start command")

    # name
    name = spec.get("name") or f"session-{uuid.uuid4().hex[:6]}"
    if not isinstance(name, str) or not _SESSION_NAME.match(name):
        bad(
            "name", "use up to 64 letters, digits, '.', '_' or '-', starting with a letter or digit"
        )

    # dependencies: the owner's own sessions only
    depends_on: list[Session] = []
    dep_ids = spec.get("depends_on") or []
    if not isinstance(dep_ids, list):
        bad("depends_on", "must be a list of session ids")
        dep_ids = []
    for dep_id in dep_ids:
        try:
            dep = Session.objects.filter(owner=owner, pk=uuid.UUID(str(dep_id))).first()
        except ValueError:
            dep = None
        if dep is None:
            bad("depends_on", f"no session of yours with id {dep_id!r}")
        elif dep in depends_on:
            bad("depends_on", f"{dep_id} is listed twice")
        else:
            depends_on.append(dep)

    # time
    starts_at = spec.get("starts_at")
    if starts_at:
        try:
            parsed = parse_datetime(starts_at) if isinstance(starts_at, str) else None
        except ValueError:  # well formed but not a date, e.g. month 13
            parsed = None
        if parsed is None:
            bad("starts_at", f"{starts_at!r} is not an ISO 8601 date-time")
        else:
            starts_at = parsed if timezone.is_aware(parsed) else timezone.make_aware(parsed)
    else:
        starts_at = None
    batch_timeout = spec.get("batch_timeout")
    if batch_timeout is not None:
        if (
            isinstance(batch_timeout, bool)
            or not isinstance(batch_timeout, (int, float))
            or batch_timeout <= 0
        ):
            bad("batch_timeout", "must be a positive number of seconds")
            batch_timeout = None
        else:
            try:
                batch_timeout = timedelta(seconds=batch_timeout)
            except OverflowError:
                bad("batch_timeout", "is too large")
                batch_timeout = None

    if errors:
        first_field, messages = next(iter(errors.items()))
        raise InvalidInput(f"{first_field}: {messages[0]}", errors)

    if "cluster_size" in quota_errors:
        raise QuotaExceeded(quota_errors["cluster_size"][0], {"fields": quota_errors})

    # Capacity: can any agent ever hold it? (only when the group has agents)
    kernel_slots = [main_slots] + [sub_slots] * (cluster_size - 1)
    _check_capacity(group=group, cluster_mode=cluster_mode, kernel_slots=kernel_slots)

    # Quotas that no amount of waiting can satisfy, and the pending limit.
    total = {}
    for one in kernel_slots:
        total = slotlib.add(total, one)
    if policy is not None:
        for slot, limit in (policy.total_resource_slots or {}).items():
            limit = Decimal(str(limit))
            if total.get(slot, Decimal(0)) > limit:
                over = total[slot] - limit
                quota_errors.setdefault("resources", []).append(
                    f"quota: total {slot} is limited to {slotlib.fmt(slot, limit)}; this session needs "
                    f"{slotlib.fmt(slot, total[slot])} ({slotlib.fmt(slot, over)} over)"
                )
        if policy.max_pending_sessions is not None:
            pending = Session.objects.filter(owner=owner, status=Status.PENDING).count()
            if pending + 1 > policy.max_pending_sessions:
                quota_errors.setdefault("non_field_errors", []).append(
                    f"quota: at most {policy.max_pending_sessions} pending sessions; you have {pending} "
                    f"pending ({pending + 1 - policy.max_pending_sessions} over with this one)"
                )
    if quota_errors:
        first_field, messages = next(iter(quota_errors.items()))
        raise QuotaExceeded(messages[0], {"fields": quota_errors})

    return {
        "name": name,
        "type": session_type,
        "image": image,
        "main_image": main_image,
        "sub_image": sub_image,
        "group": group,
        "cluster_mode": cluster_mode,
        "cluster_size": cluster_size,
        "main_slots": main_slots,
        "sub_slots": sub_slots,
        "env": env,
        "folders": folders,
        "startup_command": startup_command,
        "depends_on": depends_on,
        "starts_at": starts_at,
        "batch_timeout": batch_timeout,
    }


def _parse_resources(raw: Any, field: str, bad: Any, image: Image | None) -> dict[str, Decimal]:
    if raw is None:
        raw = {}
    try:
        parsed = slotlib.parse_slots(raw, settings.BAI_SLOT_TYPES)
    except slotlib.SlotError as exc:
        bad(field, exc.message if exc.slot == "resources" else f"{exc.slot}: {exc.message}")
        return dict(DEFAULT_SLOTS)
    slots = {**DEFAULT_SLOTS, **parsed}
    for slot in ("cpu", "mem"):
        if slots[slot] <= 0:
            bad(field, f"{slot}: must be more than 0")
    _check_min_slots(slots, image, field, bad)
    return slots


def _check_min_slots(slots: dict[str, Decimal], image: Image | None, field: str, bad: Any) -> None:
    if image is None:
        return
    for slot, minimum in slotlib.from_strings(image.min_slots or {}).items():
        if slots.get(slot, Decimal(0)) < minimum:
            bad(
                field,
                f"{slot}: image {image.reference} needs at least {slotlib.fmt(slot, minimum)} per container",
            )


def _check_capacity(
    *, group: ResourceGroup, cluster_mode: str, kernel_slots: list[dict[str, Decimal]]
) -> None:
    capacities = [
        slotlib.from_strings(c)
        for c in selectors.agents_in_group(group=group).values_list("capacity_slots", flat=True)
        if c
    ]
    if not capacities:
        return  # no agent yet: the session waits, and says so
    for need in {tuple(sorted(k.items())) for k in kernel_slots}:
        need_map = dict(need)
        if not any(not slotlib.shortfall(need_map, cap) for cap in capacities):
            short = _largest_shortfall(need_map, capacities)
            message = f"no agent in resource group {group.name!r} can ever hold one container of this size: {short}"
            raise InvalidInput(message, {"resources": [message]})
    if len(kernel_slots) < 2:
        return
    total: dict[str, Decimal] = {}
    for one in kernel_slots:
        total = slotlib.add(total, one)
    if cluster_mode != ClusterMode.SINGLE_NODE:
        # Not a packing, only a bound that never refuses what could fit: the
        # agents together must have at least the whole cluster's resources.
        group_total: dict[str, Decimal] = {}
        for cap in capacities:
            group_total = slotlib.add(group_total, cap)
        short = slotlib.shortfall(total, group_total)
        if short:
            parts = ", ".join(
                f"needs {slotlib.fmt(slot, total[slot])}, all agents together have "
                f"{slotlib.fmt(slot, group_total.get(slot, Decimal(0)))}"
                for slot in sorted(short)
            )
            message = (
                f"a cluster of {len(kernel_slots)} containers can never fit in resource group "
                f"{group.name!r}: {parts}"
            )
            raise InvalidInput(message, {"cluster_size": [message]})
        return
    if not any(not slotlib.shortfall(total, cap) for cap in capacities):
        short = _largest_shortfall(total, capacities)
        message = (
            f"a single-node cluster of {len(kernel_slots)} containers does not fit on any one agent "
            f"in {group.name!r}: {short}; use multi-node or a smaller cluster"
        )
        raise InvalidInput(message, {"cluster_size": [message]})


def _largest_shortfall(need: dict[str, Decimal], capacities: list[dict[str, Decimal]]) -> str:
    """Human text of what is short, against the best agent for each slot."""
    parts = []
    for slot, value in sorted(need.items()):
        largest = max(cap.get(slot, Decimal(0)) for cap in capacities)
        if value > largest:
            parts.append(
                f"needs {slotlib.fmt(slot, value)}, the largest agent has {slotlib.fmt(slot, largest)}"
            )
    return ", ".join(parts) or "this combination of resources (no agent has all of it at once)"


def _session_insert(
    *, owner: AbstractBaseUser, plan: dict[str, Any], template: SessionTemplate | None
) -> Session:
    private_key, public_key = _ssh_keypair()
    session = Session.objects.create(
        owner=owner,
        name=plan["name"],
        session_type=plan["type"],
        cluster_mode=plan["cluster_mode"],
        cluster_size=plan["cluster_size"],
        requested_slots=slotlib.to_strings(plan["main_slots"]),
        image=plan["image"],
        resource_group=plan["group"],
        template=template,
        environ=plan["env"],
        startup_command=plan["startup_command"],
        starts_at=plan["starts_at"],
        batch_timeout=plan["batch_timeout"],
        ssh_private_key=private_key,
        ssh_public_key=public_key,
    )
    session.mounts.set(plan["folders"])
    session.depends_on.set(plan["depends_on"])
    kernels = [
        Kernel(
            id=session.id,  # main1's kernel id equals the session id
            session=session,
            cluster_role=KernelRole.MAIN,
            cluster_idx=1,
            local_rank=0,
            cluster_hostname="main1",
            image=plan["main_image"].reference,
            requested_slots=slotlib.to_strings(plan["main_slots"]),
        )
    ]
    for idx in range(1, plan["cluster_size"]):
        kernels.append(
            Kernel(
                session=session,
                cluster_role=KernelRole.SUB,
                cluster_idx=idx,
                local_rank=idx,
                cluster_hostname=f"sub{idx}",
                image=plan["sub_image"].reference,
                requested_slots=slotlib.to_strings(plan["sub_slots"]),
            )
        )
    Kernel.objects.bulk_create(kernels)
    session.events.create(to_status=Status.PENDING, reason="created; waiting for the scheduler")
    live.session_changed(
        owner_id=owner.pk, session_id=str(session.pk), status=Status.PENDING, reason="created"
    )
    request_scheduling(group_id=plan["group"].pk)
    return session


def _ssh_keypair() -> tuple[str, str]:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.OpenSSH,
        serialization.NoEncryption(),
    ).decode()
    public = (
        key.public_key()
        .public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
        .decode()
    )
    return private, public + " backendai-session"


def request_scheduling(*, group_id: int | None = None) -> None:
    """Ask scheduler_app for a pass after this transaction commits."""
    transaction.on_commit(
        lambda: scheduling_requested.send(sender=Session, resource_group_id=group_id)
    )


# --- environment of a kernel -----------------------------------------------


def kernel_environ(*, session: Session, kernel: Kernel, hosts: list[str]) -> dict[str, str]:
    """Every BACKENDAI_* variable of CONCEPTS.md, plus the user's own."""
    env = dict(session.environ or {})
    env.update(
        {
            "BACKENDAI_SESSION_ID": str(session.pk),
            "BACKENDAI_SESSION_NAME": session.name,
            "BACKENDAI_KERNEL_ID": str(kernel.pk),
            "BACKENDAI_CLUSTER_HOST": kernel.cluster_hostname,
            "BACKENDAI_CLUSTER_HOSTS": ",".join(hosts),
            "BACKENDAI_CLUSTER_IDX": str(kernel.cluster_idx),
            "BACKENDAI_CLUSTER_LOCAL_RANK": str(kernel.local_rank),
            "BACKENDAI_CLUSTER_MODE": session.cluster_mode,
            "BACKENDAI_CLUSTER_ROLE": kernel.cluster_role,
            "BACKENDAI_CLUSTER_SIZE": str(session.cluster_size),
            "BACKENDAI_SESSION_TYPE": session.session_type,
        }
    )
    return env


def create_kernels_command(*, session: Session, kernels: list[Kernel]) -> dict[str, Any]:
    """The create_kernels message for the kernels of ``session`` on one agent."""
    all_kernels = list(session.kernels.order_by("local_rank"))
    hosts = [k.cluster_hostname for k in all_kernels]
    mounts = [{"name": f.name, "host_path": str(f.host_path)} for f in session.mounts.all()]
    return {
        "type": protocol.CREATE_KERNELS,
        "session_id": str(session.pk),
        "network": f"bai-{session.pk}",
        "cluster_mode": session.cluster_mode,
        "session_type": session.session_type,
        "ssh": {"private_key": session.ssh_private_key, "public_key": session.ssh_public_key}
        if session.ssh_private_key
        else None,
        "kernels": [
            {
                "kernel_id": str(k.pk),
                "hostname": k.cluster_hostname,
                "role": k.cluster_role,
                "image": k.image,
                "slots": k.requested_slots,
                "env": kernel_environ(session=session, kernel=k, hosts=hosts),
                "mounts": mounts,
                "startup_command": session.startup_command
                if k.cluster_role == KernelRole.MAIN
                else None,
                "cluster_hosts": hosts,
            }
            for k in kernels
        ],
    }


# --- status changes ---------------------------------------------------------


def _path(src: str, dst: str) -> list[str]:
    """Shortest chain of legal moves from src to dst (empty if none)."""
    queue: deque[list[str]] = deque([[src]])
    seen = {src}
    while queue:
        chain = queue.popleft()
        if chain[-1] == dst:
            return chain[1:]
        for nxt in TRANSITIONS[chain[-1]]:
            if nxt not in seen:
                seen.add(nxt)
                queue.append(chain + [nxt])
    return []


def session_sync_status(*, session: Session, reason: str) -> Session:
    """Bring a session's status in line with its kernels' (CONCEPTS.md).

    When the session starts ending, every kernel still alive is told to go;
    when it has ended, a scheduling pass is requested (resources were freed).
    """
    kernels = list(session.kernels.all())
    main = next(k for k in kernels if k.cluster_role == KernelRole.MAIN)
    target = derive_session_status(main.status, [k.status for k in kernels])
    session.refresh_from_db(fields=["status", "status_reason", "status_changed_at"])
    if session.status != target and session.status not in TERMINAL:
        for step in _path(session.status, target):
            if not session.transition(step, reason):
                session.refresh_from_db()
                break
    if session.status == Status.TERMINATING:
        _destroy_live_kernels(session=session, kernels=kernels, reason=reason)
    if session.status in TERMINAL:
        # Resources were freed, and dependents (in any group) may now start
        # or must be cancelled: ask for a pass everywhere.
        request_scheduling(group_id=None)
    if session.status in TERMINAL or session.status == Status.TERMINATING:
        # Ending (a batch result is known once main1 exits): dependents that
        # can never start are cancelled now, not at the next pass.
        session_cancel_dependents(session=session)
    return session


def _destroy_live_kernels(*, session: Session, kernels: list[Kernel], reason: str) -> None:
    by_agent: dict[str, list[str]] = {}
    for kernel in kernels:
        if kernel.status in TERMINAL:
            continue
        if kernel.status == Status.PENDING:
            kernel.mark_cancelled(reason)
            continue
        # Only the kernels this call moves are told to go: one already
        # TERMINATING got its destroy when it moved, and the heartbeat path
        # re-sends it while the agent still reports the kernel.
        if (
            kernel.status != Status.TERMINATING
            and kernel.mark_terminating(reason)
            and kernel.agent_id
        ):
            by_agent.setdefault(kernel.agent_id, []).append(str(kernel.pk))
    for agent_id, kernel_ids in by_agent.items():
        live.send_to_agent_after_commit(
            agent_id, {"type": protocol.DESTROY_KERNELS, "kernel_ids": kernel_ids, "reason": reason}
        )


def session_terminate(*, session: Session, reason: str) -> Session:
    """End a session, whatever phase it is in. Ending an ended session is refused."""
    with transaction.atomic():
        session = Session.objects.select_for_update().get(pk=session.pk)
        if session.status in TERMINAL:
            raise Conflict(f"The session has already ended ({session.status}).")
        kernels = list(session.kernels.select_for_update().order_by("local_rank"))
        if session.status == Status.PENDING:
            for kernel in kernels:
                if kernel.status == Status.PENDING:
                    kernel.mark_cancelled(reason)
            session.mark_cancelled(reason)
            session_cancel_dependents(session=session)
            # group None: every group, since dependents may wait anywhere.
            request_scheduling(group_id=None)
            return session
        _destroy_live_kernels(session=session, kernels=kernels, reason=reason)
        return session_sync_status(session=session, reason=reason)


def session_cancel_dependents(*, session: Session) -> list[Session]:
    """Cancel, transitively, the pending sessions waiting on ``session`` once
    it can no longer end with SUCCESS; each reason names the dependency and why
    (``dependency B cancelled: dependency A ended FAILED (exit code 1)``).

    Idempotent, and a no-op while ``session`` may still succeed. Runs in the
    caller's transaction; the scheduler's dependency check is the backstop.
    """
    cancelled: list[Session] = []
    with transaction.atomic():
        queue, seen = deque([session]), {session.pk}
        while queue:
            dependency = Session.objects.get(pk=queue.popleft().pk)
            outcome = _failed_dependency_outcome(dependency)
            if outcome is None:
                continue
            reason = f"dependency {dependency.name} {outcome}"
            waiting = dependency.dependents.select_for_update(of=("self",)).filter(
                status=Status.PENDING
            )
            for dependent in waiting.order_by("created_at"):
                for kernel in dependent.kernels.filter(status=Status.PENDING):
                    kernel.mark_cancelled(reason)
                if dependent.mark_cancelled(reason) and dependent.pk not in seen:
                    seen.add(dependent.pk)
                    cancelled.append(dependent)
                    queue.append(dependent)
    return cancelled


def _failed_dependency_outcome(session: Session) -> str | None:
    """How a session ended, worded for its dependents; None if it may still succeed."""
    if session.result == Result.SUCCESS:
        return None
    if session.result == Result.FAILED:
        detail = (
            f"exit code {session.exit_code}"
            if session.exit_code is not None
            else session.status_reason
        )
        return f"ended FAILED ({detail})"
    if session.status == Status.CANCELLED:
        return f"cancelled: {session.status_reason}"
    if session.status in TERMINAL:
        return f"ended {session.status} without success: {session.status_reason}"
    return None


def kernel_apply_report(*, kernel: Kernel, report: dict[str, Any]) -> None:
    """Apply what an agent says about one of its kernels (idempotent)."""
    status = report.get("status")
    reason = report.get("reason") or ""
    exit_code = report.get("exit_code")
    container_id = report.get("container_id") or kernel.container_id
    with transaction.atomic():
        # Lock order everywhere: the session row, then its kernels (as
        # session_terminate does), so the two paths cannot deadlock.
        Session.objects.select_for_update().filter(pk=kernel.session_id).first()
        kernel = Kernel.objects.select_for_update().get(pk=kernel.pk)
        if kernel.status in TERMINAL:
            return
        changed = False
        if status == protocol.KR_PREPARING and kernel.status == Status.SCHEDULED:
            changed = kernel.mark_preparing(
                reason or "creating the container", container_id=container_id
            )
        elif status == protocol.KR_PULLING and kernel.status in (
            Status.SCHEDULED,
            Status.PREPARING,
        ):
            changed = kernel.mark_pulling(reason or "pulling the image", container_id=container_id)
        elif status == protocol.KR_RUNNING and kernel.status in (
            Status.SCHEDULED,
            Status.PREPARING,
            Status.PULLING,
        ):
            changed = kernel.mark_running(reason or "running", container_id=container_id)
        elif status == protocol.KR_EXITED:
            text = reason or f"exited with code {exit_code}"
            if kernel.status in (Status.SCHEDULED, Status.PREPARING, Status.PULLING):
                changed = kernel.mark_running("running", container_id=container_id)
            changed = (
                kernel.mark_terminated(text, exit_code=exit_code, container_id=container_id)
                or changed
            )
            if kernel.cluster_role == KernelRole.MAIN:
                _record_result(kernel=kernel, exit_code=exit_code)
        elif status == protocol.KR_ERROR:
            changed = kernel.mark_error(reason or "the agent could not start the kernel")
        elif status == protocol.KR_GONE:
            changed = kernel.mark_terminated(reason or "destroyed")
        if changed:
            session = Session.objects.get(pk=kernel.session_id)
            if kernel.status in TERMINAL:
                why = f"{kernel.cluster_hostname}: {kernel.status_reason}"
                if kernel.agent_id:
                    agent_refresh_occupancy(agent_id=kernel.agent_id)
            else:
                why = kernel.status_reason
            session_sync_status(session=session, reason=why)


def agent_refresh_occupancy(*, agent_id: str) -> None:
    """Agent.occupied_slots (shown to admins) from the kernels that hold slots
    there now; the scheduler derives its own figure and never trusts this one."""
    held: dict[str, Decimal] = {}
    for requested in Kernel.objects.filter(agent_id=agent_id, status__in=OCCUPYING).values_list(
        "requested_slots", flat=True
    ):
        held = slotlib.add(held, slotlib.from_strings(requested))
    Agent.objects.filter(pk=agent_id).update(occupied_slots=slotlib.to_strings(held))


def _record_result(*, kernel: Kernel, exit_code: int | None) -> None:
    session = Session.objects.get(pk=kernel.session_id)
    if session.session_type != SessionType.BATCH:
        Session.objects.filter(pk=session.pk).update(exit_code=exit_code)
        return
    result = Result.SUCCESS if exit_code == 0 else Result.FAILED
    Session.objects.filter(pk=session.pk, result=Result.UNDEFINED).update(
        result=result, exit_code=exit_code
    )


def kernel_store_log_tail(*, kernel_id: str, data: str) -> None:
    limit = settings.BAI_LOG_TAIL_BYTES
    tail = data.encode("utf-8", "replace")[-limit:].decode("utf-8", "ignore")
    Kernel.objects.filter(pk=kernel_id).update(log_tail=tail)


def session_touch(*, session_id: object, now: datetime | None = None) -> None:
    """Record user activity (resets the idle timer)."""
    Session.objects.filter(pk=session_id, status__in=ACTIVE).update(
        last_activity_at=now or timezone.now()
    )


# --- folders and templates --------------------------------------------------


def folder_create(*, owner: AbstractBaseUser, name: str) -> DataFolder:
    if not isinstance(name, str) or not _FOLDER_NAME.match(name):
        raise field_error(
            "name", "use up to 64 letters, digits, '_' or '-', starting with a letter or digit"
        )
    if DataFolder.objects.filter(owner=owner, name=name).exists():
        raise Conflict(
            f"You already have a folder named {name!r}.", {"fields": {"name": ["already exists"]}}
        )
    with transaction.atomic():
        folder = DataFolder.objects.create(owner=owner, name=name)
        path = folder.host_path
        root = settings.BAI_STORAGE_ROOT
        if root not in path.resolve().parents:
            raise field_error("name", "resolves outside the storage root")
        path.mkdir(parents=True, exist_ok=True)
        # The kernel user's and its group's, nobody else's (new files keep the group).
        # Without root it stays the server's own; an agent running as root hands it over.
        if os.geteuid() == 0:
            os.chown(path, protocol.KERNEL_UID, protocol.KERNEL_GID)
        path.chmod(0o2770)
        # Process kernels reach a folder by its path: the directories above it stay searchable.
        for parent in [p for p in path.parents if p == root or root in p.parents]:
            with contextlib.suppress(OSError):
                if parent.stat().st_mode & 0o011 != 0o011:
                    parent.chmod(stat.S_IMODE(parent.stat().st_mode) | 0o011)
    return folder


def folder_delete(*, folder: DataFolder) -> None:
    in_use = folder.sessions.filter(status__in=ACTIVE).first()
    if in_use is not None:
        raise Conflict(f"Folder {folder.name!r} is mounted by active session {in_use.name!r}.")
    path = folder.host_path
    folder.delete()
    if path.is_dir() and settings.BAI_STORAGE_ROOT in path.resolve().parents:
        shutil.rmtree(path, ignore_errors=True)


def template_save(
    *,
    owner: AbstractBaseUser | None,
    name: str,
    spec: dict[str, Any],
    description: str = "",
    is_shared: bool = False,
    template: SessionTemplate | None = None,
) -> SessionTemplate:
    from .templates import validate_template_spec

    spec = validate_template_spec(spec)
    if not isinstance(name, str) or not name.strip():
        raise field_error("name", "is required")
    qs = SessionTemplate.objects.filter(owner=owner, name=name)
    if template is not None:
        qs = qs.exclude(pk=template.pk)
    if qs.exists():
        raise Conflict(
            f"A template named {name!r} exists already.", {"fields": {"name": ["already exists"]}}
        )
    if template is None:
        template = SessionTemplate(owner=owner)
    template.name = name
    template.description = description
    template.spec = spec
    template.is_shared = is_shared
    template.save()
    return template


__all__ = [
    "ApplicationError",
    "folder_create",
    "folder_delete",
    "kernel_apply_report",
    "session_create",
    "session_terminate",
]
