"""Writes: endpoints, scaling, tokens and rules. Validation raises an
ApplicationError (400/403/404/409) before anything is written; the reconciler is
kicked after commit (``request_reconcile``)."""

from __future__ import annotations

import hashlib
import logging
import re
import secrets
from datetime import datetime
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.db import IntegrityError, transaction
from django.utils import timezone

from sessions_app import selectors as session_selectors
from sessions_app import service_ports
from sessions_app import services as session_services
from sessions_app.errors import (
    Conflict,
    InvalidInput,
    NotFound,
    PendingLimitReached,
    QuotaExceeded,
)
from sessions_app.launch import plan_preview
from sessions_app.models import TERMINAL, DataFolder, FolderShare, Image, ResourceGroup

from .models import (
    MAX_REPLICAS,
    AutoScalingRule,
    Endpoint,
    EndpointStatus,
    EndpointToken,
    EventKind,
    record,
)

logger = logging.getLogger(__name__)

ENDPOINT_NAME = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,62}[a-z0-9])?")
HEALTH_PATH = re.compile(r"/[A-Za-z0-9._~!$&'()*+,;=:@%/?-]{0,254}")
MAX_TOKENS = 32
MAX_RULES = 16
MODEL_ROOT = "/home/work"


def request_reconcile(*, endpoint_id: Any) -> None:
    """Run the reconciler for this endpoint after this transaction commits."""
    from .tasks import reconcile_endpoint

    key = str(endpoint_id)
    transaction.on_commit(lambda: reconcile_endpoint.delay(key))


# --- endpoints -------------------------------------------------------------------------


def _bad(field: str, message: str) -> InvalidInput:
    return InvalidInput(f"{field}: {message}", {field: [message]})


def model_folder_for(*, owner: AbstractBaseUser, ref: str) -> DataFolder:
    """The owner's folder by name, or one shared with the owner as ``owner/name``."""
    user, _, name = ref.rpartition("/")
    if not user:
        folder = session_selectors.folders_for_user(user=owner).filter(name=name).first()
    else:
        share = (
            FolderShare.objects.select_related("folder")
            .filter(user=owner, folder__owner__username=user, folder__name=name)
            .first()
        )
        folder = share.folder if share else None
    if folder is None:
        raise _bad("model_folder", f"you have no data folder named {ref!r}")
    return folder


def start_command_of(endpoint: Endpoint) -> str:
    """What its replicas run: the endpoint's start command, else its image's serving command."""
    return endpoint.start_command.strip() or endpoint.image.serve_command.strip()


def no_command(endpoint: Endpoint) -> str:
    return (
        f"image {endpoint.image.reference} has no default serving command: give the command "
        f"that starts your model server, listening on port {endpoint.port} ($BAI_SERVE_PORT)"
    )


def replica_spec(endpoint: Endpoint, *, name: str) -> dict[str, Any]:
    """The launch spec of one replica session of ``endpoint``."""
    image = endpoint.image
    declared = {app.port for app in service_ports.declared_apps(image.service_ports)}
    spec: dict[str, Any] = {
        "name": name,
        "type": "inference",
        "image": image.reference,
        "resource_group": endpoint.resource_group.name,
        "resources": dict(endpoint.resources or {}),
        "cluster_size": endpoint.cluster_size,
        "startup_command": start_command_of(endpoint),
        # The port must be reachable through the apps proxy's tunnel: an image's own app
        # port already is; any other is opened like a user's port.
        "ports": [] if endpoint.port in declared else [endpoint.port],
        "env": {"BAI_SERVE_ENDPOINT": endpoint.name, "BAI_SERVE_PORT": str(endpoint.port)},
    }
    if endpoint.cluster_size > 1:
        spec["cluster_mode"] = "single-node"
    folder = endpoint.model_folder
    if folder is not None:
        own = folder.owner_id == endpoint.owner_id
        spec["mounts"] = [folder.name if own else f"{folder.owner.username}/{folder.name}"]
        spec["env"]["BAI_MODEL_DIR"] = f"{MODEL_ROOT}/{folder.name}"
    return spec


# The launch checks name their fields; these are the endpoint's names for them.
_LAUNCH_FIELDS = {
    "mounts": "model_folder",
    "startup_command": "start_command",
    "ports": "port",
    "type": "resource_group",
}


