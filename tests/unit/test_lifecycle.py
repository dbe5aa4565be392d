"""The status lifecycle of sessions and kernels (CONCEPTS.md, Lifecycle).

Every pair of statuses is generated from ``Status``, so a new status is
covered (allowed or refused) without touching this file. Transitions go
through the model methods only, on PostgreSQL, because the compare-and-swap
is what keeps two writers from both winning.
"""

from __future__ import annotations

import itertools
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sessions_app.models import (
    ACTIVE,
    TERMINAL,
    TRANSITIONS,
    Kernel,
    Session,
    SessionEvent,
    Status,
    derive_session_status,
)

S = Status
ALL_PAIRS = list(itertools.product(Status, Status))
ALLOWED = [(src, dst) for src, dst in ALL_PAIRS if dst in TRANSITIONS[src]]
REFUSED = [(src, dst) for src, dst in ALL_PAIRS if dst not in TRANSITIONS[src]]
REACHABLE = frozenset().union(*TRANSITIONS.values())
NOW = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)
EARLIER = datetime(2029, 12, 31, 0, 0, 0, tzinfo=UTC)


def _pair_id(pair: tuple[str, str]) -> str:
    return f"{pair[0]}->{pair[1]}"


# --- fixtures: one session (with its main1 kernel) in any status ------------


@pytest.fixture(autouse=True)
def _fast_password_hashing(settings):
    # Creating the personas dominates these tests with the real hasher.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def make_session(db, alice, group, image, agent):
    def make(status: str) -> Session:
        return Session.objects.create(
            owner=alice,
            name="s",
            image=image,
            resource_group=group,
            status=status,
            status_changed_at=EARLIER,
            created_at=EARLIER,
        )

    return make


@pytest.fixture
def make_kernel(make_session, agent):
    def make(status: str) -> Kernel:
        session = make_session(S.RUNNING)
        return Kernel.objects.create(
            id=session.id,
            session=session,
            cluster_role="main",
            cluster_idx=1,
            local_rank=0,
            cluster_hostname="main1",
            image="bai-kernel/minimal:1",
            agent=agent,  # a placed kernel must have one; harmless for the others
            status=status,
            status_changed_at=EARLIER,
            created_at=EARLIER,
        )

    return make


@pytest.fixture(params=["session", "kernel"])
def make_row(request, make_session, make_kernel):
    """A Session or a Kernel in a given status: both follow the same table."""
    return make_session if request.param == "session" else make_kernel


def _events(row: Session | Kernel):
    if isinstance(row, Kernel):
        return SessionEvent.objects.filter(kernel=row)
    return SessionEvent.objects.filter(session=row, kernel__isnull=True)


def _mark(row: Session | Kernel, dst: str):
    """``row.mark_<dst>``; a status nothing may move to has no such method."""
    method = getattr(row, f"mark_{dst.lower()}", None)
    if method is None:
        assert dst not in REACHABLE
        return lambda reason, **fields: row.transition(dst, reason, **fields)
    return method


# --- the table itself ---------------------------------------------------------


def test_every_status_has_a_row_in_the_table_and_a_mark_method_if_reachable():
    assert set(TRANSITIONS) == set(Status)
    assert set(Status) - REACHABLE == {S.PENDING}  # where everything starts, and only that
    for status in REACHABLE:
        assert callable(getattr(Session, f"mark_{status.lower()}"))
        assert callable(getattr(Kernel, f"mark_{status.lower()}"))


def test_terminal_statuses_lead_nowhere_and_every_active_one_can_end():
    for status in TERMINAL:
        assert TRANSITIONS[status] == frozenset()
    for status in ACTIVE:
        assert TRANSITIONS[status] & TERMINAL, f"{status} can never end"
        assert S.ERROR in TRANSITIONS[status], f"{status} cannot fail"


