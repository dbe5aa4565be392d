"""Everything agent-facing, in one room: where an agent's report lands.

- who an agent is (``agent_authenticate``) and what it says about itself (``agent_register``);
- the kernel environment and the create command (``kernel_environ``, ``create_kernels_command``);
- reconciliation: desired state (database) against the agent's report, answered with the
  create and destroy commands that close the gap (``agent_reconcile``), and the fast-path
  nudge that makes a gateway reconcile now (``notify_agents``);
- applying kernel reports and results (``kernel_apply_report``), occupancy shown to
  admins (``agent_refresh_occupancy``), kept log tails (``kernel_store_log_tail``);
- liveness: a heartbeat's time, recorded apart from its report (``agent_heartbeat``);
  the gateway's listening beacon and the lost-agent sweep (``sweep_lost_agents``).

An agent speaks only about its own kernels: every report is looked up with the
agent's id, and a report about another agent's kernel changes nothing. The gateway
has checked every field against ``agent.protocol`` before anything here runs.
User-facing services (``sessions_app.services``) never compose agent messages:
ending a session marks its kernels TERMINATING and asks for their agents to be
reconciled, and the destroys leave from here.
"""

from __future__ import annotations

import logging
import time
import uuid
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import redis
from django.conf import settings
from django.db import DatabaseError, transaction
from django.db.models import F
from django.utils import timezone

from agent import protocol
from backendai_web import redis as shared_redis
from sessions_app import live
from sessions_app import services as session_services
from sessions_app import slots as slotlib
from sessions_app.models import (
    OCCUPYING,
    TERMINAL,
    Agent,
    AgentStatus,
    Kernel,
    KernelRole,
    Result,
    Session,
    SessionType,
    Status,
    hash_token,
)
from sessions_app.selectors import session_apps
from sessions_app.sftp import is_sftp_session, sftp_apply_report, sftp_kernel_spec

from .locks import lock_group

logger = logging.getLogger(__name__)


# --- who the agent is ------------------------------------------------------


class AgentRefused(Exception):
    """The agent may not connect; the message says why (and is logged)."""


def agent_authenticate(*, token: str) -> Agent:
    agent = (
        Agent.objects.filter(token_hash=hash_token(token)).select_related("resource_group").first()
    )
    if agent is None:
        raise AgentRefused("unknown agent token (create the agent and its token in Django admin)")
    if agent.status == AgentStatus.TERMINATED:
        raise AgentRefused(f"agent {agent.pk} was decommissioned by an admin")
    return agent


def agent_register(*, agent: Agent, info: dict[str, Any], now: datetime | None = None) -> Agent:
    """Record what the agent says about itself and mark it alive."""
    now = now or timezone.now()
    capacity = {}
    for slot, value in (info.get("slots") or {}).items():
        capacity[str(slot)] = str(value)
    fields: dict[str, Any] = {
        "status": AgentStatus.ALIVE,
        "status_reason": "connected",
        "backend": str(info.get("backend") or "")[:16],
        "hostname": str(info.get("hostname") or "")[:255],
        "version": str(info.get("version") or "")[:64],
        "capacity_slots": capacity,
        "labels": info.get("labels") or {},
        "last_heartbeat_at": now,
        "lost_at": None,
        "connection_generation": F("connection_generation") + 1,
    }
    if agent.first_contact_at is None:
        fields["first_contact_at"] = now
    claimed = info.get("resource_group")
    if claimed and claimed != agent.resource_group.name:
        # The group is the admin's to set: an agent cannot move itself.
        logger.warning(
            "agent %s says it belongs to group %r; it stays in %r (set in admin)",
            agent.pk,
            str(claimed)[:64],
            agent.resource_group.name,
        )
    with transaction.atomic():
        Agent.objects.filter(pk=agent.pk).update(**fields)
        # Read back under the update's row lock: this registration's own generation.
        agent.refresh_from_db()
    logger.info("agent %s registered: %s backend, slots %s", agent.pk, agent.backend, capacity)
    session_services.request_scheduling(group_id=agent.resource_group_id)
    return agent


