"""SFTP system sessions and users' SSH keys: services and selectors.

An SFTP session is a ``system`` session of the SFTP image on chosen data folders. Its kernel
runs our SFTP server (``agent/sftp_server.py``); its agent publishes the server's port on the
agent's public address and reports where (``Kernel.published_host`` / ``published_port``).
Who may log in: the session's own key pair (the private key is the user's download) and the
owner's registered SSH keys at the time the kernel is created.

It counts against ``max_concurrent_sftp_sessions`` only, and never waits: over the limit, or
failing any other check of the scheduling pass, it is cancelled at once with the reason
(``scheduler_app.policy.schedule``).
"""

from __future__ import annotations

import logging
import secrets
from dataclasses import replace
from datetime import timedelta
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.db import IntegrityError, transaction
from django.db.models import QuerySet

from . import selectors
from .errors import Conflict, InvalidInput, NotFound, field_error
from .kernel_images import SFTP_IMAGE
from .launch import plan_launch
from .models import (
    DataFolder,
    FolderPermission,
    FolderShare,
    Image,
    Kernel,
    KernelRole,
    ResourceGroup,
    Session,
    SessionType,
    SSHKey,
)
from .sshkeys import parse_public_key

logger = logging.getLogger(__name__)

SFTP_USER = "work"
# Per SFTP kernel: the server is small, but a large transfer wants its buffers, and a whole
# CPU: sshd and the SFTP server spend ~2.5 CPU-seconds per GB (AES, the SFTP replies, the
# kernel's TCP work), so the 0.25 CPU of old held a transfer to ~60 MB/s (bench/README.md, SFTP).
SFTP_RESOURCES = {"cpu": "1", "mem": "256m"}
MAX_SFTP_FOLDERS = 32
SSH_KEY_NAME_MAX = 64


def is_sftp_session(session: Session) -> bool:
    """System sessions are SFTP sessions (the only kind there is)."""
    return session.session_type == SessionType.SYSTEM


# --- folders a user may open over SFTP ---------------------------------------------------------


def _folders_for_sftp(
    *, owner: AbstractBaseUser, folder_ids: list[Any]
) -> tuple[list[DataFolder], set[int]]:
    """The chosen folders (own, or shared with ``owner``) and the ids of those given read-only."""
    if not isinstance(folder_ids, list) or not folder_ids:
        raise field_error("folders", "choose at least one folder (a list of folder ids)")
    if len(folder_ids) > MAX_SFTP_FOLDERS:
        raise field_error("folders", f"at most {MAX_SFTP_FOLDERS} folders in one SFTP session")
    ids: list[int] = []
    for value in folder_ids:
        if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 2**63:
            raise field_error("folders", f"{str(value)[:40]!r} is not a folder id")
        if value in ids:
            raise field_error("folders", f"folder {value} is listed twice")
        ids.append(value)
    own = {f.pk: f for f in DataFolder.objects.filter(owner=owner, pk__in=ids)}
    shares = {
        s.folder_id: s
        for s in FolderShare.objects.filter(user=owner, folder_id__in=ids).select_related("folder")
    }
    folders, readonly = [], set()
    for pk in ids:
        if pk in own:
            folders.append(own[pk])
        elif pk in shares:
            folders.append(shares[pk].folder)
            if shares[pk].permission == FolderPermission.READ_ONLY:
                readonly.add(pk)
        else:
            raise field_error("folders", f"no folder with id {pk}")
    names = [f.name for f in folders]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise field_error(
            "folders", f"two folders named {twice[0]!r}: they would share one path; pick one"
        )
    return folders, readonly