def test_the_documented_paths_are_allowed():
    for path in (
        [S.PENDING, S.SCHEDULED, S.PREPARING, S.PULLING, S.RUNNING, S.TERMINATING, S.TERMINATED],
        [S.PENDING, S.SCHEDULED, S.PREPARING, S.RUNNING, S.TERMINATED],
        [S.PENDING, S.CANCELLED],
    ):
        for src, dst in itertools.pairwise(path):
            assert dst in TRANSITIONS[src], f"{src} → {dst}"


def test_only_a_session_that_never_ran_can_be_cancelled_and_none_goes_back_to_pending():
    assert [src for src, dst in ALLOWED if dst == S.CANCELLED] == [S.PENDING]
    assert [src for src, dst in ALLOWED if dst == S.PENDING] == []
    assert [dst for src, dst in ALLOWED if src == S.RUNNING and dst not in TERMINAL] == [
        S.TERMINATING
    ]


# --- allowed and refused moves ---------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize(("src", "dst"), ALLOWED, ids=map(_pair_id, ALLOWED))
def test_an_allowed_transition_wins_sets_its_fields_and_appends_one_event(make_row, src, dst):
    row = make_row(src)

    assert _mark(row, dst)("because of the test", now=NOW) is True

    stored = type(row).objects.get(pk=row.pk)
    for obj in (row, stored):  # the caller's copy is updated as well as the row
        assert obj.status == dst
        assert obj.status_reason == "because of the test"
        assert obj.status_changed_at == NOW
        assert obj.scheduled_at == (NOW if dst == S.SCHEDULED else None)
        assert obj.started_at == (NOW if dst == S.RUNNING else None)
        assert obj.terminated_at == (NOW if dst in TERMINAL else None)
    [event] = _events(row)
    assert (event.from_status, event.to_status, event.reason) == (src, dst, "because of the test")
    assert event.created_at == NOW
    assert event.session_id == (row.session_id if isinstance(row, Kernel) else row.pk)


@pytest.mark.django_db
@pytest.mark.parametrize(("src", "dst"), REFUSED, ids=map(_pair_id, REFUSED))
def test_a_refused_transition_raises_and_changes_nothing(make_row, src, dst):
    row = make_row(src)

    with pytest.raises(ValueError, match=f"{src} → {dst}"):
        _mark(row, dst)("should not happen", now=NOW)

    stored = type(row).objects.get(pk=row.pk)
    for obj in (row, stored):
        assert obj.status == src
        assert obj.status_reason == ""
        assert obj.status_changed_at == EARLIER
    assert not _events(row).exists()


@pytest.mark.django_db
def test_the_generic_transition_method_follows_the_same_table(make_row):
    row = make_row(S.PENDING)
    with pytest.raises(ValueError):
        row.transition(S.RUNNING, "skipping ahead")
    assert row.transition(S.SCHEDULED, "placed") is True
    assert type(row).objects.get(pk=row.pk).status == S.SCHEDULED


@pytest.mark.django_db
def test_extra_fields_are_written_together_with_the_status(make_kernel):
    kernel = make_kernel(S.RUNNING)
    assert kernel.mark_terminated("exited with code 3", exit_code=3) is True
    stored = Kernel.objects.get(pk=kernel.pk)
    assert (stored.status, stored.exit_code) == (S.TERMINATED, 3)


@pytest.mark.django_db
def test_a_long_reason_is_cut_to_fit_and_still_recorded(make_session):
    session = make_session(S.PENDING)
    assert session.mark_cancelled("x" * 900) is True
    assert len(Session.objects.get(pk=session.pk).status_reason) == 500
    assert session.events.get().reason == "x" * 500