def _check_replica_fits(*, owner: AbstractBaseUser, endpoint: Endpoint) -> None:
    """A replica must be a launch the owner could make: image, group, resources and
    folder are judged by the launch checks, and refused when no agent could ever
    hold one replica."""
    spec = replica_spec(endpoint, name="serve-check")
    try:
        _, never = plan_preview(owner=owner, spec=spec)
    except PendingLimitReached:
        return  # the pending limit: the reconciler waits and says so
    except Conflict:
        return  # a session named serve-check: only the name clashed
    except InvalidInput as exc:
        fields = {_LAUNCH_FIELDS.get(k, k): v for k, v in exc.fields.items()}
        first, messages = next(iter(fields.items()))
        raise InvalidInput(f"{first}: {messages[0]}", fields) from None
    if never is not None:
        raise _bad("resources", never)


def _check_bounds(replicas: int, min_replicas: int, max_replicas: int) -> None:
    if max_replicas > MAX_REPLICAS:
        raise _bad("max_replicas", f"at most {MAX_REPLICAS}")
    if min_replicas > max_replicas:
        raise _bad("min_replicas", f"must not exceed max_replicas ({max_replicas})")
    if not min_replicas <= replicas <= max_replicas:
        raise _bad(
            "replicas",
            f"must be from min_replicas ({min_replicas}) to max_replicas ({max_replicas})",
        )


def endpoint_create(*, owner: AbstractBaseUser, data: dict[str, Any]) -> Endpoint:
    """Create an endpoint from checked API input (types and ranges already judged by
    the API's serializer; their meaning here). Nothing is written on error."""
    name = data["name"]
    if not ENDPOINT_NAME.fullmatch(name):
        raise _bad(
            "name", "use 1-64 lower-case letters, digits or '-', not starting or ending with '-'"
        )
    image = Image.objects.filter(reference=data["image"], is_active=True).first()
    if image is None:
        raise _bad("image", f"unknown image {data['image']!r}")
    group_name = data.get("resource_group") or "default"
    group = ResourceGroup.objects.filter(name=group_name, is_active=True).first()
    if group is None:
        raise _bad("resource_group", f"unknown resource group {group_name!r}")
    folder = None
    if data.get("model_folder"):
        folder = model_folder_for(owner=owner, ref=data["model_folder"])
    port = data.get("port", 8000)
    if port in service_ports.RESERVED_PORTS:
        raise _bad("port", f"{port} is reserved for the runner (sshd)")
    health_path = data.get("health_path", "/health")
    if not HEALTH_PATH.fullmatch(health_path):
        raise _bad("health_path", "must be a path starting with '/' (at most 255 URL characters)")
    min_replicas = data.get("min_replicas", 0)
    max_replicas = data.get("max_replicas", max(1, data.get("replicas", 1)))
    replicas = data.get("replicas", 1)
    _check_bounds(replicas, min_replicas, max_replicas)
    endpoint = Endpoint(
        owner=owner,
        name=name,
        image=image,
        model_folder=folder,
        start_command=data.get("start_command", "").strip(),
        port=port,
        health_path=health_path,
        health_interval=data.get("health_interval", 5),
        resources=data.get("resources") or {},
        cluster_size=data.get("cluster_size", 1),
        resource_group=group,
        replicas=replicas,
        min_replicas=min_replicas,
        max_replicas=max_replicas,
        open_to_public=data.get("open_to_public", False),
        status=EndpointStatus.PROVISIONING if replicas else EndpointStatus.SCALED_TO_ZERO,
    )
    if not start_command_of(endpoint):
        raise _bad("start_command", no_command(endpoint))
    _check_replica_fits(owner=owner, endpoint=endpoint)
    rules = [_rule_from(endpoint, r, f"rules.{i}") for i, r in enumerate(data.get("rules") or [])]
    if len(rules) > MAX_RULES:
        raise _bad("rules", f"at most {MAX_RULES} rules")
    if Endpoint.objects.filter(name=name).exists():
        raise _name_taken(name)
    try:
        with transaction.atomic():
            # The count and the insert under the owner's lock: creates at once queue here.
            session_services.lock_owner(owner)
            _check_endpoint_cap(owner)
            endpoint.save()
            for rule in rules:
                rule.endpoint = endpoint
                rule.save()
            record(
                endpoint,
                EventKind.CREATED,
                f"created with {replicas} replica(s) ({min_replicas}–{max_replicas})",
                to=replicas,
            )
            request_reconcile(endpoint_id=endpoint.pk)
    except IntegrityError:
        if Endpoint.objects.filter(name=name).exists():
            raise _name_taken(name) from None
        raise
    logger.info("endpoint %s (%s) created by user %s", endpoint.pk, name, owner.pk)
    return endpoint


