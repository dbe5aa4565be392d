"""Writes. Every change a user, an admin or an agent causes goes through here.

Validation raises an ApplicationError before anything is written; writes run
in one transaction; side effects (pushes, agent commands, scheduling
requests) happen after commit.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import shutil
import stat
import uuid
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.core import signing
from django.db import IntegrityError, transaction
from django.utils import timezone

from agent import protocol
from backendai_web import redis as shared_redis
from bai_common import units

from . import folder_files, live, selectors
from . import policy as rules
from . import slots as slotlib
from .errors import Conflict, NotFound, PayloadTooLarge, QuotaExceeded, field_error
from .launch import FOLDER_NAME, LaunchPlan, check_pending_limit, name_conflict, plan_launch
from .models import (
    ACTIVE,
    TERMINAL,
    TRANSITIONS,
    DataFolder,
    FolderPermission,
    FolderShare,
    Kernel,
    KernelRole,
    Session,
    SessionTemplate,
    SessionType,
    Status,
    derive_session_status,
)
from .signals import reconcile_requested, scheduling_requested

logger = logging.getLogger(__name__)


# --- session creation -------------------------------------------------------


def session_create(*, owner: AbstractBaseUser, spec: dict[str, Any]) -> Session:
    """Check a launch spec (``launch.plan_launch``) and enqueue the session.

    Raises InvalidInput / Forbidden / QuotaExceeded / Conflict naming the
    field; nothing is written then.
    """
    plan = plan_launch(owner=owner, spec=spec)
    try:
        with transaction.atomic():
            if plan.session_type != SessionType.SYSTEM:
                # Counted again under the owner's lock: launches at once (a user's, and the
                # serving reconciler's replicas of several endpoints) queue here, and each
                # counts the pending sessions the ones before it committed.
                lock_owner(owner)
                check_pending_limit(owner=owner, plan=plan)
            session = _session_insert(owner=owner, plan=plan)
    except IntegrityError:
        # Checked here rather than before the insert, so that two concurrent
        # launches cannot both pass; by existence, since SQLite's message
        # does not name the constraint.
        conflict = name_conflict(owner=owner, name=plan.name)
        if conflict is not None:
            raise conflict from None
        raise
    logger.info("session %s created by user %s in group %s", session.pk, owner.pk, plan.group.name)
    return session


def lock_owner(owner: AbstractBaseUser) -> None:
    """Lock the user's row until the transaction ends: quota counts and the inserts they
    allow (sessions, endpoints) run one at a time per user, never on a stale count."""
    list(get_user_model().objects.select_for_update().filter(pk=owner.pk).values_list("pk"))


def _session_insert(*, owner: AbstractBaseUser, plan: LaunchPlan) -> Session:
    private_key, public_key = _ssh_keypair()
    session = Session.objects.create(
        owner=owner,
        name=plan.name,
        session_type=plan.session_type,
        cluster_mode=plan.cluster_mode,
        cluster_size=plan.cluster_size,
        requested_slots=slotlib.to_strings(plan.main.slots),
        image=plan.image,
        resource_group=plan.group,
        template=plan.template,
        environ=plan.env,
        startup_command=plan.startup_command,
        starts_at=plan.starts_at,
        batch_timeout=plan.batch_timeout,
        designated_agents=list(plan.agents),
        preopen_ports=list(plan.ports),
        ssh_private_key=private_key,
        ssh_public_key=public_key,
    )
    session.mounts.set(plan.folders)
    session.readonly_mounts.set(plan.readonly_folders)
    session.depends_on.set(plan.depends_on)
    kernels = [
        Kernel(
            id=session.id,  # main1's kernel id equals the session id
            session=session,
            cluster_role=KernelRole.MAIN,
            cluster_idx=1,
            local_rank=0,
            cluster_hostname="main1",
            image=plan.main.image.reference,
            requested_slots=slotlib.to_strings(plan.main.slots),
        )
    ]
    for idx in range(1, plan.cluster_size):
        kernels.append(
            Kernel(
                session=session,
                cluster_role=KernelRole.SUB,
                cluster_idx=idx,
                local_rank=idx,
                cluster_hostname=f"sub{idx}",
                image=plan.sub.image.reference,
                requested_slots=slotlib.to_strings(plan.sub.slots),
            )
        )
    Kernel.objects.bulk_create(kernels)
    session.events.create(to_status=Status.PENDING, reason="created; waiting for the scheduler")
    live.session_changed(
        owner_id=owner.pk, session_id=str(session.pk), status=Status.PENDING, reason="created"
    )
    request_scheduling(group_id=plan.group.pk)
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


def request_reconcile(*, agent_ids: set[str]) -> None:
    """Ask scheduler_app to reconcile these agents after this transaction commits."""
    if agent_ids:
        ids = sorted(agent_ids)
        transaction.on_commit(lambda: reconcile_requested.send(sender=Session, agent_ids=ids))


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

    When the session starts ending, every kernel still alive is ended (its
    agent is asked to reconcile, and destroys it); when it has ended, a
    scheduling pass is requested (resources were freed).
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
            live.status_changed(session)
    if session.status == Status.TERMINATING:
        _end_live_kernels(kernels=kernels, reason=reason)
    if session.status in TERMINAL:
        # Resources were freed, and dependents (in any group) may now start
        # or must be cancelled: ask for a pass everywhere.
        request_scheduling(group_id=None)
    if session.status in TERMINAL or session.status == Status.TERMINATING:
        # Ending (a batch result is known once main1 exits): dependents that
        # can never start are cancelled now, not at the next pass.
        session_cancel_dependents(session=session)
    return session


def _end_live_kernels(*, kernels: list[Kernel], reason: str) -> None:
    """Cancel the kernels still pending; move the placed ones to TERMINATING and
    ask their agents to reconcile (the reconcile path sends the destroys)."""
    agent_ids: set[str] = set()
    for kernel in kernels:
        if kernel.status in TERMINAL or kernel.status == Status.TERMINATING:
            continue
        if kernel.status == Status.PENDING:
            moved = kernel.mark_cancelled(reason)
        else:
            moved = kernel.mark_terminating(reason)
            if moved and kernel.agent_id:
                agent_ids.add(kernel.agent_id)
        if moved:
            live.status_changed(kernel)
    request_reconcile(agent_ids=agent_ids)


def session_terminate(*, session: Session, reason: str) -> Session:
    """End a session, whatever phase it is in. Ending an ended session is refused."""
    with transaction.atomic():
        session = Session.objects.select_for_update().get(pk=session.pk)
        if session.status in TERMINAL:
            raise Conflict(f"The session has already ended ({session.status}).")
        kernels = list(session.kernels.select_for_update().order_by("local_rank"))
        if session.status == Status.PENDING:
            _end_live_kernels(kernels=kernels, reason=reason)
            if session.mark_cancelled(reason):
                live.status_changed(session)
            session_cancel_dependents(session=session)
            # group None: every group, since dependents may wait anywhere.
            request_scheduling(group_id=None)
            return session
        _end_live_kernels(kernels=kernels, reason=reason)
        return session_sync_status(session=session, reason=reason)


def session_cancel_dependents(*, session: Session) -> list[Session]:
    """Cancel, transitively, the pending sessions waiting on ``session`` once
    it can no longer end with SUCCESS. Each reason names, by session name, every
    dependency of that dependant that was not satisfied, and why
    (``dependency B cancelled: dependency A ended FAILED (exit code 1)``).

    Idempotent, and a no-op while ``session`` may still succeed. Runs in the
    caller's transaction; the scheduler's dependency check is the backstop.
    """
    cancelled: list[Session] = []
    with transaction.atomic():
        queue, seen = deque([session]), {session.pk}
        while queue:
            dependency = queue.popleft()
            waiting = dependency.dependents.select_for_update(of=("self",)).filter(
                status=Status.PENDING
            )
            for dependent in waiting.order_by("created_at"):
                reason, _ = rules.dependencies_verdict(
                    [(dep.name, _dependency_state(dep)) for dep in dependent.depends_on.all()]
                )
                if reason is None:
                    continue  # this dependency may still succeed
                _end_live_kernels(kernels=list(dependent.kernels.all()), reason=reason)
                if not dependent.mark_cancelled(reason):
                    continue
                live.status_changed(dependent)
                if dependent.pk not in seen:
                    seen.add(dependent.pk)
                    cancelled.append(dependent)
                    queue.append(dependent)
    return cancelled


def _dependency_state(session: Session) -> rules.DependencyState:
    return rules.dependency_state(
        status=session.status,
        result=session.result,
        name=session.name,
        exit_code=session.exit_code,
        status_reason=session.status_reason,
    )


def session_touch(*, session_id: object, now: datetime | None = None) -> None:
    """Record user activity (resets the idle timer)."""
    Session.objects.filter(pk=session_id, status__in=ACTIVE).update(
        last_activity_at=now or timezone.now()
    )


# --- folders and templates --------------------------------------------------


def folder_create(*, owner: AbstractBaseUser, name: str) -> DataFolder:
    """A new, empty folder; refused past the owner's ``max_folders`` with the figures."""
    if not isinstance(name, str) or not FOLDER_NAME.fullmatch(name):
        raise field_error(
            "name", "use up to 64 letters, digits, '_' or '-', starting with a letter or digit"
        )
    if DataFolder.objects.filter(owner=owner, name=name).exists():
        raise Conflict(
            f"You already have a folder named {name!r}.", {"fields": {"name": ["already exists"]}}
        )
    policy = selectors.policy_for_user(user=owner)
    with transaction.atomic():
        if policy is not None and policy.max_folders is not None:
            # Serialise this owner's creations so two at once cannot both pass the count.
            # The user model, not the owner's class: a request's user is a lazy wrapper.
            get_user_model().objects.select_for_update().filter(pk=owner.pk).first()
            count = DataFolder.objects.filter(owner=owner).count()
            if count >= policy.max_folders:
                raise QuotaExceeded(
                    f"You have {count} folder{'s' if count != 1 else ''}, the most your "
                    f"policy allows ({policy.max_folders}).",
                    {"folder_count": count, "max_folders": policy.max_folders},
                )
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
    """Delete a folder and its files; refused (naming every one) while live sessions mount it."""
    in_use = [s.name for s in selectors.folder_sessions_mounting(folder=folder)]
    if in_use:
        names = ", ".join(repr(name) for name in in_use)
        raise Conflict(
            f"Folder {folder.name!r} is mounted by live session{'s' if len(in_use) > 1 else ''} "
            f"{names}; terminate {'them' if len(in_use) > 1 else 'it'} first.",
            {"sessions": in_use},
        )
    path = folder.host_path
    folder.delete()
    if path.is_dir() and settings.BAI_STORAGE_ROOT in path.resolve().parents:
        shutil.rmtree(path, ignore_errors=True)