def _sftp_group(*, owner: AbstractBaseUser, name: str | None) -> ResourceGroup:
    """The resource group asked for (it must allow system sessions), or the first that does."""
    groups = list(selectors.resource_groups_for_user(user=owner))
    allowing = [g for g in groups if SessionType.SYSTEM in (g.allowed_session_types or [])]
    if name is not None:
        if not isinstance(name, str) or not name:
            raise field_error("resource_group", "a resource group name")
        group = next((g for g in groups if g.name == name), None)
        if group is None:
            raise field_error("resource_group", f"unknown resource group {name[:64]!r}")
        if group in allowing:
            return group
    elif allowing:
        return next((g for g in allowing if g.name == "default"), allowing[0])
    which = ", ".join(g.name for g in allowing) or "none of your resource groups"
    where = f"resource group {name!r} does not" if name else "no resource group of yours does"
    raise field_error(
        "resource_group", f"{where} allow system (SFTP) sessions; groups that do: {which}"
    )


def sftp_session_create(
    *, owner: AbstractBaseUser, folder_ids: list[Any], resource_group: str | None = None
) -> Session:
    """Start an SFTP system session on the chosen folders (read-only where shared so).

    Raises InvalidInput (400) naming the field; nothing is written then. The session is
    created PENDING; the scheduling pass places it or cancels it at once with the reason.
    """
    folders, readonly = _folders_for_sftp(owner=owner, folder_ids=folder_ids)
    group = _sftp_group(owner=owner, name=resource_group)
    if not Image.objects.filter(reference=SFTP_IMAGE, is_active=True).exists():
        raise InvalidInput(
            f"The SFTP image {SFTP_IMAGE} is not registered; an admin builds it with "
            "`manage.py build_kernel_images`."
        )
    spec = {
        "name": f"sftp-{secrets.token_hex(3)}",
        "type": SessionType.SYSTEM,
        "image": SFTP_IMAGE,
        "resource_group": group.name,
        "resources": SFTP_RESOURCES,
    }
    plan = replace(plan_launch(owner=owner, spec=spec), folders=tuple(folders))
    from .services import _session_insert  # the one insert of a planned session

    try:
        with transaction.atomic():
            session = _session_insert(owner=owner, plan=plan)
            session.readonly_mounts.set([f for f in folders if f.pk in readonly])
    except IntegrityError:
        raise Conflict("An SFTP session of that name exists; try again.") from None
    logger.info(
        "SFTP session %s created by user %s on folders %s", session.pk, owner.pk, plan.folders
    )
    return session


# --- what the agent is told (scheduler_app.reconcile) ------------------------------------------


def sftp_kernel_spec(*, session: Session, folders: list[DataFolder]) -> dict[str, Any]:
    """The ``sftp`` part of an SFTP kernel's spec: the owner's registered keys, and per
    folder owner their byte quota and what their folders outside this session hold."""
    keys = list(
        SSHKey.objects.filter(owner_id=session.owner_id).values_list("public_key", flat=True)
    )
    quotas = []
    by_owner: dict[int, list[DataFolder]] = {}
    for folder in folders:
        by_owner.setdefault(folder.owner_id, []).append(folder)
    for owner_id, mounted in by_owner.items():
        policy = selectors.policy_for_user(user=mounted[0].owner)
        limit = policy.max_folder_bytes if policy else None
        if limit is None:
            continue
        names = {f.name for f in mounted}
        others = DataFolder.objects.filter(owner_id=owner_id).exclude(name__in=names)
        quotas.append(
            {
                "max_bytes": int(limit),
                "other_bytes": sum(selectors.folder_usage(folder=f).bytes for f in others),
                "folders": sorted(names),
            }
        )
    return {"authorized_keys": keys, "quotas": quotas}


def sftp_apply_report(*, kernel: Kernel, report: dict[str, Any], now: Any) -> None:
    """An agent's word on an SFTP kernel's published port: where it is, and its activity
    (a connection open now, or the time the last one ended, resets the idle timer)."""
    fields = {
        "published_host": report["host"],
        "published_port": report["port"],
        "host_key_fingerprint": report.get("host_key_fingerprint") or "",
    }
    if any(getattr(kernel, k) != v for k, v in fields.items()):
        Kernel.objects.filter(pk=kernel.pk).update(**fields)
        for key, value in fields.items():
            setattr(kernel, key, value)
    if report.get("connections"):
        active_at = now
    elif report.get("idle_for") is not None:
        active_at = now - timedelta(seconds=float(report["idle_for"]))
    else:
        return
    Session.objects.filter(pk=kernel.session_id, last_activity_at__lt=active_at).update(
        last_activity_at=active_at
    )


