"""Time limits enforced by Celery beat: idle timeout, lifetime limit, batch timeout.

The rules themselves live in ``sessions_app.deadlines``; this module finds
the sessions that may be overdue and ends them through
``sessions_app.services.session_terminate``. (The pending timeout of a
resource group is applied by the scheduling pass, which beat runs every few
seconds.)

Safe to run twice at once and to interrupt: candidates are read without
locks, then each session is handled in its own short transaction that locks
its row and re-checks its deadline against fresh data. A second sweep that
waited for the lock finds the session already ending and does nothing, and a
sweep killed half-way has ended some sessions completely and left the others
for the next run.

One row never stops a sweep. A database error on one session (a deadlock
with a kernel report, say) leaves it for the next run; a session whose data
the rules cannot handle (a value no API would have written) is ended with
that error as its reason; either way the sweep carries on with the others.
The candidate queries do no date arithmetic that could overflow: a bounded
limit is subtracted from ``now``, and a limit too large to be reached finds no
candidate.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import DatabaseError, transaction
from django.db.models import DateTimeField, ExpressionWrapper, F, Q, Value
from django.db.models.functions import Coalesce, Greatest, Least
from django.utils import timezone

from sessions_app import selectors
from sessions_app import services as session_services
from sessions_app.deadlines import (
    IDLE_TYPES,
    MAX_BATCH_TIMEOUT,
    STARTED,
    overdue,
    session_deadlines,
)
from sessions_app.errors import Conflict
from sessions_app.models import (
    ACTIVE,
    DataFolder,
    Kernel,
    KernelRole,
    ResourcePolicy,
    Result,
    Session,
    SessionType,
    Status,
)

logger = logging.getLogger(__name__)


@dataclass
class SweepResult:
    """Ids of the sessions this sweep ended, by rule (``idle``, ``lifetime``, ``batch``)."""

    ended: dict[str, list[str]] = field(default_factory=dict)
    failed: list[str] = field(default_factory=list)

    @property
    def count(self) -> int:
        return sum(len(ids) for ids in self.ended.values())


def sweep_timeouts(*, now: datetime | None = None) -> SweepResult:
    """End every session past its idle, lifetime or batch deadline at ``now``."""
    now = now or timezone.now()
    candidates = set(idle_candidates(now=now))
    candidates.update(lifetime_candidates(now=now))
    candidates.update(batch_candidates(now=now))
    result = SweepResult()
    for session_id in sorted(candidates, key=str):
        try:
            verdict = end_if_overdue(session_id=session_id, now=now)
        except DatabaseError:
            # A deadlock with a kernel report, say: the next sweep tries again.
            logger.exception("sweep: could not end session %s; will retry", session_id)
            result.failed.append(str(session_id))
            continue
        except (ValueError, ArithmeticError) as exc:
            verdict = _end_unhandled(session_id=session_id, error=exc)
            if verdict is None:
                result.failed.append(str(session_id))
                continue
        if verdict is not None:
            result.ended.setdefault(verdict[0], []).append(str(session_id))
    if result.count:
        logger.info("sweep: ended %s", {rule: len(ids) for rule, ids in result.ended.items()})
    return result


def end_if_overdue(*, session_id: Any, now: datetime) -> tuple[str, str] | None:
    """End one session if a deadline has passed at ``now``; returns (rule, reason) if it did.

    One short transaction holding the session's row lock: the check and the
    end see the same state, so two sweeps cannot both end it.
    """
    with transaction.atomic():
        session = Session.objects.select_for_update().filter(pk=session_id).first()
        if session is None or session.status not in STARTED:
            return None
        policy = selectors.policy_for_user(user=session.owner)
        main_started_at = (
            Kernel.objects.filter(session=session, cluster_role=KernelRole.MAIN)
            .values_list("started_at", flat=True)
            .first()
        )
        deadlines = session_deadlines(
            session=session, policy=policy, main_started_at=main_started_at
        )
        verdict = overdue(deadlines, policy=policy, batch_timeout=session.batch_timeout, now=now)
        if verdict is None:
            return None
        rule, reason = verdict
        if session.session_type == SessionType.BATCH:
            # Its command did not complete: the result is FAILED whatever exit
            # code the killed process reports later (_record_result keeps the first).
            Session.objects.filter(pk=session.pk, result=Result.UNDEFINED).update(
                result=Result.FAILED
            )
        logger.info("session %s: %s", session.pk, reason)
        session_services.session_terminate(session=session, reason=reason)
        return verdict


UNHANDLED = "unhandled"


def _end_unhandled(*, session_id: Any, error: Exception) -> tuple[str, str] | None:
    """End a session whose time limits cannot be worked out, with the error as
    its reason (it would fail every sweep, unchecked, for ever)."""
    reason = f"ended: its time limits cannot be checked ({type(error).__name__}: {error})"
    logger.error("sweep: session %s: %s", session_id, reason)
    try:
        with transaction.atomic():
            session = Session.objects.select_for_update().filter(pk=session_id).first()
            if session is None or session.status not in STARTED:
                return None
            session_services.session_terminate(session=session, reason=reason)
    except (DatabaseError, Conflict):
        logger.exception("sweep: could not end session %s; will retry", session_id)
        return None
    return UNHANDLED, reason


# --- candidates: cheap queries, no locks; end_if_overdue decides ------------


def _owners_of_policies(limit: str) -> Iterator[tuple[ResourcePolicy, Q]]:
    """Each policy that sets ``limit``, with a filter on the sessions of its users."""
    for policy in ResourcePolicy.objects.filter(**{f"{limit}__isnull": False}):
        owners = Q(owner__resource_policy__policy=policy)
        if policy.is_default:
            owners |= Q(owner__resource_policy__isnull=True)
        yield policy, owners


def _cutoff(now: datetime, limit: timedelta) -> datetime | None:
    """``now - limit``; None when that is before the first date a datetime
    holds (no session can be that old)."""
    try:
        return now - limit
    except OverflowError:
        return None


def idle_candidates(*, now: datetime) -> list[Any]:
    ids: list[Any] = []
    for policy, owners in _owners_of_policies("idle_timeout"):
        assert policy.idle_timeout is not None
        cutoff = _cutoff(now, policy.idle_timeout)
        if cutoff is None:
            continue
        ids += Session.objects.filter(
            owners,
            session_type__in=IDLE_TYPES,
            status=Status.RUNNING,
            last_activity_at__lte=cutoff,
            started_at__lte=cutoff,
        ).values_list("pk", flat=True)
    return ids


def lifetime_candidates(*, now: datetime) -> list[Any]:
    ids: list[Any] = []
    for policy, owners in _owners_of_policies("max_session_lifetime"):
        assert policy.max_session_lifetime is not None
        cutoff = _cutoff(now, policy.max_session_lifetime)
        if cutoff is None:
            continue
        ids += (
            Session.objects.filter(owners, status__in=STARTED)
            .alias(since=Coalesce("started_at", "scheduled_at"))
            .filter(since__lte=cutoff)
            .values_list("pk", flat=True)
        )
    return ids


def batch_candidates(*, now: datetime) -> list[Any]:
    """Batch sessions past their timeout, and those whose timeout is out of
    range (``deadlines.batch_timeout_refusal``: due at once)."""
    in_range = Q(
        session__batch_timeout__gt=timedelta(0), session__batch_timeout__lte=MAX_BATCH_TIMEOUT
    )
    # ``now - timeout`` rather than ``started_at + timeout``, with the timeout
    # clamped into range in SQL (which does not promise to evaluate the
    # conditions of a WHERE in any order): the subtraction never overflows,
    # whatever the row holds.
    bounded = Greatest(
        Least(F("session__batch_timeout"), Value(MAX_BATCH_TIMEOUT)), Value(timedelta(0))
    )
    cutoff = ExpressionWrapper(
        Value(now, output_field=DateTimeField()) - bounded, output_field=DateTimeField()
    )
    return list(
        Kernel.objects.filter(
            cluster_role=KernelRole.MAIN,
            started_at__isnull=False,
            session__session_type=SessionType.BATCH,
            session__status__in=STARTED,
            session__batch_timeout__isnull=False,
        )
        .filter(~in_range | (in_range & Q(started_at__lte=cutoff)))
        .values_list("session_id", flat=True)
    )


def sweep_folder_usage() -> dict[str, list[Any]]:
    """Measure the folders that kernels may be writing now (those mounted by live
    sessions) and those never measured, and store their usage
    (``services.folders_measure``: one bad folder never stops the others). The
    filesystem here has no quota of its own, so a kernel's writes are seen after
    the fact: the owner's uploads (API, SFTP) are refused while over."""
    mounted = DataFolder.objects.filter(sessions__status__in=ACTIVE)
    never = DataFolder.objects.filter(measured_at__isnull=True)
    ids = set(mounted.values_list("pk", flat=True)) | set(never.values_list("pk", flat=True))
    done = session_services.folders_measure(folder_ids=ids)
    if done["failed"]:
        logger.warning("folder usage: %d folders could not be measured", len(done["failed"]))
    return done