def agent_generation(*, agent_id: str) -> int | None:
    """The number of the agent's newest registration (``agent_register``); None if gone."""
    return Agent.objects.filter(pk=agent_id).values_list("connection_generation", flat=True).first()


# --- what a kernel is given -------------------------------------------------


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
    folders = list(session.mounts.all())
    readonly = set(session.readonly_mounts.values_list("pk", flat=True))
    mounts = [
        {
            "name": f.name,
            "host_path": str(f.host_path),
            **({"readonly": True} if f.pk in readonly else {}),
        }
        for f in folders
    ]
    sftp = sftp_kernel_spec(session=session, folders=folders) if is_sftp_session(session) else None
    # main1's service ports: a kernel that has any gets a network even when alone.
    app_ports = [app.port for app in session_apps(session=session)]
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
                "service_ports": app_ports if k.cluster_role == KernelRole.MAIN else [],
                **({"sftp": sftp} if sftp is not None else {}),
            }
            for k in kernels
        ],
    }


# --- reconciliation --------------------------------------------------------


def notify_agents(agent_ids: list[str]) -> None:
    """Fast path: tell each agent's gateway to reconcile now, all in one trip
    into the event loop (a pass may touch a thousand agents). Best effort: the
    heartbeat path catches up."""
    live.group_send_many(
        [(protocol.agent_group(a), {"type": protocol.GW_AGENT_RECONCILE}) for a in agent_ids]
    )


# Kernels created less than this long ago may not be reported yet.
CREATE_GRACE = timedelta(seconds=20)


def agent_reconcile(
    *, agent_id: str, reports: list[dict[str, Any]] | None, now: datetime | None = None
) -> list[dict[str, Any]]:
    """Compare desired state (database) with the agent's report and return
    the commands that close the gap. ``reports`` None: no fresh report (a
    nudge after a scheduling pass or a terminate): create what is new and
    destroy what is ending. The heartbeat's time is not recorded here but by
    ``agent_heartbeat``, the moment the heartbeat arrives.
    """
    now = now or timezone.now()
    reported: dict[str, dict[str, Any]] = {}
    if reports is not None:
        reported = {str(r["kernel_id"]): r for r in reports if r.get("kernel_id")}
        for kernel_id, report in reported.items():
            _apply_report(agent_id=agent_id, kernel_id=kernel_id, report=report)
    placed = {
        str(k.pk): k
        for k in Kernel.objects.filter(agent_id=agent_id, status__in=OCCUPYING).select_related(
            "session"
        )
    }
    to_create, to_destroy = _gaps(
        agent_id=agent_id, placed=placed, reported=reported, fresh=reports is not None, now=now
    )
    commands = [
        create_kernels_command(session=kernels[0].session, kernels=kernels)
        for kernels in to_create.values()
    ]
    for reason, kernel_ids in sorted(to_destroy.items()):
        commands.append(
            {"type": protocol.DESTROY_KERNELS, "kernel_ids": sorted(kernel_ids), "reason": reason}
        )
    return commands


def _gaps(
    *,
    agent_id: str,
    placed: dict[str, Kernel],
    reported: dict[str, dict[str, Any]],
    fresh: bool,
    now: datetime,
) -> tuple[dict[Any, list[Kernel]], dict[str, set[str]]]:
    """The kernels to create (by session) and to destroy (by reason) on one agent.

    ``fresh``: ``reported`` is what the agent runs now (a heartbeat), so a
    kernel it no longer lists is gone.
    """
    to_create: dict[Any, list[Kernel]] = {}
    to_destroy: dict[str, set[str]] = {}
    for kernel_id, kernel in placed.items():
        if kernel.status == Status.TERMINATING:
            if fresh and kernel_id not in reported:
                kernel_apply_report(
                    kernel=kernel, report={"status": protocol.KR_GONE, "reason": "destroyed"}
                )
            else:
                to_destroy.setdefault(kernel.status_reason or "ended", set()).add(kernel_id)
        elif kernel_id in reported:
            continue
        elif kernel.status == Status.SCHEDULED:
            to_create.setdefault(kernel.session_id, []).append(kernel)
        elif not fresh:
            continue
        elif kernel.status == Status.RUNNING:
            # It ran here and the agent no longer has it.
            reason = f"the container vanished from agent {agent_id}"
            kernel_apply_report(
                kernel=kernel, report={"status": protocol.KR_ERROR, "reason": reason}
            )
        elif kernel.status_changed_at and now - kernel.status_changed_at > CREATE_GRACE:
            # Preparing for long and not reported: the create was lost; send it again.
            to_create.setdefault(kernel.session_id, []).append(kernel)
    # Reported but not wanted here: ended, unknown or placed elsewhere. Never adopt twice.
    for kernel_id, report in reported.items():
        if kernel_id not in placed and report.get("status") != protocol.KR_GONE:
            to_destroy.setdefault("not wanted", set()).add(kernel_id)
    return to_create, to_destroy