def _check_endpoint_cap(owner: AbstractBaseUser) -> None:
    """The policy's ``max_endpoints`` (403 with the figures); the caller holds the owner's lock."""
    policy = session_selectors.policy_for_user(user=owner)
    limit = policy.max_endpoints if policy is not None else None
    if limit is None:
        return
    count = Endpoint.objects.filter(owner=owner).count()
    if count >= limit:
        raise QuotaExceeded(
            f"You have {count} endpoint{'s' if count != 1 else ''}, the most your policy "
            f"allows ({limit}): delete one first.",
            {"endpoint_count": count, "max_endpoints": limit},
        )


def _name_taken(name: str) -> Conflict:
    return Conflict(
        f"An endpoint named {name!r} exists already (names are URLs, shared by all users).",
        {"fields": {"name": ["already taken"]}},
    )


def _lock(endpoint: Endpoint) -> Endpoint:
    """The endpoint's row, locked until the transaction ends; 404 once it is deleted (a
    request that found it may reach here after a concurrent delete committed)."""
    locked = Endpoint.objects.select_for_update(of=("self",)).filter(pk=endpoint.pk).first()
    if locked is None or locked.status == EndpointStatus.DESTROYING:
        raise NotFound("The endpoint was deleted.")
    return locked


def endpoint_update(
    *, endpoint: Endpoint, user: AbstractBaseUser, data: dict[str, Any]
) -> Endpoint:
    """Change the replica bounds and count, public access, health checks, or the
    rules (a given ``rules`` list replaces them all)."""
    with transaction.atomic():
        endpoint = _lock(endpoint)
        old = endpoint.replicas
        replicas = data.get("replicas", endpoint.replicas)
        min_replicas = data.get("min_replicas", endpoint.min_replicas)
        max_replicas = data.get("max_replicas", endpoint.max_replicas)
        if "replicas" not in data:  # new bounds pull the current count in
            replicas = min(max(replicas, min_replicas), max_replicas)
        _check_bounds(replicas, min_replicas, max_replicas)
        if "health_path" in data and not HEALTH_PATH.fullmatch(data["health_path"]):
            raise _bad(
                "health_path", "must be a path starting with '/' (at most 255 URL characters)"
            )
        rules = None
        if "rules" in data:
            rules = [_rule_from(endpoint, r, f"rules.{i}") for i, r in enumerate(data["rules"])]
            if len(rules) > MAX_RULES:
                raise _bad("rules", f"at most {MAX_RULES} rules")
        for field in ("open_to_public", "health_path", "health_interval"):
            if field in data:
                setattr(endpoint, field, data[field])
        endpoint.min_replicas, endpoint.max_replicas = min_replicas, max_replicas
        _set_replicas(endpoint, replicas, f"changed by {user.get_username()}", old=old)
        endpoint.start_failures = 0  # the user acted: starts are tried again
        endpoint.save()
        if rules is not None:
            endpoint.rules.all().delete()
            for rule in rules:
                rule.save()
        request_reconcile(endpoint_id=endpoint.pk)
    return endpoint


def _set_replicas(endpoint: Endpoint, replicas: int, why: str, *, old: int, **data: Any) -> None:
    """Set the desired count and record it (caller saves)."""
    if replicas == old:
        return
    endpoint.replicas = replicas
    if (old == 0) != (replicas == 0):
        endpoint.scaled_at = timezone.now()
    record(
        endpoint,
        EventKind.SCALE,
        f"scaled {old} → {replicas}: {why}",
        **{"from": old, "to": replicas, **data},
    )


def endpoint_scale(*, endpoint: Endpoint, user: AbstractBaseUser, replicas: int) -> Endpoint:
    """Set the desired replica count by hand (within the endpoint's min and max)."""
    return endpoint_update(endpoint=endpoint, user=user, data={"replicas": replicas})


def endpoint_delete(*, endpoint: Endpoint, user: AbstractBaseUser) -> None:
    """Terminate every replica session, then delete the endpoint (and its history)."""
    with transaction.atomic():
        endpoint = _lock(endpoint)
        Endpoint.objects.filter(pk=endpoint.pk).update(status=EndpointStatus.DESTROYING, replicas=0)
        for route in endpoint.routes.select_related("session"):
            session = route.session
            if session is not None and session.status not in TERMINAL:
                try:
                    session_services.session_terminate(
                        session=session, reason=f"endpoint {endpoint.name} deleted"
                    )
                except Conflict:
                    pass  # it ended meanwhile
        endpoint_id = endpoint.pk
        endpoint.delete()
    logger.info("endpoint %s (%s) deleted by user %s", endpoint_id, endpoint.name, user.pk)