REVOKE_NOTE = "Revoking affects sessions started from now on; running sessions keep their mount."


def folder_share_set(
    *, folder: DataFolder, username: str, permission: str
) -> tuple[FolderShare, bool]:
    """Share ``folder`` with a user (again: change the permission). Returns (share, created)."""
    from django.contrib.auth import get_user_model

    if permission not in FolderPermission.values:
        raise field_error("permission", "must be 'ro' or 'rw'")
    user = get_user_model().objects.filter(username=username, is_active=True).first()
    if user is None:
        raise field_error("user", f"no user named {username!r}")
    if user.pk == folder.owner_id:
        raise field_error("user", "the folder is yours already; share it with someone else")
    share, created = FolderShare.objects.update_or_create(
        folder=folder, user=user, defaults={"permission": permission}
    )
    logger.info("folder %s shared with user %s (%s)", folder.pk, user.pk, permission)
    return share, created


def folder_share_revoke(*, folder: DataFolder, username: str) -> None:
    deleted, _ = FolderShare.objects.filter(folder=folder, user__username=username).delete()
    if not deleted:
        raise NotFound(f"Folder {folder.name!r} is not shared with {username!r}.")
    logger.info("folder %s no longer shared with %r", folder.pk, username)


# --- files in folders -------------------------------------------------------------


