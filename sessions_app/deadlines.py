"""When a session must end: idle timeout, lifetime limit, batch timeout.

Pure functions of a session's recorded times, its owner's resource policy and
``now``. The sweeps (scheduler_app.sweeps) end a session when one of these
deadlines has passed; the API shows them, and the time left, to the user.

The rules (CONCEPTS.md, "Dependencies, templates, idleness"):

- **Idle timeout** (policy ``idle_timeout``) applies to *interactive* and
  *system* (SFTP) sessions that run. The clock starts at the later of the last activity
  (``last_activity_at``: terminal keystrokes, code runs and their input, app
  traffic through the apps proxy, an SFTP connection; not an open page) and the moment the session started running, so a
  slow image pull does not count as idleness. Batch sessions are never idle:
  their command is the activity, and they end by themselves.
- **Lifetime limit** (policy ``max_session_lifetime``) applies to every session
  type, from the moment it was placed on agents (``started_at``, or
  ``scheduled_at`` while it still starts); time spent pending is governed by
  the resource group's pending timeout instead.
- **Batch timeout** (the session's ``batch_timeout``) applies to batch
  sessions from the moment ``main1`` started running its command.

Only sessions that hold resources and are not already ending have deadlines.

Every sum is bounded: a deadline past what a datetime holds (an enormous
limit) is no deadline at all, never an OverflowError. A batch timeout out of
the API's range (``batch_timeout_refusal``; only a row written around the API
has one) makes the batch deadline due at once, so the sweep ends the session
and says why.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol

from bai_common.units import format_duration

from .specs import MAX_BATCH_TIMEOUT as _MAX_BATCH_SECONDS

# Statuses in which a session holds agents and may be ended by a deadline.
STARTED = frozenset({"SCHEDULED", "PREPARING", "PULLING", "RUNNING"})

IDLE = "idle"
LIFETIME = "lifetime"
BATCH = "batch"

# The longest batch timeout the API accepts (sessions_app.specs).
MAX_BATCH_TIMEOUT = timedelta(seconds=_MAX_BATCH_SECONDS)


def batch_timeout_refusal(batch_timeout: timedelta | None) -> str | None:
    """Why a stored batch timeout is out of the API's range, or None."""
    if batch_timeout is None or timedelta(0) < batch_timeout <= MAX_BATCH_TIMEOUT:
        return None
    return (
        f"{format_duration(batch_timeout)} is out of range "
        f"(more than 0 s, at most {format_duration(MAX_BATCH_TIMEOUT)})"
    )


def _after(when: datetime, delta: timedelta) -> datetime | None:
    """``when + delta``; None when that is beyond the dates a datetime holds (never reached)."""
    try:
        return when + delta
    except OverflowError:
        return None


class PolicyLike(Protocol):
    idle_timeout: timedelta | None
    max_session_lifetime: timedelta | None


@dataclass(frozen=True)
class Deadlines:
    idle: datetime | None = None
    lifetime: datetime | None = None
    batch: datetime | None = None

    def earliest(self) -> tuple[str, datetime] | None:
        """The rule whose deadline comes first, and that deadline."""
        dated = [(when, rule) for rule, when in self.items() if when is not None]
        if not dated:
            return None
        when, rule = min(dated)
        return rule, when

    def seconds_left(self, now: datetime) -> int | None:
        """Whole seconds until the earliest deadline (0 once passed); None: no limit."""
        first = self.earliest()
        if first is None:
            return None
        return max(0, int((first[1] - now).total_seconds()))

    def items(self) -> list[tuple[str, datetime | None]]:
        return [(IDLE, self.idle), (LIFETIME, self.lifetime), (BATCH, self.batch)]


IDLE_TYPES = ("interactive", "system")  # the session types an idle timeout ends


def idle_deadline(
    *,
    session_type: str,
    status: str,
    last_activity_at: datetime | None,
    started_at: datetime | None,
    idle_timeout: timedelta | None,
) -> datetime | None:
    if idle_timeout is None or session_type not in IDLE_TYPES or status != "RUNNING":
        return None
    times = [t for t in (last_activity_at, started_at) if t is not None]
    return _after(max(times), idle_timeout) if times else None


def lifetime_deadline(
    *,
    status: str,
    started_at: datetime | None,
    scheduled_at: datetime | None,
    max_lifetime: timedelta | None,
) -> datetime | None:
    if max_lifetime is None or status not in STARTED:
        return None
    since = started_at or scheduled_at
    return _after(since, max_lifetime) if since is not None else None


def batch_deadline(
    *,
    session_type: str,
    status: str,
    main_started_at: datetime | None,
    batch_timeout: timedelta | None,
) -> datetime | None:
    if batch_timeout is None or session_type != "batch" or status not in STARTED:
        return None
    if main_started_at is None:
        return None
    if batch_timeout_refusal(batch_timeout) is not None:
        return main_started_at  # due at once: the sweep ends it and says why
    return _after(main_started_at, batch_timeout)


def session_deadlines(
    *, session: Any, policy: PolicyLike | None, main_started_at: datetime | None
) -> Deadlines:
    """All deadlines of a session (a Session or anything with its fields).

    ``main_started_at``: when main1 started running (None while it has not);
    the batch timeout counts from it.
    """
    return Deadlines(
        idle=idle_deadline(
            session_type=session.session_type,
            status=session.status,
            last_activity_at=session.last_activity_at,
            started_at=session.started_at,
            idle_timeout=policy.idle_timeout if policy else None,
        ),
        lifetime=lifetime_deadline(
            status=session.status,
            started_at=session.started_at,
            scheduled_at=session.scheduled_at,
            max_lifetime=policy.max_session_lifetime if policy else None,
        ),
        batch=batch_deadline(
            session_type=session.session_type,
            status=session.status,
            main_started_at=main_started_at,
            batch_timeout=session.batch_timeout,
        ),
    )


def overdue(
    deadlines: Deadlines,
    *,
    policy: PolicyLike | None,
    batch_timeout: timedelta | None,
    now: datetime,
) -> tuple[str, str] | None:
    """The rule that ends the session now, with the reason shown to the user.

    When several deadlines have passed, the earliest one is the reason.
    """
    passed = sorted(
        (when, rule) for rule, when in deadlines.items() if when is not None and when <= now
    )
    if not passed:
        return None
    rule = passed[0][1]
    if rule == IDLE:
        assert policy is not None and policy.idle_timeout is not None
        return rule, f"idle timeout: no activity for {format_duration(policy.idle_timeout)}"
    if rule == LIFETIME:
        assert policy is not None and policy.max_session_lifetime is not None
        return (
            rule,
            f"lifetime limit: ran longer than {format_duration(policy.max_session_lifetime)}",
        )
    assert batch_timeout is not None
    why = batch_timeout_refusal(batch_timeout)
    if why is not None:
        return rule, f"batch timeout: {why}"
    return rule, f"batch timeout: ran longer than {format_duration(batch_timeout)}"


def owner_policy(*, owner_id: Any) -> Any:
    """The resource policy that applies to a user (their own, else the
    default), in one query; None when there is none."""
    from django.db.models import Q

    from .models import ResourcePolicy

    return (
        ResourcePolicy.objects.filter(Q(assignments__user_id=owner_id) | Q(is_default=True))
        .order_by("is_default")
        .distinct()
        .first()
    )