def _apply_report(*, agent_id: str, kernel_id: str, report: dict[str, Any]) -> bool:
    kernel = Kernel.objects.filter(pk=_uuid_or_none(kernel_id), agent_id=agent_id).first()
    if kernel is None:
        return False
    if kernel.status not in TERMINAL:
        kernel_apply_report(kernel=kernel, report=report)
        if report.get("sftp") and report.get("status") == protocol.KR_RUNNING:
            sftp_apply_report(kernel=kernel, report=report["sftp"], now=timezone.now())
    return True


def agent_kernel_report(*, agent_id: str, report: dict[str, Any]) -> bool:
    """A kernel_status message: apply it at once. Returns whether the kernel is
    one of that agent's (a report about any other kernel changes nothing)."""
    return _apply_report(agent_id=agent_id, kernel_id=str(report.get("kernel_id")), report=report)


def agent_heartbeat(*, agent_id: str, now: datetime | None = None) -> None:
    """Record that the agent was heard from: one indexed update, nothing else, so
    that it never waits behind the reports the agent sent before."""
    Agent.objects.filter(pk=agent_id).update(last_heartbeat_at=now or timezone.now())


def _uuid_or_none(value: str) -> Any:
    try:
        return uuid.UUID(value)
    except (ValueError, TypeError):
        return None


def agent_disconnected(*, agent_id: str) -> None:
    Agent.objects.filter(pk=agent_id, status=AgentStatus.ALIVE).update(
        status_reason="disconnected; waiting"
    )


# --- reports ---------------------------------------------------------------


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
            live.status_changed(kernel)
            session = Session.objects.get(pk=kernel.session_id)
            if kernel.status in TERMINAL:
                why = f"{kernel.cluster_hostname}: {kernel.status_reason}"
                if kernel.agent_id:
                    agent_refresh_occupancy(agent_id=kernel.agent_id)
            else:
                why = kernel.status_reason
            session_services.session_sync_status(session=session, reason=why)


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


def kernel_store_log_tail(*, agent_id: str, kernel_id: str, data: str) -> bool:
    """Keep the last ``BAI_LOG_TAIL_BYTES`` of a kernel's log; only its own agent may.

    Returns whether a kernel of that agent took it.
    """
    limit = settings.BAI_LOG_TAIL_BYTES
    tail = data.encode("utf-8", "replace")[-limit:].decode("utf-8", "ignore")
    # Output may hold NUL bytes; PostgreSQL text cannot.
    tail = tail.replace("\x00", "\ufffd")
    pk = _uuid_or_none(kernel_id)
    return bool(pk) and Kernel.objects.filter(pk=pk, agent_id=agent_id).update(log_tail=tail) == 1


# --- lost agents -----------------------------------------------------------
#
# Silence only counts while someone listens. Each process that serves the agent
# gateway beats a Redis key (``gateway_listening_beat``): set once with the time it
# found the key absent -- the start of this listening period -- and its expiry pushed
# on at every beat. When every gateway is gone (a daphne restart), the key expires
# after a third of the lost timeout, and the next beat starts a new period. The
# sweep declares an agent LOST only when it has been silent for the whole timeout
# *and* gateways have been listening for the whole timeout: a manager that was away
# longer than the timeout gives every agent a full timeout to dial back in, and a
# session that was starting meanwhile is adopted from the agent's report when it
# does, not failed. A truly silent agent is still LOST one timeout after the return.