UPLOAD_LEDGER_PREFIX = "bai:folder-writes:"
UPLOAD_LEDGER_TTL = 24 * 3600


def _upload_ledger_key(owner_id: int) -> str:
    return f"{shared_redis.keyed(UPLOAD_LEDGER_PREFIX)}{owner_id}"


@dataclass(frozen=True)
class UploadAllowance:
    """How many bytes an upload may write: ``None`` when the owner has no byte quota.

    ``used`` is what the owner's folders held when the upload began. Uploads running at
    the same time (other tabs, other processes) all add what they write to the owner's
    ledger in Redis, which only grows; ``mark`` is its value at the start, so an upload
    sees every byte written into the owner's folders since, and two uploads that each
    fit cannot together pass the quota."""

    owner_name: str  # "your" or "alice's": whose folders the figures are about
    used: int
    max_bytes: int | None
    replaced: int  # the size of the file the upload replaces
    owner_id: int = 0
    mark: int = 0

    @property
    def limit(self) -> int | None:
        if self.max_bytes is None:
            return None
        return max(0, self.max_bytes - self.used + self.replaced)

    def metered(self, chunks: Iterable[bytes]) -> Iterator[bytes]:
        """``chunks``, each added to the owner's ledger before it is written; refused
        once this upload and what others wrote since it began pass the quota."""
        if self.max_bytes is None:
            yield from chunks
            return
        ledger, key, own = shared_redis.client(), _upload_ledger_key(self.owner_id), 0
        for chunk in chunks:
            own += len(chunk)
            pipe = ledger.pipeline(transaction=False)
            pipe.incrby(key, len(chunk))
            pipe.expire(key, UPLOAD_LEDGER_TTL)
            total = pipe.execute()[0]
            others = max(0, total - self.mark - own)
            if self.used + others - self.replaced + own > self.max_bytes:
                raise self.refusal(own, so_far=True, others=others)
            yield chunk

    def refusal(self, size: int, *, so_far: bool = False, others: int = 0) -> PayloadTooLarge:
        assert self.max_bytes is not None
        if others:
            shown = units.format_size_rounded
            return PayloadTooLarge(
                f"Upload refused: {self.owner_name} folders hold {shown(self.used + others)} "
                f"of {'your' if self.owner_name == 'your' else 'their'} "
                f"{shown(self.max_bytes)} quota, {shown(others)} of it written by other "
                f"uploads while this one ran; this file (more than {shown(size)}) would take "
                f"them to more than {shown(self.used + others - self.replaced + size)}.",
                {
                    "used_bytes": self.used + others,
                    "max_bytes": self.max_bytes,
                    "file_bytes": size,
                },
            )
        after = self.used - self.replaced + size
        shown = units.format_size_rounded
        this = f"more than {shown(size)}" if so_far else shown(size)
        return PayloadTooLarge(
            f"Upload refused: {self.owner_name} folders hold {shown(self.used)} of "
            f"{'your' if self.owner_name == 'your' else 'their'} {shown(self.max_bytes)} quota; "
            f"this file ({this}) would take them to {'more than ' if so_far else ''}"
            f"{shown(after)}.",
            {"used_bytes": self.used, "max_bytes": self.max_bytes, "file_bytes": size},
        )