def wake(endpoint_id: str, reason: str) -> None:
    """An endpoint at 0 replicas with a request waiting: desired := max(1, min_replicas),
    and the reconciler runs now. Idempotent: an endpoint with replicas does nothing."""
    with transaction.atomic():
        endpoint = (
            Endpoint.objects.select_for_update()
            .filter(pk=endpoint_id)
            .exclude(status=EndpointStatus.DESTROYING)
            .first()
        )
        if endpoint is None or endpoint.replicas > 0:
            return
        target = max(1, endpoint.min_replicas)
        endpoint.last_request_at = timezone.now()
        _set_replicas(endpoint, target, reason or "a request arrived while scaled to zero", old=0)
        endpoint.start_failures = 0
        endpoint.status = EndpointStatus.PROVISIONING
        endpoint.status_reason = "waking up: a request is waiting"
        endpoint.save()
        request_reconcile(endpoint_id=endpoint.pk)
    logger.info("endpoint %s woken: %s", endpoint_id, reason)


# --- tokens ------------------------------------------------------------------------------


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def token_create(
    *, endpoint: Endpoint, user: AbstractBaseUser, expires_at: datetime | None = None
) -> tuple[EndpointToken, str]:
    """A new caller token and its plain text, which exists only now."""
    if expires_at is not None and expires_at <= timezone.now():
        raise _bad("expires_at", "must be in the future")
    plain = "bai_" + secrets.token_hex(24)
    with transaction.atomic():
        # The count and the insert under the endpoint's row lock: parallel creates
        # queue here, so none of them counts before another's insert is committed.
        if not Endpoint.objects.select_for_update().filter(pk=endpoint.pk).exists():
            raise NotFound("No such endpoint.")
        if endpoint.tokens.count() >= MAX_TOKENS:
            raise Conflict(f"An endpoint has at most {MAX_TOKENS} tokens: delete one first.")
        token = EndpointToken.objects.create(
            endpoint=endpoint,
            prefix=plain[4:12],
            digest=hash_token(plain),
            expires_at=expires_at,
            created_by=user,
        )
        record(endpoint, EventKind.TOKEN, f"token {token.prefix}… created by {user.get_username()}")
    return token, plain


def token_delete(*, endpoint: Endpoint, user: AbstractBaseUser, token_id: int) -> None:
    token = endpoint.tokens.filter(pk=token_id).first()
    if token is None:
        raise NotFound("No such token.")
    with transaction.atomic():
        token.delete()
        record(endpoint, EventKind.TOKEN, f"token {token.prefix}… deleted by {user.get_username()}")


# --- rules -----------------------------------------------------------------------------------


def _rule_from(endpoint: Endpoint, data: dict[str, Any], field: str) -> AutoScalingRule:
    rule = AutoScalingRule(
        endpoint=endpoint,
        metric=data["metric"],
        comparator=data["comparator"],
        threshold=data["threshold"],
        step=data["step"],
        cooldown=data.get("cooldown", 60),
        min_replicas=data.get("min_replicas", endpoint.min_replicas),
        max_replicas=data.get("max_replicas", endpoint.max_replicas),
    )
    if rule.step == 0:
        raise _bad(f"{field}.step", "must not be 0")
    if rule.min_replicas > rule.max_replicas:
        raise _bad(f"{field}.min_replicas", f"must not exceed max_replicas ({rule.max_replicas})")
    return rule


def rule_create(*, endpoint: Endpoint, data: dict[str, Any]) -> AutoScalingRule:
    """Add one autoscaling rule to an existing endpoint (at most ``MAX_RULES``)."""
    with transaction.atomic():
        endpoint = _lock(endpoint)  # the count and the insert: one at a time per endpoint
        if endpoint.rules.count() >= MAX_RULES:
            raise Conflict(f"An endpoint has at most {MAX_RULES} rules: delete one first.")
        rule = _rule_from(endpoint, data, "rule")
        rule.save()
        request_reconcile(endpoint_id=endpoint.pk)
    return rule


def rule_delete(*, endpoint: Endpoint, rule_id: int) -> None:
    with transaction.atomic():
        endpoint = _lock(endpoint)
        deleted, _ = endpoint.rules.filter(pk=rule_id).delete()
    if not deleted:
        raise NotFound("No such rule.")