# --- what a user sees ----------------------------------------------------------------------------


def sftp_session_info(*, session: Session) -> dict[str, Any]:
    """How to connect to an SFTP session (``GET /sessions/{id}/sftp/``)."""
    if not is_sftp_session(session):
        raise NotFound("This session is not an SFTP session.")
    main = Kernel.objects.filter(session=session, cluster_role=KernelRole.MAIN).first()
    running = session.status == "RUNNING" and main is not None and main.published_port
    host = main.published_host if running else None
    port = main.published_port if running else None
    keys = ["session key"] + list(
        SSHKey.objects.filter(owner_id=session.owner_id).values_list("name", flat=True)
    )
    target = f"{SFTP_USER}@{host or 'HOST'}"
    return {
        "status": session.status,
        "status_reason": session.status_reason,
        "host": host,
        "port": port,
        "user": SFTP_USER,
        "folders": sorted(session.mounts.values_list("name", flat=True)),
        "readonly_folders": sorted(session.readonly_mounts.values_list("name", flat=True)),
        "host_key_fingerprint": (main.host_key_fingerprint or None) if running else None,
        "command": f"sftp -P {port or 'PORT'} -i KEYFILE {target}",
        "scp_command": f"scp -P {port or 'PORT'} -i KEYFILE FILE {target}:/{{folder}}/",
        "authorized_keys": keys,
    }


def sftp_private_key(*, session: Session) -> str:
    if not is_sftp_session(session):
        raise NotFound("This session is not an SFTP session.")
    return session.ssh_private_key


# --- SSH keys ------------------------------------------------------------------------------------


def ssh_keys_for_user(*, user: AbstractBaseUser) -> QuerySet[SSHKey]:
    return SSHKey.objects.filter(owner=user).order_by("name")


def ssh_key_create(*, owner: AbstractBaseUser, name: Any, public_key: Any) -> SSHKey:
    """Register a public key (ssh-ed25519, ecdsa or RSA of 2048 bits or more). It may log in
    to the owner's SFTP sessions started from now on."""
    errors: dict[str, list[str]] = {}
    if not isinstance(name, str) or not name.strip():
        errors["name"] = ["a name for the key, e.g. 'laptop'"]
    elif len(name.strip()) > SSH_KEY_NAME_MAX or any(ord(c) < 32 for c in name):
        errors["name"] = [f"at most {SSH_KEY_NAME_MAX} printable characters"]
    parsed = None
    try:
        parsed = parse_public_key(public_key)
    except ValueError as exc:
        errors["public_key"] = [str(exc)]
    if errors:
        first, messages = next(iter(errors.items()))
        raise InvalidInput(f"{first}: {messages[0]}", errors)
    assert parsed is not None and isinstance(name, str)
    name = name.strip()
    if SSHKey.objects.filter(owner=owner, name=name).exists():
        raise field_error("name", f"you already have a key named {name!r}")
    if SSHKey.objects.filter(owner=owner, fingerprint=parsed.fingerprint).exists():
        raise field_error("public_key", f"this key ({parsed.fingerprint}) is registered already")
    try:
        with transaction.atomic():
            key = SSHKey.objects.create(
                owner=owner, name=name, public_key=parsed.line, fingerprint=parsed.fingerprint
            )
    except IntegrityError:
        raise Conflict("That key or name was registered at the same moment.") from None
    logger.info("user %s registered SSH key %s (%s)", owner.pk, key.pk, key.fingerprint)
    return key


def ssh_key_delete(*, owner: AbstractBaseUser, key_id: Any) -> None:
    deleted, _ = SSHKey.objects.filter(owner=owner, pk=key_id).delete()
    if not deleted:
        raise NotFound("No such SSH key.")
    logger.info("user %s deleted SSH key %s", owner.pk, key_id)