def folder_upload_allowance(
    *, access: selectors.FolderAccess, user: AbstractBaseUser, parts: tuple[str, ...]
) -> UploadAllowance:
    """The room an upload into ``access.folder`` has under its owner's byte quota
    (shared folders count for their owner, also when a sharee writes)."""
    access.require_write()
    folder = access.folder
    policy = selectors.policy_for_user(user=folder.owner)
    max_bytes = policy.max_folder_bytes if policy is not None else None
    if max_bytes is None:
        return UploadAllowance("your", 0, None, 0)
    # The ledger is read before the disk: bytes landing in between count twice (a
    # refusal a little early), never not at all.
    mark = int(shared_redis.client().get(_upload_ledger_key(folder.owner_id)) or 0)
    owner_name = "your" if folder.owner_id == user.pk else f"{folder.owner.username}'s"
    used = selectors.storage_used(owner=folder.owner)
    if used > max_bytes:
        # Sessions wrote past the quota (no filesystem quota stops a kernel here).
        shown = units.format_size_rounded
        raise PayloadTooLarge(
            f"Upload refused: {owner_name} folders hold {shown(used)}, over "
            f"{'your' if owner_name == 'your' else 'their'} {shown(max_bytes)} quota "
            "(sessions wrote past it). Uploads are refused until they are under it again: "
            "delete files first.",
            {"used_bytes": used, "max_bytes": max_bytes, "over_quota": True},
        )
    return UploadAllowance(
        owner_name=owner_name,
        used=used,
        max_bytes=max_bytes,
        replaced=folder_files.existing_file_size(folder.host_path, parts),
        owner_id=folder.owner_id,
        mark=mark,
    )


def folder_measure(*, folder: DataFolder, seconds: float | None = None) -> int:
    """Measure the bytes ``folder`` holds on disk now and store them (``measured_bytes``).
    A walk cut short by its time bound stores what it counted: a lower bound."""
    used = selectors.folder_usage(
        folder=folder, seconds=selectors.FOLDER_WALK_SECONDS if seconds is None else seconds
    ).bytes
    now = timezone.now()
    DataFolder.objects.filter(pk=folder.pk).update(measured_bytes=used, measured_at=now)
    folder.measured_bytes, folder.measured_at = used, now
    return int(used)