def _listening_ttl() -> float:
    return max(0.3, settings.BAI_AGENT_LOST_TIMEOUT / 3)


def gateway_listening_period() -> float:
    """Seconds between two beats of a gateway process (several beats per expiry)."""
    return _listening_ttl() / 3


def gateway_listening_key() -> str:
    # Keyed by database too: test runs and a dev server may share one Redis.
    return f"bai:gateway-listening:{settings.DATABASES['default']['NAME']}"


def _redis() -> redis.Redis:
    return shared_redis.client(timeout=2)


def gateway_listening_beat(*, now: float | None = None) -> None:
    """A gateway process is listening for agents now (raises redis.RedisError)."""
    key, ttl_ms = gateway_listening_key(), int(_listening_ttl() * 1000)
    pipe = _redis().pipeline(transaction=False)
    pipe.set(key, repr(now if now is not None else time.time()), nx=True, px=ttl_ms)
    pipe.pexpire(key, ttl_ms)
    pipe.execute()


def gateway_listening_since() -> datetime | None:
    """Since when gateways have been listening without a break; None: none is
    listening now. Raises redis.RedisError when Redis cannot say."""
    raw = _redis().get(gateway_listening_key())
    if raw is None:
        return None
    try:
        return datetime.fromtimestamp(float(raw), tz=UTC)
    except (ValueError, OverflowError):
        logger.warning("gateway listening key holds %r; counting from now", raw[:40])
        return timezone.now()


def sweep_lost_agents(*, now: datetime | None = None) -> list[str]:
    """Agents silent past the timeout, while gateways listened all that time,
    become LOST; their kernels end with that
    reason (their sessions too) and their slots are freed. Safe to run twice,
    and to interrupt: returns the agents it declared lost.

    Lock order, as everywhere: the group's lock before its agents (as a pass
    takes them), and a session before its kernels before their agent (as
    reports and terminations take them). So an agent is declared lost in one
    short transaction under the group's lock (a pass that placed there has
    committed, and later passes see it LOST), and each of its kernels then ends
    in its own transaction through ``kernel_apply_report``. The kernels of
    every LOST agent are looked for, so those a killed sweep left are ended by
    the next one; a kernel that cannot be ended now is left for the next.
    """
    now = now or timezone.now()
    timeout = timedelta(seconds=settings.BAI_AGENT_LOST_TIMEOUT)
    try:
        since = gateway_listening_since()
    except redis.RedisError:
        # Without the beacon the sweep cannot tell a manager restart from silent
        # agents: it falls back to heartbeats alone rather than never sweeping.
        logger.warning("redis unavailable: the lost-agent sweep goes by heartbeats alone")
        since = datetime.min.replace(tzinfo=UTC)
    if since is None or since > now - timeout:
        # Nobody listened for the whole timeout: silence proves nothing yet.
        return []
    lost: list[str] = []
    candidates = Agent.objects.filter(status=AgentStatus.ALIVE, last_heartbeat_at__lt=now - timeout)
    for agent_id, group_id, last in candidates.values_list(
        "pk", "resource_group_id", "last_heartbeat_at"
    ):
        silent = int((now - last).total_seconds())
        reason = f"agent {agent_id} lost: no heartbeat for {silent} s"
        with transaction.atomic():
            lock_group(group_id)
            moved = Agent.objects.filter(
                pk=agent_id, status=AgentStatus.ALIVE, last_heartbeat_at__lt=now - timeout
            ).update(status=AgentStatus.LOST, status_reason=reason, lost_at=now, occupied_slots={})
        if moved:
            lost.append(agent_id)
            logger.warning("%s", reason)
    for kernel in Kernel.objects.filter(
        agent__status=AgentStatus.LOST, status__in=OCCUPYING
    ).select_related("agent"):
        assert kernel.agent is not None
        why = kernel.agent.status_reason or f"agent {kernel.agent_id} lost"
        try:
            kernel_apply_report(kernel=kernel, report={"status": protocol.KR_ERROR, "reason": why})
        except DatabaseError:
            logger.exception("lost-agent sweep: kernel %s not ended; next sweep retries", kernel.pk)
    return lost