# --- compare-and-swap -------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize(("src", "dst"), ALLOWED, ids=map(_pair_id, ALLOWED))
def test_of_two_stale_copies_only_the_first_transition_wins(make_row, src, dst):
    row = make_row(src)
    model = type(row)
    first, second = model.objects.get(pk=row.pk), model.objects.get(pk=row.pk)

    assert _mark(first, dst)("first writer") is True
    assert _mark(second, dst)("second writer") is False

    stored = model.objects.get(pk=row.pk)
    assert (stored.status, stored.status_reason) == (dst, "first writer")
    assert second.status == src  # the loser's copy is not made to look as if it won
    assert [e.reason for e in _events(row)] == ["first writer"]


@pytest.mark.django_db
def test_a_stale_copy_loses_even_when_its_own_move_would_be_legal(make_session):
    session = make_session(S.RUNNING)
    first, second = Session.objects.get(pk=session.pk), Session.objects.get(pk=session.pk)

    assert first.mark_terminating("user asked") is True
    assert second.mark_error("agent lost") is False

    assert Session.objects.get(pk=session.pk).status == S.TERMINATING
    assert list(session.events.values_list("to_status", flat=True)) == [S.TERMINATING]


# --- a session's status from its kernels' --------------------------------------------


@pytest.mark.parametrize(
    ("main", "subs", "expected"),
    [
        # a single kernel: the session simply follows main1
        *[(status, [], status) for status in Status],
        # starting: the least advanced kernel sets the pace, main1 included
        (S.PENDING, [S.PENDING, S.PENDING], S.PENDING),
        (S.SCHEDULED, [S.SCHEDULED], S.SCHEDULED),
        (S.PREPARING, [S.RUNNING, S.RUNNING], S.PREPARING),
        (S.PULLING, [S.PREPARING], S.PREPARING),
        (S.RUNNING, [S.PULLING, S.RUNNING], S.PULLING),
        (S.RUNNING, [S.SCHEDULED], S.SCHEDULED),
        # RUNNING only when every kernel runs
        (S.RUNNING, [S.RUNNING, S.RUNNING], S.RUNNING),
        # one kernel ended or ending while others live: the session is ending
        (S.RUNNING, [S.TERMINATED, S.RUNNING], S.TERMINATING),
        (S.RUNNING, [S.ERROR], S.TERMINATING),
        (S.TERMINATED, [S.RUNNING], S.TERMINATING),
        (S.ERROR, [S.RUNNING, S.RUNNING], S.TERMINATING),
        (S.TERMINATING, [S.RUNNING], S.TERMINATING),
        (S.RUNNING, [S.TERMINATING], S.TERMINATING),
        (S.PREPARING, [S.ERROR], S.TERMINATING),
        # endings
        (S.CANCELLED, [S.CANCELLED, S.CANCELLED], S.CANCELLED),
        (S.TERMINATED, [S.TERMINATED, S.TERMINATED], S.TERMINATED),
        (S.TERMINATED, [S.ERROR], S.TERMINATED),
        (S.ERROR, [S.TERMINATED, S.TERMINATED], S.ERROR),
        (S.ERROR, [S.ERROR], S.ERROR),
        (S.CANCELLED, [S.TERMINATED], S.TERMINATED),
    ],
)
def test_a_sessions_status_is_derived_from_its_kernels(main, subs, expected):
    assert derive_session_status(main, [main, *subs]) == expected


kernel_statuses = st.sampled_from(list(Status))


@given(main=kernel_statuses, subs=st.lists(kernel_statuses, max_size=6))
def test_a_session_is_running_exactly_when_every_kernel_runs(main, subs):
    kernels = [main, *subs]
    derived = derive_session_status(main, kernels)
    assert (derived == S.RUNNING) == all(k == S.RUNNING for k in kernels)


@given(main=kernel_statuses, subs=st.lists(kernel_statuses, max_size=6))
def test_a_session_has_ended_exactly_when_every_kernel_has(main, subs):
    kernels = [main, *subs]
    derived = derive_session_status(main, kernels)
    assert (derived in TERMINAL) == all(k in TERMINAL for k in kernels)
    if derived not in TERMINAL and any(k in TERMINAL for k in kernels):
        assert derived == S.TERMINATING