def folder_file_write(
    *,
    folder: DataFolder,
    parts: tuple[str, ...],
    chunks: Iterable[bytes],
    allowance: UploadAllowance,
    length: int | None,
) -> int:
    """Stream an upload into the folder (no database: runs off the event loop).
    Refused before a byte is read when ``length`` is past the quota, else as soon
    as the stream passes it; nothing is left behind either way."""
    limit = allowance.limit
    if limit is not None and length is not None and length > limit:
        raise allowance.refusal(length)
    try:
        size = folder_files.write_file(
            folder.host_path, parts, allowance.metered(chunks), limit=limit
        )
    except folder_files.TooLarge as exc:
        raise allowance.refusal(exc.args[0], so_far=True) from None
    logger.info("folder %s: wrote %s bytes", folder.pk, size)
    return size


def folders_measure(*, folder_ids: Iterable[Any]) -> dict[str, list[Any]]:
    """Measure each folder (``folder_measure``); one that fails (storage gone, a walk
    error, a database error) is logged and skipped, never stopping the others."""
    done: dict[str, list[Any]] = {"measured": [], "failed": []}
    for folder in DataFolder.objects.filter(pk__in=list(folder_ids)).order_by("pk"):
        try:
            folder_measure(folder=folder)
        except Exception:  # noqa: BLE001 - one bad folder never stops the sweep
            logger.warning("folder %s: cannot measure its usage", folder.pk, exc_info=True)
            done["failed"].append(folder.pk)
        else:
            done["measured"].append(folder.pk)
    return done


def template_save(
    *,
    owner: AbstractBaseUser | None,
    name: str,
    spec: dict[str, Any],
    description: str = "",
    is_shared: bool = False,
    template: SessionTemplate | None = None,
) -> SessionTemplate:
    from .templates import validate_template_fields, validate_template_spec

    spec = validate_template_spec(spec)
    validate_template_fields(name=name, description=description)
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
    try:
        with transaction.atomic():
            template.save()
    except IntegrityError:
        # Another request saved the same name since the check above.
        raise Conflict(
            f"A template named {name!r} exists already.", {"fields": {"name": ["already exists"]}}
        ) from None
    return template


# --- apps (service ports) ----------------------------------------------------------

APP_LINK_SALT = "bai.apps.link"
APP_COOKIE_SALT = "bai.apps.cookie"
APP_SECRET_SALT = "bai.apps.secret"


def app_host_label(*, session_id: object, app: str) -> str:
    """The first label of an app's own host name: one origin per session and app."""
    return f"{uuid.UUID(str(session_id)).hex}-{app}"


def app_forward_url(*, session_id: object, app: str) -> str:
    """The apps proxy's raw-TCP websocket for an app (``bai app`` dials it with a token)."""
    scheme, _, rest = settings.BAI_APPS_ORIGIN.partition("://")
    ws = "wss" if scheme == "https" else "ws"
    return f"{ws}://{rest.rstrip('/')}/_bai/tcp/{session_id}/{app}"


def app_secret(*, session_id: object, app: str) -> str:
    """The secret the proxy presents to an app it started (Jupyter's token)."""
    return signing.Signer(salt=APP_SECRET_SALT).signature(f"{session_id}:{app}")


def app_open(*, user: AbstractBaseUser, session: Session, name: str) -> dict[str, Any]:
    """A short-lived, one-time link to an app of a running session, bound to this
    user, session and app; the apps origin trades it for a cookie of that app alone.
    The caller checked that ``user`` may see ``session``."""
    from . import selectors

    app = selectors.session_app(session=session, name=name)
    if app is None:
        raise NotFound(f"This session has no app named {name!r}.")
    if session.status != Status.RUNNING:
        raise Conflict(f"The session is {session.status.lower()}: its apps open once it runs.")
    if app.protocol != "http":
        raise Conflict(f"{name} is a TCP port: forward it with `bai app {session.pk} {name}`.")
    token = signing.dumps(
        {"u": user.pk, "s": str(session.pk), "a": name, "n": secrets.token_hex(8)},
        salt=APP_LINK_SALT,
    )
    scheme, _, rest = settings.BAI_APPS_ORIGIN.partition("://")
    origin = f"{scheme}://{app_host_label(session_id=session.pk, app=name)}.{rest}"
    session_touch(session_id=session.pk)
    logger.info("app %s of session %s opened by user %s", name, session.pk, user.pk)
    return {"url": f"{origin}/_bai/open?t={token}", "origin": origin, "app": app.to_dict()}
